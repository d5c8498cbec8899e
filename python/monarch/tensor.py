"""Distributed tensors: one controller drives sharded torch tensors on a ProcMesh (docs/tensors.md).

Imported lazily (``monarch.Tensor``, ``ProcMesh.activate()``): it imports torch, which
``monarch`` and ``monarch.actor`` never do.

Controller side. ``with procs.activate():`` pushes a TorchFunctionMode; every torch call inside
it (functions, methods, operators, factories) returns a :class:`Tensor` whose shape, dtype and
stride come from running the same call on meta tensors, so nothing waits for a worker. Each call
becomes a small op tuple appended to the mesh's pending batch, which is sent (one broadcast, no
reply) when it holds ``BATCH_OPS`` ops, at a fetch, at the exit of ``activate()``, or on
:func:`flush`. Ops on a :class:`Tensor` outside ``activate()`` run on that tensor's mesh.

Worker side. One :class:`TensorWorker` actor per proc (spawned on the first ``activate()`` of a
proc mesh, shared by its views) holds ``{ref id: torch.Tensor or _Failed}`` and runs each batch
in order. An op that raises stores a :class:`TensorError` (op, proc, message) for its outputs;
ops whose inputs failed propagate it without running. Everything here is meant for one
controller thread per proc mesh: batches and fetches sent from one thread reach each worker in
send order (CAST-3); from several threads they may not.
"""

import collections
import collections.abc
import itertools
import os
import pickle
import socket
import sys
import threading
import time
import uuid
import weakref
from typing import Dict, Optional

import cloudpickle
import torch
from torch.overrides import TorchFunctionMode, _no_torch_function_mode

from monarch import actor as _actor
from monarch.actor import Actor, ActorError, Future, context, endpoint

__all__ = ["Tensor", "TensorError", "fetch_shard", "inspect", "remote", "flush", "TensorWorker"]

#: A mesh's pending batch is sent once it holds this many ops.
BATCH_OPS = 256
#: Seconds a worker waits for a ref produced by an actor endpoint (``rref``) before failing it.
REF_WAIT_S = 120.0

_REDUCTIONS = ("sum", "avg", "min", "max", "product", "stack")


class TensorError(RuntimeError):
    """An op failed on a worker (or depends on one that did). ``op``: its qualified name;
    ``rank``: the global rank of the proc; ``coords``: its coordinates (dict); ``message``: the
    original error text."""

    def __init__(self, op, rank, coords, message):
        self.op, self.rank, self.coords, self.message = op, rank, dict(coords or {}), message
        where = ", ".join("%s=%s" % kv for kv in self.coords.items()) or "rank %s" % rank
        if rank is None and not self.coords:  # found on the controller (a shape query)
            super().__init__("op %s failed on the controller: %s" % (op, message))
        elif rank is None:  # refused on the controller for the proc at coords
            super().__init__("op %s failed for proc %s: %s" % (op, where, message))
        else:
            super().__init__("op %s failed on proc %s (rank %s): %s" % (op, where, rank, message))

    def __reduce__(self):
        return (TensorError, (self.op, self.rank, self.coords, self.message))


# --- wire format ----------------------------------------------------------------------------------
# A batch is a list of op tuples, sent as TensorWorker.run(batch):
#   (_DEF, op_id, spec)                      op table entry: spec resolves to a callable
#   (_CALL, op_id, args, kwargs, outs)       run it; _Ref markers in args/kwargs are inputs
#   (_DEL, refs)                             free refs
#   (_REDUCE, ref, out, key, host, port, labels, sizes, dims, reduction, scatter)
#   (_PUT, out, tensor)                      store a tensor sent by the controller (to_mesh)
#   (_CALL_NOGRAD, ...)                      _CALL under torch.no_grad() (the controller's mode)
_DEF, _CALL, _DEL, _REDUCE, _PUT, _CALL_NOGRAD = range(6)


class _Ref:
    """An input that is a ref on the worker."""
    __slots__ = ("id",)

    def __init__(self, i):
        self.id = i

    def __reduce__(self):
        return (_Ref, (self.id,))


def _op_spec(func):
    """How a worker finds ``func``: by reference when it pickles so, a getter by its name
    (``Tensor.T``'s ``__get__``), else by value (cloudpickle)."""
    self_ = getattr(func, "__self__", None)
    if type(func).__name__ == "method-wrapper" and func.__name__ == "__get__" and \
            type(self_).__name__ == "getset_descriptor":
        return ("g", self_.__name__)
    try:
        return ("p", pickle.dumps(func, protocol=5))
    except Exception:
        return ("p", cloudpickle.dumps(func, protocol=5))


def _op_name(func):
    self_ = getattr(func, "__self__", None)
    if type(func).__name__ == "method-wrapper" and self_ is not None:
        return "Tensor.%s" % getattr(self_, "__name__", "?")
    q = getattr(func, "__qualname__", None) or getattr(func, "__name__", None) or repr(func)
    mod = getattr(func, "__module__", None)
    if q.startswith("_TensorBase.") or q.startswith("TensorBase."):
        return "Tensor." + q.split(".", 1)[1]
    if mod and mod.startswith("torch") and "." not in q:
        return "torch." + q
    return q if not mod else "%s.%s" % (mod, q)


# --- controller: sessions and views ---------------------------------------------------------------


class _View:
    """The procs a tensor lives on: a ProcMesh (view), its TensorWorker view, its global ranks."""

    def __init__(self, session, pm, key):
        self.session = session
        self.pm = pm
        self.key = key
        w = session.workers
        self.workers = w if pm._view is None else w._with_shape(pm._view)
        self.extent = pm.extent
        self.defined = set()  # op ids whose _DEF these workers have received
        self.store_port = None

    def __repr__(self):
        return "<mesh %s %s>" % (self.session.root._name, dict(self.extent))


class _Session:
    """The tensor state of one proc mesh (shared by its views): its workers, refs, op table and
    pending batches."""

    def __init__(self, pm):
        root = _actor.ProcMesh(pm._lazy, pm._name, pm._live, None, remote=pm._remote)
        root._failures = pm._failures
        self.root = root
        self.seed = torch.initial_seed() & 0x7FFFFFFF
        self.token = uuid.uuid4().hex  # tells a worker's refs from another mesh's
        self.send_error = None  # a batch that could not be sent: its refs are lost
        self.workers = root.spawn("monarch_tensor_worker", TensorWorker, self.seed, self.token)
        self.refs = itertools.count(1)
        self.ops = {}          # func (or remote fn) -> op id
        self.specs = []        # op id -> spec
        self.segments = []     # [[view, ops]], sent in order
        self.pending = 0
        self.pending_bytes = 0  # of local tensors in the pending ops
        self.dead = collections.deque()  # (view, ref) freed by GC, appended from any thread
        self.views = {}
        self.lock = threading.RLock()
        _ACTIVE_SESSIONS.add(self)

    def view(self, pm):
        sh = pm._shape()
        key = (tuple(sh.global_ranks()), tuple(sh.labels), tuple(sh.sizes))
        v = self.views.get(key)
        if v is None:
            v = self.views[key] = _View(self, pm, key)
        return v

    def failure(self):
        f = self.root._failures
        if f:
            return f[0]
        return self.send_error

    def op_id(self, func, spec_fn=_op_spec):
        i = self.ops.get(func)
        if i is None:
            i = self.ops[func] = len(self.specs)
            self.specs.append(spec_fn(func))
        return i

    def _segment(self, view):
        segs = self.segments
        if segs and segs[-1][0] is view:
            return segs[-1][1]
        ops = []
        segs.append([view, ops])
        return ops

    def _drain_dead(self):
        dead = self.dead
        while dead:
            view, ref = dead.popleft()
            self._segment(view).append((_DEL, ref))
            self.pending += 1

    def append(self, view, op, op_id=None, nbytes=0):
        """Queues ``op``; ``nbytes``: the local tensors it carries. A batch that would outgrow
        one message (channel.max_frame_bytes) is sent first."""
        with self.lock:
            if nbytes and not _actor._fits_frame(self.pending_bytes + nbytes):
                self.flush()
            self.pending_bytes += nbytes
            if self.dead:
                self._drain_dead()
            ops = self._segment(view)
            if op_id is not None and op_id not in view.defined:
                view.defined.add(op_id)
                ops.append((_DEF, op_id, self.specs[op_id]))
            ops.append(op)
            self.pending += 1
            if self.pending >= BATCH_OPS:
                self.flush()

    def flush(self):
        with self.lock:
            if self.dead:
                self._drain_dead()
            segs, self.segments, self.pending, self.pending_bytes = self.segments, [], 0, 0
            if self.failure() is not None or self.root._live.stopped is not None:
                return  # the procs failed (fetches raise that failure) or were stopped
            for view, ops in segs:
                try:
                    view.workers.run.broadcast(ops)
                except Exception as e:
                    # What was not sent is lost, and later ops may need it: every fetch on
                    # this mesh raises this from now on.
                    self.send_error = TensorError(
                        "send", None, {}, "a batch of %d ops to %r could not be sent: %s: %s"
                        % (len(ops), view, type(e).__name__, e))
                    raise


_SESSIONS_LOCK = threading.Lock()


def _session(pm) -> _Session:
    with _SESSIONS_LOCK:
        s = getattr(pm._lazy, "_monarch_tensor_session", None)
        if s is None:
            if pm._local:
                raise ValueError("activate(): this_proc() has no tensor workers; spawn procs "
                                 "with this_host().spawn_procs(...)")
            s = _Session(pm)
            pm._lazy._monarch_tensor_session = s
        return s


def _view_of(pm, what="activate()") -> _View:
    if not isinstance(pm, _actor.ProcMesh):
        raise TypeError("%s: expected a ProcMesh (or a slice of one), not %s"
                        % (what, type(pm).__name__))
    pm._live.check()  # SupervisionError naming the mesh when it was stopped
    return _session(pm).view(pm)


def flush(mesh=None):
    """Sends the pending ops of ``mesh``'s procs (every activated mesh's when None) now."""
    if mesh is not None:
        _session(mesh).flush()
        return
    for s in list(_ACTIVE_SESSIONS):
        s.flush()


_ACTIVE_SESSIONS = weakref.WeakSet()


# --- controller: Tensor ---------------------------------------------------------------------------


class _Handle:
    """Owns a ref: when the last Tensor holding it goes, the workers free it (next batch)."""
    __slots__ = ("ref", "view", "__weakref__")

    def __init__(self, ref, view):
        self.ref = ref
        self.view = view

    def __del__(self):
        try:
            self.view.session.dead.append((self.view, self.ref))
        except Exception:
            pass  # interpreter shutdown


class Tensor(torch.Tensor):
    """A tensor with one shard per proc of a mesh. Its shape, dtype and stride (those of one
    shard) are known on the controller at once; its values only through :func:`fetch_shard`.
    Any torch call on it runs on every proc of its mesh and returns a Tensor. When the shape
    could not be inferred (the op has no meta kernel, or it raised on meta tensors: then it will
    most likely fail on the workers too), ``shape`` raises :class:`TensorError` naming why.
    """

    @staticmethod
    def __new__(cls, handle, meta, why=None):
        m = meta if meta is not None else _UNKNOWN
        r = torch.Tensor._make_wrapper_subclass(cls, m.size(), strides=m.stride(),
                                                dtype=m.dtype, device="meta",
                                                requires_grad=False)
        r._h = handle
        r._meta = meta
        r._why = why
        return r

    def __init__(self, *a, **k):
        pass

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        return _dispatch(func, args, kwargs, None)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        raise RuntimeError("monarch.Tensor: %s reached the dispatcher; run it inside "
                           "mesh.activate() or on the shards (fetch_shard)" % (func,))

    @property
    def mesh(self):
        """The ProcMesh (view) whose procs hold the shards."""
        return self._v.pm

    @property
    def _v(self):
        return self.__dict__.get("_view_override") or self._h.view

    @property
    def ref(self) -> int:
        return self._h.ref

    def __repr__(self):
        m = self._meta
        what = ("shape=%s, dtype=%s" % (tuple(m.shape), m.dtype)) if m is not None \
            else "shape unknown"
        return "monarch.Tensor(%s, mesh=%s, ref=%d)" % (what, dict(self._v.extent), self._h.ref)

    __str__ = __repr__

    def __format__(self, spec):
        return repr(self)

    def __hash__(self):
        return id(self)

    def __reduce_ex__(self, proto):
        # Inside a message to an actor on the same procs: that proc's local shard.
        if not _actor._in_message():
            raise TypeError("a monarch.Tensor pickles only inside a message to an actor on its "
                            "procs (it stands for each proc's shard); to save or pickle its "
                            "values, fetch them first: fetch_shard(t, ...).get()")
        s = self._v.session
        s.flush()
        return (_local_shard, (self._h.ref, s.token, repr(self._v)))

    def __deepcopy__(self, memo):
        raise TypeError("monarch.Tensor cannot be deep-copied; use t.clone() (runs on the mesh)")

    def slice_mesh(self, **coords) -> "Tensor":
        """The shards on a slice of this tensor's mesh (``gpus=0`` or ``gpus=slice(0, 2)``), as
        a Tensor on that view; the same shards, not a copy."""
        pm = self._v.pm.slice(**coords)
        t = Tensor(self._h, self._meta, self._why)
        t._view_override = self._v.session.view(pm)
        return t

    def to_mesh(self, mesh) -> "Tensor":
        """A copy of every shard on ``mesh``, a ProcMesh with the same extent (shard at rank i
        of this mesh goes to rank i of ``mesh``). The bytes travel through the controller, and
        this call waits for them (it is not pipelined)."""
        src = self._v
        dst = _view_of(mesh, "to_mesh")
        if list(src.extent.items()) != list(dst.extent.items()):
            raise ValueError("to_mesh: the target mesh has extent %s, this tensor's has %s"
                             % (dict(dst.extent), dict(src.extent)))
        src.session.flush()
        _raise_failure(src.session)
        values = src.workers.fetch.call(self._h.ref).get()
        out = next(dst.session.refs)
        for i in range(src.extent.nelem):
            pt = dict(src.extent.point(i))
            item = values.error(**pt)
            if item is None:
                item = values.item(**pt)
            elif isinstance(item, ActorError) and isinstance(item.exception, TensorError):
                item = item.exception
            else:
                item = TensorError("to_mesh", i, pt, str(item))
            one = dst.session.view(dst.pm.slice(**dict(dst.extent.point(i))))
            dst.session.append(one, (_PUT, out, item))
        _ACTIVE_SESSIONS.add(dst.session)
        return Tensor(_Handle(out, dst), self._meta, self._why)

    def reduce(self, dims, reduction="sum", scatter=False, mesh=None) -> "Tensor":
        """Reduces the shards across mesh ``dims`` (a dim name or a list of them): ``sum``,
        ``avg``, ``min``, ``max``, ``product`` (each shard gets the result: all-reduce), or
        ``stack`` (all-gather: a new leading dim of the group's size). ``scatter=True``: each
        shard gets its slice of dim 0 of the result (reduce-scatter; dim 0 must divide by the
        group's size). Raises ValueError at once for an unknown dim or reduction."""
        return _reduce(self, dims, reduction, scatter, mesh, inplace=False)

    def reduce_(self, dims, reduction="sum", scatter=False, mesh=None) -> "Tensor":
        """In-place :meth:`reduce` (not ``stack`` nor ``scatter``, which change the shape);
        returns this tensor."""
        return _reduce(self, dims, reduction, scatter, mesh, inplace=True)


_UNKNOWN = torch.empty((), device="meta")

# Tensor methods that read only shape/dtype: answered from the meta tensor, nothing sent.
_PURE = {"size", "dim", "ndimension", "numel", "nelement", "stride", "is_contiguous",
         "element_size", "is_floating_point", "is_complex", "storage_offset", "__len__",
         "get_device", "is_sparse", "type"}
# Need values: refused on the controller.
_NEEDS_VALUE = {"item", "tolist", "numpy", "__int__", "__float__", "__index__", "__array__",
                "__complex__", "__bool__", "data_ptr", "storage", "untyped_storage"}


def _fname(func):
    n = getattr(func, "__name__", "")
    if n == "__get__":
        return getattr(getattr(func, "__self__", None), "__name__", n)
    return n


def _is_getter(func):
    return type(func).__name__ == "method-wrapper" and getattr(func, "__name__", "") == "__get__"


class _Walk:
    __slots__ = ("tensors", "plain", "unknown", "plain_bytes")

    def __init__(self):
        self.tensors = []
        self.plain = False
        self.unknown = None
        self.plain_bytes = 0  # local tensors' bytes: they travel in the batch


def _storage_bytes(t):
    st = t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()  # torch < 2
    return st.nbytes()


def _convert(a, w):
    """(meta version, wire version) of an argument."""
    if isinstance(a, Tensor):
        w.tensors.append(a)
        if a._meta is None and w.unknown is None:
            w.unknown = a._why
        return a._meta, _Ref(a._h.ref)
    if isinstance(a, torch.Tensor):
        w.plain = True
        if a.device.type == "meta":
            return a, a
        n = a.numel() * a.element_size()
        if _storage_bytes(a) > n:
            with _Quiet():
                a = a.clone()  # a view pickles its whole storage: send only what it shows
        w.plain_bytes += n
        return a.to("meta"), a
    t = type(a)
    if t is tuple or t is list:
        if not a:
            return a, a
        ms, ws = [], []
        for x in a:
            m, wx = _convert(x, w)
            ms.append(m)
            ws.append(wx)
        return t(ms), t(ws)
    if t is dict:
        ms, ws = {}, {}
        for k, x in a.items():
            ms[k], ws[k] = _convert(x, w)
        return ms, ws
    return a, a


_INPLACE_DUNDERS = {"__iadd__", "__isub__", "__imul__", "__itruediv__", "__ifloordiv__",
                    "__imod__", "__ipow__", "__iand__", "__ior__", "__ixor__", "__ilshift__",
                    "__irshift__", "__imatmul__", "__setitem__"}


def _writes_local(fname, args, kwargs):
    """Whether an op writes into a local (plain torch) tensor: ``loc.add_(t)``, ``loc += t``,
    ``loc[0] = t``, ``torch.add(t, 1, out=loc)``."""
    out = kwargs.get("out")
    for o in (out if isinstance(out, (tuple, list)) else (out,)):
        if isinstance(o, torch.Tensor) and not isinstance(o, Tensor):
            return True
    inplace = fname in _INPLACE_DUNDERS or (fname.endswith("_") and not fname.startswith("_"))
    return inplace and bool(args) and isinstance(args[0], torch.Tensor) and \
        not isinstance(args[0], Tensor)


def _view_for(tensors, mode_view, what):
    v = mode_view
    for t in tensors:
        tv = t._v
        if v is None:
            v = tv
        elif tv.key != v.key or tv.session is not v.session:
            raise ValueError("%s: a monarch.Tensor on %r is used with %r; move it first with "
                             "t.to_mesh(mesh) or t.slice_mesh(...)" % (what, tv, v))
    if v is not None:
        v.pm._live.check()  # an op on stopped procs raises here, not at a later fetch_shard
    return v


_FUNC_INFO = {}  # func -> (qualified name, short name, answered from meta alone)
_stack_len = torch._C._len_torch_function_stack


def _func_info(func, name):
    info = _FUNC_INFO.get(func) if name is None else None
    if info is None:
        fname = _fname(func)
        info = (name or _op_name(func), fname,
                fname in _PURE or (_is_getter(func) and fname != "grad"))
        if name is None:
            _FUNC_INFO[func] = info
    return info


class _Quiet:
    """No torch function handling (modes, subclasses) while the controller runs meta ops."""

    def __enter__(self):
        self.pop = _no_torch_function_mode() if _stack_len() else None
        if self.pop is not None:
            self.pop.__enter__()
        self.off = torch._C.DisableTorchFunction()
        self.off.__enter__()

    def __exit__(self, *exc):
        self.off.__exit__(*exc)
        if self.pop is not None:
            self.pop.__exit__(*exc)
        return False


def _dispatch(func, args, kwargs, mode_view, spec_fn=_op_spec, name=None, propagate=None):
    kwargs = kwargs or {}
    w = _Walk()
    margs, wargs = _convert(tuple(args), w)
    mkwargs, wkwargs = _convert(kwargs, w) if kwargs else (kwargs, kwargs)
    if not w.tensors and (mode_view is None or w.plain):
        # Local tensors only (printing a fetched shard inside activate(), for instance).
        with _Quiet():
            return func(*args, **kwargs)
    name, fname, query = _func_info(func, name)
    if w.tensors and _writes_local(fname, args, kwargs):
        # Not a TypeError: torch turns one from an in-place dunder (loc += t) into NotImplemented,
        # and Python then rebinds loc to loc + t, a monarch.Tensor, without a word.
        raise TensorError(name, None, {}, "it would write into a local torch.Tensor, but an "
                          "operand is a monarch.Tensor, whose values live on the workers: fetch "
                          "them first (fetch_shard(t, ...).get()), or compute on the mesh")
    if w.plain_bytes and not _actor._fits_frame(w.plain_bytes):
        # Refused before it joins a batch: a batch that cannot be sent breaks the whole mesh.
        raise TensorError(name, None, {}, "its local tensor arguments are %d bytes, more than "
                          "one message carries (channel.max_frame_bytes is %d, less 64 KiB of "
                          "headers): create the tensor on the mesh (inside activate()), or move "
                          "it there in pieces" % (w.plain_bytes, _actor._frame_limit()))
    view = _view_for(w.tensors, mode_view, name)
    if fname == "__iter__" and w.tensors:  # rows, as monarch.Tensors (a meta run would leak metas)
        return iter(torch.Tensor.unbind(args[0], 0))
    # Shapes: the same call on meta tensors.
    meta, why = None, None
    if w.unknown is not None:
        why = "an input's shape is unknown (%s)" % w.unknown
    else:
        try:
            with _Quiet():
                if propagate is not None:
                    meta = propagate(*margs, **mkwargs)
                elif not w.tensors:  # a factory: torch.rand(3, 4) and the like
                    mk = dict(mkwargs, device="meta")
                    dt = _factory_dtype(func, margs, mkwargs)
                    if dt is not None:
                        mk["dtype"] = dt
                    try:
                        meta = func(*margs, **mk)
                    except TypeError as e:
                        if "device" not in str(e):
                            raise
                        meta = func(*margs, **mkwargs)
                else:
                    meta = func(*margs, **mkwargs)
        except Exception as e:
            if fname in _NEEDS_VALUE and w.tensors:
                raise TypeError("%s needs the values of a monarch.Tensor, which live on the "
                                "workers: read them with fetch_shard(t, ...) or inspect(t, ...)"
                                % name) from None
            why = "%s on meta tensors raised %s: %s" % (name, type(e).__name__, e)
    s = view.session
    if why is not None:
        if w.tensors and query:
            raise TensorError(name, None, {}, "shape unknown on the controller: " + why)
        outs = [next(s.refs)]
        result = Tensor(_Handle(outs[0], view), None, why)
    elif type(meta) is torch.Tensor and all(meta is not t._meta for t in w.tensors):
        outs = [next(s.refs)]  # the common case: one new tensor
        result = Tensor(_Handle(outs[0], view), meta)
    else:
        if w.tensors and query and not _has_tensor(meta):
            return meta  # shape/dtype queries: nothing to send
        inputs = {id(t._meta): t for t in w.tensors if t._meta is not None}
        outs = []
        result = _wrap(meta, inputs, outs, view)
    op = s.op_id(func, spec_fn)
    s.append(view, (_CALL if torch.is_grad_enabled() else _CALL_NOGRAD, op, wargs, wkwargs, outs),
             op, w.plain_bytes)
    return result


def _factory_dtype(func, args, kwargs):
    """The dtype the workers' CPU run of a factory gives where torch 1.13's meta kernel gives
    another (``torch.arange(4.)``: int64 on meta, float32 on CPU; ``torch.full((2,), 3)``: float32
    on meta, int64 on CPU), else None. Without it the controller's dtype is wrong, and an op that
    is a no-op for that dtype on meta (``.long()``) is taken as in place and overwrites the input
    on the workers."""
    if kwargs.get("dtype") is not None:
        return None
    if func is torch.full:
        fill = args[1] if len(args) > 1 else kwargs.get("fill_value")
        return None if fill is None else torch.full((), fill).dtype  # 0-dim: cheap
    if func is torch.arange:
        nums = [a for a in args if isinstance(a, (int, float))] + \
            [kwargs[k] for k in ("start", "end", "step") if isinstance(kwargs.get(k), (int, float))]
        return torch.tensor(nums).dtype if nums else None
    return None


def _has_tensor(x):
    if isinstance(x, torch.Tensor):
        return True
    if isinstance(x, (tuple, list)):
        return any(_has_tensor(y) for y in x)
    return False


def _wrap(meta, inputs, outs, view):
    if isinstance(meta, torch.Tensor):
        t = inputs.get(id(meta))
        if t is not None and t._meta is meta:  # in place: the same ref
            outs.append(t._h.ref)
            return t
        ref = next(view.session.refs)
        outs.append(ref)
        return Tensor(_Handle(ref, view), meta)
    tp = type(meta)
    if tp is tuple or tp is list:
        return tp(_wrap(m, inputs, outs, view) for m in meta)
    if isinstance(meta, tuple) and hasattr(tp, "n_fields"):  # torch.return_types
        return tp([_wrap(m, inputs, outs, view) for m in meta])
    if tp is dict:  # a remote function's {name: tensor}; the worker flattens it in this order
        return {k: _wrap(m, inputs, outs, view) for k, m in meta.items()}
    return meta


def _raise_failure(session):
    f = session.failure()
    if f is not None:
        raise f


# --- activate -------------------------------------------------------------------------------------


class _MeshMode(TorchFunctionMode):
    def __init__(self, view):
        super().__init__()
        self.view = view

    def __torch_function__(self, func, types, args=(), kwargs=None):
        return _dispatch(func, args, kwargs, self.view)


class _Activation:
    """``with procs.activate():``: torch calls inside run on ``procs``."""

    def __init__(self, pm):
        self.view = _view_of(pm)
        self.mode = None

    def __enter__(self):
        _ACTIVE_SESSIONS.add(self.view.session)
        self.mode = _MeshMode(self.view)
        self.mode.__enter__()
        return self

    def __exit__(self, *exc):
        self.mode.__exit__(*exc)
        self.view.session.flush()
        return False


def _activate(pm):
    return _Activation(pm)


# --- reading --------------------------------------------------------------------------------------


def _merge_coords(shard, coords, what):
    if shard is None:
        return coords
    if not isinstance(shard, collections.abc.Mapping):
        raise TypeError("%s: shard is a dict of mesh dim -> coordinate, such as {'gpus': 1}, "
                        "not %r" % (what, shard))
    return dict(shard, **coords)


def _one_proc_view(t, coords, what):
    """The one proc at ``coords``; dims not named are coordinate 0 (Monarch's rule:
    fetch_shard(t) after an all-reduce reads the first proc)."""
    v = t._v
    dims = list(v.extent)
    for d in coords:
        if d not in dims:
            raise ValueError("%s: unknown dim %r (dims: %s)" % (what, d, ", ".join(dims) or "none"))
    pm = v.pm.slice(**dict({d: 0 for d in dims}, **coords)) if dims else v.pm
    if len(pm) != 1:
        raise ValueError("%s: %s selects %d procs of %s" % (what, coords, len(pm), dict(v.extent)))
    return v.session.view(pm)


def fetch_shard(t: Tensor, shard: Optional[Dict[str, int]] = None, **coords) -> Future:
    """Future of the shard of ``t`` on the proc at ``shard`` and ``coords`` (``{"gpus": 1}`` or
    ``gpus=1``), a torch.Tensor on the controller's CPU; a dim not named is coordinate 0. Sends
    the pending ops first. The Future raises :class:`TensorError` (op, proc, message) when ``t``
    failed, ``MeshFailure`` when a proc of the mesh failed. Raises at once ValueError/IndexError
    for bad coords, and TensorError for a shard larger than one message
    (``channel.max_frame_bytes``, 64 MiB by default). Called from the controller's threads."""
    if not isinstance(t, Tensor):
        raise TypeError("fetch_shard: %r is not a monarch.Tensor" % (type(t).__name__,))
    coords = _merge_coords(shard, coords, "fetch_shard")
    v1 = _one_proc_view(t, coords, "fetch_shard")
    m = t._meta
    if m is not None:
        nbytes = m.numel() * m.element_size()
        if not _actor._fits_frame(nbytes):
            raise TensorError(
                "fetch_shard", None, coords,
                "the shard (shape %s, %s) is %d bytes, more than one message carries "
                "(channel.max_frame_bytes is %d, less 64 KiB of headers): fetch it in slices "
                "(fetch_shard(t[i:j], ...)), read it through monarch.rdma.RDMABuffer, or raise "
                "MONARCH_CHANNEL_MAX_FRAME_BYTES"
                % (tuple(m.shape), m.dtype, nbytes, _actor._frame_limit()))
    s = v1.session
    s.flush()
    _raise_failure(s)
    f = v1.workers.fetch.call(t._h.ref)

    def decode(raw):
        try:
            with _no_torch_function_mode():
                vm = f._decode(raw)
                value = vm.values()[0]
        except ActorError as e:
            if isinstance(e.exception, TensorError):
                raise e.exception from None
            _raise_failure(s)
            raise
        except Exception:
            _raise_failure(s)
            raise
        m = t._meta
        if m is not None and isinstance(value, torch.Tensor) and \
                (value.shape != m.shape or value.dtype != m.dtype):
            # Never hand back a shard that is not what t.shape/t.dtype say: a propagate= that
            # does not match its function, or an in-place op that changed the shape (resize_).
            raise TensorError(
                "fetch_shard", None, coords,
                "the shard here has shape %s and dtype %s, but the controller's monarch.Tensor "
                "says shape %s and dtype %s (a propagate= that does not match its function, or "
                "an in-place op that changes the shape, such as resize_)"
                % (tuple(value.shape), value.dtype, tuple(m.shape), m.dtype))
        return value

    return Future(native=f._native, decode=decode)


def inspect(t: Tensor, shard: Optional[Dict[str, int]] = None, **coords) -> torch.Tensor:
    """``fetch_shard(t, shard, **coords).get()``."""
    return fetch_shard(t, shard, **coords).get()


# --- reductions -----------------------------------------------------------------------------------


def _free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as so:
        so.bind(("127.0.0.1", 0))
        return so.getsockname()[1]


def _reduce(t, dims, reduction, scatter, mesh, inplace):
    if not isinstance(t, Tensor):
        raise TypeError("reduce: %r is not a monarch.Tensor" % (type(t).__name__,))
    v = t._v
    labels = list(v.extent)
    if isinstance(dims, str):
        dims = [dims]
    if not isinstance(dims, (list, tuple)) or not all(isinstance(d, str) for d in dims):
        raise TypeError("reduce: dims takes a mesh dim name or a list of names (dims: %s), "
                        "not %r" % (", ".join(labels), dims))
    dims = list(dims)
    if not dims:
        raise ValueError("reduce: give at least one mesh dim (dims: %s)" % ", ".join(labels))
    for d in dims:
        if d not in labels:
            raise ValueError("reduce: unknown mesh dim %r (dims: %s)" % (d, ", ".join(labels)))
    if len(set(dims)) != len(dims):
        raise ValueError("reduce: dim listed twice in %s" % dims)
    if reduction not in _REDUCTIONS:
        raise ValueError("reduce: unknown reduction %r (use %s)"
                         % (reduction, ", ".join(_REDUCTIONS)))
    if not isinstance(scatter, bool):
        raise TypeError("reduce: scatter must be a bool, not %r" % (scatter,))
    if mesh is not None and _view_of(mesh).key != v.key:
        raise ValueError("reduce: mesh= other than the tensor's own is not supported; "
                         "use t.reduce(...).to_mesh(mesh)")
    if scatter and reduction == "stack":
        raise ValueError("reduce: scatter=True with reduction='stack' is not supported")
    group = 1
    for d in dims:
        group *= v.extent[d]
    meta = t._meta
    if meta is not None:
        if reduction == "stack":
            meta = torch.empty((group,) + tuple(meta.shape), dtype=meta.dtype, device="meta")
        elif scatter:
            if meta.dim() == 0 or meta.shape[0] % group:
                raise ValueError("reduce: scatter=True splits dim 0 (size %s) over %d shards "
                                 "of %s; it must divide" % (
                                     tuple(meta.shape)[:1] or "none", group, dims))
            meta = torch.empty((meta.shape[0] // group,) + tuple(meta.shape[1:]),
                               dtype=meta.dtype, device="meta")
        else:
            meta = torch.empty(meta.shape, dtype=meta.dtype, device="meta")
    if inplace and (reduction == "stack" or scatter):
        raise ValueError("reduce_: %s changes the shape; use reduce()"
                         % ("stack" if reduction == "stack" else "scatter=True"))
    s = v.session
    if v.store_port is None:
        v.store_port = _free_port()
    host = _store_host(v)
    out = t._h.ref if inplace else next(s.refs)
    sizes = [v.extent[d] for d in labels]
    s.append(v, (_REDUCE, t._h.ref, out, v.key, host, v.store_port, labels, sizes, dims,
                 reduction, scatter))
    _ACTIVE_SESSIONS.add(s)
    if inplace:
        return t
    return Tensor(_Handle(out, v), meta, t._why)


def _store_host(v):
    """Where rank 0 of the view hosts the TCPStore: 127.0.0.1 for procs of this host, else
    the host part of the first proc's tcp address."""
    try:
        addr = v.pm._lazy.result().address(v.key[0][0])
    except Exception:
        return "127.0.0.1"
    if addr.startswith("tcp://"):
        host = addr[len("tcp://"):].rsplit(":", 1)[0].strip("[]")
        if host not in ("0.0.0.0", "", "localhost"):
            return host
    return "127.0.0.1"


# --- remote functions and actor endpoints ---------------------------------------------------------


class _RemoteFunction:
    """A function that runs on every proc of the mesh with the local shards (see remote)."""

    def __init__(self, fn, propagate):
        self._fn = fn
        self._propagate = propagate
        if isinstance(fn, str):
            self.__name__ = fn.rsplit(".", 1)[-1]
            self._spec = ("n", fn)
        else:
            self.__name__ = getattr(fn, "__name__", "remote")
            self._spec = ("p", cloudpickle.dumps(fn, protocol=5))
        self._key = ("remote", id(self))

    def __call__(self, *args, **kwargs):
        mode = torch.overrides._get_current_function_mode()
        view = mode.view if isinstance(mode, _MeshMode) else None
        w = _Walk()
        _convert((args, kwargs), w)
        if view is None and not w.tensors:
            if isinstance(self._fn, str):
                raise ValueError("remote %s: call it inside mesh.activate() or with a "
                                 "monarch.Tensor argument" % self._fn)
            return self._fn(*args, **kwargs)
        fn = self._fn if not isinstance(self._fn, str) else _resolve_name(self._fn)
        spec = self._spec
        return _dispatch(self._key, args, kwargs, view, spec_fn=lambda _: spec,
                         name="remote " + self.__name__,
                         propagate=self._propagate or fn)


def _resolve_name(qual):
    mod, _, attr = qual.rpartition(".")
    import importlib
    return getattr(importlib.import_module(mod), attr)


def remote(fn=None, *, propagate=None):
    """``@remote`` (or ``remote(fn)``, or ``remote("pkg.mod.fn")``): calling the result inside
    ``mesh.activate()`` (or with monarch.Tensor arguments) runs ``fn`` on every proc with the
    local shards and returns monarch.Tensors. The shapes of the results come from
    ``propagate(*meta_args, **meta_kwargs)`` when given, else from running ``fn`` on meta
    tensors. ``fn`` travels by reference when importable by the workers, else by value
    (cloudpickle). Called with no mesh and no monarch.Tensor, it is a plain local call."""
    if fn is None:
        return lambda f: _RemoteFunction(f, propagate)
    if not callable(fn) and not isinstance(fn, str):
        raise TypeError("remote: %r is not a function nor a qualified name" % (fn,))
    return _RemoteFunction(fn, propagate)


def _rref(endpoint_ref, args, kwargs):
    """``actor_mesh.endpoint.rref(*args)``: the endpoint runs on every member with local shards
    and its result becomes a monarch.Tensor (shape from the endpoint's ``propagate=``)."""
    spec = endpoint_ref._spec
    where = endpoint_ref._where()
    if spec.propagate is None:
        raise TypeError("%s.rref: the endpoint has no propagate=; declare it with "
                        "@endpoint(propagate=fn), fn(*meta_args) -> the result's meta tensor"
                        % where)
    am = endpoint_ref._mesh
    mode = torch.overrides._get_current_function_mode()
    w = _Walk()
    margs, _ = _convert((tuple(args), dict(kwargs)), w)
    view = _view_for(w.tensors, mode.view if isinstance(mode, _MeshMode) else None, where)
    if view is None:
        procs = getattr(am, "_procs", None)
        if procs is None:
            raise ValueError("%s.rref: call it inside procs.activate() or with a monarch.Tensor "
                             "argument" % where)
        view = _view_of(procs)
    procs = getattr(am, "_procs", None)
    if procs is not None and procs._lazy is not view.session.root._lazy:
        raise ValueError("%s.rref: the actor mesh is on other procs than the tensors (%r)"
                         % (where, view))
    if list(am.extent.items()) != list(view.extent.items()):
        raise ValueError("%s.rref: the actor mesh has extent %s, the tensors' mesh %s; they must "
                         "be the same procs" % (where, dict(am.extent), dict(view.extent)))
    why, meta = None, None
    if w.unknown is not None:
        why = "an input's shape is unknown (%s)" % w.unknown
    else:
        try:
            with _no_torch_function_mode(), torch._C.DisableTorchFunction():
                meta = spec.propagate(*margs[0], **margs[1])
        except Exception as e:
            why = "%s's propagate raised %s: %s" % (where, type(e).__name__, e)
    if meta is not None and not isinstance(meta, torch.Tensor):
        raise TypeError("%s.rref: propagate must return one (meta) tensor, not %r"
                        % (where, type(meta).__name__))
    s = view.session
    ref = next(s.refs)
    s.flush()  # the inputs reach the workers before the actor reads them
    wargs, wkwargs = _rref_args((tuple(args), dict(kwargs)))
    wkwargs["_monarch_rref"] = ref
    endpoint_ref._send(wargs, wkwargs, None, "all")
    return Tensor(_Handle(ref, view), meta, why)


# --- worker ---------------------------------------------------------------------------------------


class _Failed:
    __slots__ = ("error",)

    def __init__(self, error):
        self.error = error


class _LocalRefs:
    """This proc's refs (one table per proc process: TensorWorker and the user's actors on the
    same proc share it). ``get`` waits for a ref an actor endpoint has yet to store (rref)."""

    def __init__(self):
        self.refs = {}
        self.cond = threading.Condition()
        self.tombstones = set()  # freed before an rref stored them
        self.token = None  # the session whose TensorWorker runs on this proc

    def get(self, ref):
        v = self.refs.get(ref)
        if v is not None:
            return v
        deadline = time.monotonic() + REF_WAIT_S
        with self.cond:
            while ref not in self.refs:
                left = deadline - time.monotonic()
                if left <= 0:
                    return _Failed(TensorError("lookup", _my_rank(), _my_coords(),
                                               "ref %d never arrived on this proc within %s s"
                                               % (ref, REF_WAIT_S)))
                self.cond.wait(min(left, 0.5))
            return self.refs[ref]

    def put_late(self, ref, value):
        """Stores a value produced off the worker's stream (an actor's rref result)."""
        with self.cond:
            if ref in self.tombstones:
                self.tombstones.discard(ref)
                return
            self.refs[ref] = value
            self.cond.notify_all()

    def delete(self, ref):
        if self.refs.pop(ref, None) is None:
            with self.cond:
                if self.refs.pop(ref, None) is None:
                    self.tombstones.add(ref)


_LOCAL = _LocalRefs()
_SEEDS = {}


def _my_rank():
    try:
        return context().actor_instance.rank.rank
    except Exception:
        return None


def _my_coords():
    try:
        return dict(context().actor_instance.rank)
    except Exception:
        return {}


def _local_shard(ref, token, where):
    """Unpickled inside a message to an actor on the procs: the local shard of ``ref``."""
    if _LOCAL.token != token:
        raise ValueError("a monarch.Tensor of %s was sent to an actor on other procs; its shards "
                         "are only on that mesh's procs (move it with t.to_mesh(...))" % where)
    v = _LOCAL.get(ref)
    if isinstance(v, _Failed):
        raise v.error
    return v


class _RrefArg:
    """A monarch.Tensor argument of an rref call: resolved by the wrapper, not at unpickling,
    so that a failed input fails the result instead of the actor."""
    __slots__ = ("ref",)

    def __init__(self, ref):
        self.ref = ref

    def __reduce__(self):
        return (_RrefArg, (self.ref,))


def _rref_args(x):
    if isinstance(x, Tensor):
        return _RrefArg(x._h.ref)
    t = type(x)
    if t is tuple or t is list:
        return t(_rref_args(y) for y in x)
    if t is dict:
        return {k: _rref_args(y) for k, y in x.items()}
    return x


def _rref_resolve(x, bad):
    if type(x) is _RrefArg:
        v = _LOCAL.get(x.ref)
        if type(v) is _Failed:
            bad.append(v)
        return v
    t = type(x)
    if t is tuple or t is list:
        return t(_rref_resolve(y, bad) for y in x)
    if t is dict:
        return {k: _rref_resolve(y, bad) for k, y in x.items()}
    return x


def _run_rref(fn, ref):
    """Wraps an actor endpoint called through rref: stores its result (or its failure) as
    ``ref`` in this proc's table instead of replying."""
    import inspect as _inspect

    def store(result=None, exc=None, label=None):
        if exc is not None:
            _LOCAL.put_late(ref, _Failed(TensorError(label, _my_rank(), _my_coords(),
                                                     "%s: %s" % (type(exc).__name__, exc))))
        elif not isinstance(result, torch.Tensor):
            _LOCAL.put_late(ref, _Failed(TensorError(label, _my_rank(), _my_coords(),
                                                     "rref endpoint returned %s, not a tensor"
                                                     % type(result).__name__)))
        else:
            _LOCAL.put_late(ref, result)

    label = getattr(fn, "__qualname__", getattr(fn, "__name__", "endpoint"))

    def args_of(a, k):
        bad = []
        a, k = _rref_resolve((a, k), bad)
        return a, k, (bad[0] if bad else None)

    if _inspect.iscoroutinefunction(fn):
        async def wrapped(self, *a, **k):
            a, k, failed = args_of(a, k)
            if failed is not None:
                return _LOCAL.put_late(ref, failed)
            try:
                store(await fn(self, *a, **k), label=label)
            except Exception as e:
                store(exc=e, label=label)
    else:
        def wrapped(self, *a, **k):
            a, k, failed = args_of(a, k)
            if failed is not None:
                return _LOCAL.put_late(ref, failed)
            try:
                store(fn(self, *a, **k), label=label)
            except Exception as e:
                store(exc=e, label=label)
    return wrapped


def _flatten_out(x, acc):
    if isinstance(x, torch.Tensor):
        acc.append(x)
    elif isinstance(x, (tuple, list)):
        for y in x:
            _flatten_out(y, acc)
    elif isinstance(x, dict):  # in the dict's order, as _wrap on the controller
        for y in x.values():
            _flatten_out(y, acc)
    return acc


class TensorWorker(Actor):
    """One per proc: holds this proc's shards and runs the controller's batches in order."""

    def __init__(self, seed, token):
        _LOCAL.token = token
        me = context().actor_instance.rank
        self.rank = me.rank
        self.coords = dict(me)
        torch.manual_seed(seed + self.rank)
        self.table = {}  # op id -> callable
        self.names = {}  # op id -> name for errors
        self.groups = {}  # view key -> MeshGroups
        self.refs = _LOCAL

    def _fail(self, name, e):
        if isinstance(e, TensorError):
            return _Failed(e)
        return _Failed(TensorError(name, self.rank, self.coords, "%s: %s" % (type(e).__name__, e)))

    def _resolve(self, a, bad):
        t = type(a)
        if t is _Ref:
            v = self.refs.refs.get(a.id)
            if v is None:
                v = self.refs.get(a.id)
            if type(v) is _Failed:
                bad.append(v)
            return v
        if t is tuple or t is list:
            return t(self._resolve(x, bad) for x in a)
        if t is dict:
            return {k: self._resolve(x, bad) for k, x in a.items()}
        return a

    @endpoint
    def run(self, batch):
        refs = self.refs.refs
        for op in batch:
            kind = op[0]
            try:
                if kind == _CALL:
                    self._call(op, refs)
                elif kind == _DEL:
                    self.refs.delete(op[1])
                elif kind == _DEF:
                    self._define(op[1], op[2])
                elif kind == _REDUCE:
                    self._reduce(op, refs)
                elif kind == _CALL_NOGRAD:
                    with torch.no_grad():
                        self._call(op, refs)
                elif kind == _PUT:
                    v = op[2]
                    refs[op[1]] = _Failed(v) if isinstance(v, BaseException) else v
            except Exception as e:  # never fail the actor: record it on the outputs
                self._lost(op, e)

    def _lost(self, op, e):
        """An op that could not even start (a bad op id, a malformed tuple): its outputs fail."""
        kind = op[0]
        outs = op[4] if kind in (_CALL, _CALL_NOGRAD) and len(op) > 4 else \
            [op[2]] if kind == _REDUCE and len(op) > 2 else \
            [op[1]] if kind == _PUT and len(op) > 1 else []
        f = self._fail(self.names.get(op[1], "op") if kind in (_CALL, _CALL_NOGRAD) else
                       "worker", e)
        for o in outs if isinstance(outs, (list, tuple)) else []:
            self.refs.refs[o] = f
        if not outs:
            print("monarch.tensor: %s" % f.error, file=sys.stderr)

    def _define(self, op_id, spec):
        kind, body = spec
        name = None
        try:
            if kind == "g":
                import operator
                fn = operator.attrgetter(body)
                name = "Tensor." + body
            elif kind == "n":
                fn = _resolve_name(body)
                name = "remote " + body
            else:
                fn = pickle.loads(body)
                name = _op_name(fn)
        except Exception as e:
            fn = _Failed(TensorError(name or "op %d" % op_id, self.rank, self.coords,
                                     "cannot load the op here: %s: %s" % (type(e).__name__, e)))
        self.table[op_id] = fn
        self.names[op_id] = name or _op_name(fn)

    def _call(self, op, refs):
        _, op_id, args, kwargs, outs = op
        fn = self.table[op_id]
        bad = []
        a = []
        for x in args:  # the usual case inline: refs and constants
            tx = type(x)
            if tx is _Ref:
                v = refs.get(x.id)
                if v is None:
                    v = self.refs.get(x.id)
                if type(v) is _Failed:
                    bad.append(v)
                a.append(v)
            elif tx is tuple or tx is list or tx is dict:
                a.append(self._resolve(x, bad))
            else:
                a.append(x)
        k = self._resolve(kwargs, bad) if kwargs else kwargs
        if type(fn) is _Failed:
            bad.append(fn)
        if bad:
            for o in outs:
                refs[o] = bad[0]
            return
        try:
            r = fn(*a, **k)
        except Exception as e:
            f = self._fail(self.names[op_id], e)
            if not outs:
                print("monarch.tensor: %s" % f.error, file=sys.stderr)
            for o in outs:
                refs[o] = f
            return
        if not outs:
            return
        if len(outs) == 1 and isinstance(r, torch.Tensor):
            refs[outs[0]] = r
            return
        flat = _flatten_out(r, [])
        if len(flat) != len(outs):
            f = self._fail(self.names[op_id], RuntimeError(
                "returned %d tensors here, %d on the controller's meta tensors"
                % (len(flat), len(outs))))
            for o in outs:
                refs[o] = f
            return
        for o, x in zip(outs, flat):
            refs[o] = x

    def _reduce(self, op, refs):
        _, ref, out, key, host, port, labels, sizes, dims, reduction, scatter = op
        name = "reduce(%s, %s%s)" % (dims, reduction, ", scatter" if scatter else "")
        x = refs.get(ref)
        if x is None:
            x = self.refs.get(ref)
        if type(x) is _Failed:
            refs[out] = x
            return
        try:
            g = self.groups.get(key)
            if g is None:
                from monarch._tensor_collectives import MeshGroups
                rank = context().message_rank.rank
                g = self.groups[key] = MeshGroups(rank, list(labels), list(sizes), host, port)
            r = g.reduce(x, list(dims), reduction, scatter)
            if out == ref and r is not x:
                x.copy_(r)
                r = x
            refs[out] = r
        except Exception as e:
            refs[out] = self._fail(name, e)

    @endpoint
    def fetch(self, ref):
        v = self.refs.get(ref)
        if type(v) is _Failed:
            raise v.error
        if not isinstance(v, torch.Tensor):
            return v
        v = v.detach()
        try:  # a view of a larger storage would pickle all of it
            whole = v.is_contiguous() and v.storage_offset() == 0 and \
                v.storage().size() == v.numel()
        except Exception:
            whole = False
        return v if whole else v.clone()

    @endpoint
    def stats(self):
        """``{"refs": live refs on this proc, "rss_kb": resident memory, "pid": pid}``."""
        rss = 0
        try:
            with open("/proc/self/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        rss = int(line.split()[1])
        except OSError:
            pass
        return {"refs": len(self.refs.refs), "rss_kb": rss, "pid": os.getpid()}

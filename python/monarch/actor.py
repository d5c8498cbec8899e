"""Monarch's actor API over the monarch-cpp runtime.

    from monarch.actor import Actor, endpoint, this_host

    class Counter(Actor):
        def __init__(self, start: int):
            self.value = start

        @endpoint
        def incr(self, n: int) -> int:
            self.value += n
            return self.value

    procs = this_host().spawn_procs(per_host={"gpus": 4})   # 4 worker processes, no wait
    counters = procs.spawn("counter", Counter, 10)          # one Counter per proc
    print(counters.incr.call(1).get().values())              # [11, 11, 11, 11]
    print(counters.slice(gpus=2).incr.call_one(5).get())     # 16

Threads: every function here may be called from any thread. Waiting (``Future.get``,
``PortReceiver.recv``) releases the GIL and wakes for signals, so Ctrl-C interrupts it.
Results complete on runtime threads. Inside an async endpoint use ``await fut``: ``get()``
there raises instead of blocking the proc's event loop.

Errors (monarch.errors): a handler that raises in a call reaches the caller as
:class:`ActorError` (with the remote traceback); the actor lives on. One that raises in a
broadcast fails the actor; its proc mesh reports a :class:`MeshFailure` to the owner's
``__supervise__``, or to :data:`unhandled_fault_hook` (default: print and exit 1).
"""

import asyncio
import base64
import collections.abc
import atexit
import contextvars
import functools
import inspect
import itertools
import logging
import math
import operator
import os
import pickle
import sys
import threading
import time
import weakref
import concurrent.futures
from collections.abc import Mapping
from typing import Any, Dict, Generic, Iterator, List, Optional, Tuple, TypeVar

import cloudpickle

from monarch import _native
from monarch.errors import (  # noqa: F401 (re-exported: Monarch users import them from here)
    ActorError,
    DeadlockError,
    DeliveryFailure,
    MeshFailure,
    MonarchError,
    SupervisionError,
    TimeoutError,
    UsageError,
)

R = TypeVar("R")

__all__ = [
    "Accumulator", "Actor", "ActorError", "ActorMesh", "Channel", "Context", "Extent", "Future",
    "HostMesh", "MeshFailure", "Point", "Port", "PortReceiver", "ProcMesh", "SupervisionError",
    "UndeliverableMessageEnvelope", "ValueMesh", "attach_to_workers", "concurrent_endpoint",
    "context", "current_actor_name", "current_rank", "current_size", "endpoint", "send",
    "this_host", "this_proc", "unhandled_fault_hook",
]


# --- Points and extents --------------------------------------------------------------------------


class _DimKeyError(KeyError):
    """A KeyError whose text reads as written (KeyError's own str() shows its message quoted).
    A traceback names it ``KeyError``, what callers catch, not this private helper."""

    def __str__(self):
        return str(self.args[0]) if self.args else ""

    def __reduce__(self):  # by the function below: pickle cannot find the class by its new name
        return _dim_key_error, self.args


def _dim_key_error(*args):
    return _DimKeyError(*args)


_DimKeyError.__module__, _DimKeyError.__qualname__ = "builtins", "KeyError"


class Extent(Mapping):
    """Named dims with sizes, e.g. ``{"hosts": 2, "gpus": 4}``; ranks are row-major."""

    def __init__(self, labels, sizes):
        self.labels = list(labels)
        self.sizes = [int(s) for s in sizes]
        if len(self.labels) != len(self.sizes):
            raise ValueError("Extent: %d labels for %d sizes" % (len(self.labels), len(self.sizes)))

    @property
    def nelem(self) -> int:
        n = 1
        for s in self.sizes:
            n *= s
        return n

    def point(self, rank: int) -> "Point":
        if not 0 <= rank < self.nelem:
            raise IndexError("rank %d out of range for extent %s" % (rank, self))
        coords = []
        for s in reversed(self.sizes):
            coords.append(rank % s)
            rank //= s
        return Point(list(reversed(coords)), self)

    def rank_of(self, coords: Dict[str, int]) -> int:
        """The rank at ``coords`` (dim -> int; a negative one counts from the end, as in
        ``slice()``; a dim of size 1 may be left out). Raises KeyError for an unknown or missing
        dim, TypeError for a coordinate that is not an int, IndexError for one out of range."""
        unknown = set(coords) - set(self.labels)
        if unknown:
            raise _DimKeyError("unknown dim %s of extent %s" % (", ".join(sorted(unknown)), self))
        r = 0
        for lab, s in zip(self.labels, self.sizes):
            c = coords.get(lab, 0 if s == 1 else None)
            if c is None:
                raise _DimKeyError("missing coordinate for dim %r of extent %s" % (lab, self))
            if isinstance(c, bool) or not hasattr(c, "__index__"):
                raise TypeError("coordinate %s= takes an int, not %r (%s)"
                                % (lab, c, type(c).__name__))
            c = operator.index(c)
            i = c + s if c < 0 else c
            if not 0 <= i < s:
                raise IndexError("%s=%d out of range for size %d" % (lab, c, s))
            r = r * s + i
        return r

    def __getitem__(self, k):
        return self.sizes[self.labels.index(k)] if k in self.labels else _missing(k, self)

    def __iter__(self):
        return iter(self.labels)

    def __len__(self):
        return len(self.labels)

    def __eq__(self, o):
        return isinstance(o, Extent) and o.labels == self.labels and o.sizes == self.sizes

    def __hash__(self):
        return hash((tuple(self.labels), tuple(self.sizes)))

    def __repr__(self):
        return "{" + ", ".join("%s=%d" % (k, v) for k, v in zip(self.labels, self.sizes)) + "}"


def _missing(k, where):
    raise KeyError("no dim %r in %s" % (k, where))


class Point(Mapping):
    """Coordinates in an Extent: ``point["gpus"]``, ``point.rank`` (row-major)."""

    def __init__(self, coords, extent: Extent):
        self.coords = list(coords)
        self.extent = extent

    @property
    def rank(self) -> int:
        r = 0
        for c, s in zip(self.coords, self.extent.sizes):
            r = r * s + c
        return r

    def __getitem__(self, k):
        if k in self.extent.labels:
            return self.coords[self.extent.labels.index(k)]
        return _missing(k, self)

    def __iter__(self):
        return iter(self.extent.labels)

    def __len__(self):
        return len(self.coords)

    def __eq__(self, o):
        return isinstance(o, Point) and o.coords == self.coords and o.extent == self.extent

    def __hash__(self):
        return hash((tuple(self.coords), self.extent))

    def __repr__(self):
        """Monarch's text: ``{'hosts': 0/1, 'gpus': 3/4}`` (coordinate/size per dim)."""
        return "{" + ", ".join("'%s': %d/%d" % (k, c, n) for k, c, n in zip(
            self.extent.labels, self.coords, self.extent.sizes)) + "}"


def _point_from_tuple(t) -> Optional[Point]:
    if t is None:
        return Point([], Extent([], []))
    labels, sizes, coords = t
    return Point(coords, Extent(labels, sizes))


# --- Context -----------------------------------------------------------------------------------


class ActorInstance:
    """The actor a handler runs in: ``rank`` (its Point in the whole mesh), ``actor_id``,
    ``name``."""

    def __init__(self, actor_id, name, rank):
        self.actor_id = actor_id
        self.name = name
        self.rank = rank

    def __repr__(self):
        return "ActorInstance(%s, rank=%s)" % (self.actor_id, self.rank)


class Context:
    """What a handler may ask: ``actor_instance`` and ``message_rank`` (the receiver's Point in
    the view the message was cast to)."""

    def __init__(self, actor_instance, message_rank, view=None, local_rank=None):
        self.actor_instance = actor_instance
        self._message_rank = message_rank
        self._view = view            # (labels, sizes) of the cast view: the Point is made lazily
        self._local_rank = local_rank

    @property
    def message_rank(self) -> Point:
        if self._message_rank is None:
            self._message_rank = Extent(*self._view).point(self._local_rank)
        return self._message_rank


_CLIENT = ActorInstance("client", "client", Point([], Extent([], [])))
_current: contextvars.ContextVar = contextvars.ContextVar("monarch_context", default=None)


def context() -> Context:
    """The current handler's Context; outside actors a client context (zero-dim rank)."""
    c = _current.get()
    return c if c is not None else Context(_CLIENT, _CLIENT.rank)


def current_rank() -> Point:
    """The calling actor's Point in its whole mesh (Monarch: current_rank())."""
    return context().actor_instance.rank


def current_size() -> Dict[str, int]:
    """The sizes of the calling actor's mesh, e.g. {"gpus": 4}."""
    return dict(context().actor_instance.rank.extent)


def current_actor_name() -> str:
    return context().actor_instance.name


def _in_actor() -> bool:
    return _current.get() is not None


# --- Futures ---------------------------------------------------------------------------------------


def _check_timeout(timeout):
    if timeout is None:
        return -1.0
    if not isinstance(timeout, (int, float)) or isinstance(timeout, bool):
        raise TypeError("timeout must be a number of seconds or None, not %r" % (timeout,))
    if not timeout >= 0:  # negative, or NaN
        raise ValueError("timeout must be >= 0 seconds (or None to wait forever), not %r"
                         % (timeout,))
    return float(timeout)  # inf or huge: forever (the runtime clamps)


class _WouldBlock(RuntimeError):
    """A blocking operation called inside a running event loop (_no_running_loop). Pickling
    passes it on as it is, rather than as "cannot be serialised"."""


def _no_running_loop(what, instead="use `await` on the future instead"):
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return
    raise _WouldBlock(
        "%s called inside a running asyncio event loop (an async endpoint?): it would block the "
        "loop; %s" % (what, instead))


def _in_running_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def _settle_from(cf, fn):
    """Completes the concurrent.futures.Future ``cf`` with ``fn()``'s value or error."""
    try:
        cf.set_result(fn())
    except BaseException as e:
        cf.set_exception(e)


_UNSET = object()


class Future(Generic[R]):
    """The result of an endpoint call, a spawn or a stop.

    ``get(timeout=None)`` blocks (GIL released) and returns the value or raises the error;
    ``await fut`` does the same in a coroutine. A ``TimeoutError`` leaves the future usable, and
    the result, once there, can be read again. ``result()`` is ``get()``; ``exception()``
    returns the error instead of raising it (None on success).
    """

    def __init__(self, *, native=None, decode=None, thunk=None, value=_UNSET, cf=None,
                 deadlock=None):
        self._deadlock = deadlock      # set when waiting here could never end (DeadlockError)
        self._native = native          # _native.NativeFuture
        self._decode = decode or (lambda x: x)
        self._thunk = thunk            # callable(timeout_s) -> value (blocking receivers)
        self._cf = cf                  # concurrent.futures.Future
        self._value = value
        self._error = None
        self._lock = threading.Lock()

    def _settled(self):
        return self._value is not _UNSET or self._error is not None

    def _settle_native(self):
        try:
            v = self._decode(self._native.result())
        except BaseException as e:
            self._error = e
        else:
            self._value = v

    def _wait(self, timeout_s):
        if self._settled():
            return True
        if self._native is not None:
            if not self._native.wait(timeout_s):
                return False
            with self._lock:
                if not self._settled():
                    self._settle_native()
            return True
        if self._cf is not None:
            if not _wait_done(self._cf, timeout_s):
                return False
            try:
                v = self._cf.result()
            except KeyboardInterrupt:  # interrupts this wait, not the future
                raise
            except BaseException as e:
                self._error = e
                return True
            try:
                self._value = self._decode(v)
            except BaseException as e:
                self._error = e
            return True
        if self._thunk is not None:
            try:
                self._value = self._decode(self._thunk(timeout_s))
            except TimeoutError:
                return False
            except KeyboardInterrupt:  # interrupts this wait, not the future
                raise
            except BaseException as e:
                self._error = e
            return True
        return True

    def _timeout_error(self, timeout):
        return TimeoutError("future not ready within %s s (it stays usable: wait again)" % timeout)

    def get(self, timeout: Optional[float] = None) -> R:
        t = _check_timeout(timeout)
        _no_running_loop("Future.get()")
        if self._deadlock is not None and not self.done():
            raise DeadlockError(self._deadlock)
        if not self._wait(t):
            raise self._timeout_error(timeout)
        if self._error is not None:
            raise self._error
        return self._value

    result = get

    def exception(self, timeout: Optional[float] = None) -> Optional[BaseException]:
        t = _check_timeout(timeout)
        _no_running_loop("Future.exception()")
        if not self._wait(t):
            raise self._timeout_error(timeout)
        return self._error

    def done(self) -> bool:
        if self._settled():
            return True
        if self._native is not None:
            return self._native.done()
        if self._cf is not None:
            return self._cf.done()
        return False

    def __await__(self):
        if not self._settled():
            loop = asyncio.get_running_loop()
            if self._native is not None or self._cf is not None:  # no thread held while waiting
                af = loop.create_future()

                def wake():
                    if loop.is_closed():
                        return  # the awaiting coroutine was abandoned and its loop is gone
                    try:
                        loop.call_soon_threadsafe(lambda: af.done() or af.set_result(None))
                    except RuntimeError:
                        pass  # the loop closed since the check

                if self._native is not None:
                    self._native.add_done_callback(wake)
                else:
                    self._cf.add_done_callback(lambda _: wake())
                yield from af.__await__()
                self._wait(0)
            else:
                yield from loop.run_in_executor(None, self._wait, -1.0).__await__()
        if self._error is not None:
            raise self._error
        return self._value

    def __repr__(self):
        return "<monarch Future %s>" % ("done" if self.done() else "pending")


class _StreamPump:
    """Takes a native stream's replies in arrival order on a thread of its own
    (``monarch-stream``, started once the stream is sent) and completes the k-th of ``cfs``
    with the k-th reply: a value, or the member's error. Waiting on those futures therefore
    needs no thread of the waiter's (``await`` holds no executor thread)."""

    def __init__(self, size):
        self.cfs = [concurrent.futures.Future() for _ in range(size)]

    def start(self, st, where):
        threading.Thread(target=self._run, args=(st, where), name="monarch-stream",
                         daemon=True).start()

    def _run(self, st, where):
        for k, cf in enumerate(self.cfs):
            try:
                rank, v = st.next(-1.0)
            except BaseException as e:  # the runtime stopped waiting (the interpreter exits)
                return self.fail(e, k)
            d = _decode_reply(v, rank, where())
            if isinstance(d, _Failure):
                cf.set_exception(d.error)
            else:
                cf.set_result(d)

    def fail(self, error, first=0):
        """The stream could not be sent (its procs failed to start), or its replies cannot be
        taken any more: every Future from ``first`` on holds ``error``."""
        for cf in self.cfs[first:]:
            cf.set_exception(error)


class _Applied(collections.abc.Coroutine):
    """What a setting that took effect at the call returns (logging_option): awaiting it, or
    ``asyncio.run`` on it, completes at once with None. Not a real coroutine, so nothing warns
    when it is never awaited."""

    def send(self, value):
        raise StopIteration(None)

    def throw(self, typ, val=None, tb=None):
        raise typ if val is None else val

    def close(self):
        pass

    def __await__(self):
        return iter(())


def _ready(value) -> Future:
    return Future(value=value)


def _all_of(futures, name) -> Future:
    """A Future[None] that completes once every one of ``futures`` did (with the first error,
    if any), waited for on a thread ``name``."""
    if not futures:
        return _ready(None)
    cf = concurrent.futures.Future()

    def wait_all():
        error = None
        for f in futures:
            try:
                f.get()
            except BaseException as e:
                error = error or e
        if error is None:
            cf.set_result(None)
        else:
            cf.set_exception(error)

    threading.Thread(target=wait_all, name=name, daemon=True).start()
    return Future(cf=cf)


def _owned_by_current_actor(mesh):
    """Records a mesh spawned inside an actor's handler (or ``__init__``) as that actor's: it is
    stopped when the actor stops or fails (ActorHost.stop_owned), as in Monarch."""
    host = _current_actor_host()
    if host is not None:
        host.own(mesh)
    return mesh


# --- Wire format (see monarch/_host.py) -----------------------------------------------------------

_FRAME_HEADROOM = 64 * 1024  # headers around a payload, as the native check_frame leaves
_FRAME_LIMIT = []


def _frame_limit() -> int:
    """channel.max_frame_bytes (read once): the largest message, headers included."""
    if not _FRAME_LIMIT:
        _FRAME_LIMIT.append(_native.max_frame_bytes())
    return _FRAME_LIMIT[0]


def _fits_frame(nbytes: int) -> bool:
    """Whether a payload of ``nbytes`` fits one message with its headers (a reply, a tensor
    batch's constants, a fetched shard); the channel refuses a larger one."""
    return nbytes + _FRAME_HEADROOM <= _frame_limit()


def _dumps(obj) -> bytes:
    """cloudpickle, protocol 5 (classes and functions of __main__ travel by value): every message,
    reply and spawn argument is pickled here, so that an object that only means something inside
    a message (a monarch.Tensor: its shard on the receiving proc) can tell (:func:`_in_message`)
    and refuse any other pickling (``torch.save``, ``pickle.dumps``)."""
    return cloudpickle.dumps(obj, protocol=5)


def _in_message() -> bool:
    """Whether this thread is inside :func:`_dumps`. It walks the stack, so that the message hot
    path pays nothing (a thread-local depth counter in _dumps cost about 5 % of py_call_rate);
    only objects that ask (a monarch.Tensor being pickled) pay for the walk."""
    f = sys._getframe(1)
    code = _dumps.__code__
    while f is not None:
        if f.f_code is code:
            return True
        f = f.f_back
    return False



def _dumps_args(args, kwargs, view, port, where):
    try:
        return _dumps((args, kwargs, view, port))
    except _WouldBlock:
        raise
    except Exception as e:
        for i, a in enumerate(args):
            try:
                _dumps(a)
            except Exception as inner:
                raise TypeError("%s: argument %d (%s) cannot be serialised: %s"
                                % (where, i, type(a).__name__, inner)) from None
        for k, a in kwargs.items():
            try:
                _dumps(a)
            except Exception as inner:
                raise TypeError("%s: argument %r (%s) cannot be serialised: %s"
                                % (where, k, type(a).__name__, inner)) from None
        raise TypeError("%s: arguments cannot be serialised: %s" % (where, e)) from None


class _Failure:
    """A member's error in a reply list (an endpoint may return an exception object as a value,
    so errors are marked, not recognised by type)."""

    __slots__ = ("error",)

    def __init__(self, error):
        self.error = error

    def __repr__(self):
        # A ValueMesh's repr shows what failed: the error's first line (which endpoint, which
        # actor) and, for a traceback, its last (the exception), not an object address.
        lines = [ln for ln in str(self.error).splitlines() if ln.strip()]
        text = lines[0] if lines else ""
        if len(lines) > 1:
            text += " ... " + lines[-1].strip()
        return "<failed: %s: %s>" % (type(self.error).__name__, text)


def _decode_reply(b, rank=None, where="endpoint"):
    """An encoded reply: the value, or a _Failure holding the member's error (not raised).
    ``where``: the endpoint, as text or a callable giving it (formatted only for an error)."""
    if isinstance(b, BaseException):  # the runtime's error for this member (C++ side)
        return _Failure(b)
    try:
        if b[:1] == b"\x00":
            return pickle.loads(b[1:])
        exc, text, endpoint_label, actor = pickle.loads(b[1:])
    except Exception as e:
        return _Failure(MonarchError("%s: the reply%s cannot be unpickled here: %s: %s" % (
            where() if callable(where) else where, "" if rank is None else " of rank %d" % rank,
            type(e).__name__, e)))
    if actor:
        msg = "endpoint %s of actor %s raised:\n%s" % (endpoint_label, actor, text.rstrip())
    else:  # raised in the cast tree, not in an actor: a reduce's reducer
        msg = "%s: the %s raised:\n%s" % (where() if callable(where) else where, endpoint_label,
                                           text.rstrip())
    return _Failure(ActorError(msg, actor, rank, "", exception=exc))


def _value_or_raise(b, where="endpoint"):
    v = _decode_reply(b, None, where)
    if isinstance(v, _Failure):
        raise v.error
    return v


# --- Endpoints ------------------------------------------------------------------------------------


class _EndpointSpec:
    def __init__(self, fn, explicit_response_port=False, concurrent=False, propagate=None):
        self.fn = fn
        self.name = fn.__name__
        self.is_async = inspect.iscoroutinefunction(fn)
        self.explicit_response_port = explicit_response_port
        self.concurrent = concurrent
        self.propagate = propagate


class _EndpointDescriptor:
    """What ``@endpoint`` leaves on the class: the function, callable as a method locally."""

    def __init__(self, spec):
        self._monarch_endpoint = spec
        functools.update_wrapper(self, spec.fn)

    def __get__(self, obj, objtype=None):
        if obj is None:
            return self
        return self._monarch_endpoint.fn.__get__(obj, objtype)

    def __set_name__(self, owner, name):
        self._monarch_endpoint.name = name


def endpoint(fn=None, *, explicit_response_port: bool = False, propagate=None,
             instrument: bool = False):
    """Marks an actor method as an endpoint (``def`` or ``async def``).

    With ``explicit_response_port=True`` the handler's first argument after self is a Port; it
    answers with ``port.send(value)`` (now or later, once), and its return value is ignored.
    A port dropped unanswered, or still unanswered when the actor stops (after its
    ``__cleanup__``), fails its call: the caller's ``get()`` raises ActorError naming the endpoint.
    ``propagate(*meta_args, **meta_kwargs)`` gives the meta tensor of the result of
    ``endpoint.rref(...)`` (distributed tensors, docs/tensors.md); ``instrument`` is accepted so
    that Monarch scripts run unchanged and changes nothing.
    """
    def wrap(f):
        if not callable(f):
            raise TypeError("@endpoint decorates a function, not %r" % (f,))
        return _EndpointDescriptor(_EndpointSpec(f, explicit_response_port, False, propagate))
    return wrap(fn) if fn is not None else wrap


def concurrent_endpoint(fn=None, *, explicit_response_port: bool = False):
    """An endpoint that may run while its actor handles other messages (an ``async def`` runs
    beside the actor's other coroutines; a ``def`` runs on a thread pool). Every other endpoint
    runs one message at a time."""
    def wrap(f):
        if not callable(f):
            raise TypeError("@concurrent_endpoint decorates a function, not %r" % (f,))
        return _EndpointDescriptor(_EndpointSpec(f, explicit_response_port, True))
    return wrap(fn) if fn is not None else wrap


def _endpoints_of(cls) -> Dict[str, _EndpointSpec]:
    out = {}
    for klass in reversed(cls.__mro__):
        for name, v in vars(klass).items():
            spec = getattr(v, "_monarch_endpoint", None)
            if isinstance(spec, _EndpointSpec):
                out[name] = spec
    return out


class Actor:
    """Base class of every actor. Its ``@endpoint`` methods are what meshes call. ``__init__``
    runs on the actor's proc before its first message. Optional hooks:

    ``__supervise__(self, failure: MeshFailure)`` (def or async def): procs this actor spawned
    failed; a truthy return means handled (the survivors go on), anything else fails the actor.
    ``_handle_undeliverable_message(self, message: UndeliverableMessageEnvelope)`` (def or async
    def): a message this actor sent without waiting for an answer (a ``broadcast``, a
    ``port.send``) could not be delivered; truthy means handled (the actor lives on), anything
    else, or a raise, fails the actor, which is also what happens without the hook.
    ``__cleanup__(self, exc)``: runs when the actor stops (``exc`` is None on a normal stop).

    ``self.logger`` is ``logging.getLogger(<the class's name>)``, as in Monarch.
    """

    @functools.cached_property
    def logger(self) -> logging.Logger:
        return logging.getLogger(type(self).__name__)


class UndeliverableMessageEnvelope:
    """A message an actor sent that could not be delivered, as its
    ``_handle_undeliverable_message`` hook receives it. The hook runs on the actor's own thread
    (or event loop, for async actors), between its messages.

    ``sender()``: the id (str) of the actor that sent it, the one whose hook runs.
    ``dest()``: the id (str) of the actor it was for; for a ``port.send``, the port's id (as in
    ``repr(port)``); for a broadcast queued until its procs were up, which failed to start, the
    actor mesh's name. ``error_msg()``: the whole report, which
    names the message, the destination and why ("message send to ADDR.kid[3] undeliverable: its
    proc was declared failed: ..."). ``reason()``: only why. A broadcast that loses several
    members of one failed proc arrives as one envelope, naming the first member and the count.
    """

    def __init__(self, sender, dest, reason, text):
        self._sender = sender
        self._dest = dest
        self._reason = reason
        self._text = text

    def sender(self):
        return self._sender

    def dest(self):
        return self._dest

    def reason(self):
        return self._reason

    def error_msg(self):
        return self._text

    def __repr__(self):
        return "UndeliverableMessageEnvelope(%s)" % self._text

    def __reduce__(self):
        return (UndeliverableMessageEnvelope, (self._sender, self._dest, self._reason, self._text))


def _check_actor_class(cls):
    if not (isinstance(cls, type) and issubclass(cls, Actor)):
        raise TypeError("spawn: %r is not a subclass of monarch.actor.Actor" % (cls,))
    eps = _endpoints_of(cls)
    taken = sorted(n for n in eps if n.startswith("_") or hasattr(ActorMesh, n))
    if taken:
        raise TypeError("actor class %s: endpoint name%s %s would be hidden by the actor mesh's "
                        "own attribute%s (mesh.%s); rename %s" % (
                            cls.__name__, "s" if len(taken) > 1 else "", ", ".join(taken),
                            "s" if len(taken) > 1 else "", taken[0],
                            "them" if len(taken) > 1 else "it"))
    kinds = {e.is_async for e in eps.values() if not e.concurrent}
    if len(kinds) > 1:
        sync = sorted(n for n, e in eps.items() if not e.is_async and not e.concurrent)
        asy = sorted(n for n, e in eps.items() if e.is_async and not e.concurrent)
        raise TypeError(
            "actor class %s mixes def endpoints (%s) and async def endpoints (%s); make them all "
            "one kind (or mark the odd ones @concurrent_endpoint)"
            % (cls.__name__, ", ".join(sync), ", ".join(asy)))
    return eps


# --- Mesh algebra -------------------------------------------------------------------------------


def _wait_done(cf, timeout_s) -> bool:
    """Waits for a concurrent.futures.Future by polling (from 0.1 up to 10 ms): Ctrl-C then
    interrupts between polls, never inside a Condition (which it can leave broken)."""
    deadline = None if timeout_s < 0 or timeout_s > 1e9 else time.monotonic() + timeout_s
    nap = 0.0001
    while not cf.done():
        if deadline is not None and time.monotonic() >= deadline:
            return False
        time.sleep(nap)
        nap = min(nap * 2, 0.01)
    return True


class _Lazy:
    """A value computed on another thread (procs spawning): result() waits for it.

    Operations issued inside a running event loop while it is pending (which must not block
    there) are queued with :meth:`later`; the thread that completes the value then runs them in
    issue order, and later ones join the queue until it is empty, so none overtakes another.
    """

    def __init__(self, cf: concurrent.futures.Future):
        self.cf = cf
        self._lock = threading.Lock()
        self._queue: List[Any] = []
        self._drained = False  # the value is there and the queue is empty: run ops at once
        self._drained_event = threading.Event()  # set with _drained
        cf.add_done_callback(self._drain)

    @staticmethod
    def of(value):
        cf = concurrent.futures.Future()
        cf.set_result(value)
        return _Lazy(cf)

    def result(self):
        if not self.cf.done():  # waiting would block the loop; a ready value does not
            _no_running_loop("using a mesh before its procs are up",
                             "first `await procs.initialized` (the ProcMesh the mesh runs on)")
            _wait_done(self.cf, -1.0)
        return self.cf.result()

    def ready(self) -> bool:
        """Whether an operation may go at once: the value is there and nothing is queued."""
        return self._drained

    def wait_ready(self):
        """Blocks (outside a running loop) until :meth:`ready`, so that what this thread sends
        next follows what it queued; raises RuntimeError inside a running loop."""
        if not self._drained:
            self.result()
            self._drained_event.wait()  # the completing thread is running what was queued

    def later(self, op) -> bool:
        """Queues ``op()`` (which must not raise) to run once the value is there, after every op
        queued before, on the thread that completes it; returns False, queuing nothing, when
        :meth:`ready` (the caller then runs it)."""
        with self._lock:
            if not self._drained:
                self._queue.append(op)
                return True
        return False

    def _drain(self, _cf=None):
        while True:
            with self._lock:
                if not self._queue:
                    self._drained = True
                    self._drained_event.set()
                    return
                op = self._queue.pop(0)
            op()


class MeshTrait:
    """Views shared by every mesh: slice, split, flatten, rename, extent, sizes, len()."""

    def _shape(self):
        raise NotImplementedError

    def _with_shape(self, shape):
        raise NotImplementedError

    @property
    def extent(self) -> Extent:
        s = self._shape()
        return Extent(s.labels, s.sizes)

    @property
    def sizes(self) -> Dict[str, int]:
        return dict(self.extent)

    def __len__(self):
        return len(self._shape())

    def slice(self, **kwargs):
        """``slice(gpus=0)`` drops the dim; ``slice(gpus=slice(0, 4, 2))`` keeps it, restricted."""
        s = self._shape()
        for dim, sel in kwargs.items():
            labels, sizes = s.labels, s.sizes
            if dim not in labels:
                raise ValueError("slice: unknown dim %r (%s)" % (
                    dim, "dims: " + ", ".join(labels) if labels else
                    "no dims are left: the other coordinates picked one member"))
            size = sizes[labels.index(dim)]
            if not isinstance(sel, (bool, int, slice)) and hasattr(sel, "__index__"):
                sel = operator.index(sel)  # numpy.int64 and the like
            if isinstance(sel, bool) or not isinstance(sel, (int, slice)):
                raise TypeError("slice: %s= takes an int or a slice, not %r (%s)"
                                % (dim, sel, type(sel).__name__))
            if isinstance(sel, int):
                i = sel + size if sel < 0 else sel
                if not 0 <= i < size:
                    raise IndexError("slice: %s=%d out of range for size %d" % (dim, sel, size))
                s = s.slice_index(dim, i)
            else:
                if sel.step is not None and (not isinstance(sel.step, int) or sel.step <= 0):
                    raise ValueError("slice: %s= needs a positive int step, not %r"
                                     % (dim, sel.step))
                start, stop, step = sel.indices(size)
                if step <= 0:
                    raise ValueError("slice: %s= needs a positive step" % dim)
                if start >= stop:
                    raise ValueError("slice: %s=%r selects nothing of size %d" % (dim, sel, size))
                s = s.slice_range(dim, start, stop, step)
        return self._with_shape(s)

    def split(self, **kwargs):
        """``split(gpus=("dp", "tp"), tp=2)``: replaces a dim by several (row-major); sizes of all
        but one new dim are given, the last is inferred. Raises ValueError/TypeError naming what
        is wrong (unknown dim, sizes that do not divide it, a size for no new dim)."""
        s = self._shape()
        splits = {k: v for k, v in kwargs.items() if isinstance(v, (tuple, list))}
        sizes_given = {k: v for k, v in kwargs.items() if k not in splits}
        if not splits:
            raise ValueError("split: name the dim to split and its new dims, e.g. "
                             "split(gpus=('dp', 'tp'), tp=2)")
        new_names = [n for names in splits.values() for n in names]
        for k, v in sizes_given.items():
            if k not in new_names:
                raise ValueError("split: %s=%r is the size of no new dim (new dims: %s); give a "
                                 "dim's new names as a tuple" % (k, v, ", ".join(new_names)))
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise ValueError("split: size %s=%r must be a positive int" % (k, v))
        for dim, names in splits.items():
            if dim not in s.labels:
                raise ValueError("split: unknown dim %r (dims: %s)" % (dim, ", ".join(s.labels)))
            if not names or not all(isinstance(n, str) and n for n in names):
                raise ValueError("split: the new dims of %r must be non-empty str, not %r"
                                 % (dim, names))
            total = s.sizes[s.labels.index(dim)]
            known = 1
            missing = [n for n in names if n not in sizes_given]
            for n in names:
                if n in sizes_given:
                    known *= sizes_given[n]
            if len(missing) > 1:
                raise ValueError("split: give the sizes of all but one of %s" % (tuple(names),))
            if total % known or (not missing and known != total):
                raise ValueError("split: %s=%d cannot be split into sizes %s" % (
                    dim, total, {n: sizes_given.get(n, "?") for n in names}))
            sz = [sizes_given[n] if n in sizes_given else total // known for n in names]
            s = s.split(dim, list(names), sz)
        return self._with_shape(s)

    def flatten(self, name: str):
        """One dim ``name`` over every member (the view must be contiguous)."""
        if not isinstance(name, str) or not name:
            raise TypeError("flatten: the new dim's name must be a non-empty str, not %r" % (name,))
        return self._with_shape(self._shape().flatten(name))

    def rename(self, **kwargs):
        """``rename(gpus="devices")``."""
        s = self._shape()
        for old, new in kwargs.items():
            if not isinstance(new, str) or not new:
                raise TypeError("rename: %s= takes the new name (a non-empty str), not %r"
                                % (old, new))
            if old not in s.labels:
                raise ValueError("rename: unknown dim %r (dims: %s)" % (old, ", ".join(s.labels)))
            s = s.rename(old, new)
        return self._with_shape(s)


# --- ValueMesh ------------------------------------------------------------------------------------


class ValueMesh(MeshTrait, Generic[R]):
    """One value per member of the view a call went to, indexed by Points.

    A member that failed holds its error: reading it (``item``, ``values``, ``items``) raises
    that error (ActorError, SupervisionError, DeliveryFailure); ``ok()``, ``failed_ranks()`` and
    ``error()`` look without raising. The mesh algebra (``slice``, ``flatten``, ``split``,
    ``rename``) gives ValueMeshes of the values it selects, as in Monarch.
    """

    def __init__(self, extent: Extent, values: List[Any]):
        self._extent = extent
        self._values = values

    @property
    def extent(self) -> Extent:
        return self._extent

    def _shape(self):
        return _native.Shape(self._extent.labels, self._extent.sizes)

    def _with_shape(self, shape):
        return ValueMesh(Extent(shape.labels, shape.sizes),
                         [self._values[g] for g in shape.global_ranks()])

    def __len__(self):
        return len(self._values)

    def _at(self, rank):
        v = self._values[rank]
        if isinstance(v, _Failure):
            raise v.error
        return v

    def item(self, **coords) -> R:
        """The value at these coordinates (every dim of size > 1 must be given; a negative one
        counts from the end). Raises what the member failed with, or KeyError / TypeError /
        IndexError for bad coordinates (Extent.rank_of)."""
        return self._at(self.extent.rank_of(coords))

    def items(self) -> Iterator[Tuple[Point, R]]:
        for r in range(len(self._values)):
            yield self.extent.point(r), self._at(r)

    def values(self) -> List[R]:
        return [self._at(r) for r in range(len(self._values))]

    def ok(self, **coords) -> bool:
        return not isinstance(self._values[self.extent.rank_of(coords)], _Failure)

    def error(self, **coords) -> Optional[BaseException]:
        v = self._values[self.extent.rank_of(coords)]
        return v.error if isinstance(v, _Failure) else None

    def failed_ranks(self) -> List[int]:
        return [r for r, v in enumerate(self._values) if isinstance(v, _Failure)]

    def throw_if_failed(self):
        for v in self._values:
            if isinstance(v, _Failure):
                raise v.error

    def __iter__(self):
        return self.items()

    def __repr__(self):
        return "ValueMesh(%s, %r)" % (self.extent, self._values)


# --- Actor meshes -----------------------------------------------------------------------------


class _Liveness:
    """Whether a mesh was stopped: one per proc mesh (shared by its views) and one per actor
    mesh (shared by its views), whose ``parent`` is its proc mesh's, so that stopping the procs
    stops their actors, while stopping an actor mesh leaves its procs usable."""

    def __init__(self, what, parent=None):
        self.what = what
        self.stopped = None
        self.parent = parent

    def check(self):
        if self.parent is not None:
            self.parent.check()
        if self.stopped is not None:
            raise SupervisionError("%s was stopped (%s); spawn a new one" % (self.what, self.stopped))


class _Sized:
    """``size()`` of proc and host meshes (not actor meshes: there an endpoint may be named
    ``size``, as in Monarch, where an actor mesh's endpoints shadow its methods)."""

    def size(self, dim=None) -> int:
        """Members of the mesh (``dim`` None), along one dim (a str), or over several (a sequence
        of dim names, their sizes multiplied), as Monarch's ``size``. ValueError names the dims
        when one is not the mesh's."""
        sizes = self.sizes
        if dim is None:
            return len(self)
        if not isinstance(dim, (str, list, tuple)):
            raise TypeError("size: dim must be a dim's name, a list of them or None, not %r"
                            % (dim,))
        dims = [dim] if isinstance(dim, str) else list(dim)
        n = 1
        for d in dims:
            if d not in sizes:
                raise ValueError("size: %r is not a dim of this mesh (its dims: %s)"
                                 % (d, ", ".join(sizes) or "none"))
            n *= sizes[d]
        return n


class ActorMesh(MeshTrait, Generic[R]):
    """Actors of one class on the procs of a ProcMesh, addressed as a whole or through views.

    ``mesh.some_endpoint`` gives the endpoint's adverbs: ``call``, ``call_one``, ``choose``,
    ``stream``, ``broadcast``, ``reduce``. Meshes are sendable inside messages.
    """

    def __init__(self, cls, lazy: _Lazy, name: str, live: _Liveness, shape=None, procs=None,
                 full=None):
        self._procs = procs  # keeps the proc mesh (and so its procs) alive while this mesh is
        self._full = full    # the whole mesh's shape, when known before it is up
        self._cls = cls
        self._eps = _endpoints_of(cls)
        self._lazy = lazy
        self._name = name
        self._live = live
        self._view = shape

    def _mesh(self):
        m = self.__dict__.get("_native_mesh")
        if m is None:
            m = self._lazy.result()
            if self._view is not None:
                m = m.with_view(self._view)
            s = m.shape
            self._native_mesh = m
            self._view_tuple = (s.labels, s.sizes)
        return m

    def _shape(self):
        if self._view is not None:
            return self._view
        return self._full if self._full is not None else self._lazy.result().shape

    def _with_shape(self, shape):
        return ActorMesh(self._cls, self._lazy, self._name, self._live, shape, self._procs,
                         self._full)

    def _shape_if_known(self):
        """This view's shape without waiting for the mesh, or None when that would wait."""
        if self._view is None and self._full is None and not self._lazy.cf.done():
            return None
        return self._shape()

    def __getattr__(self, name):
        if name.startswith("__") or name not in self.__dict__.get("_eps", {}):
            if name.startswith("_"):
                raise AttributeError(name)
            raise AttributeError("actor mesh %r (%s) has no endpoint %r (endpoints: %s)" % (
                self.__dict__.get("_name"), getattr(self.__dict__.get("_cls"), "__name__", "?"),
                name, ", ".join(sorted(self.__dict__.get("_eps", {}))) or "none"))
        ref = EndpointRef(self, name, self._eps[name])
        self.__dict__[name] = ref  # next access skips __getattr__
        return ref

    def survivors(self) -> "ActorMesh":
        """The members on procs not known to have failed (a view with extent {ranks: n})."""
        return _PickedMesh(self, self._mesh().survivors())

    @property
    def initialized(self) -> Future[bool]:
        """Completes once every actor is spawned (raises the spawn error if one failed)."""
        return Future(cf=self._lazy.cf, decode=lambda _: True)

    def stop(self, reason: str = "stopped by the client") -> Future[None]:
        """Stops every member (queued messages run first, then ``__cleanup__``)."""
        parent = self._live.parent
        if self._live.stopped is not None or (parent is not None and parent.stopped is not None):
            return _ready(None)  # already stopped, or its procs are (and it with them)
        fut = Future(native=self._mesh().stop())
        self._live.stopped = "ActorMesh.stop(): %s" % reason
        return fut

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop().get()

    def __reduce__(self):
        return (_rebuild_actor_mesh, (self._cls, self._mesh().encode(), self._name))

    def __repr__(self):
        return "<ActorMesh %r of %s>" % (self._name, self._cls.__name__)


class _PickedMesh(ActorMesh):
    """A survivors()/select() view: not rectangular, so it cannot be sliced further."""

    def __init__(self, parent, native):
        super().__init__(parent._cls, _Lazy.of(native), parent._name, parent._live,
                         procs=parent._procs)

    def _with_shape(self, shape):
        raise ValueError("this view was made by survivors(); slice the mesh first, then take "
                         "its survivors")


def _lost_send(where, mesh_name, error, owner):
    """A broadcast to actor mesh ``mesh_name`` queued until its procs were up that then could
    not be sent (``error``: why, e.g. they failed to start), reported as an undeliverable
    broadcast is (PY-7): to ``owner`` (the ActorHost of the async endpoint that sent it), whose
    ``_handle_undeliverable_message`` decides on its own thread (dest() is the mesh's name;
    without the hook, or falsy, the actor fails); from the client, to ``unhandled_fault_hook``.
    Runs on the thread that completed the procs' start."""
    reason = "%s: %s" % (type(error).__name__, error)
    text = "%s: a broadcast sent before its procs were up could not be sent: %s" % (where, reason)
    me = getattr(owner, "me", None)
    if me is not None:
        me.lost(mesh_name, reason, text)
    else:
        _run_fault_hook(error if isinstance(error, MonarchError) else SupervisionError(text))


def _rebuild_actor_mesh(cls, encoded, name):
    return ActorMesh(cls, _Lazy.of(_native.decode_mesh(encoded)), name, _Liveness(name))


class _SenderOrder:
    """One sender's order towards one actor mesh (PY-1): keeps its ``call_one`` behind its own
    earlier casts to the same member.

    A cast (call, broadcast, reduce, send) reaches a member through the tree (comm[0] -> ... ->
    the member's proc), and casts from one sender stay in order there (CAST-3); a direct message
    takes the shorter way and overtook them (CAST-4): ``broadcast(set)`` then ``call_one(get)``
    read the old state. So after a cast, this sender's ``call_one`` to a member goes through the
    tree too, as a cast of its one-member view, until a reply through the tree shows that member
    has run everything this sender cast before: then no tree message to it is in flight, and
    direct messages are in order again. A sender is an actor (on whichever thread it runs) or,
    outside actors, one thread. Updated from the sending thread and reply callbacks: ``lock``."""

    __slots__ = ("lock", "casts", "confirmed", "in_tree")

    def __init__(self):
        self.lock = threading.Lock()
        self.casts = 0       # casts sent so far
        self.confirmed = {}  # member id -> casts known run by it
        self.in_tree = {}    # member id -> call_ones through the tree not yet answered

    def cast(self):
        with self.lock:
            self.casts += 1

    def route(self, member):
        """Whether a call_one to ``member`` must go through the tree; if so it is counted in
        flight, and ``done(member, n)`` with the returned ``n`` ends it."""
        with self.lock:
            if self.casts == 0 or (self.confirmed.get(member, 0) >= self.casts
                                   and not self.in_tree.get(member)):
                return None
            self.in_tree[member] = self.in_tree.get(member, 0) + 1
            return self.casts

    def done(self, member, n):
        with self.lock:
            self.in_tree[member] -= 1
            if self.confirmed.get(member, 0) < n:
                self.confirmed[member] = n


def _sender_order(lazy) -> _SenderOrder:
    """The calling sender's _SenderOrder towards the actor mesh of ``lazy`` (shared by its
    views)."""
    ctx = _current.get()
    inst = getattr(ctx, "actor_instance", None) if ctx is not None else None
    key = inst.actor_id if inst is not None else threading.get_ident()
    orders = lazy.__dict__.get("_orders")
    if orders is None:
        with lazy._lock:
            orders = lazy.__dict__.setdefault("_orders", {})
    o = orders.get(key)
    if o is None:
        with lazy._lock:
            o = orders.setdefault(key, _SenderOrder())
    return o


def _chosen_one(m):
    """A native view of one member of native mesh ``m``, picked at random among those whose proc
    is not known dead (``m`` itself when it has no dims: one member)."""
    if not m.shape.labels:
        return m
    i = m.choose_rank()
    return m.with_view(m.shape.flatten("_all").slice_range("_all", i, i + 1, 1))


class EndpointRef(Generic[R]):
    """One endpoint of an actor mesh (``mesh.incr``): its adverbs."""

    def __init__(self, mesh: ActorMesh, name: str, spec: _EndpointSpec):
        self._mesh = mesh
        self._name = name
        self._spec = spec

    def _where(self):
        return "endpoint %s.%s" % (self._mesh._name, self._name)

    def _value_or_raise(self, b):
        return _value_or_raise(b, self._where)

    def _prepare(self, args, kwargs, port=None):
        """The native mesh and the encoded request. The mesh is None when the operation must be
        queued (see _Lazy.later): its actors are not up yet and the caller is inside a running
        event loop, which must not block. Outside one this waits for them (and for what was
        queued before)."""
        self._mesh._live.check()
        lazy = self._mesh._lazy
        if lazy.ready() or not _in_running_loop() or self._mesh._shape_if_known() is None:
            lazy.wait_ready()  # raises RuntimeError in a loop when even the shape is unknown
            m = self._mesh._mesh()
            view = self._mesh._view_tuple
        else:
            m = None
            s = self._mesh._shape_if_known()
            view = (s.labels, s.sizes)
        return m, _dumps_args(args, kwargs, view, port, self._where())

    def _future(self, args, kwargs, send, decode, deadlock=False) -> Future:
        """``send(native mesh, request)`` -> NativeFuture, now or, when the mesh is not up yet
        inside a running loop, queued: the Future then completes (on a runtime thread) once the
        procs are up and the reply is there, or fails with the error that kept them from
        starting (what a blocking call raises)."""
        m, payload = self._prepare(args, kwargs)
        if m is not None:
            return Future(native=send(m, payload), decode=decode,
                          deadlock=self._deadlock(m) if deadlock else None)
        cf = concurrent.futures.Future()

        def op():
            try:
                native = send(self._mesh._mesh(), payload)
            except BaseException as e:
                cf.set_exception(e)
                return
            native.add_done_callback(lambda: _settle_from(cf, native.result))

        if not self._mesh._lazy.later(op):
            op()
        return Future(cf=cf, decode=decode)

    def _fire(self, args, kwargs, port, send):
        """``send(native mesh, request, me)`` for a fire-and-forget operation (``me``: the
        sending actor's handle, None outside actors), now or queued as in
        _future. A queued one that cannot be sent (its procs failed to start; a blocking one
        raises that at the call site) is reported as an undeliverable broadcast is (PY-7,
        _lost_send): to the sending actor's hook, or from the client to
        ``unhandled_fault_hook``."""
        owner = _current_actor_host()
        me = getattr(owner, "me", None)  # the sender, also off the actor's thread (async)
        m, payload = self._prepare(args, kwargs, port)
        if m is not None:
            send(m, payload, me)
            return

        def op():
            try:
                send(self._mesh._mesh(), payload, me)
            except BaseException as e:
                _lost_send(self._where(), self._mesh._name, e, owner)

        if not self._mesh._lazy.later(op):
            op()

    def call(self, *args, **kwargs) -> Future[ValueMesh[R]]:
        """Every member; a ValueMesh over the view (failed members hold their errors)."""
        def decode(values):
            ext = Extent(*self._mesh._view_tuple)
            return ValueMesh(ext, [_decode_reply(v, r, self._where) for r, v in enumerate(values)])

        order = _sender_order(self._mesh._lazy)

        def send(m, p):
            order.cast()
            return m.call(self._name, p)

        return self._future(args, kwargs, send, decode, True)

    def _deadlock(self, m):
        """Why get() on this call could never return, or None: the caller is a handler that
        blocks its actor (a sync, non-concurrent endpoint) and its own actor is in the view."""
        ctx = _current.get()
        if ctx is None or not getattr(ctx, "_blocking", False):
            return None
        me = ctx.actor_instance.actor_id
        members = self._mesh.__dict__.get("_member_ids")
        if members is None:
            members = frozenset(m.member_name(i) for i in range(len(m)))
            self._mesh._member_ids = members
        if me not in members:
            return None
        return ("%s: actor %s waits in get() for its own reply, which it can only send once this "
                "handler returns; use @concurrent_endpoint or an async endpoint, or do not wait"
                % (self._where(), me))

    def _ordered_one(self, order, one, p, member):
        """Sends a call to ``one`` (a native view of one member, ``member`` its id): direct, or,
        after this sender's casts, as a cast of that view (_SenderOrder)."""
        n = order.route(member)
        if n is None:
            return one.call_one(self._name, p)
        try:
            native = one.call(self._name, p)  # behind this sender's casts
        except BaseException:
            order.done(member, 0)  # not sent: not in flight, and it confirms nothing
            raise
        native.add_done_callback(lambda: order.done(member, n))
        return native

    def _one_reply(self, b):
        """A call through the tree gives a list of one reply; call_one, the reply."""
        return self._value_or_raise(b[0] if isinstance(b, (list, tuple)) else b)

    def call_one(self, *args, **kwargs) -> Future[R]:
        """The view must hold exactly one member (the error names the mesh and its size)."""
        order = _sender_order(self._mesh._lazy)

        def send(m, p):
            if not order.casts:  # this sender never cast to the mesh: the direct way
                return m.call_one(self._name, p)
            member = self._mesh.__dict__.get("_member0")
            if member is None:
                if len(m) != 1:
                    return m.call_one(self._name, p)  # raises, naming the mesh and its size
                member = self._mesh._member0 = m.member_name(0)
            return self._ordered_one(order, m, p, member)

        return self._future(args, kwargs, send, self._one_reply, True)

    def choose(self, *args, **kwargs) -> Future[R]:
        """One member, picked at random among those whose proc is not known dead (a
        SupervisionError when every proc is). Kept behind this sender's casts as call_one is."""
        order = _sender_order(self._mesh._lazy)

        def send(m, p):
            if not order.casts:
                return m.choose(self._name, p)
            one = _chosen_one(m)
            return self._ordered_one(order, one, p, one.member_name(0))

        return self._future(args, kwargs, send, self._one_reply)

    def stream(self, *args, **kwargs) -> Iterator[Future[R]]:
        """Every member; returns at once an iterator of one Future per member, the k-th of which
        completes with the k-th reply to arrive (value or the member's error). The replies are
        taken on a thread of the stream's own, so nothing blocks until a Future is waited on
        (``get``, or ``await``, which leaves a running loop free for the replies it may owe).
        Inside a running loop on a mesh whose procs are still starting, the stream is queued as
        ``call`` is (PY-2)."""
        m, payload = self._prepare(args, kwargs)
        if m is not None:
            pump = _StreamPump(len(m))
            pump.start(m.stream(self._name, payload), self._where)
        else:
            pump = _StreamPump(math.prod(self._mesh._shape_if_known().sizes))

            def op():
                try:
                    pump.start(self._mesh._mesh().stream(self._name, payload), self._where)
                except BaseException as e:
                    pump.fail(e)

            if not self._mesh._lazy.later(op):
                op()
        return iter([Future(cf=cf) for cf in pump.cfs])

    def broadcast(self, *args, **kwargs) -> None:
        """Every member, fire and forget; a handler that raises fails its actor."""
        order = _sender_order(self._mesh._lazy)

        def send(m, p, me):
            order.cast()
            m.broadcast(self._name, p, me)

        self._fire(args, kwargs, None, send)

    def reduce(self, reducer, *args, **kwargs) -> Future[R]:
        """Every member; the replies combined inside the cast tree, so one value comes back.

        ``reducer``: "sum", "min", "max", any associative and commutative ``f(a, b)`` (shipped
        with cloudpickle), or an :class:`Accumulator`'s combine. The first member error wins.
        """
        fn = _REDUCERS.get(reducer, reducer) if isinstance(reducer, str) else reducer
        if isinstance(reducer, str) and reducer not in _REDUCERS:
            raise ValueError("reduce: unknown reducer %r (use %s or a function)"
                             % (reducer, ", ".join(sorted(_REDUCERS))))
        if not callable(fn):
            raise TypeError("reduce: the reducer must be callable, not %r" % (fn,))
        try:
            fnb = _dumps(fn)
        except Exception as e:
            raise TypeError("reduce: the reducer cannot be serialised: %s" % e) from None
        order = _sender_order(self._mesh._lazy)

        def send(m, p):
            order.cast()
            return m.reduce(fnb, self._name, p)

        return self._future(args, kwargs, send, self._value_or_raise)

    def rref(self, *args, **kwargs):
        """Runs the endpoint on every member with the local shards of its monarch.Tensor
        arguments and returns its result as a monarch.Tensor, without waiting; the endpoint
        must declare ``@endpoint(propagate=fn)`` (fn(*meta_args) -> the result's meta tensor).
        The actor mesh must be on the tensors' procs. Imports torch (monarch.tensor)."""
        from monarch import tensor as _tensor
        return _tensor._rref(self, args, kwargs)

    def _send(self, args, kwargs, port, selection):
        if selection not in ("all", "choose"):
            raise ValueError('send: selection must be "all" or "choose", not %r' % (selection,))

        order = _sender_order(self._mesh._lazy)

        def send(m, payload, me):
            order.cast()
            if selection == "choose":
                m = _chosen_one(m)
            m.broadcast(self._name, payload, me)

        self._fire(args, kwargs, port, send)


_REDUCERS = {"sum": operator.add, "min": min, "max": max}


def send(endpoint: EndpointRef, args=(), kwargs=None, port=None, selection="all") -> None:
    """Sends ``endpoint(*args, **kwargs)`` to the members ``selection`` picks ("all" or
    "choose"), fire and forget. With ``port``, each member's result is sent to it (an
    explicit-response-port endpoint gets it as its port)."""
    if not isinstance(endpoint, EndpointRef):
        raise TypeError("send: the first argument must be an endpoint of an actor mesh "
                        "(mesh.some_endpoint), not %r" % (endpoint,))
    if not isinstance(args, (tuple, list)):
        raise TypeError("send: args must be a tuple of the endpoint's arguments, e.g. (5,), "
                        "not %r" % (args,))
    if kwargs is not None and not isinstance(kwargs, Mapping):
        raise TypeError("send: kwargs must be a dict, not %r" % (kwargs,))
    if port is not None and not isinstance(port, Port):
        raise TypeError("send: port must be a monarch.actor.Port, not %r" % (port,))
    endpoint._send(tuple(args), dict(kwargs or {}), port, selection)


class Accumulator(Generic[R]):
    """Folds the replies of every member with ``combine``, starting from ``identity``, inside the
    cast tree: ``Accumulator(mesh.value, 0, lambda a, b: a + b).accumulate().get()``."""

    def __init__(self, endpoint: EndpointRef, identity, combine):
        """TypeError unless ``endpoint`` is an actor mesh's endpoint and ``combine`` a callable
        ``f(a, b)``."""
        if not isinstance(endpoint, EndpointRef):
            raise TypeError("Accumulator: endpoint must be an actor mesh's endpoint, such as "
                            "mesh.value, not %r" % (endpoint,))
        if not callable(combine):
            raise TypeError("Accumulator: combine must be a callable f(a, b), not %r" % (combine,))
        self._endpoint = endpoint
        self._identity = identity
        self._combine = combine

    def accumulate(self, *args, **kwargs) -> Future[R]:
        """Calls every member; the Future's value is ``combine(identity, folded replies)``. A
        combine that raises fails it with ActorError naming the endpoint."""
        f = self._endpoint.reduce(self._combine, *args, **kwargs)
        combine, identity, where = self._combine, self._identity, self._endpoint._where

        def decode(b):
            value = _value_or_raise(b, where)
            try:
                return combine(identity, value)
            except Exception as e:
                raise ActorError("%s: the accumulator's combine raised: %s: %s"
                                 % (where(), type(e).__name__, e), "", None, "",
                                 exception=e) from e

        if f._native is None:  # queued: its procs were not up yet
            return Future(cf=f._cf, decode=decode)
        return Future(native=f._native, decode=decode)


# --- Ports ---------------------------------------------------------------------------------------


class Port(Generic[R]):
    """Where messages go: ``port.send(value)`` from any process. Sendable inside messages."""

    def __init__(self, native):
        self._native = native

    def send(self, value: R) -> None:
        """Sends ``value`` (pickled here) to the port's receiver, from any thread. A message its
        owner cannot take (receiver dropped, proc gone) comes back to the sending actor's
        ``_handle_undeliverable_message``, also from an ``async def`` endpoint; from the client
        or a thread of the user's own, to ``unhandled_fault_hook``."""
        self._native.send(_dumps(value), getattr(_current_actor_host(), "me", None))

    def __reduce__(self):
        return (_rebuild_port, (self._native.encode(),))

    def __repr__(self):
        return "<Port %r>" % self._native


def _rebuild_port(encoded):
    return Port(_native.decode_port(encoded))


class PortReceiver(Generic[R]):
    """The receiving end of a Channel; messages from one sender arrive in send order."""

    def __init__(self, native):
        self._native = native

    def recv(self) -> Future[R]:
        """The next message, as a Future (``recv().get(timeout=...)``)."""
        return Future(thunk=self._native.recv, decode=pickle.loads)

    def try_recv(self):
        b = self._native.try_recv()
        return None if b is None else pickle.loads(b)


class Channel(Generic[R]):
    @staticmethod
    def open() -> Tuple[Port, PortReceiver]:
        """A new (Port, PortReceiver) pair owned by this process."""
        p, r = _native.open_port()
        return Port(p), PortReceiver(r)


class _ResponsePort(Port):
    """The port of an explicit-response-port endpoint: answers its one call."""

    def __init__(self, reply, label, actor):
        self._reply = reply
        self._label = label
        self._actor = actor
        self._answered = False

    def send(self, value) -> None:
        from monarch import _host
        self._answered = True
        self._reply.send(_host.encode_value(value, self._label, self._actor))

    def exception(self, exc: BaseException) -> None:
        """Answers the call with an error: its caller's get() raises ActorError carrying
        ``exc``. TypeError unless ``exc`` is an exception."""
        if not isinstance(exc, BaseException):
            raise TypeError("%s: response port exception() takes an exception, such as "
                            "ValueError('why'), not %r" % (self._label, exc))
        self._fail(exc)

    def __del__(self):
        # Dropped unanswered (the handler returned without send() and kept it nowhere): tell
        # the caller which endpoint, rather than a bare "promise dropped without a result".
        if not self._answered:
            try:
                self._fail(RuntimeError("endpoint %s of actor %s dropped its response port "
                                        "without answering it" % (self._label, self._actor)))
            except Exception:
                pass  # interpreter shutdown: the native drop reports it

    def _fail(self, exc):
        # The handler raised. If it had answered already, the caller keeps that answer and
        # the error is only reported here (on the proc's stderr, forwarded to the client).
        from monarch import _host
        self._answered = True
        try:
            self._reply.send(_host.encode_error(exc, self._label, self._actor))
        except UsageError:
            sys.stderr.write("monarch: endpoint %s raised after it answered its response port: "
                             "%s: %s\n" % (self._label, type(exc).__name__, exc))

    def __reduce__(self):
        raise TypeError("a response port answers its own call; it cannot be sent on")


class _NullPort(Port):
    def __init__(self):
        pass

    def send(self, value) -> None:
        pass


# --- Procs and hosts ------------------------------------------------------------------------------


_PROC_MESHES: List["ProcMesh"] = []
_MAX_PROCS_PER_HOST = 4096
_COUNTER = itertools.count()


def _worker_env():
    paths = [p for p in sys.path if p and os.path.isdir(p)]
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if here not in paths:
        paths.insert(0, here)
    main = sys.modules.get("__main__")
    main_file = getattr(main, "__file__", None)
    if main_file:
        d = os.path.dirname(os.path.abspath(main_file))
        if d not in paths:
            paths.insert(0, d)
    return ["PYTHONPATH=" + os.pathsep.join(paths), "PYTHONUNBUFFERED=1"]


class ProcMesh(MeshTrait, _Sized):
    """Procs (worker processes running Python) arranged in an extent, e.g. {hosts: 2, gpus: 4}.

    Returned by ``HostMesh.spawn_procs`` at once; the procs start in the background, and the
    first use waits for them. ``stop()`` returns a Future; ``with procs:`` stops on exit.
    """

    def __init__(self, lazy: _Lazy, name: str, live: _Liveness, shape=None, local=False,
                 remote=False, full=None):
        self._remote = remote  # received inside a message: may spawn on it, not stop it
        self._full = full      # the whole mesh's shape, known before its procs are up
        self._lazy = lazy
        self._name = name
        self._live = live
        self._view = shape
        self._local = local
        self._failures: List[MeshFailure] = []
        self._spawned: List[ActorMesh] = []  # this_proc(): what stop() stops

    def _procs(self):
        p = self._lazy.result()
        return p if self._view is None else p.with_view(self._view)

    def _shape(self):
        if self._local:
            return _native.Shape([], [])
        if self._view is not None:
            return self._view
        return self._full if self._full is not None else self._lazy.result().shape

    def slice(self, **kwargs):
        """As MeshTrait.slice. TypeError on ``this_proc()``: this process alone, no dims."""
        if self._local:
            raise TypeError("slice: this_proc() is this process alone, a mesh of one: it has no "
                            "dims to slice")
        return super().slice(**kwargs)

    def _with_shape(self, shape):
        if self._local:
            raise TypeError("this_proc() is a mesh of one; it has no dims to slice")
        m = ProcMesh(self._lazy, self._name, self._live, shape, remote=self._remote)
        m._failures = self._failures  # views see the failures of the procs they share
        return m

    def activate(self):
        """``with procs.activate():`` torch calls inside the block run on these procs and
        return ``monarch.Tensor``s (docs/tensors.md). Imports torch (monarch.tensor)."""
        from monarch import tensor as _tensor
        return _tensor._activate(self)

    @property
    def initialized(self) -> Future[bool]:
        """Completes once every proc is up (raises the spawn error if one failed to start)."""
        return Future(cf=self._lazy.cf, decode=lambda _: True)

    def spawn(self, name: str, Class, *args, **kwargs) -> ActorMesh:
        """One ``Class(*args, **kwargs)`` per proc of this view. Does not wait for the procs.
        Raises TypeError when name is not a str, Class is not an Actor subclass, mixes def and
        async def endpoints, or its arguments cannot be serialised (cloudpickle); ValueError
        when name is empty or holds a control character or a bracket (actor ids quote it)."""
        if not isinstance(name, str):
            raise TypeError("spawn: the first argument is the mesh's name (a non-empty str), "
                            "not %r; call spawn(name, Class, *args)" % (name,))
        if not name or any(c in "[]" or ord(c) < 0x20 or ord(c) == 0x7f for c in name):
            raise ValueError("spawn: mesh name %r must be non-empty, without control characters "
                             "or brackets" % (name,))
        _check_actor_class(Class)
        self._live.check()
        try:
            spec = _dumps((Class, args, kwargs))
        except _WouldBlock:
            raise
        except Exception as e:
            raise TypeError("spawn %s: the class or its arguments cannot be serialised: %s"
                            % (name, e)) from None
        live = _Liveness("actor mesh %r" % name, parent=self._live)
        if self._local:
            mesh = ActorMesh(Class, _Lazy.of(_native.spawn_local(name, spec)), name, live)
            self._spawned.append(mesh)
            return _owned_by_current_actor(mesh)
        cf = concurrent.futures.Future()

        def go(_):
            try:
                cf.set_result(self._procs().spawn(name, spec))
            except BaseException as e:
                cf.set_exception(e)

        self._lazy.cf.add_done_callback(go)
        return _owned_by_current_actor(
            ActorMesh(Class, _Lazy(cf), name, live, procs=self,
                      full=self._view if self._view is not None else self._full))

    def stop(self, reason: str = "stopped by the client") -> Future[None]:
        """Stops every proc of the whole mesh (procs not gone within the stop timeout are
        killed). Completes once they are gone and their output has reached this client.
        Raises UsageError on a proc mesh received inside a message (only its owner stops it).
        On ``this_proc()`` it stops the actor meshes spawned through this object (the process
        itself is the caller's and lives on); later spawns on it raise SupervisionError."""
        if self._remote:
            raise UsageError("proc mesh %r was received inside a message: only the process that "
                             "spawned it can stop it" % self._name)
        if self._live.stopped is not None:
            return _ready(None)
        if self._local:
            stops = [m.stop(reason) for m in self._spawned]  # before the parent is marked
            self._live.stopped = "ProcMesh.stop(): %s" % reason
            self._spawned = []
            return _all_of(stops, "monarch-stop")
        self._live.stopped = "ProcMesh.stop(): %s" % reason
        cf = concurrent.futures.Future()

        tensors = getattr(self._lazy, "_monarch_tensor_session", None)

        def run():
            try:
                if self._lazy.cf.exception() is None:  # procs that never came up: nothing to stop
                    if tensors is not None and not tensors.root._failures:
                        # Distributed tensors (monarch.tensor): the batches in flight reach
                        # their workers (the stop's barrier) before the procs go.
                        try:
                            Future(native=tensors.workers._mesh().stop()).get(timeout=30)
                        except Exception:
                            pass
                    self._lazy.cf.result().stop()
                cf.set_result(None)
            except BaseException as e:
                cf.set_exception(e)
        threading.Thread(target=run, name="monarch-stop", daemon=True).start()
        return Future(cf=cf)

    def logging_option(self, stream_to_client: bool = True, aggregate_window_sec=None,
                       level=None) -> "_Applied":
        """Whether the procs' output is shown here, with ``[mesh rank]`` prefixes (default
        on), and its aggregation: identical lines from several procs within
        ``aggregate_window_sec`` seconds print once, with the ranks that wrote them (0: every
        line at once; None: leave it, default the config key mesh.log_aggregate_window).
        Raises TypeError for a non-bool switch or a window that is not a number, ValueError for
        a window outside [0, 3600] s (NaN included).

        Applied at the call (inside a running loop on procs still starting: queued, before the
        operations issued after it). Returns an awaitable that is done already, so that
        Monarch's ``await procs.logging_option(...)`` and ``asyncio.run(procs.logging_option(
        ...))`` work too."""
        if not isinstance(stream_to_client, bool):
            raise TypeError("logging_option: stream_to_client must be a bool")
        if aggregate_window_sec is not None and (
                isinstance(aggregate_window_sec, bool)
                or not isinstance(aggregate_window_sec, (int, float))):
            raise TypeError("logging_option: aggregate_window_sec must be a number of seconds "
                            "or None, not %s" % type(aggregate_window_sec).__name__)
        if aggregate_window_sec is not None and not 0 <= aggregate_window_sec <= 3600:
            raise ValueError("logging_option: aggregate_window_sec must be a number of seconds "
                             "in [0, 3600], not %r" % (aggregate_window_sec,))
        self._live.check()  # a stopped mesh: SupervisionError, as for a call
        if self._local or self._remote:
            return _Applied()
        lazy = self._lazy

        def apply():
            native = lazy.result()
            native.set_stream_logs(stream_to_client)
            if aggregate_window_sec is not None:
                native.set_log_window(float(aggregate_window_sec))

        if lazy.cf.done() or not _in_running_loop():
            apply()
            return _Applied()

        def queued():  # on the thread that completes the spawn, before the operations queued next
            try:
                apply()
            except BaseException:
                pass  # the procs did not start: the mesh's first use raises that

        if not lazy.later(queued):
            queued()
        return _Applied()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop().get()

    def __repr__(self):
        return "<ProcMesh %r>" % self._name

    def __reduce__(self):
        if self._local:
            raise TypeError("this_proc() cannot be sent inside a message; send a ProcMesh from "
                            "spawn_procs, or an actor mesh")
        return (_rebuild_proc_mesh, (self._procs().encode(), self._name))


def _rebuild_proc_mesh(encoded, name):
    return ProcMesh(_Lazy.of(_native.decode_procs(encoded)), name,
                    _Liveness("proc mesh %r" % name), remote=True)


class HostMesh(MeshTrait, _Sized):
    """Hosts, each running a host agent: ``this_host()``, ``attach_to_workers(...)``, or a
    launcher's (SLURM, Kubernetes)."""

    def __init__(self, native):
        self._native = native
        self._spawned = weakref.WeakSet()  # its ProcMeshes still referenced (shutdown())

    @property
    def initialized(self) -> Future[bool]:
        """Completed: a HostMesh exists once its host agents answered."""
        return _ready(True)

    def shutdown(self) -> Future[None]:
        """Stops every ProcMesh spawned on this HostMesh that is still referenced; the Future
        completes once they all stopped (with the first stop error, if any). The host agents
        themselves keep running: this_host()'s is the client, and an attached worker's agent
        may serve other clients (stop those with SIGTERM, or their job)."""
        return _all_of([pm.stop() for pm in list(self._spawned)], "monarch-shutdown")

    def __reduce__(self):
        raise TypeError("a HostMesh cannot be sent inside a message (it holds this client's "
                        "links to the host agents): send a ProcMesh spawned on it instead")

    def _shape(self):
        return _native.Shape(self._native.labels, self._native.sizes)

    def _with_shape(self, shape):
        raise ValueError("slicing a HostMesh is not supported; slice the ProcMesh instead")

    def slice(self, **kwargs):
        """Not supported (ValueError), whatever the dims: slice the ProcMesh instead."""
        raise ValueError("slicing a HostMesh is not supported; slice the ProcMesh instead")

    def spawn_procs(self, per_host: Optional[Dict[str, int]] = None, bootstrap=None,
                    name: Optional[str] = None) -> ProcMesh:
        """``per_host`` procs on every host (e.g. {"gpus": 4}); the ProcMesh's dims are the
        host dims followed by these. Returns at once; the procs start in the background.
        ``bootstrap``: a callable (shipped with cloudpickle) each proc runs before it serves; if
        it raises, the proc exits and the first use of the mesh raises, naming the rank.
        Raises ValueError for a bad per_host or name, TypeError for a bad bootstrap."""
        per_host = {"procs": 1} if per_host is None else per_host
        if not isinstance(per_host, Mapping):
            raise TypeError("spawn_procs: per_host must be a dict of dim -> size, "
                            "e.g. {'gpus': 4}, not %r" % (per_host,))
        if not per_host:
            raise ValueError("spawn_procs: per_host is empty; give at least one dim, "
                             "e.g. {'gpus': 4}")
        for k, v in per_host.items():
            if not isinstance(k, str) or not (k.isascii() and k.isidentifier()):
                raise ValueError("spawn_procs: dim names must be identifiers "
                                 "([A-Za-z_][A-Za-z0-9_]*, as mesh.slice(name=...) takes them), "
                                 "not %r" % (k,))
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise ValueError("spawn_procs: size of dim %r must be a positive int, not %r"
                                 % (k, v))
        per_host_total = 1
        for v in per_host.values():
            per_host_total *= v
        if per_host_total > _MAX_PROCS_PER_HOST:
            raise ValueError("spawn_procs: %s is %d procs per host, more than %d (each is a "
                             "process)" % (dict(per_host), per_host_total, _MAX_PROCS_PER_HOST))
        if name is None:
            name = "procs%d" % next(_COUNTER)
        if not isinstance(name, str):
            raise TypeError("spawn_procs: name must be a non-empty str, not %r" % (name,))
        if not name:
            raise ValueError("spawn_procs: name must be a non-empty str, not ''")
        # The runtime's rule, checked now: the spawn itself runs later, on another thread, and a
        # bad name failed only the mesh's first use. Raises UsageError (a ValueError).
        _native.check_proc_mesh_name(name)
        labels, sizes = list(per_host), [per_host[k] for k in per_host]
        env = _worker_env()
        if bootstrap is not None:
            if not callable(bootstrap):
                raise TypeError("spawn_procs: bootstrap must be a callable (run in each proc "
                                "before it serves), not %r" % (bootstrap,))
            try:
                blob = base64.b64encode(_dumps(bootstrap)).decode()
            except Exception as e:
                raise TypeError("spawn_procs: bootstrap cannot be serialised: %s" % e) from None
            env.append("MONARCH_PY_BOOTSTRAP=" + blob)
        args = (labels, sizes, name, sys.executable, ["-m", "monarch._worker"], env)
        live = _Liveness("proc mesh %r" % name)
        cf = concurrent.futures.Future()
        try:  # the host dims, then per_host's (slicing and queued calls need no wait)
            full = _native.Shape(self._native.labels + labels, self._native.sizes + sizes)
        except Exception:
            full = None  # a dim named twice: the spawn fails, and so does the first use
        mesh = ProcMesh(_Lazy(cf), name, live, full=full)
        self._spawned.add(mesh)
        _owned_by_current_actor(mesh)
        host = _current_host_instance()
        if host is not None and threading.current_thread().name != "monarch-asyncio":
            # Inside an actor's handler: the actor owns the procs (its __supervise__ sees
            # their failures). Spawned on its own thread, so this blocks the handler.
            try:
                cf.set_result(self._native.spawn_procs(*args, True))
            except BaseException as e:
                cf.set_exception(e)
                raise
            return mesh

        owner = _current_actor_host()

        def on_failure(mesh_name, ranks, cause, text):
            if owner is not None:  # spawned inside an async endpoint: that actor owns them
                return owner.owned_failure(mesh_name, ranks, cause, text)
            f = MeshFailure(mesh_name, ranks, cause, text)
            mesh._failures.append(f)
            _run_fault_hook(f)
            return True

        # The owning actor, for the runtime: what it sent to a proc that then failed is not
        # reported to it again as undeliverable (it hears the failure in __supervise__).
        owner_id = getattr(getattr(owner, "me", None), "actor", None)

        def run():
            try:
                pm = self._native.spawn_procs(*args, False, owner_id)
                pm.set_failure_handler(on_failure)
                cf.set_result(pm)
            except BaseException as e:
                cf.set_exception(e)

        threading.Thread(target=run, name="monarch-spawn-" + name, daemon=True).start()
        _PROC_MESHES.append(mesh)
        return mesh

    def __repr__(self):
        return "<HostMesh %s>" % self.extent


def _current_host_instance():
    c = _current.get()
    return c.actor_instance if c is not None else None


def _current_actor_host():
    """The ActorHost (monarch._host) of the actor whose handler runs here, sync or async; None in
    the client and on threads of the user's own."""
    host = _current_host_instance()
    return getattr(host, "_host", None) if host is not None else None


_THIS_HOST = None
_THIS_HOST_LOCK = threading.Lock()


def this_host() -> HostMesh:
    """This host, through a host agent embedded in this process (its procs die with it)."""
    global _THIS_HOST
    with _THIS_HOST_LOCK:
        if _THIS_HOST is None:
            _THIS_HOST = HostMesh(_native.this_host())
            _install_fault_hook()
        return _THIS_HOST


def this_proc() -> ProcMesh:
    """This process as a mesh of one: actors spawned on it run here. Each call gives a new
    handle; its ``stop()`` stops the actors spawned through that handle (not the process)."""
    if not _native.is_worker():
        this_host()
    return ProcMesh(_Lazy.of(None), "this_proc", _Liveness("this_proc"), local=True)


def attach_to_workers(workers, name: Optional[str] = None) -> HostMesh:
    """Hosts whose agents were started by hand (``monarch agent --listen tcp://0.0.0.0:26600``):
    ``workers`` is a list of their addresses. Raises when one cannot be reached."""
    if isinstance(workers, str):
        workers = [workers]
    workers = list(workers)
    if not workers:
        raise ValueError("attach_to_workers: give a non-empty list of agent addresses")
    for w in workers:
        if not isinstance(w, str) or not w:
            raise TypeError("attach_to_workers: an agent address is a non-empty str such as "
                            "'tcp://10.0.0.5:26600', not %r" % (w,))
    this_host()  # the client runtime and its fault hook
    h = _native.attach_to_workers(workers)
    # This HostMesh has its own client Proc (TCP): make it the one meshes decoded and ports
    # opened here use (this_host()'s unix socket is unreachable from other hosts), and send
    # what nobody handled on it to unhandled_fault_hook (not the C++ default: print, exit).
    _native.prefer_client_of(h)
    _native.set_host_fault_hook(h, _unhandled_report)
    return HostMesh(h)


# --- Unhandled failures ----------------------------------------------------------------------------


def _default_fault_hook(failure) -> None:
    """Prints the failure and exits the client with status 1 (fail fast)."""
    text = failure.report() if isinstance(failure, MeshFailure) else str(failure)
    try:
        sys.stdout.flush()
    except Exception:
        pass
    sys.stderr.write("monarch: unhandled failure: %s\n" % text)
    sys.stderr.flush()
    os._exit(1)


#: Receives every failure nobody handled (a MeshFailure, or an actor failure's report as a
#: MonarchError). Replace it to keep going; runs on a runtime thread. Default: print, exit 1.
unhandled_fault_hook = _default_fault_hook


def _run_fault_hook(failure) -> None:
    """Gives ``failure`` to ``unhandled_fault_hook``, on the runtime thread that found it. A hook
    that raises (or is not callable) has not handled it: the failure and the hook's error are
    printed and the client exits 1, as with the default hook (``sys.exit(n)`` in a hook exits
    with ``n``). Before, the error was printed as ignored and the client went on."""
    hook = globals().get("unhandled_fault_hook", _default_fault_hook)
    try:
        hook(failure)
        return
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
        why = None
    except BaseException as e:
        code, why = 1, "%s: %s" % (type(e).__name__, e)
    text = failure.report() if isinstance(failure, MeshFailure) else str(failure)
    try:
        sys.stdout.flush()
        if why is not None:
            sys.stderr.write("monarch: unhandled failure: %s\nmonarch: unhandled_fault_hook %r "
                             "raised %s\n" % (text, hook, why))
        sys.stderr.flush()
    finally:
        os._exit(code)


_INTERRUPTED = False
_previous_excepthook = sys.excepthook


def _excepthook(tp, value, tb):
    global _INTERRUPTED
    if issubclass(tp, KeyboardInterrupt):
        _INTERRUPTED = True
    _previous_excepthook(tp, value, tb)


sys.excepthook = _excepthook


def _stop_at_exit():
    # Procs still running when the client exits are stopped (their output drained, their
    # __cleanup__ run); those not gone within the stop timeout are killed. After Ctrl-C they are
    # not waited for: they die with this process (the host agent's children, PR_SET_PDEATHSIG).
    if _INTERRUPTED:
        return
    # Every mesh's stop starts before any is waited for: busy procs each take up to the stop
    # timeout, which added up mesh after mesh.
    stops = []
    for pm in list(_PROC_MESHES):
        if pm._live.stopped is None and pm._lazy.cf.done() and pm._lazy.cf.exception() is None:
            try:
                stops.append(pm.stop())
            except BaseException:
                pass
    for f in stops:
        try:
            f.get(timeout=30)
        except BaseException:
            pass


# atexit runs handlers last-registered first: prepare_exit runs after _stop_at_exit.
atexit.register(_native.prepare_exit)
atexit.register(_stop_at_exit)


def _unhandled_report(text):
    _run_fault_hook(SupervisionError(text))


def _install_fault_hook():
    _native.set_fault_hook(_unhandled_report)

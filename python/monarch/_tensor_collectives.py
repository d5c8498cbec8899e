"""Worker-side collectives of the tensor engine (issue 19): reductions over mesh dims.

Internal module: the tensor worker (monarch.tensor's TensorWorker) builds one ``MeshGroups`` per
proc and calls ``reduce`` for ``t.reduce(dims, reduction, scatter)``. It imports torch (only the
tensor engine imports this module; ``import monarch`` stays torch-free).

Groups. A mesh of extent ``dims``/``sizes`` (e.g. ["hosts", "gpus"], [2, 2]) has, for every
non-empty subset D of its dims, one group per combination of coordinates of the other dims: the
ranks that differ only in D. ``reduce(t, D, ...)`` runs over the group that holds this rank.
Each group is a gloo ``ProcessGroupGloo`` of its own, rendezvoused through a key prefix of one
``TCPStore`` (rank 0 hosts it at ``store_host:store_port``; the others connect). No default
process group is initialised (``torch.distributed.init_process_group`` is process-global: a
second engine in the same process, or a user's own ``init_process_group``, would collide), so
groups need no world-wide ``new_group`` call: only a group's members take part in building it.
Groups are built lazily on first use; that is deadlock-free because every rank of a group sees
the same reduce calls in the same order (the controller sends every worker the same stream).

Group order. A group's ranks are ordered by their global (row-major) mesh rank, which is
row-major over the reduced dims taken in the mesh's dim order (``dims`` given to ``reduce`` in
another order mean the same group). "stack" and scatter use this order.

Threads: ``reduce`` blocks the calling thread until every member of the group has called it with
a tensor of the same shape and dtype, or ``timeout_s`` passes (then RuntimeError naming the
group). A MeshGroups is not thread-safe: call it from one thread (the worker's op thread).
"""

import datetime
import ipaddress
import itertools
import socket
from typing import Dict, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

REDUCTIONS = ("sum", "avg", "min", "max", "product", "stack")

_OPS = {
    "sum": dist.ReduceOp.SUM,
    "avg": dist.ReduceOp.SUM,  # then divided by the group size
    "min": dist.ReduceOp.MIN,
    "max": dist.ReduceOp.MAX,
    "product": dist.ReduceOp.PRODUCT,
}

# dtypes gloo reduces natively (torch 1.13); others are carried in a wider or same-width type.
_GLOO_DTYPES = {torch.float16, torch.float32, torch.float64, torch.uint8, torch.int8,
                torch.int32, torch.int64}


# The shape check's header: dtype code, ndim, numel, then up to 7 leading dims.
_HEADER = 10
_DTYPE_CODES = {d: i for i, d in enumerate(
    (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32,
     torch.int16, torch.int8, torch.uint8, torch.bool, torch.complex64, torch.complex128))}


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def reduced_shape(shape: Sequence[int], group_size: int, reduction: str,
                  scatter: bool) -> Tuple[int, ...]:
    """The shape ``reduce`` returns for an input of ``shape`` over a group of ``group_size``
    ranks (for the controller's shape inference). Raises ValueError like ``reduce``."""
    shape = tuple(shape)
    if reduction not in REDUCTIONS:
        raise ValueError("reduce: unknown reduction %r; expected one of %s"
                         % (reduction, ", ".join(REDUCTIONS)))
    if reduction == "stack":
        return (1,) + shape if scatter else (group_size,) + shape
    if not scatter:
        return shape
    if not shape:
        raise ValueError("reduce: scatter=True needs a tensor with at least one dim (it splits "
                         "dim 0), got a 0-dim tensor")
    if shape[0] % group_size:
        raise ValueError("reduce: scatter=True splits dim 0 (size %d) over %d ranks; it must be "
                         "divisible by the group size" % (shape[0], group_size))
    return (shape[0] // group_size,) + shape[1:]


class MeshGroups:
    """The gloo groups of one proc of a mesh, and reductions over them.

    rank: this proc's row-major rank in the mesh of extent ``dims``/``sizes``.
    store_host, store_port: where rank 0 serves the TCPStore that every rank connects to (rank 0
        binds it; the caller picks a free port). ``timeout_s`` (seconds, > 0) bounds the store
        connection, every group's rendezvous and every collective.
    device_host: the address gloo binds its connections to; default ``store_host`` when that is
        a loopback address (one-host meshes), else this host's name.
    check_shapes: before each collective, all-gather the members' shapes and dtypes (10 int64)
        and raise ValueError on every member when they differ. gloo aborts the process whose
        buffer is the smaller one otherwise; turn it off only where every member's shape is known
        to agree (it adds one small collective, a round of latency, to every reduce).
    Raises ValueError for a bad rank, dims or sizes; RuntimeError (naming the store) when the
    store cannot be reached within ``timeout_s``.
    """

    def __init__(self, rank: int, dims: List[str], sizes: List[int], store_host: str,
                 store_port: int, timeout_s: float = 60.0, device_host: Optional[str] = None,
                 check_shapes: bool = True):
        dims, sizes = list(dims), [int(s) for s in sizes]
        if len(dims) != len(sizes) or not dims:
            raise ValueError("MeshGroups: dims %r and sizes %r must be non-empty and of the "
                             "same length" % (dims, sizes))
        if len(set(dims)) != len(dims) or not all(isinstance(d, str) and d for d in dims):
            raise ValueError("MeshGroups: dims must be distinct non-empty names, got %r"
                             % (dims,))
        if any(s <= 0 for s in sizes):
            raise ValueError("MeshGroups: sizes must be positive, got %r" % (sizes,))
        world = 1
        for s in sizes:
            world *= s
        if not 0 <= rank < world:
            raise ValueError("MeshGroups: rank %d is outside the mesh %s (%d ranks)"
                             % (rank, dict(zip(dims, sizes)), world))
        if not timeout_s > 0:
            raise ValueError("MeshGroups: timeout_s must be > 0 seconds, got %r" % (timeout_s,))
        self.rank, self.dims, self.sizes, self.world = rank, dims, sizes, world
        self.coords = self._coords_of(rank)
        self._timeout = datetime.timedelta(seconds=timeout_s)
        if device_host is None:
            device_host = store_host if _is_loopback(store_host) else socket.gethostname()
        self._device_host = device_host
        self.check_shapes = bool(check_shapes)
        try:
            self._store = dist.TCPStore(store_host, store_port, world, rank == 0, self._timeout)
        except Exception as e:
            raise RuntimeError("MeshGroups: rank %d cannot %s the TCPStore at %s:%d: %s"
                               % (rank, "serve" if rank == 0 else "reach", store_host,
                                  store_port, e)) from None
        # key: the reduced dims (mesh order) -> (ProcessGroupGloo or None for a group of one,
        # group size, this rank's index in the group)
        self._groups: Dict[Tuple[str, ...], Tuple[Optional[object], int, int]] = {}

    # --- geometry --------------------------------------------------------------------------

    def _coords_of(self, rank: int) -> List[int]:
        out = []
        for s in reversed(self.sizes):
            out.append(rank % s)
            rank //= s
        return out[::-1]

    def _rank_of(self, coords: Sequence[int]) -> int:
        r = 0
        for c, s in zip(coords, self.sizes):
            r = r * s + c
        return r

    def _canonical(self, dims, reduction: str) -> Tuple[str, ...]:
        if isinstance(dims, str):
            dims = [dims]
        dims = list(dims)
        if not dims:
            raise ValueError("reduce(%r): no dims given; name one or more of the mesh's dims %s"
                             % (reduction, self.dims))
        unknown = [d for d in dims if d not in self.dims]
        if unknown:
            raise ValueError("reduce(%s, %r): unknown dim(s) %s; the mesh's dims are %s"
                             % (dims, reduction, unknown, self.dims))
        if len(set(dims)) != len(dims):
            raise ValueError("reduce(%s, %r): a dim is named twice" % (dims, reduction))
        return tuple(d for d in self.dims if d in dims)

    def group_ranks(self, dims) -> List[int]:
        """The global ranks of this rank's group over ``dims``, in group order."""
        key = self._canonical(dims, "?")
        idx = [self.dims.index(d) for d in key]
        ranks = []
        for combo in itertools.product(*[range(self.sizes[i]) for i in idx]):
            c = list(self.coords)
            for i, v in zip(idx, combo):
                c[i] = v
            ranks.append(self._rank_of(c))
        return sorted(ranks)

    def _group(self, key: Tuple[str, ...]):
        g = self._groups.get(key)
        if g is not None:
            return g
        ranks = self.group_ranks(key)
        me = ranks.index(self.rank)
        if len(ranks) == 1:
            g = (None, 1, 0)
        else:
            fixed = ",".join("%s=%d" % (d, c) for d, c in zip(self.dims, self.coords)
                             if d not in key)
            prefix = "monarch/groups/%s/%s" % ("+".join(key), fixed)
            opts = dist.ProcessGroupGloo._Options()
            opts._timeout = self._timeout
            opts._devices = [dist.ProcessGroupGloo.create_device(hostname=self._device_host)]
            try:
                pg = dist.ProcessGroupGloo(dist.PrefixStore(prefix, self._store), me, len(ranks),
                                           opts)
            except Exception as e:
                raise RuntimeError("reduce over %s: rank %d could not form the gloo group of "
                                   "ranks %s: %s" % (list(key), self.rank, ranks, e)) from None
            g = (pg, len(ranks), me)
        self._groups[key] = g
        return g

    def group_size(self, dims) -> int:
        """How many ranks reduce over ``dims`` (the product of their sizes)."""
        n = 1
        for d in self._canonical(dims, "?"):
            n *= self.sizes[self.dims.index(d)]
        return n

    # --- reductions ------------------------------------------------------------------------

    def reduce(self, t: torch.Tensor, dims, reduction: str = "sum",
               scatter: bool = False) -> torch.Tensor:
        """Reduces ``t`` over the ranks of this rank's group over ``dims``; every member must
        call it with a tensor of the same shape and dtype. Returns a new CPU tensor (``t`` is
        not modified):

        - "sum", "min", "max", "product": elementwise over the group, shape and dtype of ``t``
          (an all-reduce: every member gets the result).
        - "avg": the sum divided by the group size, in ``t``'s dtype. For integer dtypes that
          division floors (Python's ``//``, torch's ``div(rounding_mode="floor")``).
        - "stack": the members' tensors stacked along a new leading dim of the group size, in
          group order (an all-gather).
        - scatter=True (a reduce-scatter): the result above split into group-size chunks along
          dim 0, each member keeping the chunk of its group index. Dim 0 must be divisible by the
          group size (ValueError). With "stack" the result's dim 0 is the group size, so each
          member keeps its own tensor, shape (1, *t.shape), and nothing crosses the wire.

        dtypes: those gloo knows (float16/32/64, uint8, int8, int32, int64) directly; bfloat16
        is reduced in float32 and rounded back once; bool works for min, max, product and stack
        (sum and avg of bools: TypeError, as the result would not be a bool). Others: TypeError.
        Raises ValueError for an unknown reduction or dim, or (check_shapes) on every member
        when the members' shapes or dtypes differ, naming each one's; RuntimeError naming the
        dims, the reduction and the group when the collective fails or times out (a member
        gone).
        """
        if reduction not in REDUCTIONS:
            raise ValueError("reduce(%s): unknown reduction %r; expected one of %s"
                             % (list(dims) if not isinstance(dims, str) else [dims], reduction,
                                ", ".join(REDUCTIONS)))
        key = self._canonical(dims, reduction)
        if not isinstance(t, torch.Tensor):
            raise TypeError("reduce(%s, %r): expected a torch.Tensor, got %s"
                            % (list(key), reduction, type(t).__name__))
        if t.device.type != "cpu":
            raise TypeError("reduce(%s, %r): only CPU tensors reduce over gloo, got one on %s"
                            % (list(key), reduction, t.device))
        n = self.group_size(key)
        try:
            reduced_shape(t.shape, n, reduction, scatter)
        except ValueError as e:
            raise ValueError("reduce(%s, %r): %s" % (list(key), reduction,
                                                     str(e)[len("reduce: "):])) from None
        if reduction == "stack" and scatter:
            return t.detach().clone().unsqueeze(0)
        pg, n, me = self._group(key)
        wire, back = self._wire_dtype(t.dtype, reduction, key)
        if pg is not None and self.check_shapes:
            self._check_same_shape(pg, n, t, key, reduction)
        x = t.detach().to(wire, copy=True).contiguous()
        try:
            if reduction == "stack":
                if pg is None:
                    out = x.unsqueeze(0)
                else:
                    parts = [torch.empty_like(x) for _ in range(n)]
                    pg.allgather([parts], [x]).wait()
                    out = torch.stack(parts)
            else:
                if pg is not None:
                    o = dist.AllreduceOptions()
                    o.reduceOp = _OPS[reduction]
                    pg.allreduce([x], o).wait()
                out = x
        except RuntimeError as e:
            raise RuntimeError("reduce(%s, %r) of a %s %s tensor over ranks %s failed on rank "
                               "%d: %s" % (list(key), reduction, tuple(t.shape), t.dtype,
                                           self.group_ranks(key), self.rank, e)) from None
        if reduction == "avg" and n > 1:
            if out.is_floating_point():
                out = out.div_(n)
            else:
                out = torch.div(out, n, rounding_mode="floor")
        if back is not None:
            out = out.to(back)
        if scatter:
            out = out.chunk(n, 0)[me].clone()
        return out

    def _check_same_shape(self, pg, n, t, key, reduction):
        """All-gathers a small header (dtype, ndim, numel, the first dims) and raises ValueError
        on every member, naming each member's shape, when they differ: gloo aborts the process
        when the byte counts of a collective disagree, and a stack of different shapes has no
        meaning. One extra collective of 10 int64 per reduce."""
        h = torch.full((_HEADER,), -1, dtype=torch.int64)
        h[0] = _DTYPE_CODES.setdefault(t.dtype, len(_DTYPE_CODES))
        h[1] = t.dim()
        h[2] = t.numel()
        lead = list(t.shape)[:_HEADER - 3]
        if lead:
            h[3:3 + len(lead)] = torch.tensor(lead, dtype=torch.int64)
        parts = [torch.empty_like(h) for _ in range(n)]
        try:
            pg.allgather([parts], [h]).wait()
        except RuntimeError as e:
            raise RuntimeError("reduce(%s, %r) over ranks %s failed on rank %d: %s"
                               % (list(key), reduction, self.group_ranks(key), self.rank,
                                  e)) from None
        if all(torch.equal(p, parts[0]) for p in parts[1:]):
            return
        codes = {v: k for k, v in _DTYPE_CODES.items()}
        shown = []
        for r, p in zip(self.group_ranks(key), parts):
            nd = int(p[1])
            dims = [int(x) for x in p[3:3 + min(nd, _HEADER - 3)]]
            shape = str(tuple(dims)) if nd <= len(dims) else str(tuple(dims))[:-1] + ", ...)"
            shown.append("rank %d: %s %s" % (r, shape, codes.get(int(p[0]), "?")))
        raise ValueError("reduce(%s, %r): the members' tensors differ in shape or dtype (%s); "
                         "every member of the group must give the same"
                         % (list(key), reduction, "; ".join(shown)))

    def _wire_dtype(self, dtype, reduction, key):
        """(dtype sent over gloo, dtype to convert back to or None)."""
        if dtype in _GLOO_DTYPES:
            return dtype, None
        if dtype == torch.bfloat16:
            return torch.float32, torch.bfloat16
        if dtype == torch.bool:
            if reduction in ("sum", "avg"):
                raise TypeError("reduce(%s, %r): a bool tensor has no %s that is a bool; "
                                "convert it first (e.g. t.int())" % (list(key), reduction,
                                                                     reduction))
            return torch.uint8, torch.bool
        raise TypeError("reduce(%s, %r): gloo cannot reduce %s tensors" % (list(key), reduction,
                                                                          dtype))

    def close(self) -> None:
        """Drops the groups and the store connection; the MeshGroups is unusable after."""
        self._groups.clear()
        self._store = None

"""One-sided reads and writes of another process's memory: ``RDMABuffer``, as in Monarch.

    # owner (an actor, or the client)
    self.weights = torch.zeros(16 << 20)            # 64 MiB, CPU, contiguous
    buf = RDMABuffer(self.weights)                  # registers the tensor's memory; no copy
    return buf                                      # sendable inside any message

    # any process holding buf
    local = torch.empty(16 << 20)
    buf.read_into(local).get()                      # the whole buffer into `local`
    buf.write_from(patch, offset=4096).get()        # patch's bytes into the buffer at byte 4096
    buf.drop()                                      # owner: ends remote access

Memory: a CPU ``torch.Tensor`` (contiguous, not empty) or any contiguous buffer-protocol object
(``bytearray``, ``memoryview``, a numpy array). A read-only object (``bytes``, a read-only numpy
array) is registered read-only: peers can read it, and a ``write_from`` to it raises ``ValueError``
(or, from a peer that skips that check, fails with ``RdmaError``); it can be the source of a
``write_from`` but not the destination of a ``read_into``. Registration never copies: peers read and
write the object's own memory. The buffer keeps a reference to the object while it is registered,
that is until ``drop()`` (not until the ``RDMABuffer`` is garbage-collected: a buffer returned from
an endpoint must stay readable after the handler let go of it), so call ``drop()`` when peers are
done. Torch is never imported here; a tensor is recognised only when torch is already loaded.

Routes (docs/data-plane.md): a reader on the owner's host reads with ``process_vm_readv``
(``cma``) straight from the owner's memory; writes, and readers elsewhere, go over the data plane's
backend (channel links, or UCX). ``RDMABuffer.allocate(nbytes)`` makes memory in shared memory
instead (see ``memory()``): same-host peers then read and write it with one memcpy (``shm``).
``route()`` says which route a transfer takes.

Sizes and offsets are bytes. ``timeout`` is seconds (> 0; None: the ``rdma.timeout`` setting, 30 s
by default): a transfer not done by then fails with :class:`monarch.errors.RdmaError`.

Errors: bad arguments raise at the call, before anything moves: ``TypeError`` (not a tensor or
buffer), ``ValueError`` (empty, non-contiguous, on a GPU, read-only destination, a size or offset
that does not fit, a bad timeout); using a dropped buffer raises ``RdmaError``. Failures of the
transfer itself (owner gone, dropped by its owner, timeout) come through the returned Future as
``RdmaError``.

Threads: any thread, including endpoints (``await buf.read_into(t)`` in an async one). The GIL is
released while bytes move. A reader on the owner's host copies on the calling thread, so the
Future is done when ``read_into`` returns; otherwise it completes on the data plane's thread. The
source or destination object is kept alive until the transfer's Future completes; do not change
it (a source) or read it (a destination) before then.
"""

import sys
import threading
from typing import Any, Optional

from monarch import _native
from monarch.actor import Future
from monarch.errors import RdmaError

__all__ = ["RDMABuffer"]

# Owned registrations, by id of their native buffer: (native buffer, the object whose memory it
# is). Kept until drop(), so that a buffer handed out in a message stays readable after its
# RDMABuffer object is garbage-collected here.
_registered = {}
# Transfers in flight, by id of their native future: the source or destination object, kept alive
# until the transfer completed (a transfer writes into or reads from it until then).
_inflight = {}
_lock = threading.Lock()

_DEFAULT_TIMEOUT = 3.0  # seconds


def _tensor_type():
    torch = sys.modules.get("torch")
    return None if torch is None else torch.Tensor


def _describe(obj) -> str:
    t = _tensor_type()
    if t is not None and isinstance(obj, t):
        return "tensor(%s, shape %s)" % (str(obj.dtype).replace("torch.", ""), tuple(obj.shape))
    return type(obj).__name__


def _span(obj, writable: bool, what: str):
    """(address, bytes, keep) of obj's memory; `keep` must stay referenced while it is used."""
    t = _tensor_type()
    if t is not None and isinstance(obj, t):
        if obj.device.type != "cpu":
            raise ValueError("%s: the tensor is on %s; RDMABuffer reaches CPU memory only"
                             % (what, obj.device))
        if obj.is_sparse:
            raise ValueError("%s: a sparse tensor has no single block of memory" % what)
        if not obj.is_contiguous():
            raise ValueError("%s: the tensor is not contiguous (shape %s, strides %s); pass "
                             "t.contiguous()" % (what, tuple(obj.shape), obj.stride()))
        nbytes = obj.numel() * obj.element_size()
        if nbytes == 0:
            raise ValueError("%s: the tensor is empty (shape %s)" % (what, tuple(obj.shape)))
        return obj.data_ptr(), nbytes, obj
    try:
        mv = memoryview(obj)
    except TypeError:
        raise TypeError("%s: needs a torch.Tensor or a buffer-protocol object (bytearray, "
                        "memoryview, numpy array), not %s" % (what, type(obj).__name__)) from None
    if mv.nbytes == 0:
        raise ValueError("%s: the %s is empty (0 bytes)" % (what, type(obj).__name__))
    if not mv.contiguous:
        raise ValueError("%s: the %s is not contiguous (strides %s)"
                         % (what, type(obj).__name__, mv.strides))
    if writable and mv.readonly:
        raise ValueError("%s: the %s is read-only" % (what, type(obj).__name__))
    address, nbytes = _native.buffer_span(mv, writable)
    return address, nbytes, mv  # the memoryview holds an export: a bytearray cannot resize


def _timeout_ms(timeout, what: str) -> int:
    if timeout is None:
        return 0  # the rdma.timeout setting
    if not isinstance(timeout, (int, float)) or isinstance(timeout, bool):
        raise TypeError("%s: timeout must be a number of seconds or None, not %r" % (what, timeout))
    if not 0 < timeout <= _MAX_TIMEOUT_S:  # also NaN and infinity
        raise ValueError("%s: timeout must be > 0 and at most %d seconds (a transfer always has a "
                         "deadline; None: the rdma.timeout setting), not %r"
                         % (what, _MAX_TIMEOUT_S, timeout))
    return max(1, int(round(timeout * 1000.0)))


_MAX_TIMEOUT_S = 10_000_000  # 115 days: far past any transfer, far below the clock's range


def _offset(offset, size: int, what: str) -> int:
    if not isinstance(offset, int) or isinstance(offset, bool):
        raise TypeError("%s: offset must be an int (bytes), not %r" % (what, offset))
    if offset < 0 or offset >= size:
        raise ValueError("%s: offset %d is outside the buffer's %d bytes" % (what, offset, size))
    return offset


def _track(native_future, keep) -> Future:
    key = id(native_future)
    with _lock:
        _inflight[key] = (native_future, keep)

    def done():
        with _lock:
            _inflight.pop(key, None)

    native_future.add_done_callback(done)  # at once when already done
    return Future(native=native_future)


class RDMABuffer:
    """Registered memory that other processes read and write one-sidedly (module docstring).

    ``RDMABuffer(data, *, name=None)``: ``data`` a CPU tensor or a buffer-protocol object (see
    the module docstring); ``name`` appears in error messages (default: a description of data).
    Sendable inside messages (pickle): the copy a peer receives reaches the owner's memory.
    """

    def __init__(self, data: Any, *, name: Optional[str] = None):
        address, nbytes, keep = _span(data, False, "RDMABuffer()")
        if name is None:
            name = _describe(data)
        elif not isinstance(name, str):
            raise TypeError("RDMABuffer(): name must be a str, not %r" % (name,))
        read_only = isinstance(keep, memoryview) and keep.readonly
        self._native = _native.RdmaBuffer(address, nbytes, name, read_only)
        with _lock:
            _registered[id(self._native)] = (self._native, keep)

    @classmethod
    def allocate(cls, nbytes: int, *, name: str = "buffer") -> "RDMABuffer":
        """A new buffer of ``nbytes`` zeroed bytes in shared memory that the data plane owns.

        Same-host peers map it (the ``shm`` route: a read or write is one memcpy, faster than
        the ``cma`` route of a registered tensor). Use its memory through ``memory()``, e.g.
        ``t = torch.frombuffer(buf.memory(), dtype=torch.float32)``. Raises ValueError for
        ``nbytes`` <= 0, RdmaError if the memory cannot be had.
        """
        if not isinstance(nbytes, int) or isinstance(nbytes, bool):
            raise TypeError("RDMABuffer.allocate: nbytes must be an int, not %r" % (nbytes,))
        if nbytes <= 0:
            raise ValueError("RDMABuffer.allocate: nbytes must be > 0, not %d" % nbytes)
        if not isinstance(name, str):
            raise TypeError("RDMABuffer.allocate: name must be a str, not %r" % (name,))
        self = cls.__new__(cls)
        self._native = _native.RdmaBuffer.allocate(nbytes, name)
        with _lock:
            _registered[id(self._native)] = (self._native, None)
        return self

    def memory(self) -> memoryview:
        """The bytes of a buffer made by ``allocate()`` in this process: a writable memoryview
        (format "B"), valid as long as it (or a tensor made from it) is referenced, also after
        ``drop()`` (which only ends remote access). Raises ValueError for other buffers (their
        memory is the object they were made from)."""
        if not self._native.allocated:
            raise ValueError("RDMABuffer.memory(): buffer %s was not made by RDMABuffer.allocate() "
                             "in this process" % self._native.describe())
        return memoryview(self._native)

    @classmethod
    def _from_native(cls, native):
        self = cls.__new__(cls)
        self._native = native
        return self

    def _live(self, what):
        if self._native.dropped:
            raise RdmaError("%s: RDMABuffer %s was dropped; it cannot be used any more"
                            % (what, self._native.describe()))

    def size(self) -> int:
        """The buffer's length in bytes."""
        return self._native.size

    def read_into(self, dst: Any, offset: int = 0, timeout: Optional[float] = _DEFAULT_TIMEOUT
                  ) -> Future[None]:
        """Copies the buffer's bytes [offset, size()) into the front of ``dst``.

        ``dst``: a writable CPU tensor or buffer of at least ``size() - offset`` bytes. Returns a
        Future (value None), done once every byte is in ``dst``.
        """
        what = "RDMABuffer.read_into"
        self._live(what)
        size = self._native.size
        off = _offset(offset, size, what)
        ms = _timeout_ms(timeout, what)
        address, nbytes, keep = _span(dst, True, what + " (destination)")
        need = size - off
        if nbytes < need:
            raise ValueError("%s: the destination (%s) holds %d bytes, too small for the %d bytes "
                             "of buffer %r (size %d, from offset %d)"
                             % (what, _describe(dst), nbytes, need, self._native.name, size, off))
        return _track(self._native.read_into(address, need, off, ms), keep)

    def write_from(self, src: Any, offset: int = 0, timeout: Optional[float] = _DEFAULT_TIMEOUT
                   ) -> Future[None]:
        """Copies all of ``src`` into the buffer at byte ``offset``.

        ``src``: a CPU tensor or buffer with ``offset + its bytes <= size()``. Returns a Future
        (value None), done once every byte is in the owner's memory.
        """
        what = "RDMABuffer.write_from"
        self._live(what)
        if self._native.read_only:
            raise ValueError("%s: buffer %s is read-only (registered from a read-only object)"
                             % (what, self._native.describe()))
        size = self._native.size
        off = _offset(offset, size, what)
        ms = _timeout_ms(timeout, what)
        address, nbytes, keep = _span(src, False, what + " (source)")
        if off + nbytes > size:
            raise ValueError("%s: the source (%s) has %d bytes, which do not fit in buffer %r of "
                             "%d bytes at offset %d" % (what, _describe(src), nbytes,
                                                        self._native.name, size, off))
        return _track(self._native.write_from(address, nbytes, off, ms), keep)

    def drop(self) -> Future[None]:
        """Owner: ends remote access (later transfers fail with RdmaError) once transfers in
        progress finished, and lets go of the memory. A copy received in a message: forgets it
        here only (the owner's registration stays). Idempotent. Returns a done Future, as in
        Monarch (``buf.drop().get()`` works)."""
        native = self._native
        if not native.dropped:
            native.drop()  # GIL released while it waits for transfers
            with _lock:
                _registered.pop(id(native), None)
        return Future(value=None)

    def route(self, write: bool = False) -> str:
        """The route a read (or write) from this process takes now: "in-process", "shm", "cma",
        "ucx" or "channel" (docs/data-plane.md)."""
        self._live("RDMABuffer.route")
        return self._native.route(bool(write))

    def __reduce__(self):
        self._live("pickling an RDMABuffer")
        return (_rebuild, (self._native.encode(),))

    def __repr__(self):
        state = " dropped" if self._native.dropped else ""
        return "<RDMABuffer %s%s>" % (self._native.describe(), state)


def _rebuild(encoded: bytes) -> RDMABuffer:
    return RDMABuffer._from_native(_native.decode_rdma(encoded))

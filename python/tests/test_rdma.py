"""monarch.rdma.RDMABuffer between real worker processes: 64 MiB tensors both ways, buffers
inside messages, buffers owned by the client, and every bad input the issue lists."""
import os
import pickle
import re
import subprocess
import sys

import numpy as np
import pytest
import torch

from monarch.actor import Actor, endpoint, this_host
from monarch.errors import RdmaError
from monarch.rdma import RDMABuffer

BIG = 64 << 20  # bytes
T = 30  # seconds: every wait has a deadline


def pattern(seed, n=BIG):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g)


class Owner(Actor):
    """Owns a 64 MiB tensor and hands out an RDMABuffer of it."""

    def __init__(self):
        self.data = pattern(1)
        self.bufs = {}

    @endpoint
    def buffer(self):
        return RDMABuffer(self.data)

    @endpoint
    def holds(self, seed):
        return torch.equal(self.data, pattern(seed))

    @endpoint
    def reset(self, seed):
        self.data.copy_(pattern(seed))

    @endpoint
    def small(self, name):
        buf = RDMABuffer(bytearray(b"x" * 4096), name=name)
        self.bufs[name] = buf
        return buf

    @endpoint
    def drop_small(self, name):
        self.bufs.pop(name).drop()


class Peer(Actor):
    """Reads and writes buffers it receives in messages."""

    @endpoint
    def read_all(self, msg):
        buf = msg["buf"]
        dst = torch.empty(buf.size(), dtype=torch.uint8)
        buf.read_into(dst).get(timeout=T)
        return torch.equal(dst, pattern(msg["seed"])), buf.route()

    @endpoint
    def read_bytes(self, buf):
        out = bytearray(buf.size())
        buf.read_into(out).get(timeout=T)
        return bytes(out)

    @endpoint
    def write_bytes(self, buf, data, offset):
        buf.write_from(data, offset=offset).get(timeout=T)


class AsyncPeer(Actor):
    """Awaits transfers in an async endpoint."""

    @endpoint
    async def write_all(self, buf, seed):
        await buf.write_from(pattern(seed), timeout=T)
        return buf.route(write=True)


@pytest.fixture(scope="module")
def procs_and_actors():
    """Two worker procs: an Owner on the first, a Peer and an AsyncPeer on the second."""
    procs = this_host().spawn_procs(per_host={"procs": 2}, name="rdma_test")
    owner = procs.slice(procs=0).spawn("owner", Owner)
    peer = procs.slice(procs=1).spawn("peer", Peer)
    apeer = procs.slice(procs=1).spawn("apeer", AsyncPeer)
    yield procs, owner, peer, apeer
    procs.stop().get(timeout=T)


@pytest.fixture(scope="module")
def actors(procs_and_actors):
    return procs_and_actors[1:]


# --- 64 MiB tensors both ways ------------------------------------------------------------------


def test_client_reads_and_writes_64_mib_of_an_actors_tensor(actors):
    owner, _, _ = actors
    owner.reset.call_one(1).get(timeout=T)
    buf = owner.buffer.call_one().get(timeout=T)
    assert buf.size() == BIG
    dst = torch.zeros(BIG, dtype=torch.uint8)
    assert buf.read_into(dst).get(timeout=T) is None
    assert torch.equal(dst, pattern(1))
    src = pattern(2)
    buf.write_from(src).get(timeout=T)
    assert owner.holds.call_one(2).get(timeout=T)
    assert not owner.holds.call_one(1).get(timeout=T)
    buf.drop()


def test_actor_reads_and_writes_a_buffer_sent_inside_a_message(actors):
    owner, peer, apeer = actors
    owner.reset.call_one(3).get(timeout=T)
    buf = owner.buffer.call_one().get(timeout=T)
    ok, route = peer.read_all.call_one({"buf": buf, "seed": 3}).get(timeout=T)
    assert ok, "the peer read other bytes than the owner holds (route %s)" % route
    route = apeer.write_all.call_one(buf, 4).get(timeout=T)
    assert owner.holds.call_one(4).get(timeout=T), "route %s" % route


def test_actor_reads_and_writes_a_buffer_the_client_owns(actors):
    _, peer, _ = actors
    mem = bytearray(os.urandom(1 << 20))
    buf = RDMABuffer(mem)
    assert peer.read_bytes.call_one(buf).get(timeout=T) == bytes(mem)
    before = bytes(mem)
    peer.write_bytes.call_one(buf, b"\x07" * 100, 1000).get(timeout=T)
    assert bytes(mem) == before[:1000] + b"\x07" * 100 + before[1100:]
    buf.drop()


def test_numpy_array_and_memoryview_register_zero_copy():
    arr = np.arange(1000, dtype=np.float64)
    buf = RDMABuffer(arr)
    assert buf.size() == 8000
    out = np.zeros(1000)
    buf.read_into(memoryview(out)).get(timeout=T)
    assert np.array_equal(out, arr)
    buf.write_from(np.full(10, -1.0), offset=80).get(timeout=T)
    assert list(arr[9:21]) == [9.0] + [-1.0] * 10 + [20.0]  # the owner's own memory changed
    buf.drop()


def test_pickled_buffer_rebuilds_and_reaches_the_same_memory():
    t = torch.arange(256, dtype=torch.int64)
    buf = RDMABuffer(t, name="weights")
    copy = pickle.loads(pickle.dumps(buf))
    assert copy.size() == buf.size() == 2048
    assert "weights" in repr(copy)
    dst = torch.zeros(256, dtype=torch.int64)
    copy.read_into(dst).get(timeout=T)
    assert torch.equal(dst, t)
    buf.drop()


def test_a_buffer_its_owner_dropped_fails_readers_through_the_future(actors):
    owner, _, _ = actors
    buf = owner.small.call_one("gone").get(timeout=T)
    out = bytearray(4096)
    buf.read_into(out).get(timeout=T)
    assert out == b"x" * 4096
    owner.drop_small.call_one("gone").get(timeout=T)
    fut = buf.read_into(bytearray(4096))  # the check is the owner's: the error comes later
    with pytest.raises(RdmaError, match="gone"):
        fut.get(timeout=T)
    buf.drop()  # the client's copy: forgotten here


def test_client_drop_ends_remote_access(actors):
    _, peer, _ = actors
    mem = bytearray(b"y" * 4096)
    buf = RDMABuffer(mem, name="short-lived")
    assert peer.read_bytes.call_one(buf).get(timeout=T) == bytes(mem)
    copy = pickle.loads(pickle.dumps(buf))
    buf.drop()
    buf.drop()  # idempotent
    with pytest.raises(Exception, match="short-lived") as e:
        peer.read_bytes.call_one(copy).get(timeout=T)
    assert "ropped" in str(e.value), e.value


# --- Bad input ---------------------------------------------------------------------------------


def test_non_contiguous_tensor_is_refused():
    t = torch.zeros(64, 64).t()
    with pytest.raises(ValueError, match="not contiguous"):
        RDMABuffer(t)
    buf = RDMABuffer(torch.zeros(64))
    with pytest.raises(ValueError, match="not contiguous"):
        buf.read_into(torch.zeros(128)[::2])
    buf.drop()


def test_empty_tensor_or_buffer_is_refused():
    with pytest.raises(ValueError, match="empty"):
        RDMABuffer(torch.zeros(0))
    with pytest.raises(ValueError, match="empty"):
        RDMABuffer(bytearray())
    buf = RDMABuffer(bytearray(8))
    with pytest.raises(ValueError, match="empty"):
        buf.write_from(b"")
    buf.drop()


def test_a_read_only_object_is_registered_read_only(actors):
    """bytes are immutable (hashed, shared): peers may read a buffer made from them, and a write
    to it is refused, in this process and from a peer. It used to overwrite the bytes in place."""
    _, peer, _ = actors
    data = bytes(os.urandom(4096))
    copy = bytes(bytearray(data))
    buf = RDMABuffer(data, name="constant")
    assert peer.read_bytes.call_one(buf).get(timeout=T) == copy
    with pytest.raises(ValueError, match="constant.*read-only"):
        buf.write_from(b"ZZ")
    with pytest.raises(Exception, match="read-only") as e:
        peer.write_bytes.call_one(buf, b"ZZ", 0).get(timeout=T)
    assert "constant" in str(e.value), e.value
    assert data == copy
    buf.drop()


def test_a_name_that_is_not_a_str_is_a_type_error():
    with pytest.raises(TypeError, match="name must be a str"):
        RDMABuffer(bytearray(16), name=5)
    with pytest.raises(TypeError, match="name must be a str"):
        RDMABuffer.allocate(16, name=5)


def test_not_a_buffer_is_a_type_error():
    with pytest.raises(TypeError, match="buffer-protocol"):
        RDMABuffer([1, 2, 3])
    with pytest.raises(TypeError, match="buffer-protocol"):
        RDMABuffer("text")


def test_destination_too_small_names_both_sizes():
    buf = RDMABuffer(bytearray(1000))
    with pytest.raises(ValueError) as e:
        buf.read_into(bytearray(999))
    msg = str(e.value)
    assert re.search(r"\b999 bytes\b", msg) and re.search(r"\b1000\b", msg), msg
    with pytest.raises(ValueError) as e:
        buf.read_into(torch.zeros(10, dtype=torch.uint8), offset=100)
    assert "10 bytes" in str(e.value) and "900 bytes" in str(e.value), e.value
    with pytest.raises(ValueError) as e:
        buf.write_from(bytes(600), offset=500)
    assert "600 bytes" in str(e.value) and "1000 bytes" in str(e.value), e.value
    with pytest.raises(ValueError, match="offset 1000"):
        buf.read_into(bytearray(1000), offset=1000)
    with pytest.raises(ValueError, match="read-only"):
        buf.read_into(bytes(1000))
    buf.drop()


def test_a_timeout_outside_0_to_10_million_seconds_is_refused():
    buf = RDMABuffer(bytearray(16))
    with pytest.raises(ValueError, match="timeout"):
        buf.read_into(bytearray(16), timeout=-1)
    with pytest.raises(ValueError, match="timeout"):
        buf.write_from(bytearray(16), timeout=-0.5)
    with pytest.raises(TypeError, match="timeout"):
        buf.read_into(bytearray(16), timeout="1")
    # These reached the native layer as an OverflowError and a pybind11 signature dump.
    for bad in (float("inf"), float("nan"), 1e300):
        with pytest.raises(ValueError, match="at most 10000000 seconds"):
            buf.read_into(bytearray(16), timeout=bad)
    buf.read_into(bytearray(16), timeout=None).get(timeout=T)  # None: the rdma.timeout setting
    buf.read_into(bytearray(16), timeout=86400).get(timeout=T)
    buf.drop()


def test_use_after_drop_raises():
    buf = RDMABuffer(torch.zeros(16))
    buf.drop()
    with pytest.raises(RdmaError, match="dropped"):
        buf.read_into(torch.zeros(16))
    with pytest.raises(RdmaError, match="dropped"):
        buf.write_from(torch.zeros(16))
    with pytest.raises(RdmaError, match="dropped"):
        pickle.dumps(buf)
    assert buf.size() == 64  # still known


def test_import_monarch_does_not_import_torch():
    code = ("import sys, monarch, monarch.actor, monarch.rdma\n"
            "b = monarch.rdma.RDMABuffer(bytearray(8)); b.drop()\n"
            "assert 'torch' not in sys.modules, 'torch imported'\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


# --- Memory the data plane allocates (the shm route), and the channel route --------------------


class ShmOwner(Actor):
    def __init__(self):
        self.buf = RDMABuffer.allocate(BIG, name="shm-weights")
        self.data = torch.frombuffer(self.buf.memory(), dtype=torch.uint8)
        self.data.copy_(pattern(5))

    @endpoint
    def buffer(self):
        return self.buf

    @endpoint
    def holds(self, seed):
        return torch.equal(self.data, pattern(seed))


def test_allocated_buffer_is_read_and_written_over_shm(procs_and_actors):
    procs, _, peer, _ = procs_and_actors
    shm = procs.slice(procs=0).spawn("shm_owner", ShmOwner)
    buf = shm.buffer.call_one().get(timeout=T)
    assert buf.route() == "shm" and buf.route(write=True) == "shm"
    dst = torch.zeros(BIG, dtype=torch.uint8)
    buf.read_into(dst).get(timeout=T)
    assert torch.equal(dst, pattern(5))
    buf.write_from(pattern(6)).get(timeout=T)
    assert shm.holds.call_one(6).get(timeout=T)
    ok, route = peer.read_all.call_one({"buf": buf, "seed": 6}).get(timeout=T)
    assert ok and route == "shm", route
    shm.stop().get(timeout=T)


def test_allocate_gives_zeroed_memory_that_outlives_drop():
    buf = RDMABuffer.allocate(4096, name="scratch")
    view = buf.memory()
    assert view.nbytes == 4096 and not view.readonly and bytes(view) == bytes(4096)
    t = torch.frombuffer(view, dtype=torch.int32)
    t.fill_(7)
    out = torch.zeros(1024, dtype=torch.int32)
    buf.read_into(out).get(timeout=T)
    assert torch.equal(out, t)
    buf.drop()
    del buf, view
    assert int(t.sum()) == 7 * 1024  # the tensor still holds the memory
    with pytest.raises(ValueError, match="allocate"):
        RDMABuffer(bytearray(4)).memory()
    with pytest.raises(ValueError, match="nbytes"):
        RDMABuffer.allocate(0)


CHANNEL_SCRIPT = r"""
import torch
from monarch.actor import Actor, endpoint, this_host
from monarch.rdma import RDMABuffer

class Owner(Actor):
    def __init__(self):
        g = torch.Generator().manual_seed(9)
        self.t = torch.randint(0, 256, (64 << 20,), dtype=torch.uint8, generator=g)
    @endpoint
    def buffer(self):
        return RDMABuffer(self.t)
    @endpoint
    def total(self):
        return int(self.t.sum())

procs = this_host().spawn_procs(per_host={"procs": 1}, name="rdma_channel")
owner = procs.spawn("owner", Owner)
buf = owner.buffer.call_one().get(timeout=30)
assert buf.route() == "channel" and buf.route(write=True) == "channel", buf.route()
dst = torch.zeros(64 << 20, dtype=torch.uint8)
buf.read_into(dst, timeout=30).get(timeout=30)
g = torch.Generator().manual_seed(9)
assert torch.equal(dst, torch.randint(0, 256, (64 << 20,), dtype=torch.uint8, generator=g))
buf.write_from(torch.ones(64 << 20, dtype=torch.uint8), timeout=30).get(timeout=30)
assert owner.total.call_one().get(timeout=30) == 64 << 20
# Transfers still in flight keep their destination / source alive (nobody else refers to them).
import gc
futs = [buf.read_into(bytearray(64 << 20)), buf.write_from(bytes(64 << 20))]
gc.collect()
for f in futs:
    assert f.get(timeout=30) is None
assert owner.total.call_one().get(timeout=30) == 0
procs.stop().get(timeout=30)
print("channel ok")
"""


def test_64_mib_both_ways_over_the_channel_route():
    env = dict(os.environ, MONARCH_RDMA_BACKEND="channel", MONARCH_RDMA_LOCAL_ROUTES="false")
    r = subprocess.run([sys.executable, "-c", CHANNEL_SCRIPT], env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0 and "channel ok" in r.stdout, r.stdout + r.stderr

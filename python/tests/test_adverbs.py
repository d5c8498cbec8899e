"""Every adverb of an endpoint (call, call_one, choose, stream, broadcast, reduce, send) on a
mesh of four real worker procs, and per-sender FIFO order over 10k broadcasts."""

import pickle
import threading
import traceback

import pytest

from monarch.actor import (Accumulator, Actor, Channel, Point, ValueMesh, current_rank, endpoint,
                           send)


class _FailsToLoad:
    """Pickles on the worker; unpickling it (on the caller) raises ZeroDivisionError."""

    def __reduce__(self):
        return (divmod, (1, 0))


class Member(Actor):
    def __init__(self, base):
        self.base = base
        self.seen = []
        self.gate_port, self.gate = Channel.open()

    @endpoint
    def value(self, x=0):
        return self.base + 10 * current_rank().rank + x

    @endpoint
    def rank(self):
        return current_rank().rank

    @endpoint
    def unloadable(self):
        return _FailsToLoad()

    @endpoint
    def record(self, i):
        self.seen.append(i)

    @endpoint
    def take_seen(self):
        out, self.seen = self.seen, []
        return out

    @endpoint
    def gate_port_of(self):
        return self.gate_port

    @endpoint
    def slow_on(self, slow_rank):
        """Member `slow_rank` answers only once its gate port got a message."""
        r = current_rank().rank
        if r == slow_rank:
            self.gate.recv().get(timeout=30)
        return r


@pytest.fixture(scope="module")
def members(procs):
    return procs.spawn("members", Member, 100)


def test_call_gives_a_value_mesh(members):
    vm = members.value.call(1).get(timeout=30)
    assert isinstance(vm, ValueMesh)
    assert len(vm) == 4
    assert vm.values() == [101, 111, 121, 131]
    items = list(vm.items())
    assert [p.rank for p, _ in items] == [0, 1, 2, 3]
    assert all(isinstance(p, Point) and p["gpus"] == p.rank for p, _ in items)
    assert [v for _, v in items] == [101, 111, 121, 131]
    assert vm.item(gpus=2) == 121
    with pytest.raises(KeyError) as missing:
        vm.item()  # gpus has size 4: its coordinate is required
    assert str(missing.value) == "missing coordinate for dim 'gpus' of extent {gpus=4}"
    # A traceback's last line names the exception as callers know it, not a private class.
    assert traceback.format_exception_only(missing.type, missing.value) == [
        "KeyError: missing coordinate for dim 'gpus' of extent {gpus=4}\n"]
    again = pickle.loads(pickle.dumps(missing.value))  # it still pickles (multiprocessing does)
    assert isinstance(again, KeyError) and str(again) == str(missing.value)
    assert vm.item(gpus=-1) == 131 and vm.item(gpus=-4) == 101  # from the end, as slice() counts
    with pytest.raises(IndexError, match="gpus=-5 out of range for size 4"):
        vm.item(gpus=-5)
    for bad in ("2", 2.0, True):  # a TypeError naming the dim, not one from a comparison
        with pytest.raises(TypeError, match="coordinate gpus= takes an int"):
            vm.item(gpus=bad)
    # Monarch's ValueMesh is a mesh: slicing and flattening select values (its test_value_mesh)
    assert vm.slice(gpus=slice(1, 4, 2)).values() == [111, 131]
    assert vm.slice(gpus=2).item() == 121
    grid = vm.split(gpus=("dp", "tp"), tp=2)
    assert grid.sizes == {"dp": 2, "tp": 2} and grid.item(dp=1, tp=0) == 121
    assert grid.slice(tp=1).values() == [111, 131]
    assert grid.flatten("all").values() == vm.values()
    assert grid.rename(dp="data").slice(data=0).values() == [101, 111]


def test_call_on_a_slice_covers_only_the_slice(members):
    vm = members.slice(gpus=slice(1, 3)).value.call(x=2).get(timeout=30)
    assert vm.values() == [112, 122]
    assert vm.item(gpus=0) == 112


def test_call_one(members):
    assert members.slice(gpus=3).value.call_one(5).get(timeout=30) == 135


def test_call_one_on_many_members_names_the_mesh_and_size(members):
    with pytest.raises(ValueError) as ei:  # monarch.errors.UsageError
        members.value.call_one().get(timeout=30)
    text = str(ei.value)
    assert "members" in text and "4" in text, text


def test_choose_picks_one_member(members):
    got = {members.rank.choose().get(timeout=30) for _ in range(40)}
    assert got <= {0, 1, 2, 3}
    assert len(got) > 1  # 40 random picks of 4 landing on one member: p = 4 * 4**-40


def test_stream_yields_in_arrival_order(members):
    gate = members.slice(gpus=2).gate_port_of.call_one().get(timeout=30)
    it = members.slow_on.stream(2)
    first = [next(it).get(timeout=30) for _ in range(3)]
    assert sorted(first) == [0, 1, 3]  # member 2 cannot answer yet: it waits for the gate
    gate.send("go")
    assert next(it).get(timeout=30) == 2
    assert list(it) == []


def test_broadcast_returns_none(members):
    assert members.record.broadcast("b") is None
    assert members.take_seen.call().get(timeout=30).values() == [["b"]] * 4


def test_reduce_builtins(members):
    # values are 100, 110, 120, 130
    assert members.value.reduce("sum").get(timeout=30) == 460
    assert members.value.reduce("min").get(timeout=30) == 100
    assert members.value.reduce("max").get(timeout=30) == 130
    with pytest.raises(ValueError):
        members.value.reduce("median")


def test_a_raising_reducer_and_an_unpicklable_reply_name_the_endpoint(members):
    """They said `endpoint reduce of actor  raised` and `endpoint: the reply cannot be
    unpickled`, naming neither the endpoint nor the mesh."""
    from monarch.actor import ActorError, MonarchError

    def boom(a, b):
        raise KeyError("no combine")

    with pytest.raises(ActorError, match=r"endpoint members\.value: the reducer raised") as ei:
        members.value.reduce(boom).get(timeout=30)
    assert isinstance(ei.value.exception, KeyError)
    with pytest.raises(MonarchError, match=r"endpoint members\.unloadable: the reply cannot be "
                                           "unpickled here: ZeroDivisionError"):
        members.slice(gpus=0).unloadable.call_one().get(timeout=30)
    vm = members.unloadable.call().get(timeout=30)
    assert "endpoint members.unloadable: the reply of rank 1" in str(vm.error(gpus=1))


def test_reduce_with_a_lambda(members):
    assert members.value.reduce(lambda a, b: a * b % 1000003, 1).get(timeout=30) == (
        101 * 111 * 121 * 131) % 1000003


def test_accumulator(members):
    acc = Accumulator(members.value, [], lambda a, b: (a if isinstance(a, list) else [a]) +
                      (b if isinstance(b, list) else [b]))
    assert sorted(acc.accumulate().get(timeout=30)) == [100, 110, 120, 130]
    total = Accumulator(members.value, 1000, lambda a, b: a + b)
    assert total.accumulate(x=1).get(timeout=30) == 1000 + 101 + 111 + 121 + 131


def test_accumulator_errors_name_the_endpoint_and_bad_arguments_fail_at_construction(members):
    from monarch.actor import ActorError
    with pytest.raises(TypeError, match="endpoint must be an actor mesh's endpoint"):
        Accumulator(lambda: 1, 0, lambda a, b: a + b)
    with pytest.raises(TypeError, match="combine must be a callable"):
        Accumulator(members.value, 0, "sum")
    wrong_arity = Accumulator(members.value, 0, lambda a: a)
    with pytest.raises(ActorError, match=r"endpoint members\.value: the (reducer|accumulator)"):
        wrong_arity.accumulate().get(timeout=30)


def test_send_all_to_a_port(members):
    port, rx = Channel.open()
    assert send(members.value, (3,), {}, port=port, selection="all") is None
    got = sorted(rx.recv().get(timeout=30) for _ in range(4))
    assert got == [103, 113, 123, 133]


def test_send_choose_reaches_one_member(members):
    port, rx = Channel.open()
    send(members.value, args=(), kwargs={"x": 7}, port=port, selection="choose")
    assert rx.recv().get(timeout=30) in (107, 117, 127, 137)
    # Every member answers this call after anything it sent to the port before (FIFO per sender
    # pair), so no second reply can still be on its way.
    members.rank.call().get(timeout=30)
    assert rx.try_recv() is None


def test_send_without_port_and_bad_selection(members):
    send(members.record, ("s",))
    assert members.take_seen.call().get(timeout=30).values() == [["s"]] * 4
    with pytest.raises(ValueError):
        send(members.record, ("s",), selection="some")
    with pytest.raises(TypeError):
        send(members.record, ("s",), port=object())
    with pytest.raises(TypeError):
        send(lambda: None, ())


def test_fifo_over_10k_broadcasts(members):
    n = 10000
    for i in range(n):
        members.record.broadcast(i)
    seen = members.take_seen.call().get(timeout=60).values()
    for rank, s in enumerate(seen):
        assert len(s) == n, "member %d saw %d of %d broadcasts" % (rank, len(s), n)
        assert s == list(range(n)), "member %d saw the broadcasts out of order" % rank


def test_call_one_after_a_broadcast_sees_it(members):
    """One sender's broadcast then call_one to the same member arrive in send order (PY-1). The
    call_one took the direct way and overtook the broadcast's way through the tree: 200 of 200
    reads after a write were stale."""
    one = members.slice(gpus=3)
    one.take_seen.call_one().get(timeout=30)
    for i in range(100):
        members.record.broadcast(i)  # the whole mesh: through comm[0], then member 3's proc
        assert one.take_seen.call_one().get(timeout=30) == [i]
        one.record.broadcast(-i)  # a one-member slice
        assert one.take_seen.call_one().get(timeout=30) == [-i]
    members.take_seen.call().get(timeout=30)


def test_choose_after_a_broadcast_sees_it(members):
    for i in range(50):
        members.record.broadcast(i)
        assert members.take_seen.choose().get(timeout=30)[-1:] == [i]
    members.take_seen.call().get(timeout=30)


def test_interleaved_call_one_and_broadcast_keep_send_order(members):
    one = members.slice(gpus=1)
    one.take_seen.call_one().get(timeout=30)
    pending = []
    for i in range(600):
        if i % 3 == 0:
            pending.append(one.record.call_one(i))
        else:
            one.record.broadcast(i)
    for f in pending:
        f.get(timeout=30)
    assert one.take_seen.call_one().get(timeout=30) == list(range(600))
    members.take_seen.call().get(timeout=30)


def test_choose_picks_only_members_on_live_procs(fault_hook):
    """choose() and send(selection="choose") skip a proc known dead: a fifth of the picks used to
    land on it and fail with SupervisionError although three members were alive."""
    import os
    import signal
    import time

    from monarch.actor import MeshFailure, this_host

    pm = this_host().spawn_procs(per_host={"gpus": 4}, name="choosy")
    try:
        m = pm.spawn("pids", Pid)
        pids = m.pid.call().get(timeout=60).values()
        os.kill(pids[2], signal.SIGKILL)
        deadline = time.monotonic() + 60
        failure = None
        while failure is None:  # the fault hook hears of the dead proc
            got = fault_hook.get(timeout=max(deadline - time.monotonic(), 0.1))
            failure = got if isinstance(got, MeshFailure) else None
        assert 2 in failure.ranks, failure
        picked = {m.rank.choose().get(timeout=30) for _ in range(60)}
        assert picked == {0, 1, 3}, picked
        port, recv = Channel.open()
        for _ in range(30):
            send(m.rank, port=port, selection="choose")
        sent = {recv.recv().get(timeout=30) for _ in range(30)}
        assert 2 not in sent and sent <= {0, 1, 3}, sent
    finally:
        pm.stop().get(timeout=60)


class Pid(Actor):
    @endpoint
    def pid(self):
        import os
        return os.getpid()

    @endpoint
    def rank(self):
        return current_rank().rank


_GATE = threading.Event()    # per proc: Parked.park waits on it
_PARKED = threading.Event()  # per proc: set once park runs


class Parked(Actor):
    @endpoint
    def park(self):
        _PARKED.set()
        if not _GATE.wait(60):
            raise TimeoutError("park: never released")
        return current_rank().rank


class Gatekeeper(Actor):
    @endpoint
    def parked(self):
        return _PARKED.is_set()

    @endpoint
    def release(self):
        _GATE.set()


def test_a_member_whose_proc_dies_during_a_call_is_named(fault_hook):
    """The slot of a member whose proc died while a call waited on it named the cast tree's
    comm actor on that proc (monarch.comm), not the member."""
    import os
    import signal
    import time

    from monarch.actor import MeshFailure, SupervisionError, this_host

    pm = this_host().spawn_procs(per_host={"gpus": 4}, name="dying")
    try:
        pids = pm.spawn("pids", Pid).pid.call().get(timeout=60).values()
        parked, keeper = pm.spawn("parked", Parked), pm.spawn("keeper", Gatekeeper)
        pending = parked.park.call()
        deadline = time.monotonic() + 60
        while not all(keeper.parked.call().get(timeout=30).values()):  # every member waits
            assert time.monotonic() < deadline, "the members never started park()"
        os.kill(pids[2], signal.SIGKILL)
        failure = None
        while failure is None:  # the fault hook hears of the dead proc
            got = fault_hook.get(timeout=max(deadline - time.monotonic(), 0.1))
            failure = got if isinstance(got, MeshFailure) else None
        keeper.survivors().release.broadcast()
        got = pending.get(timeout=60)
        assert got.failed_ranks() == [2]
        assert [got.item(gpus=r) for r in (0, 1, 3)] == [0, 1, 3]
        err = got.error(gpus=2)
        assert isinstance(err, SupervisionError), repr(err)
        assert ".parked[" in str(err) and "monarch.comm" not in str(err), str(err)
        assert "SIGKILL" in str(err), str(err)
    finally:
        pm.stop().get(timeout=60)

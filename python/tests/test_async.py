"""async def endpoints, one message at a time unless @concurrent_endpoint, and Futures:
get/await/result/exception, get() inside a running loop, TimeoutError leaving a future usable."""

import asyncio
import functools
import socket
import threading

import pytest

import monarch.errors
from monarch.actor import (Accumulator, Actor, ActorError, Channel, concurrent_endpoint,
                           current_rank, endpoint, this_host)


class Plain(Actor):
    def __init__(self):
        self.gate_port, self.gate = Channel.open()

    @endpoint
    def value(self, x):
        return 10 * current_rank().rank + x

    @endpoint
    def fail(self):
        raise ValueError("plain failure")

    @endpoint
    def gate_port_of(self):
        return self.gate_port

    @endpoint
    def gated(self, x):
        return (self.gate.recv().get(timeout=30), x)


class Async(Actor):
    def __init__(self):
        self.active = 0
        self.most = 0
        self.order = []
        self.waiting = 0
        self.met = None

    @endpoint
    async def relay(self, other, x):
        vm = await other.value.call(x)
        one = await other.slice(gpus=3).value.call_one(x)
        return vm.values(), one

    @endpoint
    async def busy(self, i):
        self.active += 1
        self.most = max(self.most, self.active)
        for _ in range(20):
            await asyncio.sleep(0)  # lets any other coroutine of this actor run meanwhile
        self.order.append(i)
        self.active -= 1
        return i

    @endpoint
    async def stats(self):
        return self.most, self.order

    @endpoint
    async def whoami(self):
        return current_rank().rank

    @endpoint
    async def gather_stream(self, other):
        """Awaits each Future of a stream from `other`, whose members share this one's procs
        (and their asyncio loops): awaiting must leave the loop free for them to answer."""
        return sorted([await f for f in other.whoami.stream()])

    @endpoint
    async def blocking_get(self, other):
        try:
            other.slice(gpus=0).value.call_one(1).get(timeout=5)
        except RuntimeError as e:
            return "RuntimeError: %s" % e
        return "no error"

    @concurrent_endpoint
    async def meet(self):
        """Returns only once two meet() calls run at the same time (10 s deadline)."""
        if self.met is None:
            self.met = asyncio.Event()
        self.waiting += 1
        if self.waiting == 2:
            self.met.set()
        await asyncio.wait_for(self.met.wait(), timeout=10)
        return "met"


class SyncConcurrent(Actor):
    def __init__(self):
        self.barrier = threading.Barrier(2, timeout=10)

    @concurrent_endpoint
    def meet(self):
        self.barrier.wait()  # BrokenBarrierError unless two run at once
        return "met"

    @endpoint
    def value(self):
        return current_rank().rank


@pytest.fixture(scope="module")
def plain(procs):
    return procs.spawn("plain", Plain)


@pytest.fixture(scope="module")
def asyncs(procs):
    return procs.spawn("asyncs", Async)


def test_async_endpoint_awaits_another_mesh(asyncs, plain):
    got = asyncs.slice(gpus=0).relay.call_one(plain, 1).get(timeout=30)
    assert got == ([1, 11, 21, 31], 31)
    vm = asyncs.relay.call(plain, 2).get(timeout=30)
    assert vm.values() == [([2, 12, 22, 32], 32)] * 4


def test_an_async_endpoint_awaits_a_stream_from_actors_on_its_own_procs(procs, asyncs):
    """stream() returns at once; awaiting its Futures does not block the proc's loop, which the
    streamed actors (async too, on the same procs) need to answer (Monarch's
    test_mesh_passed_to_mesh hung here: stream() waited for each reply inside next())."""
    others = procs.spawn("others", Async)
    got = asyncs.slice(gpus=0).gather_stream.call_one(others).get(timeout=30)
    assert got == [0, 1, 2, 3]
    vm = asyncs.gather_stream.call(others).get(timeout=30)
    assert vm.values() == [[0, 1, 2, 3]] * 4


def test_awaits_on_a_stream_hold_no_thread_and_can_be_cancelled(plain):
    """Waiting on a stream's Futures in a loop holds no executor thread: twelve awaits on a
    reply that waits for a gate (more than the default executor's threads here) do not hold up
    another stream, and a cancelled await leaves nothing behind that asyncio.run waits for."""
    one = plain.slice(gpus=1)
    gate = one.gate_port_of.call_one().get(timeout=30)

    async def main():
        slow = list(one.gated.stream(7))  # answers once the gate opens
        waits = [asyncio.ensure_future(slow[0]) for _ in range(12)]
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(slow[0], 0.2)
        fast = list(plain.slice(gpus=0).value.stream(1))
        assert await asyncio.wait_for(fast[0], 30) == 1
        gate.send("go")
        return await asyncio.wait_for(asyncio.gather(*waits), 30)

    assert asyncio.run(main()) == [("go", 7)] * 12


def test_stream_inside_a_loop_before_the_procs_are_up_is_queued():
    gate = socket.socket()
    gate.bind(("127.0.0.1", 0))
    gate.listen(8)
    procs = this_host().spawn_procs(per_host={"gpus": 2}, name="streamq",
                                    bootstrap=functools.partial(_wait_for_gate,
                                                                gate.getsockname()[1]))

    async def main():
        plain = procs.spawn("plain", Plain)
        futs = list(plain.value.stream(5))  # returns at once: queued until the procs are up
        assert len(futs) == 2 and not any(f.done() for f in futs)
        # A mesh not up yet cannot be pickled into an argument without blocking the loop: the
        # error says what to await (not "cannot be serialised").
        with pytest.raises(RuntimeError, match="await procs.initialized"):
            plain.value.call(plain)
        gate.close()
        return sorted([await asyncio.wait_for(f, timeout=60) for f in futs])

    try:
        assert asyncio.run(main()) == [5, 15]
    finally:
        procs.stop().get(timeout=60)


def test_async_endpoints_run_one_at_a_time(asyncs):
    one = asyncs.slice(gpus=1)
    futs = [one.busy.call_one(i) for i in range(20)]
    assert [f.get(timeout=30) for f in futs] == list(range(20))
    most, order = one.stats.call_one().get(timeout=30)
    assert most == 1, "%d async handlers of one actor ran at once" % most
    assert order == list(range(20))


def test_concurrent_async_endpoint_overlaps(asyncs):
    one = asyncs.slice(gpus=2)
    a, b = one.meet.call_one(), one.meet.call_one()
    assert a.get(timeout=30) == "met" and b.get(timeout=30) == "met"


def test_concurrent_def_endpoint_overlaps(procs):
    m = procs.slice(gpus=0).spawn("syncconc", SyncConcurrent)
    a, b = m.meet.call_one(), m.meet.call_one()
    assert a.get(timeout=30) == "met" and b.get(timeout=30) == "met"
    assert m.value.call_one().get(timeout=30) == 0
    m.stop().get(timeout=30)


def test_get_inside_an_async_endpoint_raises(asyncs, plain):
    text = asyncs.slice(gpus=0).blocking_get.call_one(plain).get(timeout=30)
    assert text.startswith("RuntimeError:") and "await" in text, text


def test_get_inside_a_running_loop_raises(plain):
    async def main():
        fut = plain.slice(gpus=0).value.call_one(1)
        with pytest.raises(RuntimeError, match="event loop"):
            fut.get()
        with pytest.raises(RuntimeError):
            fut.result()
        return await fut

    assert asyncio.run(main()) == 1


def test_await_a_future(plain):
    async def main():
        vm = await plain.value.call(3)
        one = await plain.slice(gpus=2).value.call_one(4)
        with pytest.raises(ActorError):
            await plain.slice(gpus=1).fail.call_one()
        return vm.values(), one

    assert asyncio.run(main()) == ([3, 13, 23, 33], 24)


def test_result_and_exception(plain):
    ok = plain.slice(gpus=3).value.call_one(0)
    assert ok.result(timeout=30) == 30
    assert ok.exception(timeout=30) is None
    assert ok.get() == 30  # the value can be read again
    bad = plain.slice(gpus=3).fail.call_one()
    e = bad.exception(timeout=30)
    assert isinstance(e, ActorError) and isinstance(e.exception, ValueError)
    with pytest.raises(ActorError):
        bad.result()
    assert bad.done() and ok.done()


def test_timeout_leaves_the_future_usable(plain):
    one = plain.slice(gpus=1)
    gate = one.gate_port_of.call_one().get(timeout=30)
    fut = one.gated.call_one("x")
    with pytest.raises(TimeoutError) as ei:  # the built-in, and monarch's
        fut.get(timeout=0.1)
    assert isinstance(ei.value, monarch.errors.TimeoutError)
    with pytest.raises(TimeoutError):
        fut.exception(timeout=0)
    assert not fut.done()
    gate.send("open")
    assert fut.get(timeout=30) == ("open", "x")
    assert fut.get(timeout=0) == ("open", "x")


def test_mixing_def_and_async_def_is_refused_at_spawn(procs):
    class Mixed(Actor):
        @endpoint
        def sync_one(self):
            return 1

        @endpoint
        async def async_one(self):
            return 2

    with pytest.raises(TypeError) as ei:
        procs.spawn("mixed", Mixed)
    text = str(ei.value)
    assert "sync_one" in text and "async_one" in text and "Mixed" in text, text


# --- Operations on a mesh whose procs are not up yet, inside a running loop ---------------------


def _wait_for_gate(port):
    """A bootstrap that holds its proc back until the test closes its listening socket on
    ``port``: the pending connection is then reset, and a later one refused (60 s at most)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
            s.recv(1)
    except OSError:
        pass


def _explode():
    raise RuntimeError("bootstrap exploded on purpose")


class Recorder(Actor):
    def __init__(self):
        self.log = []

    @endpoint
    async def note(self, i):
        self.log.append(i)
        return i

    @endpoint
    async def seen(self):
        return self.log


def test_operations_before_the_procs_are_up_are_queued_in_issue_order():
    """Inside a running loop, operations on meshes whose procs are still starting return at
    once and are sent in issue order once they are up, also those issued just after. (Order
    holds per view: the runtime does not order a whole-mesh cast after a one-member view's
    direct send, with or without queuing, so each mesh here gets one kind of send.)"""
    gate = socket.socket()
    gate.bind(("127.0.0.1", 0))
    gate.listen(8)  # never accepted: closing it resets both procs' connections
    procs = this_host().spawn_procs(per_host={"gpus": 2}, name="queued",
                                    bootstrap=functools.partial(_wait_for_gate, gate.getsockname()[1]))

    async def main():
        rec = procs.spawn("rec", Recorder)
        solo = procs.slice(gpus=1).spawn("solo", Recorder)  # sliced before the procs are up
        futs, whole, one = [], [], []

        def issue(i):
            kind = i % 6
            if kind == 0:
                rec.note.broadcast(i)
            elif kind == 1:
                futs.append(rec.note.call(i))
            elif kind == 2:
                futs.append(rec.note.reduce("max", i))
            elif kind == 3:
                futs.append(Accumulator(rec.note, 0, lambda a, b: a + b).accumulate(i))
            elif kind == 4:
                futs.append(solo.note.call_one(i))
            else:
                futs.append(solo.note.choose(i))
            (one if kind >= 4 else whole).append(i)

        for i in range(30):
            issue(i)
        assert not procs.initialized.done(), "the procs came up before the gate opened"
        gate.close()
        await asyncio.wait_for(procs.initialized, timeout=60)
        for i in range(30, 50):  # right after they are up: behind the queued ones
            issue(i)
        got = [await asyncio.wait_for(f, timeout=60) for f in futs]
        assert [g.values() if hasattr(g, "values") else g for g in got][:4] == [
            [1, 1], 2, 3 + 3, 4]
        return (whole, one, (await rec.seen.call()).values(),
                await solo.seen.call_one())

    try:
        whole, one, seen, seen_solo = asyncio.run(main())
        assert seen == [whole, whole]
        assert seen_solo == one
    finally:
        procs.stop().get(timeout=60)


def test_queued_operations_fail_with_the_spawn_error(fault_hook):
    procs = this_host().spawn_procs(per_host={"gpus": 2}, bootstrap=_explode, name="badqueue")

    async def main():
        rec = procs.spawn("rec", Recorder)
        futs = [rec.note.call(1), rec.slice(gpus=0).note.call_one(2), rec.note.choose(3),
                rec.note.reduce("sum", 4)]
        rec.note.broadcast(5)
        with pytest.raises(Exception) as ei:
            await asyncio.wait_for(procs.initialized, timeout=60)
        errors = []
        for f in futs:
            with pytest.raises(Exception) as e:
                await asyncio.wait_for(f, timeout=60)
            errors.append(e.value)
        return ei.value, errors

    spawn_error, errors = asyncio.run(main())
    assert "bootstrap exploded on purpose" in str(spawn_error), str(spawn_error)
    for e in errors:
        assert type(e) is type(spawn_error) and str(e) == str(spawn_error), repr(e)
    lost = fault_hook.get(timeout=60)  # the broadcast: where an undeliverable one goes
    assert "bootstrap exploded on purpose" in str(lost), str(lost)
    with pytest.raises(type(spawn_error)):  # sync code: raises at the call site, as before
        procs.spawn("rec2", Recorder).note.broadcast(6)


class QueuedBroadcaster(Actor):
    """Spawns procs that fail to start from an async endpoint and broadcasts to them before they
    are up (the broadcast is queued)."""

    def __init__(self, report):
        self.report = report

    @endpoint
    async def broadcast_to_bad_procs(self):
        procs = this_host().spawn_procs(per_host={"gpus": 2}, bootstrap=_explode, name="badowned")
        procs.spawn("rec", Recorder).note.broadcast(1)
        with pytest.raises(Exception):
            await asyncio.wait_for(procs.initialized, timeout=60)
        return "spawn failed"

    @endpoint
    async def alive(self):
        return "alive"


class HandlingQueuedBroadcaster(QueuedBroadcaster):
    def _handle_undeliverable_message(self, message):
        self.report.send((message.sender(), message.dest(), message.reason(),
                          message.error_msg()))
        return True


def test_a_lost_queued_broadcast_reaches_the_actors_undeliverable_hook(fault_hook):
    """PY-7 for a broadcast queued until its procs were up, which failed to start: the sending
    actor's _handle_undeliverable_message decides, on its own thread, as for any lost broadcast
    (it used to fail the actor whatever its hook said, taking its proc down)."""
    report, rx = Channel.open()
    pm = this_host().spawn_procs(per_host={"gpus": 1}, name="queued-owner")
    try:
        b = pm.spawn("b", HandlingQueuedBroadcaster, report)
        assert b.broadcast_to_bad_procs.call_one().get(timeout=60) == "spawn failed"
        sender, dest, reason, text = rx.recv().get(timeout=60)
        assert ".b[" in sender and dest == "rec", (sender, dest)
        assert "bootstrap exploded on purpose" in reason, reason
        assert text.startswith("endpoint rec.note: a broadcast sent before its procs were up "
                               "could not be sent: ") and text.endswith(reason), text
        assert b.alive.call_one().get(timeout=30) == "alive"
        assert rx.try_recv() is None and fault_hook.empty()
    finally:
        pm.stop().get(timeout=30)


def test_a_lost_queued_broadcast_fails_an_actor_without_the_hook(fault_hook):
    report, _rx = Channel.open()
    pm = this_host().spawn_procs(per_host={"gpus": 1}, name="queued-nohook")
    try:
        b = pm.spawn("b", QueuedBroadcaster, report)
        try:
            b.broadcast_to_bad_procs.call_one().get(timeout=60)
        except monarch.errors.SupervisionError:
            pass  # the actor may fail before its answer is sent
        failure = fault_hook.get(timeout=60)  # its mesh's owner, the client, hears it
        assert "a broadcast sent before its procs were up could not be sent" in str(failure)
        assert "bootstrap exploded on purpose" in str(failure), str(failure)
        with pytest.raises(monarch.errors.SupervisionError):
            b.alive.call_one().get(timeout=30)
    finally:
        pm.stop().get(timeout=30)

"""Errors both ways: ActorError from a call (the actor lives), a raising broadcast handler
failing its actor (-> unhandled_fault_hook), __supervise__ of procs an actor spawned with one of
them SIGKILLed, __cleanup__ on stop, bad input, stop() and context managers."""

import asyncio
import os
import signal
import threading
import time

import pytest

import monarch.errors
from monarch.actor import (Actor, ActorError, Channel, MeshFailure, SupervisionError,
                           current_rank, endpoint, this_host, this_proc)

from conftest import pid_alive, run_client, wait_exited


class Faulty(Actor):
    def __init__(self):
        self.calls = 0

    @endpoint
    def ok(self, x=None):
        self.calls += 1
        return ("ok", current_rank().rank, self.calls)

    @endpoint
    def fail(self, text):
        raise ValueError(text)

    @endpoint
    def fail_uncarried(self):
        e = RuntimeError("carries a lock")
        e.lock = threading.Lock()  # cannot be pickled: only the text can travel
        raise e

    @endpoint
    def unpicklable_result(self):
        return threading.Lock()

    @endpoint
    def pid(self):
        return os.getpid()

    @endpoint
    def call_failing(self, other):
        """Lets another actor's ActorError propagate through this handler."""
        return other.fail.call_one("nested failure").get(timeout=30)

    @endpoint
    def big_result(self, n):
        return b"r" * n


class NotAnActor:
    @endpoint
    def ok(self):
        return 1


@pytest.fixture(scope="module")
def faulty(procs):
    return procs.spawn("faulty", Faulty)


# --- exceptions of call handlers ---------------------------------------------------------------


def test_actor_error_carries_the_remote_traceback_and_the_actor_lives(faulty):
    one = faulty.slice(gpus=1)
    with pytest.raises(ActorError) as ei:
        one.fail.call_one("bad value 42").get(timeout=30)
    e = ei.value
    assert isinstance(e.exception, ValueError) and str(e.exception) == "bad value 42"
    text = str(e)
    assert "Traceback" in text and "in fail" in text and "bad value 42" in text, text
    assert "Faulty.fail" in text and "faulty" in e.actor
    assert one.ok.call_one().get(timeout=30)[:2] == ("ok", 1)


def test_call_holds_each_member_error_in_the_value_mesh(faulty):
    vm = faulty.fail.call("every member").get(timeout=30)
    assert len(vm) == 4 and vm.failed_ranks() == [0, 1, 2, 3]
    assert isinstance(vm.error(gpus=2), ActorError)
    with pytest.raises(ActorError, match="every member"):
        vm.item(gpus=0)
    with pytest.raises(ActorError):
        vm.values()
    assert [v[1] for v in faulty.ok.call().get(timeout=30).values()] == [0, 1, 2, 3]


def test_actor_error_through_another_actor(faulty):
    with pytest.raises(ActorError) as ei:
        faulty.slice(gpus=0).call_failing.call_one(faulty.slice(gpus=3)).get(timeout=30)
    e = ei.value
    assert isinstance(e.exception, ActorError)  # what the middle actor got
    assert isinstance(e.exception.exception, ValueError)  # what the last one raised
    text = str(e)
    assert "Faulty.call_failing" in text and "Faulty.fail" in text and "nested failure" in text


def test_an_exception_that_cannot_travel_still_gives_its_text(faulty):
    with pytest.raises(ActorError) as ei:
        faulty.slice(gpus=0).fail_uncarried.call_one().get(timeout=30)
    assert ei.value.exception is None
    assert "carries a lock" in str(ei.value) and "RuntimeError" in str(ei.value)


def test_unpicklable_result_is_the_handlers_error(faulty):
    with pytest.raises(ActorError) as ei:
        faulty.slice(gpus=0).unpicklable_result.call_one().get(timeout=30)
    assert isinstance(ei.value.exception, TypeError)
    assert "unpicklable_result" in str(ei.value)


# --- failures that reach supervision ------------------------------------------------------------


def test_raising_broadcast_handler_fails_the_actor_and_reaches_the_hook(fault_hook):
    pm = this_host().spawn_procs(per_host={"gpus": 2}, name="bcastfail")
    try:
        m = pm.spawn("faulty", Faulty)
        assert len(m.ok.call().get(timeout=30)) == 2
        m.slice(gpus=1).fail.broadcast("broadcast boom")
        failure = fault_hook.get(timeout=30)
        assert isinstance(failure, MeshFailure), repr(failure)
        assert failure.mesh == "bcastfail" and failure.ranks == [1]
        assert "broadcast boom" in failure.report() and "Faulty.fail" in failure.report()
        vm = m.ok.call().get(timeout=30)
        assert vm.item(gpus=0)[:2] == ("ok", 0)
        assert isinstance(vm.error(gpus=1), SupervisionError)
    finally:
        pm.stop().get(timeout=30)


def test_default_hook_prints_and_exits_nonzero(tmp_path):
    r = run_client(tmp_path, """
        from monarch.actor import Actor, endpoint, this_host

        class Bad(Actor):
            @endpoint
            def fail(self):
                raise ValueError("nobody handles this")

            @endpoint
            def ok(self):
                return 1

        procs = this_host().spawn_procs(per_host={"gpus": 1})
        m = procs.spawn("bad", Bad)
        m.ok.call_one().get(timeout=30)
        m.fail.broadcast()
        try:
            m.ok.call_one().get(timeout=30)
        except Exception:
            pass  # the actor failed; the hook may exit before or after this call fails
        import threading
        threading.Event().wait(30)  # the hook exits the process long before
        print("NOT REACHED", flush=True)
        raise SystemExit(3)
    """, timeout=60)
    assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
    assert "unhandled failure" in r.stderr and "nobody handles this" in r.stderr, r.stderr


@pytest.mark.parametrize("hook,code,text", [
    ("raise RuntimeError('the hook broke')", 1, "raised RuntimeError: the hook broke"),
    ("raise SystemExit(7)", 7, None),
])
def test_a_fault_hook_that_raises_exits_the_client(tmp_path, hook, code, text):
    """A raising hook was reported as ignored (and called a second time, with the failure's
    text), and the client went on as if the failure had been handled."""
    r = run_client(tmp_path, """
        import os, sys, threading
        import monarch.actor as ma
        from monarch.actor import Actor, endpoint, this_host

        calls = []

        def hook(failure):
            calls.append(failure)
            print("HOOK", len(calls), type(failure).__name__, flush=True)
            %s

        ma.unhandled_fault_hook = hook

        class Dies(Actor):
            @endpoint
            def die(self):
                os._exit(4)

        procs = this_host().spawn_procs(per_host={"gpus": 1})
        m = procs.spawn("dies", Dies)
        m.die.broadcast()
        threading.Event().wait(30)  # the hook's failure exits the process long before
        print("NOT REACHED", flush=True)
    """ % hook, timeout=60)
    assert r.returncode == code, (r.returncode, r.stdout, r.stderr)
    assert "NOT REACHED" not in r.stdout and r.stdout.count("HOOK") == 1, r.stdout
    if text is not None:
        assert "unhandled failure" in r.stderr and text in r.stderr, r.stderr


def test_a_proc_that_crashes_while_its_mesh_stops_is_reported(tmp_path):
    """A __cleanup__ that ended its proc with an error during ProcMesh.stop() went unreported."""
    r = run_client(tmp_path, """
        import os
        from monarch.actor import Actor, endpoint, this_host

        class Dies(Actor):
            @endpoint
            def ok(self):
                return 1

            def __cleanup__(self, exc):
                os._exit(3)

        procs = this_host().spawn_procs(per_host={"gpus": 2}, name="crashy")
        m = procs.spawn("dies", Dies)
        m.ok.call().get(timeout=30)
        procs.stop().get(timeout=60)
        print("STOPPED", flush=True)
    """, timeout=90)
    assert r.returncode == 0 and "STOPPED" in r.stdout, (r.returncode, r.stdout, r.stderr)
    for rank in (0, 1):
        assert ("proc mesh crashy: rank %d exited with code 3 while it stopped" % rank
                in r.stderr), r.stderr


class Child(Actor):
    @endpoint
    def pid(self):
        return os.getpid()

    @endpoint
    def ping(self):
        return current_rank().rank


class Supervisor(Actor):
    def __init__(self, port):
        self.port = port

    @endpoint
    def start(self):
        self.kid_procs = this_host().spawn_procs(per_host={"gpus": 2}, name="kids")
        self.kids = self.kid_procs.spawn("kid", Child)
        return self.kids.pid.call().get(timeout=30).values()

    def __supervise__(self, failure):
        self.port.send((type(failure).__name__, failure.mesh, failure.ranks, failure.cause,
                        failure.report()))
        return True

    @endpoint
    def ask_survivors(self):
        s = self.kids.survivors()
        return len(s), s.ping.call().get(timeout=30).values()

    @endpoint
    def alive(self):
        return "alive"


def test_supervise_sees_a_sigkilled_proc_and_survivors_answer():
    pm = this_host().spawn_procs(per_host={"gpus": 1}, name="supervisor")
    port, rx = Channel.open()
    try:
        sup = pm.spawn("sup", Supervisor, port)
        pids = sup.start.call_one().get(timeout=30)
        assert len(pids) == 2 and os.getpid() not in pids
        os.kill(pids[1], signal.SIGKILL)
        kind, mesh, ranks, cause, report = rx.recv().get(timeout=30)
        assert kind == "MeshFailure" and mesh == "kids" and ranks == [1], report
        assert "SIGKILL" in cause or "signal 9" in cause, cause
        assert "rank" in report and "1" in report
        assert sup.ask_survivors.call_one().get(timeout=30) == (1, [0])
        assert sup.alive.call_one().get(timeout=30) == "alive"
    finally:
        pm.stop().get(timeout=30)
    assert not pid_alive(pids[1])


class AsyncHookSupervisor(Supervisor):
    """Sync endpoints, an async def __supervise__ (it runs on the proc's event loop)."""

    async def __supervise__(self, failure):
        # Suspend once on the loop (a future the loop itself completes), so the hook resumes after
        # an await, as a real one would.
        done = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().call_soon(done.set_result, None)
        await done
        self.port.send(("async", failure.mesh, failure.ranks, failure.cause, failure.report()))
        return True


def test_async_supervise_hook():
    pm = this_host().spawn_procs(per_host={"gpus": 1}, name="asupervisor")
    port, rx = Channel.open()
    try:
        sup = pm.spawn("sup", AsyncHookSupervisor, port)
        pids = sup.start.call_one().get(timeout=30)
        os.kill(pids[0], signal.SIGKILL)
        kind, mesh, ranks, cause, _ = rx.recv().get(timeout=30)
        assert (kind, mesh, ranks) == ("async", "kids", [0]) and "SIGKILL" in cause
        assert sup.ask_survivors.call_one().get(timeout=30) == (1, [1])
    finally:
        pm.stop().get(timeout=30)


class Refuser(Supervisor):
    def __supervise__(self, failure):
        self.port.send(failure.ranks)
        return False  # not handled: the supervisor fails, and its owner (the client) hears


def test_unhandled_supervision_reaches_the_client_hook(fault_hook):
    pm = this_host().spawn_procs(per_host={"gpus": 1}, name="refuser")
    port, rx = Channel.open()
    try:
        sup = pm.spawn("sup", Refuser, port)
        pids = sup.start.call_one().get(timeout=30)
        os.kill(pids[1], signal.SIGKILL)
        assert rx.recv().get(timeout=30) == [1]
        failure = fault_hook.get(timeout=30)
        assert isinstance(failure, MeshFailure) and failure.mesh == "refuser", repr(failure)
        # the chain: the supervisor's proc failed because its kids' rank 1 was killed
        assert "kids" in failure.report() and "SIGKILL" in failure.report(), failure.report()
        with pytest.raises(monarch.errors.MonarchError):
            sup.alive.call_one().get(timeout=30)
    finally:
        pm.stop().get(timeout=30)


class Relayed(Actor):
    """Rank 0 holds the call (its proc relays the others' replies: it is the cast tree's root);
    the others answer at once. Each says on `port` that it runs the call."""

    @endpoint
    def pid(self):
        return os.getpid()

    @endpoint
    def answer(self, port):
        rank = current_rank().rank
        port.send(rank)
        if rank == 0:
            threading.Event().wait()  # until its proc is killed
        return rank


def test_replies_lost_with_a_dead_relay_say_so_and_name_their_member(fault_hook):
    """The members below a relay that dies mid-call hold a SupervisionError naming the relay's
    proc, and the text says which member's reply was lost there and that its proc is alive."""
    pm = this_host().spawn_procs(per_host={"gpus": 4}, name="relay")
    port, rx = Channel.open()
    try:
        r = pm.spawn("relayed", Relayed)
        pids = list(r.pid.call().get(timeout=30).values())
        pending = r.answer.call(port)
        assert sorted(rx.recv().get(timeout=30) for _ in range(4)) == [0, 1, 2, 3]
        os.kill(pids[0], signal.SIGKILL)
        got = pending.get(timeout=30)
        assert isinstance(fault_hook.get(timeout=30), MeshFailure)
        assert got.failed_ranks() == [0, 1, 2, 3]
        for rank in range(4):
            err = got.error(gpus=rank)
            assert isinstance(err, SupervisionError), repr(err)
            assert isinstance(err, RuntimeError)  # as Monarch's SupervisionError is
            text = str(err)
            assert "SIGKILL" in text or "signal 9" in text, text
            if rank == 0:
                assert ".relayed[" in text and "own proc is alive" not in text, text
            else:
                assert "monarch.comm" in text, text
                assert "own proc is alive" in text and ".relayed[" in text, text
    finally:
        pm.stop().get(timeout=30)


class Fatal(BaseException):
    """Not an Exception: raised by a handler, it fails the actor (Monarch's
    test_base_exception_handling)."""


class DiesOnBaseException(Actor):
    @endpoint
    def die(self):
        raise Fatal("a BaseException")

    @endpoint
    def ok(self):
        return "ok"


@pytest.mark.parametrize("method", ["die", "die_async", "local"])
def test_a_base_exception_in_a_call_handler_fails_the_actor(fault_hook, method):
    """Also for an actor of this_proc(), whose proc (the client) does not fail: its call ends
    with the SupervisionError at once rather than never."""
    local = method == "local"
    pm = this_proc() if local else this_host().spawn_procs(per_host={"gpus": 1}, name="fatal")
    method = "die" if local else method
    try:
        a = pm.spawn("fatal", DiesOnBaseException if method == "die" else AsyncDies)
        with pytest.raises(SupervisionError) as err:
            getattr(a, method).call_one().get(timeout=30)
        assert "Fatal" in str(err.value) and "not an Exception" in str(err.value), str(err.value)
        failure = fault_hook.get(timeout=30)
        assert "fatal" in str(failure), repr(failure)
        with pytest.raises(SupervisionError):
            a.ok.call_one().get(timeout=30)
    finally:
        if not local:
            pm.stop().get(timeout=30)


class AsyncDies(Actor):
    @endpoint
    async def die_async(self):
        raise Fatal("a BaseException")

    @endpoint
    async def ok(self):
        return "ok"


class Broadcaster(Actor):
    """Broadcasts to a mesh it was given; its copy of the mesh does not know the mesh stopped."""

    def __init__(self, port):
        self.port = port

    @endpoint
    def broadcast_to(self, mesh):
        mesh.ping.broadcast()
        return "sent"

    @endpoint
    def alive(self):
        return "alive"


class HandlesUndeliverable(Broadcaster):
    def _handle_undeliverable_message(self, message):
        self.port.send((message.sender(), message.dest(), message.reason(), message.error_msg(),
                        repr(message)))
        return True


class HandlesUndeliverableAsync(Broadcaster):
    async def _handle_undeliverable_message(self, message):  # awaited on the proc's loop
        self.port.send((message.sender(), message.dest(), message.reason(), message.error_msg(),
                        repr(message)))
        return True


def _broadcast_to_stopped_kids(name, cls, port):
    """Spawns `cls` on a proc mesh `name` and two kids on another; stops the kids (their procs
    live on), then has the broadcaster broadcast to them: the relays find both members gone and
    report each to the caster (CAST-9). Returns (proc meshes, broadcaster)."""
    pm = this_host().spawn_procs(per_host={"gpus": 1}, name=name)
    kid_procs = this_host().spawn_procs(per_host={"gpus": 2}, name=name + "-kids")
    b = pm.spawn("b", cls, port)
    kids = kid_procs.spawn("kid", Child)
    assert kids.ping.call().get(timeout=30).values() == [0, 1]
    kids.stop().get(timeout=30)
    assert b.broadcast_to.call_one(kids).get(timeout=30) == "sent"
    return (pm, kid_procs), b


@pytest.mark.parametrize("cls", [HandlesUndeliverable, HandlesUndeliverableAsync])
def test_handle_undeliverable_message_keeps_the_broadcaster_alive(cls):
    port, rx = Channel.open()
    meshes, b = _broadcast_to_stopped_kids("undeliv-" + cls.__name__.lower(), cls, port)
    try:
        got = [rx.recv().get(timeout=30) for _ in range(2)]  # one report per lost member
        for sender, dest, reason, text, rep in got:
            assert ".b[" in sender, sender
            assert ".kid[" in dest and dest in text, (dest, text)
            assert text.endswith("undeliverable: " + reason), text
            assert reason == "actor Child 'kid' was stopped", reason  # the member's tombstone
            assert rep == "UndeliverableMessageEnvelope(%s)" % text
        assert got[0][1] != got[1][1], got  # both members, each once
        assert b.alive.call_one().get(timeout=30) == "alive"
        assert rx.try_recv() is None
    finally:
        for m in meshes:
            m.stop().get(timeout=30)


class RefusesUndeliverable(Broadcaster):
    def _handle_undeliverable_message(self, message):
        return False


class RaisesInUndeliverable(Broadcaster):
    def _handle_undeliverable_message(self, message):
        raise RuntimeError("hook gave up on " + message.dest())


@pytest.mark.parametrize("cls", [Broadcaster, RefusesUndeliverable, RaisesInUndeliverable])
def test_an_unhandled_undeliverable_broadcast_fails_the_broadcaster(cls, fault_hook):
    """Without the hook (the default), with a falsy one, or with one that raises (PY-7)."""
    name = "unhandled-" + cls.__name__.lower()
    port, _ = Channel.open()
    meshes, b = _broadcast_to_stopped_kids(name, cls, port)
    try:
        failure = fault_hook.get(timeout=30)
        assert isinstance(failure, MeshFailure) and failure.mesh == name, repr(failure)
        assert "undeliverable" in failure.report() and ".kid[" in failure.report(), \
            failure.report()
        if cls is RaisesInUndeliverable:
            assert "_handle_undeliverable_message raised" in failure.report(), failure.report()
            assert "hook gave up on" in failure.report(), failure.report()
        with pytest.raises(monarch.errors.MonarchError):
            b.alive.call_one().get(timeout=30)
    finally:
        for m in meshes:
            m.stop().get(timeout=30)


class AsyncSupervisor(Actor):
    def __init__(self, port):
        self.port = port

    @endpoint
    async def start(self):
        self.kid_procs = this_host().spawn_procs(per_host={"gpus": 2}, name="akids")
        await self.kid_procs.initialized
        self.kids = self.kid_procs.spawn("kid", Child)
        return (await self.kids.pid.call()).values()

    async def __supervise__(self, failure):
        self.port.send((failure.mesh, failure.ranks))
        return True

    @endpoint
    async def alive(self):
        return "alive"


class CountsUndeliverable:
    """Counts the undeliverable reports it gets (and carries on)."""

    reports = 0

    def _handle_undeliverable_message(self, message):
        self.reports += 1
        return True


class BroadcastingOwner(CountsUndeliverable, Supervisor):
    @endpoint
    def broadcast_to_kid(self, rank):
        self.kids.slice(gpus=rank).ping.broadcast()

    @endpoint
    def kid_mesh(self):
        return self.kids

    @endpoint
    def undelivered(self):
        return self.reports


class AsyncBroadcastingOwner(CountsUndeliverable, AsyncSupervisor):
    """The same, with async endpoints: its procs are spawned off its thread (PY-5)."""

    async def __supervise__(self, failure):
        self.port.send((type(failure).__name__, failure.mesh, failure.ranks, failure.cause,
                        failure.report()))
        return True

    @endpoint
    async def broadcast_to_kid(self, rank):
        self.kids.slice(gpus=rank).ping.broadcast()

    @endpoint
    async def kid_mesh(self):
        return self.kids

    @endpoint
    async def undelivered(self):
        return self.reports


class StrangerBroadcaster(Broadcaster):
    def _handle_undeliverable_message(self, message):
        self.port.send(("stranger", message.reason()))
        return True


@pytest.mark.parametrize("cls", [BroadcastingOwner, AsyncBroadcastingOwner])
def test_an_owner_is_not_told_twice_of_a_broadcast_lost_with_its_proc(cls):
    """REM-6: a proc that dies within the channel's Ack window leaves the broadcast it was just
    sent unacknowledged, although its handler may have run. The owner hears the proc's failure
    in __supervise__; the lost broadcast is not reported to it a second time (it used to be, and
    without a hook that failed the owner even though its __supervise__ handled the failure). An
    actor that does not own the mesh still gets its lost broadcast back."""
    pm = this_host().spawn_procs(per_host={"gpus": 1}, name="owner-" + cls.__name__.lower())
    port, rx = Channel.open()
    try:
        owner = pm.spawn("owner", cls, port)
        stranger = pm.spawn("stranger", StrangerBroadcaster, port)  # same proc: same link
        pids = owner.start.call_one().get(timeout=30)
        kids = owner.kid_mesh.call_one().get(timeout=30)
        # Kid 0 stopped (nothing it is sent gets acknowledged), sent to by both, then killed:
        # its exit declares it failed, which returns both broadcasts in the order they were sent.
        os.kill(pids[0], signal.SIGSTOP)
        owner.broadcast_to_kid.call_one(0).get(timeout=30)
        assert stranger.broadcast_to.call_one(kids.slice(gpus=0)).get(timeout=30) == "sent"
        os.kill(pids[0], signal.SIGKILL)
        got = sorted((rx.recv().get(timeout=30) for _ in range(2)), key=lambda m: m[0])
        assert got[0][0] == "MeshFailure" and got[0][2] == [0], got[0]
        assert got[1][0] == "stranger" and "its proc was declared failed" in got[1][1], got[1]
        # The owner's report would have been posted to it before the stranger's: none came.
        assert owner.undelivered.call_one().get(timeout=30) == 0
        assert rx.try_recv() is None
    finally:
        pm.stop().get(timeout=30)


class ReportingOwner(BroadcastingOwner):
    def _handle_undeliverable_message(self, message):
        self.port.send(("owner", message.sender(), message.dest(), message.reason()))
        return True


class AsyncReportingOwner(AsyncBroadcastingOwner):
    def _handle_undeliverable_message(self, message):
        self.port.send(("owner", message.sender(), message.dest(), message.reason()))
        return True


@pytest.mark.parametrize("cls", [ReportingOwner, AsyncReportingOwner])
def test_an_owner_on_a_worker_hears_of_its_broadcast_to_a_stopped_member(cls, fault_hook):
    """An actor on a worker proc casts to the procs it spawned through its process's HostMesh
    client Proc. A member that could not be reached (stopped, its proc alive) was reported to
    that Proc, which has no such actor: its fault hook failed the whole worker. From an async
    endpoint the broadcast did not even name its sender. Now the owner's
    _handle_undeliverable_message gets the report, once, and the owner and its worker live on."""
    pm = this_host().spawn_procs(per_host={"gpus": 1}, name="reporting-" + cls.__name__.lower())
    port, rx = Channel.open()
    try:
        owner = pm.spawn("owner", cls, port)
        owner.start.call_one().get(timeout=30)
        kids = owner.kid_mesh.call_one().get(timeout=30)
        kids.stop().get(timeout=30)  # through the client's copy: the owner's does not know
        owner.broadcast_to_kid.call_one(0).get(timeout=30)
        who, sender, dest, reason = rx.recv().get(timeout=30)
        assert who == "owner" and ".owner[" in sender and ".kid[" in dest, (who, sender, dest)
        assert reason == "actor Child 'kid' was stopped", reason
        assert owner.alive.call_one().get(timeout=30) == "alive"
        assert rx.try_recv() is None and fault_hook.empty()
    finally:
        pm.stop().get(timeout=30)


def test_monarchs_import_paths_of_the_hook_types():
    from monarch._rust_bindings.monarch_hyperactor.mailbox import UndeliverableMessageEnvelope
    from monarch._rust_bindings.monarch_hyperactor.supervision import (MeshFailure as MF,
                                                                      SupervisionError as SE)
    import monarch.actor
    assert UndeliverableMessageEnvelope is monarch.actor.UndeliverableMessageEnvelope
    assert MF is monarch.actor.MeshFailure and SE is monarch.actor.SupervisionError


def test_supervise_procs_spawned_in_an_async_endpoint(fault_hook):
    pm = this_host().spawn_procs(per_host={"gpus": 1}, name="asyncsup")
    port, rx = Channel.open()
    try:
        sup = pm.spawn("sup", AsyncSupervisor, port)
        pids = sup.start.call_one().get(timeout=30)
        os.kill(pids[1], signal.SIGKILL)
        deadline = time.monotonic() + 30
        got = None
        while got is None and fault_hook.empty() and time.monotonic() < deadline:
            got = rx.try_recv()
            if got is None:
                try:
                    got = rx.recv().get(timeout=0.1)
                except TimeoutError:
                    pass
        assert fault_hook.empty(), "the supervisor's proc failed: %r" % fault_hook.get()
        assert got == ("akids", [1])
        assert sup.alive.call_one().get(timeout=30) == "alive"
    finally:
        pm.stop().get(timeout=30)


def test_a_frozen_proc_becomes_a_mesh_failure(fault_hook):
    pm = this_host().spawn_procs(per_host={"gpus": 2}, name="frozen")
    try:
        m = pm.spawn("faulty", Faulty)
        pids = m.pid.call().get(timeout=30).values()
        os.kill(pids[0], signal.SIGSTOP)
        failure = fault_hook.get(timeout=30)  # after mesh.heartbeat_timeout (2 s by default)
        assert isinstance(failure, MeshFailure) and failure.ranks == [0], repr(failure)
        assert "heartbeat" in failure.cause, failure.cause
        assert m.slice(gpus=1).ok.call_one().get(timeout=30)[:2] == ("ok", 1)
    finally:
        pm.stop().get(timeout=30)
    assert not pid_alive(pids[0])  # a frozen proc is killed, not left stopped


class Cleaned(Actor):
    def __init__(self, port):
        self.port = port

    @endpoint
    def ok(self):
        return current_rank().rank

    def __cleanup__(self, exc):
        self.logger.info("cleaning up")  # Actor.logger, as Monarch's test_cleanup uses it
        self.port.send(("cleanup", current_rank().rank, exc))


def test_cleanup_runs_on_stop(procs):
    port, rx = Channel.open()
    m = procs.slice(gpus=slice(0, 2)).spawn("cleaned", Cleaned, port)
    assert m.ok.call().get(timeout=30).values() == [0, 1]
    assert rx.try_recv() is None
    stopped = m.stop()
    assert isinstance(stopped, monarch.actor.Future)
    assert stopped.get(timeout=30) is None
    got = sorted([rx.recv().get(timeout=30), rx.recv().get(timeout=30)])
    assert got == [("cleanup", 0, None), ("cleanup", 1, None)]


class Inner(Actor):
    def __init__(self, port, tag):
        self.port, self.tag = port, tag

    @endpoint
    def pid(self):
        return os.getpid()

    def __cleanup__(self, exc):
        self.port.send(("cleanup", self.tag))


class Wrapper(Actor):
    """Spawns procs of its own and actor meshes on them and on procs it was given."""

    def __init__(self, given, port):
        self.procs = this_host().spawn_procs(per_host={"gpus": 2}, name="wrapped")
        self.on_given = given.spawn("on_given", Inner, port, "given")
        self.on_owned = self.procs.spawn("on_owned", Inner, port, "owned")

    @endpoint
    def pids(self):
        return (self.on_given.pid.call().get(timeout=30).values(),
                self.on_owned.pid.call().get(timeout=30).values())


def test_stopping_an_actor_stops_the_meshes_it_spawned(procs):
    """Monarch's test_recursive_stop: the meshes an actor spawned (actors on procs it was given,
    its own procs and the actors on them) stop with it, their __cleanup__ runs, and its procs'
    processes end; the procs it was given live on."""
    port, rx = Channel.open()
    given = procs.slice(gpus=slice(0, 2))
    w = procs.slice(gpus=2).spawn("wrapper", Wrapper, given, port)
    on_given, on_owned = w.pids.call_one().get(timeout=60)
    assert set(on_given).isdisjoint(on_owned)
    w.stop().get(timeout=60)
    got = sorted(rx.recv().get(timeout=30) for _ in range(4))
    assert got == [("cleanup", "given")] * 2 + [("cleanup", "owned")] * 2, got
    assert wait_exited(on_owned, 30) == [], on_owned
    assert all(pid_alive(p) for p in on_given)
    assert given.spawn("after", Inner, port, "x").pid.call().get(timeout=30).values() == on_given


class SlowCleanup(Actor):
    def __init__(self, port):
        self.port = port

    def __cleanup__(self, exc):
        time.sleep(2)  # a slow cleanup, within mesh.stop_timeout (5 s)
        self.port.send("cleaned")


class OwnsSlowOnes(Actor):
    def __init__(self, given, port):
        self.meshes = [given.spawn("slow%d" % i, SlowCleanup, port) for i in range(3)]

    @endpoint
    def ready(self):
        for m in self.meshes:
            m.initialized.get(timeout=30)


def test_an_owners_stop_waits_for_its_meshes_at_once_not_one_after_another(procs):
    """Three owned meshes whose __cleanup__ takes 2 s each: stopped one after another they
    would take 6 s, past the owner's own mesh.stop_timeout (5 s), and its stop would fail."""
    port, rx = Channel.open()
    owner = procs.slice(gpus=3).spawn("owner", OwnsSlowOnes, procs.slice(gpus=0), port)
    owner.ready.call_one().get(timeout=60)
    owner.stop().get(timeout=60)
    assert [rx.recv().get(timeout=30) for _ in range(3)] == ["cleaned"] * 3


# --- bad input ----------------------------------------------------------------------------------


def test_unpicklable_argument_names_endpoint_and_argument(faulty):
    with pytest.raises(TypeError) as ei:
        faulty.ok.call(threading.Lock())
    text = str(ei.value)
    assert "faulty.ok" in text and "argument 0" in text and "lock" in text, text
    with pytest.raises(TypeError) as ei:
        faulty.slice(gpus=0).ok.call_one(x=threading.Lock())
    assert "faulty.ok" in str(ei.value) and "'x'" in str(ei.value), str(ei.value)
    with pytest.raises(TypeError, match="faulty.ok"):
        faulty.ok.broadcast(threading.Lock())
    assert faulty.slice(gpus=0).ok.call_one().get(timeout=30)[:2] == ("ok", 0)


def test_unknown_endpoint(faulty):
    with pytest.raises(AttributeError, match="no endpoint 'nope'"):
        faulty.nope
    with pytest.raises(AttributeError):
        faulty.slice(gpus=0).nope.call_one()


def test_spawning_a_non_actor(procs):
    with pytest.raises(TypeError, match="not a subclass of monarch.actor.Actor"):
        procs.spawn("na", NotAnActor)
    with pytest.raises(TypeError):
        procs.spawn("na", Faulty())
    with pytest.raises(TypeError):
        procs.spawn(Faulty)  # the name is missing
    for bad in ("", "a[0]", "tab\there"):  # refused here, not at the first call on the mesh
        with pytest.raises(ValueError, match="must be non-empty, without control characters"):
            procs.spawn(bad, Faulty)
    with pytest.raises(TypeError, match="spawn lockholder"):
        procs.spawn("lockholder", Cleaned, threading.Lock())  # an argument cloudpickle refuses


def test_negative_and_bad_timeouts(faulty):
    fut = faulty.slice(gpus=0).ok.call_one()
    with pytest.raises(ValueError):
        fut.get(timeout=-1)
    with pytest.raises(ValueError):
        fut.exception(timeout=-0.5)
    with pytest.raises(TypeError):
        fut.get(timeout="1")
    _, rx = Channel.open()
    with pytest.raises(ValueError):
        rx.recv().get(timeout=-1)
    assert fut.get(timeout=30)[:2] == ("ok", 0)  # still usable


def test_message_larger_than_max_frame_bytes(faulty):
    one = faulty.slice(gpus=2)
    big = b"a" * (65 << 20)  # the default channel.max_frame_bytes is 64 MiB
    with pytest.raises(monarch.errors.MonarchError, match="max_frame_bytes"):
        one.ok.call_one(big).get(timeout=30)
    with pytest.raises(monarch.errors.MonarchError, match="max_frame_bytes"):
        one.big_result.call_one(65 << 20).get(timeout=30)
    del big
    assert one.ok.call_one().get(timeout=30)[:2] == ("ok", 2)  # the link is unaffected


def test_max_frame_bytes_from_the_environment(tmp_path):
    r = run_client(tmp_path, """
        import os
        os.environ["MONARCH_CHANNEL_MAX_FRAME_BYTES"] = "1MiB"
        import monarch.errors
        from monarch.actor import Actor, endpoint, this_host

        class A(Actor):
            @endpoint
            def echo(self, b):
                return len(b)

            @endpoint
            def big(self):
                return b"r" * (2 << 20)

        procs = this_host().spawn_procs(per_host={"gpus": 1})
        a = procs.spawn("a", A)
        print("small", a.echo.call_one(b"s" * 1000).get(timeout=30), flush=True)
        for what, f in (("arg", lambda: a.echo.call_one(b"s" * (2 << 20))),
                        ("result", lambda: a.big.call_one())):
            try:
                f().get(timeout=30)
                print(what, "no error", flush=True)
            except monarch.errors.MonarchError as e:
                print(what, type(e).__name__, "max_frame_bytes" in str(e), flush=True)
        print("after", a.echo.call_one(b"s").get(timeout=30), flush=True)
        procs.stop().get(timeout=30)
    """, timeout=60)
    assert r.returncode == 0, (r.stdout, r.stderr)
    lines = r.stdout.splitlines()
    assert "small 1000" in lines, r.stdout
    assert "arg UsageError True" in lines, r.stdout
    # The worker refuses its own oversized reply as the endpoint's error (ActorError naming A.big
    # and the limit), before the channel would (a DeliveryFailure naming C++ internals).
    assert "result ActorError True" in lines, r.stdout
    assert "after 1" in lines, r.stdout


# --- stop() and context managers -----------------------------------------------------------------


def test_stopped_meshes_raise_supervision_error():
    with this_host().spawn_procs(per_host={"gpus": 2}, name="ctx") as pm:
        with pm.spawn("faulty", Faulty) as m:
            assert len(m.ok.call().get(timeout=30)) == 2
            pids = m.pid.call().get(timeout=30).values()
        # the actor mesh is stopped, its procs are not
        with pytest.raises(SupervisionError):
            m.ok.call()
        with pytest.raises(SupervisionError):
            m.slice(gpus=0).ok.broadcast()
        assert m.stop().get(timeout=30) is None  # stopping twice is fine
        again = pm.spawn("again", Faulty)
        assert [v[1] for v in again.ok.call().get(timeout=30).values()] == [0, 1]
    with pytest.raises(SupervisionError):
        again.ok.call()
    with pytest.raises(SupervisionError):
        pm.spawn("late", Faulty)
    assert all(not pid_alive(p) for p in pids)


def test_stop_returns_futures():
    pm = this_host().spawn_procs(per_host={"gpus": 1}, name="stopfut")
    m = pm.spawn("faulty", Faulty)
    pid = m.pid.call_one().get(timeout=30)
    f = m.stop()
    assert isinstance(f, monarch.actor.Future) and f.get(timeout=30) is None
    g = pm.stop()
    assert isinstance(g, monarch.actor.Future) and g.get(timeout=30) is None
    assert not pid_alive(pid)
    assert pm.stop().get(timeout=30) is None


class FailsInInit(Actor):
    def __init__(self):
        raise ValueError("no config XYZ")

    @endpoint
    def ok(self):
        return 1


def test_every_call_to_an_actor_whose_init_raised_names_the_cause(fault_hook):
    """The first call used to get `undeliverable: actor failed` and, once the actor was gone,
    `unknown actor`: neither said why. Every call raises SupervisionError (PY-5), whether the
    proc's bounce or the client's knowledge that the proc failed reaches it first (the first call
    used to raise DeliveryFailure every time), and quotes __init__'s exception. It names the
    Python class (not the C++ PyActor that hosts it) and the user's own frame, with no frame of
    monarch's."""
    pm = this_host().spawn_procs(per_host={"gpus": 2}, name="badinit")
    try:
        m = pm.spawn("bad", FailsInInit)
        for _ in range(5):
            with pytest.raises(SupervisionError) as info:
                m.slice(gpus=0).ok.call_one().get(timeout=30)
            text = str(info.value)
            # The text depends on how far the proc's failure got: "message FailsInInit::call to
            # ADDR undeliverable: actor failed: init threw: ...", "message call to ADDR
            # undeliverable: actor FailsInInit 'bad' failed: init threw: ..." or "... actor ADDR
            # (FailsInInit) failed: init threw: ...". Each names the class before the cause.
            assert "FailsInInit" in text.split("init threw:")[0], text
            assert "init threw: FailsInInit.__init__ raised:\nTraceback" in text, text
            assert 'in __init__\n    raise ValueError("no config XYZ")' in text, text
            assert "ValueError: no config XYZ" in text, text
            assert "PyActor" not in text and "_host.py" not in text, text
        # A ValueMesh of failures shows them, not object addresses; each is a SupervisionError.
        vm = m.ok.call().get(timeout=30)
        assert vm.failed_ranks() == [0, 1]
        for g in range(2):
            assert isinstance(vm.error(gpus=g), SupervisionError), repr(vm.error(gpus=g))
        shown = repr(vm)
        assert "<failed: SupervisionError: " in shown and " object at " not in shown, shown
        assert "ValueError: no config XYZ>" in shown, shown  # the exception, not only line one
    finally:
        pm.stop().get(timeout=60)


def _refuse_to_unpickle():
    raise ValueError("cannot unpickle me")


class _Unloadable:
    def __reduce__(self):
        return (_refuse_to_unpickle, ())


def test_spawn_arguments_that_fail_to_unpickle_say_so(fault_hook):
    """The report said only "init threw: ValueError: cannot unpickle me", as if __init__ had
    raised it."""
    pm = this_host().spawn_procs(per_host={"gpus": 1}, name="badargs")
    try:
        m = pm.spawn("noload", FailsInInit, _Unloadable())
        with pytest.raises(SupervisionError) as info:
            m.ok.call_one().get(timeout=30)
        assert ("actor 'noload' could not be unpickled in this proc: ValueError: cannot unpickle "
                "me") in str(info.value), str(info.value)
    finally:
        pm.stop().get(timeout=60)


class Stuck(Actor):
    @endpoint
    def forever(self):
        threading.Event().wait()

    @endpoint
    def ok(self):
        return 1


def test_stopping_an_actor_mesh_with_a_handler_that_never_returns_times_out():
    """ActorMesh.stop() waited forever behind a handler that never returns (its barrier, then the
    member's stop). It fails after mesh.stop_timeout saying why; stopping the procs ends it."""
    from monarch.errors import TimeoutError as MonarchTimeout
    pm = this_host().spawn_procs(per_host={"gpus": 2}, name="stuckstop")
    try:
        m = pm.spawn("stuck", Stuck)
        assert m.ok.call().get(timeout=30).values() == [1, 1]
        pending = m.slice(gpus=0).forever.call_one()
        with pytest.raises(MonarchTimeout, match="handler that does not return"):
            m.stop().get(timeout=60)  # the stop's own deadline, 5 s, comes first
        with pytest.raises(SupervisionError):  # the mesh counts as stopped: no more calls
            m.slice(gpus=1).ok.call_one().get(timeout=30)
    finally:
        pm.stop().get(timeout=60)
    with pytest.raises(Exception):  # its proc is gone: the call can never be answered
        pending.get(timeout=30)

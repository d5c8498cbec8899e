"""Ports and channels: Channel.open(), ports and actor meshes sent inside messages, and
@endpoint(explicit_response_port=True) answered at once or later from another endpoint."""

import os
import signal

import pytest

from monarch.actor import Actor, Channel, Port, PortReceiver, current_rank, endpoint, this_host
from monarch.errors import TimeoutError as MonarchTimeout


class Echo(Actor):
    def __init__(self):
        self.held = None

    @endpoint
    def value(self, x):
        return 10 * current_rank().rank + x

    @endpoint
    def send_to(self, port, x):
        port.send((current_rank().rank, x))
        return "sent"

    @endpoint
    def call_other(self, other, x):
        """Calls `other` (an actor mesh that came inside this message)."""
        return other.value.call(x).get(timeout=30).values()

    @endpoint(explicit_response_port=True)
    def answer_now(self, port, x):
        port.send(x * 2)

    @endpoint(explicit_response_port=True)
    def answer_later(self, port, x):
        self.held = (port, x)

    @endpoint
    def release(self, add):
        port, x = self.held
        self.held = None
        port.send(x + add)
        return "released"

    @endpoint(explicit_response_port=True)
    def answer_error(self, port):
        raise KeyError("no answer")

    @endpoint(explicit_response_port=True)
    def forget(self, port):
        pass  # returns without answering, keeping the port nowhere

    @endpoint(explicit_response_port=True)
    def answer_text(self, port):
        port.exception("not an exception")


@pytest.fixture(scope="module")
def echo(procs):
    return procs.spawn("echo", Echo)


def test_channel_in_one_process():
    port, rx = Channel.open()
    assert isinstance(port, Port) and isinstance(rx, PortReceiver)
    assert rx.try_recv() is None
    for v in ({"a": 1}, [1, 2], "three"):
        port.send(v)
    assert [rx.recv().get(timeout=10) for _ in range(3)] == [{"a": 1}, [1, 2], "three"]


def test_recv_timeout_leaves_the_receiver_usable():
    port, rx = Channel.open()
    with pytest.raises(MonarchTimeout):
        rx.recv().get(timeout=0.05)
    port.send(7)
    assert rx.recv().get(timeout=10) == 7


def test_port_inside_a_message(echo):
    port, rx = Channel.open()
    assert echo.send_to.call(port, "hi").get(timeout=30).values() == ["sent"] * 4
    got = sorted(rx.recv().get(timeout=30) for _ in range(4))
    assert got == [(r, "hi") for r in range(4)]
    assert rx.try_recv() is None


def test_port_sent_on_by_an_actor(echo):
    """A port travels client -> actor -> actor, and the last one's send reaches the client."""
    port, rx = Channel.open()
    relay_port, relay_rx = Channel.open()
    echo.slice(gpus=0).send_to.call_one(relay_port, port).get(timeout=30)
    rank, forwarded = relay_rx.recv().get(timeout=30)
    assert rank == 0 and isinstance(forwarded, Port)
    echo.slice(gpus=3).send_to.call_one(forwarded, "via 0").get(timeout=30)
    assert rx.recv().get(timeout=30) == (3, "via 0")


def test_actor_mesh_inside_a_message(procs, echo):
    other = procs.spawn("other", Echo)
    got = echo.slice(gpus=1).call_other.call_one(other, 5).get(timeout=30)
    assert got == [5, 15, 25, 35]
    # a view travels as a view
    got = echo.slice(gpus=2).call_other.call_one(other.slice(gpus=slice(2, 4)), 1).get(timeout=30)
    assert got == [21, 31]
    other.stop().get(timeout=30)


def test_explicit_response_port_answered_now(echo):
    assert echo.slice(gpus=0).answer_now.call_one(21).get(timeout=30) == 42
    assert echo.answer_now.call(2).get(timeout=30).values() == [4] * 4


def test_explicit_response_port_answered_later(echo):
    one = echo.slice(gpus=2)
    fut = one.answer_later.call_one(40)
    assert not fut.done()  # answered only by release()
    # the actor went on to its next message before answering
    assert one.release.call_one(2).get(timeout=30) == "released"
    assert fut.get(timeout=30) == 42


def test_explicit_response_port_handler_raises(echo):
    from monarch.actor import ActorError
    with pytest.raises(ActorError) as ei:
        echo.slice(gpus=1).answer_error.call_one().get(timeout=30)
    assert isinstance(ei.value.exception, KeyError)


def test_a_response_port_dropped_unanswered_names_its_endpoint(echo):
    """It failed with a bare 'promise dropped without a result'."""
    from monarch.actor import ActorError
    with pytest.raises(ActorError, match="Echo.forget of actor .* dropped its response port"):
        echo.slice(gpus=0).forget.call_one().get(timeout=30)


def test_a_response_port_kept_unanswered_fails_when_its_actor_stops(procs):
    """The port kept in the actor's state lived on after stop() (a reference cycle held the
    instance) and its caller waited until the procs ended."""
    from monarch.actor import ActorError
    mesh = procs.spawn("keeper", Echo)
    one = mesh.slice(gpus=3)
    fut = one.answer_later.call_one(1)
    one.value.call_one(0).get(timeout=30)  # answer_later ran: the port is held
    assert not fut.done()
    mesh.stop().get(timeout=30)
    with pytest.raises(ActorError, match="stopped before endpoint Echo.answer_later answered"):
        fut.get(timeout=10)


def test_response_port_exception_needs_an_exception(echo):
    """port.exception("text") failed inside the encoder with an AttributeError."""
    from monarch.actor import ActorError
    with pytest.raises(ActorError) as ei:
        echo.slice(gpus=0).answer_text.call_one().get(timeout=30)
    assert isinstance(ei.value.exception, TypeError)
    assert "takes an exception" in str(ei.value.exception)


class Spawner(Actor):
    @endpoint
    def spawn_on(self, proc_mesh):
        m = proc_mesh.spawn("spawned_remotely", Echo)
        return m.value.call(0).get(timeout=30).values()


def test_proc_mesh_inside_a_message(procs):
    s = procs.slice(gpus=0).spawn("spawner", Spawner)
    try:
        # Spawned on a view, actors are ranked in the view's extent (as a local spawn on it).
        assert s.spawn_on.call_one(procs.slice(gpus=slice(2, 4))).get(timeout=30) == [0, 10]
    finally:
        s.stop().get(timeout=30)


class Link(Actor):
    @endpoint
    def chain(self, rest):
        """Calls the next link and waits for it (blocking this actor's worker thread)."""
        if not rest:
            return 0
        return 1 + rest[0].chain.call_one(rest[1:]).get(timeout=30)

    @endpoint
    def call_self(self, me):
        return me.chain.call_one([]).get(timeout=2)


def test_a_chain_of_blocked_actors_on_one_proc_makes_progress(procs):
    """More actors blocked in get() than the proc has worker threads: it lends spare ones."""
    one = procs.slice(gpus=0)
    links = [one.spawn("link%d" % i, Link) for i in range(8)]
    try:
        assert links[0].chain.call_one(links[1:]).get(timeout=60) == 7
    finally:
        for m in links:
            m.stop().get(timeout=30)


def test_waiting_on_its_own_reply_is_a_deadlock_error(procs):
    import monarch.errors
    me = procs.slice(gpus=1).spawn("selfcaller", Link)
    try:
        with pytest.raises(monarch.errors.ActorError) as ei:
            me.call_self.call_one(me).get(timeout=30)
        assert isinstance(ei.value.exception, monarch.errors.DeadlockError), str(ei.value)
    finally:
        me.stop().get(timeout=30)


class PortHolder(Actor):
    @endpoint
    def closed_port(self):
        """A port whose receiver is dropped when this returns: the port is closed."""
        port, _rx = Channel.open()
        return port

    @endpoint
    def open_port(self):
        """A port whose receiver this actor keeps: open while its proc lives."""
        port, self.rx = Channel.open()
        return port

    @endpoint
    def pid(self):
        return os.getpid()


class ClosedPortSender(Actor):
    def __init__(self, report):
        self.report = report

    def _handle_undeliverable_message(self, message):
        self.report.send((message.sender(), message.dest(), message.reason()))
        return True

    @endpoint
    def send_to(self, port):
        port.send("lost")
        return "sent"

    @endpoint
    def alive(self):
        return "alive"


class AsyncClosedPortSender(ClosedPortSender):
    @endpoint
    async def send_to(self, port):  # on the proc's asyncio thread: no actor is current there
        port.send("lost")
        return "sent"

    @endpoint
    async def alive(self):
        return "alive"


@pytest.mark.parametrize("cls", [ClosedPortSender, AsyncClosedPortSender])
def test_a_send_to_a_closed_port_comes_back_to_the_sending_actor(cls, fault_hook):
    """PY-7 for ports: the port's owner cannot take the message (its receiver was dropped), so it
    comes back to the actor that sent it, once, and that actor and its proc live on. From an
    async endpoint the send used to name no sender: the report went to the proc's fault hook,
    which failed the whole proc."""
    report, rx = Channel.open()
    pm = this_host().spawn_procs(per_host={"gpus": 1}, name="port-" + cls.__name__.lower())
    holder_pm = this_host().spawn_procs(per_host={"gpus": 1}, name="port-holder")
    try:
        sender = pm.spawn("sender", cls, report)
        port = holder_pm.spawn("holder", PortHolder).closed_port.call_one().get(timeout=30)
        assert sender.send_to.call_one(port).get(timeout=30) == "sent"
        who, dest, reason = rx.recv().get(timeout=30)
        assert ".sender[" in who, who
        assert repr(port) == "<Port %s>" % dest, (dest, port)  # the port, not only its owner
        assert reason == "port closed", reason
        assert sender.alive.call_one().get(timeout=30) == "alive"
        assert rx.try_recv() is None and fault_hook.empty()
    finally:
        pm.stop().get(timeout=30)
        holder_pm.stop().get(timeout=30)


def test_a_send_to_a_port_whose_proc_was_stopped_names_the_port(fault_hook):
    """The port's proc is gone, so the sender's own proc gives the message back (its link to that
    proc fails): the report names the port, as the port's owner does for a closed one (it used to
    name only the owner, with an empty message label: "message  to ...")."""
    report, rx = Channel.open()
    pm = this_host().spawn_procs(per_host={"gpus": 1}, name="port-stopped-sender")
    holder_pm = this_host().spawn_procs(per_host={"gpus": 1}, name="port-stopped-holder")
    try:
        sender = pm.spawn("sender", ClosedPortSender, report)
        port = holder_pm.spawn("holder", PortHolder).open_port.call_one().get(timeout=30)
        holder_pm.stop().get(timeout=30)
        assert sender.send_to.call_one(port).get(timeout=30) == "sent"
        who, dest, reason = rx.recv().get(timeout=30)
        assert ".sender[" in who, who
        assert repr(port) == "<Port %s>" % dest, (dest, port)
        assert reason, reason
        assert sender.alive.call_one().get(timeout=30) == "alive"
        assert rx.try_recv() is None and fault_hook.empty()
    finally:
        pm.stop().get(timeout=30)


def test_a_report_for_an_actor_that_has_stopped_does_not_fail_its_proc(fault_hook):
    """A send comes back after the actor that made it was stopped (ActorMesh.stop(): its proc
    stays usable, PY-9). No one is left to tell, so it is logged; it used to go to the proc's fault
    hook and fail the whole proc. The holder's proc is frozen so that both sends stay
    unacknowledged, then killed: its link gives them back in send order, so once the second
    actor's report arrives, the first actor's was handled."""
    report, rx = Channel.open()
    pm = this_host().spawn_procs(per_host={"gpus": 1}, name="gone-sender")
    holder_pm = this_host().spawn_procs(per_host={"gpus": 1}, name="gone-holder")
    try:
        first = pm.spawn("first", ClosedPortSender, report)
        second = pm.spawn("second", ClosedPortSender, report)
        holder = holder_pm.spawn("holder", PortHolder)
        port = holder.open_port.call_one().get(timeout=30)
        pid = holder.pid.call_one().get(timeout=30)
        os.kill(pid, signal.SIGSTOP)
        try:
            assert first.send_to.call_one(port).get(timeout=30) == "sent"
            first.stop().get(timeout=30)
            assert second.send_to.call_one(port).get(timeout=30) == "sent"
        finally:
            os.kill(pid, signal.SIGKILL)
        who, dest, reason = rx.recv().get(timeout=30)
        assert ".second[" in who and repr(port) == "<Port %s>" % dest, (who, dest)
        assert second.alive.call_one().get(timeout=30) == "alive"  # its proc lived on
        assert pm.spawn("third", ClosedPortSender, report).alive.call_one().get(
            timeout=30) == "alive"
        assert rx.try_recv() is None
        while not fault_hook.empty():  # the holder's death is the client's; nothing of pm's
            failure = fault_hook.get_nowait()
            assert "gone-sender" not in str(failure), str(failure)
    finally:
        pm.stop().get(timeout=30)

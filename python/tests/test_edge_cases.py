"""Edge cases found by the adversarial review of the front end: each was a crash, a silent loss or
a wrong answer before its fix."""

import json
import math
import os
import signal
import subprocess
import sys

import pytest

from conftest import client_env, wait_exited, write_client
from monarch.actor import Actor, endpoint, this_host
from monarch.errors import SupervisionError, UsageError


class Edge(Actor):
    @endpoint
    def give_exception(self):
        return ValueError("a value, not an error")

    @endpoint(explicit_response_port=True)
    def answer_twice(self, port):
        port.send("first")
        port.send("second")  # raises in the handler; the caller keeps "first"

    @endpoint
    def size(self, b):
        return len(b)

    @endpoint
    def echo(self, x):
        return x

    @endpoint
    def big_reply(self):
        return b"y" * (64 << 20)


@pytest.fixture(scope="module")
def edge(procs):
    m = procs.spawn("edge", Edge)
    yield m
    m.stop().get(timeout=30)


def test_a_returned_exception_is_a_value(edge):
    vm = edge.give_exception.call().get(timeout=30)
    assert vm.failed_ranks() == []
    v = vm.item(gpus=1)
    assert isinstance(v, ValueError) and str(v) == "a value, not an error"
    assert isinstance(edge.slice(gpus=0).give_exception.call_one().get(timeout=30), ValueError)


def test_a_second_answer_on_a_response_port_keeps_the_first(edge):
    assert edge.slice(gpus=2).answer_twice.call_one().get(timeout=30) == "first"
    assert edge.slice(gpus=2).echo.call_one(7).get(timeout=30) == 7  # the actor lives on


def test_oversize_messages_raise_at_the_call_site_for_every_adverb(edge):
    big = b"x" * (64 << 20)  # the default channel.max_frame_bytes
    for adverb in ("call", "broadcast"):
        with pytest.raises(UsageError, match="max_frame_bytes"):
            getattr(edge.size, adverb)(big)
    with pytest.raises(UsageError, match="endpoint size"):
        edge.slice(gpus=0).size.call_one(big)
    assert edge.slice(gpus=0).size.call_one(b"ok").get(timeout=30) == 2  # nothing was sent


def test_an_oversize_reply_names_the_endpoint_and_the_actor_lives_on(edge):
    """It came back as a DeliveryFailure of monarch::python::PyActor::call."""
    from monarch.actor import ActorError
    with pytest.raises(ActorError, match="endpoint Edge.big_reply returned 671088"):
        edge.slice(gpus=1).big_reply.call_one().get(timeout=60)
    vm = edge.big_reply.call().get(timeout=60)
    assert vm.failed_ranks() == [0, 1, 2, 3]
    assert isinstance(vm.error(gpus=3).exception, ValueError)
    assert edge.slice(gpus=1).echo.call_one(5).get(timeout=30) == 5


def test_timeouts_nan_is_refused_and_huge_or_inf_wait_until_done(edge):
    with pytest.raises(ValueError, match="timeout"):
        edge.slice(gpus=0).echo.call_one(1).get(timeout=math.nan)
    for t in (math.inf, 1e12):
        assert edge.slice(gpus=0).echo.call_one(3).get(timeout=t) == 3


def test_endpoint_names_a_mesh_attribute_would_hide_are_refused(procs):
    class Shadow(Actor):
        @endpoint
        def stop(self):
            return "never reached: mesh.stop is the mesh's"

        @endpoint
        def slice(self):
            return 0

    with pytest.raises(TypeError, match="slice, stop would be hidden"):
        procs.spawn("shadow", Shadow)


def test_mesh_algebra_rejects_bad_arguments_by_name(procs):
    with pytest.raises(ValueError, match="name the dim to split"):
        procs.split(tp=2)
    with pytest.raises(ValueError, match="size of no new dim"):
        procs.split(gpus=("dp", "tp"), tp=2, zz=9)
    with pytest.raises(ValueError, match="positive int"):
        procs.split(gpus=("dp", "tp"), tp=0)
    with pytest.raises(ValueError, match="cannot be split"):
        procs.split(gpus=("dp", "tp"), tp=3)
    with pytest.raises(TypeError, match="non-empty str"):
        procs.flatten(3)
    with pytest.raises(TypeError, match="new name"):
        procs.rename(gpus=5)
    with pytest.raises(ValueError, match="gpus= needs a positive int step"):
        procs.slice(gpus=slice(0, 2, 0))
    assert procs.split(gpus=("dp", "tp"), tp=2).sizes == {"dp": 2, "tp": 2}


def test_spawn_procs_rejects_an_empty_or_huge_per_host():
    with pytest.raises(ValueError, match="per_host is empty"):
        this_host().spawn_procs(per_host={})
    with pytest.raises(ValueError, match="procs per host"):
        this_host().spawn_procs(per_host={"gpus": 2 ** 40})


def test_spawn_procs_rejects_a_bad_name_at_the_call():
    # It returned a ProcMesh whose first use raised, whatever that use was.
    for bad in ("a[b]", "a.b", "x y"):
        with pytest.raises(ValueError, match="may hold only letters, digits"):
            this_host().spawn_procs(per_host={"gpus": 1}, name=bad)


class Pid(Actor):
    @endpoint
    def pid(self):
        return os.getpid()


def test_host_mesh_initialized_and_shutdown_stops_its_proc_meshes():
    """Monarch's HostMesh.initialized and shutdown() (rdma_pingpong.py ends with
    workers.shutdown().get()): shutdown stops the proc meshes spawned on that HostMesh."""
    host = this_host()
    assert host.initialized.get(timeout=10) is True
    pm = host.spawn_procs(per_host={"gpus": 2}, name="shut")
    pids = pm.spawn("p", Pid).pid.call().get(timeout=60).values()
    assert host.shutdown().get(timeout=60) is None
    assert wait_exited(pids, 30) == [], pids
    with pytest.raises(SupervisionError, match="was stopped"):  # as a call on it does
        pm.logging_option(stream_to_client=False)
    assert this_host().shutdown().get(timeout=10) is None  # nothing spawned on it: done at once


def test_this_proc_cannot_be_sliced():
    # It said "unknown dim 'gpus' (no dims are left: the other coordinates picked one member)".
    from monarch.actor import this_proc
    with pytest.raises(TypeError, match="this_proc\\(\\) is this process alone"):
        this_proc().slice(gpus=0)


def test_a_host_mesh_cannot_be_sliced_whatever_the_dims():
    # An unknown dim said "unknown dim 'hosts' (no dims are left...)", which hid the reason.
    for dims in ({"hosts": 0}, {}):
        with pytest.raises(ValueError, match="slicing a HostMesh is not supported"):
            this_host().slice(**dims)



def _default_sigint():
    # A client started from a shell's background job inherits SIGINT ignored (and Python then
    # installs no KeyboardInterrupt handler); a user's terminal gives it the default.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


SPAWN_THEN_WAIT = """
    from monarch.actor import this_host
    procs = this_host().spawn_procs(per_host={"gpus": 16})
    print("spawning", flush=True)
    procs.initialized.get()
    print("up", flush=True)
    import threading
    threading.Event().wait()
"""


def test_ctrl_c_while_procs_start_exits_as_interrupted(tmp_path):
    """Before the fix about 1 run in 6 aborted (SIGABRT) instead: a daemon thread inside the
    native spawn took the GIL back while the interpreter finalized."""
    path = write_client(tmp_path, SPAWN_THEN_WAIT)
    for _ in range(3):
        p = subprocess.Popen([sys.executable, str(path)], env=client_env(),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             preexec_fn=_default_sigint)
        try:
            assert p.stdout.readline().strip() == "spawning"
            p.send_signal(signal.SIGINT)
            _, err = p.communicate(timeout=60)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
        assert p.returncode in (-signal.SIGINT, 128 + signal.SIGINT), (p.returncode, err[-2000:])
        assert "terminate called" not in err, err[-2000:]


CLEANED = []


class Local(Actor):
    def __init__(self, tag):
        self.tag = tag

    @endpoint
    def tag_of(self):
        return self.tag

    def __cleanup__(self, exc):
        CLEANED.append((self.tag, exc))


def test_this_proc_stop_stops_its_actors_and_the_process_lives_on():
    """this_proc().stop() was a no-op: the actors spawned on it went on, and spawn still worked."""
    from monarch.actor import this_proc
    from monarch.errors import SupervisionError
    CLEANED.clear()
    here = this_proc()
    meshes = [here.spawn("local%d" % i, Local, i) for i in range(2)]
    assert [m.tag_of.call_one().get(timeout=30) for m in meshes] == [0, 1]
    assert here.stop().get(timeout=30) is None
    assert sorted(CLEANED) == [(0, None), (1, None)]  # every __cleanup__ ran, once
    with pytest.raises(SupervisionError, match="stopped"):
        here.spawn("late", Local, 2)
    with pytest.raises(SupervisionError, match="stopped"):
        meshes[0].tag_of.call_one().get(timeout=30)
    assert here.stop().get(timeout=30) is None  # twice: nothing more to do
    other = this_proc().spawn("other", Local, 3)  # a new handle: this process is still there
    assert other.tag_of.call_one().get(timeout=30) == 3
    other.stop().get(timeout=30)
    assert sorted(CLEANED) == [(0, None), (1, None), (3, None)]

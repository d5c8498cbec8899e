"""Ctrl-C in a client stops every proc it started: no orphans, and the exit status says the
client was interrupted. A hang-up ends it the same way, and a client that simply exits leaves no
procs either."""

import json
import signal
import subprocess
import sys
import time

from conftest import client_env, pid_alive, write_client


def _default_sigint():
    # A client started from a shell's background job inherits SIGINT ignored (and Python then
    # installs no KeyboardInterrupt handler); a user's terminal gives it the default.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


CLIENT = """
    import json, os, sys
    from monarch.actor import Actor, endpoint, this_host

    class Stuck(Actor):
        @endpoint
        def pid(self):
            return os.getpid()

        @endpoint
        def never(self):
            import threading
            threading.Event().wait()  # busy for good: the proc must be killed, not drained

    procs = this_host().spawn_procs(per_host={"gpus": 4})
    m = procs.spawn("stuck", Stuck)
    print(json.dumps(m.pid.call().get(timeout=30).values()), flush=True)
    m.slice(gpus=0).never.call_one().get()  # blocks until interrupted
"""


def _start_stuck_client(tmp_path):
    path = write_client(tmp_path, CLIENT)
    p = subprocess.Popen([sys.executable, str(path)], env=client_env(), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, preexec_fn=_default_sigint)
    line = p.stdout.readline()
    if not line:
        p.kill()
        raise AssertionError("the client printed no pids: %s" % p.communicate()[1])
    pids = json.loads(line)
    assert len(pids) == 4 and all(pid_alive(x) for x in pids)
    return p, pids


def _signal_and_wait(p, sig):
    try:
        # call_one(...).get() is waiting now or soon; a signal before it starts waiting
        # interrupts the client just as well.
        p.send_signal(sig)
        _, err = p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    return err


def _assert_no_orphans(pids):
    deadline = time.monotonic() + 20
    while any(pid_alive(x) for x in pids) and time.monotonic() < deadline:
        time.sleep(0.05)  # polling the process table against a deadline, not settling
    left = [x for x in pids if pid_alive(x)]
    assert not left, "worker procs outlived the client: %s" % left


def test_sigint_stops_every_proc(tmp_path):
    p, pids = _start_stuck_client(tmp_path)
    err = _signal_and_wait(p, signal.SIGINT)
    assert p.returncode in (-signal.SIGINT, 128 + signal.SIGINT), (p.returncode, err)
    assert "KeyboardInterrupt" in err, err
    _assert_no_orphans(pids)


def test_sighup_ends_the_client_and_its_procs(tmp_path):
    """A hang-up (closed terminal, dropped ssh session) ends the client as in plain Python. UCX's
    library constructor took SIGHUP for its debug mode, so the client lived on (rdma/ucx.cpp)."""
    p, pids = _start_stuck_client(tmp_path)
    err = _signal_and_wait(p, signal.SIGHUP)
    assert p.returncode == -signal.SIGHUP, (p.returncode, err)
    _assert_no_orphans(pids)


def test_a_client_that_exits_without_stop_leaves_no_procs(tmp_path):
    path = write_client(tmp_path, """
        import json, os
        from monarch.actor import Actor, endpoint, this_host

        class P(Actor):
            @endpoint
            def pid(self):
                return os.getpid()

        procs = this_host().spawn_procs(per_host={"gpus": 4})
        print(json.dumps(procs.spawn("p", P).pid.call().get(timeout=30).values()), flush=True)
        # no procs.stop(): the procs die with the client
    """)
    r = subprocess.run([sys.executable, str(path)], env=client_env(), capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, (r.returncode, r.stderr)
    pids = json.loads(r.stdout.splitlines()[0])
    assert len(pids) == 4
    _assert_no_orphans(pids)

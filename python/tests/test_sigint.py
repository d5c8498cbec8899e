"""Ctrl-C in a client stops every proc it started: no orphans, and the exit status says the
client was interrupted. A client that simply exits leaves no procs either."""

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


def test_sigint_stops_every_proc(tmp_path):
    path = write_client(tmp_path, CLIENT)
    p = subprocess.Popen([sys.executable, str(path)], env=client_env(), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True,
                             preexec_fn=_default_sigint)
    try:
        line = p.stdout.readline()
        assert line, "the client printed no pids: %s" % p.stderr.read()
        pids = json.loads(line)
        assert len(pids) == 4 and all(pid_alive(x) for x in pids)
        # call_one(...).get() is waiting now or soon; a SIGINT before it starts waiting
        # interrupts the client just as well (KeyboardInterrupt at the next bytecode).
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode in (-signal.SIGINT, 128 + signal.SIGINT), (p.returncode, err)
    assert "KeyboardInterrupt" in err, err
    deadline = time.monotonic() + 20
    while any(pid_alive(x) for x in pids) and time.monotonic() < deadline:
        time.sleep(0.05)  # polling the process table against a deadline, not settling
    left = [x for x in pids if pid_alive(x)]
    assert not left, "worker procs outlived the interrupted client: %s" % left


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
    deadline = time.monotonic() + 20
    while any(pid_alive(x) for x in pids) and time.monotonic() < deadline:
        time.sleep(0.05)  # polling the process table against a deadline, not settling
    assert not [x for x in pids if pid_alive(x)]

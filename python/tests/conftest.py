"""Shared fixtures of the actor API tests: real worker processes on this host.

Each test module that needs procs gets one proc mesh for the whole module (``procs``, extent
{gpus: 4}); tests that kill procs or stop meshes make their own. Failures nobody handles reach
``monarch.actor.unhandled_fault_hook``; its default exits the process, which would end the whole
pytest run, so here it records them instead, and the test during which one arrived fails.
Tests that expect a failure swap in their own hook with ``fault_hook``.
"""

import os
import queue
import select
import subprocess
import sys
import textwrap
import threading
import time

import pytest

import monarch
from monarch import actor as monarch_actor
from monarch.actor import this_host

# Where `import monarch` resolves: client scripts run in subprocesses need the same PYTHONPATH.
MONARCH_PATH = os.path.dirname(os.path.dirname(os.path.abspath(monarch.__file__)))

_unexpected = []
_unexpected_lock = threading.Lock()


def _recording_hook(failure):
    with _unexpected_lock:
        _unexpected.append(failure)


@pytest.fixture(scope="session", autouse=True)
def _no_exit_on_unhandled_failure():
    this_host()  # installs the native fault hook, which reads unhandled_fault_hook
    saved = monarch_actor.unhandled_fault_hook
    monarch_actor.unhandled_fault_hook = _recording_hook
    yield
    monarch_actor.unhandled_fault_hook = saved


@pytest.fixture(autouse=True)
def _fail_on_unexpected_failure():
    with _unexpected_lock:
        del _unexpected[:]
    yield
    with _unexpected_lock:
        seen = list(_unexpected)
        del _unexpected[:]
    assert not seen, "unhandled failures reached the client during this test: %r" % (seen,)


@pytest.fixture
def fault_hook():
    """Replaces unhandled_fault_hook for one test; returns the queue of what it received."""
    q = queue.Queue()
    saved = monarch_actor.unhandled_fault_hook
    monarch_actor.unhandled_fault_hook = q.put
    yield q
    monarch_actor.unhandled_fault_hook = saved


@pytest.fixture(scope="module")
def procs():
    """Four worker procs, {gpus: 4}, shared by the tests of one module."""
    pm = this_host().spawn_procs(per_host={"gpus": 4})
    pm.initialized.get(timeout=60)
    yield pm
    pm.stop().get(timeout=60)


def pid_alive(pid):
    """True while `pid` exists and is not a zombie."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def wait_exited(pids, timeout):
    """Waits for every process in `pids` to exit (an event: each one's pidfd turns readable when
    it ends), at most `timeout` seconds in all; returns those still running then."""
    deadline = time.monotonic() + timeout
    left = []
    for pid in pids:
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            continue  # gone (and reaped) already
        try:
            p = select.poll()
            p.register(fd, select.POLLIN)
            if not p.poll(max(0.0, deadline - time.monotonic()) * 1000):
                left.append(pid)
        finally:
            os.close(fd)
    return left


def client_env():
    env = dict(os.environ)
    env["PYTHONPATH"] = MONARCH_PATH + os.pathsep + env.get("PYTHONPATH", "")
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    return env


def write_client(tmp_path, source, name="client.py"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(source))
    return path


def run_client(tmp_path, source, timeout=60, name="client.py"):
    """Runs `source` as a client script (its own __main__) with /usr/bin/python3's monarch."""
    path = write_client(tmp_path, source, name)
    return subprocess.run([sys.executable, str(path)], env=client_env(), capture_output=True,
                          text=True, timeout=timeout)

"""spawn_procs(bootstrap=...): a callable each proc runs before it serves (Monarch's name)."""

import os

import pytest

from monarch.actor import Actor, endpoint, this_host


def _set_flag():
    os.environ["MONARCH_TEST_BOOTSTRAPPED"] = "yes-%d" % os.getpid()


def _explode():
    raise RuntimeError("bootstrap exploded on purpose")


class Reader(Actor):
    @endpoint
    def flag(self):
        return os.environ.get("MONARCH_TEST_BOOTSTRAPPED"), os.getpid()


def test_bootstrap_runs_in_every_proc_before_it_serves():
    procs = this_host().spawn_procs(per_host={"gpus": 2}, bootstrap=_set_flag, name="boot")
    try:
        got = procs.spawn("reader", Reader).flag.call().get(timeout=30).values()
        assert [flag for flag, _ in got] == ["yes-%d" % pid for _, pid in got]
    finally:
        procs.stop().get(timeout=30)


def test_a_bootstrap_that_raises_fails_the_spawn_naming_the_rank():
    procs = this_host().spawn_procs(per_host={"gpus": 1}, bootstrap=_explode, name="badboot")
    with pytest.raises(Exception) as ei:
        procs.initialized.get(timeout=60)
    assert "badboot" in str(ei.value) and "exited with code 1" in str(ei.value), str(ei.value)
    # The proc's last line on stderr says why: the exception's own text.
    assert "bootstrap exploded on purpose" in str(ei.value), str(ei.value)


def test_a_bootstrap_that_is_not_callable_is_a_type_error():
    with pytest.raises(TypeError, match="bootstrap must be a callable"):
        this_host().spawn_procs(per_host={"gpus": 1}, bootstrap="not a function")

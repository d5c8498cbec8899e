"""Log forwarding: what an endpoint prints shows up in the client's output with a
"[mesh rank]" prefix, all of it before procs.stop() returns; logging_option(stream_to_client=
False) silences it. Each check runs a client script in a subprocess and reads its output."""

import re

import pytest

from conftest import run_client

CLIENT = """
    import asyncio
    import sys
    from monarch.actor import Actor, current_rank, endpoint, this_host

    class Talker(Actor):
        @endpoint
        def talk(self, tag, n):
            r = current_rank().rank
            for i in range(n):
                print("%s %d %d" % (tag, r, i))
            print("%s-err %d" % (tag, r), file=sys.stderr)
            return r

    procs = this_host().spawn_procs(per_host={"gpus": 4}, name="talkers")
    m = procs.spawn("talker", Talker)
    assert m.talk.call("loud", 300).get(timeout=30).values() == [0, 1, 2, 3]
    assert m.talk.call("last", 300).get(timeout=30).values() == [0, 1, 2, 3]
    procs.stop().get(timeout=30)
    print("CLIENT STOPPED", flush=True)

    # The switch applies to lines as they reach the client (a call's reply may overtake its
    # output), so this mesh has it off before anything runs, and until its procs are gone.
    hushed = this_host().spawn_procs(per_host={"gpus": 2}, name="hushed")
    # Monarch's getting_started form (its logging_option is async); applied at the call
    asyncio.run(hushed.logging_option(stream_to_client=False))
    for bad, kind in (([1], TypeError), ("5", TypeError), (True, TypeError), (-1, ValueError),
                      (float("nan"), ValueError), (4000, ValueError)):
        try:
            hushed.logging_option(stream_to_client=False, aggregate_window_sec=bad)
            raise AssertionError("aggregate_window_sec=%r was accepted" % (bad,))
        except (TypeError, ValueError) as e:
            assert type(e) is kind and "aggregate_window_sec" in str(e), (bad, repr(e))
    q = hushed.spawn("talker", Talker)
    assert q.talk.call("quiet", 50).get(timeout=30).values() == [0, 1]
    hushed.stop().get(timeout=30)
    print("HUSHED STOPPED", flush=True)

    # Inside a running loop, on procs still starting: the switch is queued ahead of the calls.
    early = this_host().spawn_procs(per_host={"gpus": 2}, name="early")

    async def main():
        await early.logging_option(stream_to_client=False)
        return (await early.spawn("talker", Talker).talk.call("hidden", 50)).values()

    assert asyncio.run(main()) == [0, 1]
    early.stop().get(timeout=30)
    print("EARLY STOPPED", flush=True)
"""


@pytest.fixture(scope="module")
def output(tmp_path_factory):
    r = run_client(tmp_path_factory.mktemp("logging"), CLIENT, timeout=60)
    assert r.returncode == 0, (r.stdout, r.stderr)
    return r


def _before_stop(out):
    lines = out.splitlines()
    assert "CLIENT STOPPED" in lines, out[-2000:]
    return lines[:lines.index("CLIENT STOPPED")]


def test_prints_reach_the_client_with_mesh_rank_prefixes(output):
    lines = _before_stop(output.stdout)
    for tag in ("loud", "last"):
        for r in range(4):
            pattern = r"\[talkers %d\] %s %d \d+" % (r, tag, r)
            got = [ln for ln in lines if re.fullmatch(pattern, ln)]
            assert [int(ln.rsplit(" ", 1)[1]) for ln in got] == list(range(300)), (
                "rank %d's %r lines before stop() returned: %d of 300" % (r, tag, len(got)))


def test_stderr_is_forwarded_to_stderr(output):
    for r in range(4):
        assert "[talkers %d] loud-err %d" % (r, r) in output.stderr.splitlines(), output.stderr


def test_stream_to_client_false_silences(output):
    assert "HUSHED STOPPED" in output.stdout.splitlines(), output.stdout[-2000:]
    assert "quiet" not in output.stdout and "quiet" not in output.stderr
    assert "EARLY STOPPED" in output.stdout.splitlines(), output.stdout[-2000:]
    assert "hidden" not in output.stdout and "hidden" not in output.stderr


def test_runtime_warnings_go_to_stderr(tmp_path):
    """The runtime's own log lines (spdlog) go to stderr, in the client and in the workers, so a
    program's stdout holds only what it printed: here a proc dies, which the client and the
    surviving worker both log as a warning."""
    r = run_client(tmp_path, """
        import json, os
        import monarch.actor
        from monarch.actor import Actor, endpoint, this_host

        monarch.actor.unhandled_fault_hook = lambda failure: None

        class Quitter(Actor):
            @endpoint
            def quit(self):
                os._exit(1)

            @endpoint
            def ok(self):
                return 1

        procs = this_host().spawn_procs(per_host={"gpus": 2}, name="quitters")
        q = procs.spawn("q", Quitter)
        q.slice(gpus=1).quit.call().get(timeout=30)
        assert q.slice(gpus=0).ok.call_one().get(timeout=30) == 1
        procs.stop().get(timeout=30)
        print(json.dumps({"result": 42}))
    """, timeout=60)
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert r.stdout == '{"result": 42}\n', r.stdout
    assert "[warning]" in r.stderr and "declared failed" in r.stderr, r.stderr

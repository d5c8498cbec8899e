#!/usr/bin/env python3
"""Python front end benchmarks (issue 17), run by scripts/run-bench.sh after the C++ benches.

  py_call_rtt     call_one(...).get() on a Python actor in another process, 64-byte bytes payload
                  echoed back (us; p50 and p99). Peers: mp_pipe, a multiprocessing.Pipe ping-pong of
                  the same 64 bytes between two processes (send_bytes/recv_bytes, the fastest
                  idiom); cpp_actor, the C++ remote actor call of the same run (bench_channel's
                  xproc_rtt monarch_actor, unix, 64 B), copied from $MONARCH_BENCH_OUT.
                  Targets: <= 60 us and <= 3x mp_pipe.
  py_call_rate    call_one with 64 calls in flight (a window: wait the oldest, issue one more),
                  calls/s. Peer mp_pipe: the same window of 64 B messages over the Pipe.
                  Target >= 30k calls/s.
  py_cast_gather  call() to 16 procs (one actor each) plus the gather into a ValueMesh (us; p50).
                  Peer cpp_mesh: bench_procs' cast_gather_procs (16 procs, 1 actor each), run as
                  BUILD/bench/bench_procs with PROCS_BENCH_ONLY=gather1 between the Python runs
                  (alternating); the ratio is the median of the per-run ratios. Without that
                  binary, the row of this make bench run is copied instead. Target <= 2x cpp_mesh.

Each figure is the median over PY_BENCH_RUNS runs (default 5; monarch and its peer alternate run
by run), and "spread" is [min, max] of the runs. Appends JSON lines to $MONARCH_BENCH_OUT like
the C++ benches (common/report.hpp); scripts/bench-report.py prints the ratios.

Usage: PYTHONPATH=build/python /usr/bin/python3 bench/py_bench.py [BUILD]
"""
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import time

from bench_json import emit, emit_runs  # bench/ is the script's dir: on sys.path

RUNS = int(os.environ.get("PY_BENCH_RUNS", "5"))
RTT_ITERS = int(os.environ.get("PY_BENCH_RTT_ITERS", "3000"))
RATE_CALLS = int(os.environ.get("PY_BENCH_RATE_CALLS", "20000"))
GATHER_ITERS = int(os.environ.get("PY_BENCH_GATHER_ITERS", "400"))
WARMUP = 200
SIZE = 64
IN_FLIGHT = 64
PROCS = 16


def pct(v, q):
    v = sorted(v)
    return v[int(q * (len(v) - 1))]


# --- the multiprocessing.Pipe peer -------------------------------------------------------------


def pipe_echo(conn):
    """The peer process: echoes every message until an empty one."""
    while True:
        b = conn.recv_bytes()
        if not b:
            return
        conn.send_bytes(b)


def pipe_rtt(conn, iters):
    payload = bytes(SIZE)
    for _ in range(WARMUP):
        conn.send_bytes(payload)
        conn.recv_bytes()
    v = []
    for _ in range(iters):
        t0 = time.perf_counter()
        conn.send_bytes(payload)
        conn.recv_bytes()
        v.append((time.perf_counter() - t0) * 1e6)
    return v


def pipe_rate(conn, n):
    payload = bytes(SIZE)
    t0 = time.perf_counter()
    for _ in range(IN_FLIGHT):
        conn.send_bytes(payload)
    for i in range(n):
        conn.recv_bytes()
        if i + IN_FLIGHT < n:
            conn.send_bytes(payload)
    return n / (time.perf_counter() - t0)


# --- monarch -----------------------------------------------------------------------------------


def monarch_rtt(echo, iters):
    payload = bytes(SIZE)
    for _ in range(WARMUP):
        echo.echo.call_one(payload).get(timeout=30)
    v = []
    for _ in range(iters):
        t0 = time.perf_counter()
        echo.echo.call_one(payload).get(timeout=30)
        v.append((time.perf_counter() - t0) * 1e6)
    return v


def monarch_rate(echo, n):
    payload = bytes(SIZE)
    window = []
    t0 = time.perf_counter()
    for _ in range(IN_FLIGHT):
        window.append(echo.echo.call_one(payload))
    head = 0
    for i in range(n):
        window[head].get(timeout=30)
        window[head] = echo.echo.call_one(payload) if i + IN_FLIGHT < n else None
        head = (head + 1) % IN_FLIGHT
    return n / (time.perf_counter() - t0)


def monarch_gather(mesh, iters):
    for _ in range(20):
        mesh.ping.call().get(timeout=30)
    v = []
    for _ in range(iters):
        t0 = time.perf_counter()
        vm = mesh.ping.call().get(timeout=30)
        v.append((time.perf_counter() - t0) * 1e6)
        if len(vm) != PROCS:
            raise RuntimeError("py_cast_gather: %d replies, expected %d" % (len(vm), PROCS))
    return v


def cpp_gather_p50(build):
    """One run of bench_procs' cast_gather_procs at 1 actor per proc (PROCS_BENCH_ONLY=gather1):
    its p50 in us, or None where the binary is not built (MONARCH_BUILD_BENCH=OFF)."""
    exe = os.path.join(build, "bench", "bench_procs")
    if not os.access(exe, os.X_OK):
        return None
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "procs.jsonl")
        env = dict(os.environ, PROCS_BENCH_ONLY="gather1", MONARCH_BENCH_OUT=out)
        subprocess.run([exe], env=env, check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, timeout=300)
        with open(out) as f:
            for line in f:
                r = json.loads(line)
                if (r.get("bench"), r.get("metric"), r.get("actors_per_proc")) == (
                        "cast_gather_procs", "p50", 1):
                    return r["value"]
    raise RuntimeError("bench_procs PROCS_BENCH_ONLY=gather1 wrote no cast_gather_procs p50 row")


def cpp_row(bench, impl, metric, **params):
    """The value of a C++ bench's row in this run's results file, or None."""
    out = os.environ.get("MONARCH_BENCH_OUT")
    if not out or not os.path.exists(out):
        return None
    found = None
    with open(out) as f:
        for line in f:
            try:
                r = json.loads(line)
            except ValueError:
                continue
            if (r.get("bench"), r.get("impl"), r.get("metric")) == (bench, impl, metric) and all(
                    r.get(k) == v for k, v in params.items()):
                found = r["value"]
    return found


def main():
    # The peer process first: spawned (not forked) so that it does not inherit runtime threads.
    ctx = multiprocessing.get_context("spawn")
    mine, theirs = ctx.Pipe(duplex=True)
    peer = ctx.Process(target=pipe_echo, args=(theirs,), daemon=True)
    peer.start()

    from monarch.actor import Actor, endpoint, this_host  # noqa: E402 (after the peer started)

    class Echo(Actor):
        @endpoint
        def echo(self, b: bytes) -> bytes:
            return b

        @endpoint
        def ping(self) -> int:
            return 1

    host = this_host()
    procs = host.spawn_procs(per_host={"procs": 1}, name="py_bench_rtt")
    echo = procs.spawn("echo", Echo)

    # py_call_rtt
    m50, m99, p50, p99 = [], [], [], []
    for _ in range(RUNS):
        v = monarch_rtt(echo, RTT_ITERS)
        m50.append(pct(v, 0.5))
        m99.append(pct(v, 0.99))
        v = pipe_rtt(mine, RTT_ITERS)
        p50.append(pct(v, 0.5))
        p99.append(pct(v, 0.99))
    for impl, runs50, runs99 in (("monarch", m50, m99), ("mp_pipe", p50, p99)):
        emit_runs("py_call_rtt", impl, "p50", runs50, "us", "lower", size=SIZE)
        emit_runs("py_call_rtt", impl, "p99", runs99, "us", "lower", size=SIZE)
    cpp = cpp_row("xproc_rtt", "monarch_actor", "p50", transport="unix", size=SIZE)
    if cpp is not None:
        emit("py_call_rtt", "cpp_actor", "p50", cpp, "us", "lower",
             note="bench_channel xproc_rtt monarch_actor unix, this run", size=SIZE)
    else:
        print("py_bench: no xproc_rtt monarch_actor row in $MONARCH_BENCH_OUT (bench_channel not "
              "run before this); py_call_rtt cpp_actor left out")

    # py_call_rate
    mr, pr = [], []
    for _ in range(RUNS):
        mr.append(monarch_rate(echo, RATE_CALLS))
        pr.append(pipe_rate(mine, RATE_CALLS))
    emit_runs("py_call_rate", "monarch", "rate", mr, "calls/s", "higher",
         size=SIZE, in_flight=IN_FLIGHT)
    emit_runs("py_call_rate", "mp_pipe", "rate", pr, "calls/s", "higher",
         size=SIZE, in_flight=IN_FLIGHT)
    mine.send_bytes(b"")
    peer.join(10)
    procs.stop().get(timeout=60)

    # py_cast_gather
    procs16 = host.spawn_procs(per_host={"procs": PROCS}, name="py_bench_gather")
    mesh = procs16.spawn("echo", Echo)
    build = sys.argv[1] if len(sys.argv) > 1 else "build"
    g50, c50 = [], []
    for _ in range(RUNS):  # alternating: a busy moment of the machine hits both sides alike
        g50.append(pct(monarch_gather(mesh, GATHER_ITERS), 0.5))
        c = cpp_gather_p50(build)
        if c is not None:
            c50.append(c)
    emit_runs("py_cast_gather", "monarch", "p50", g50, "us", "lower", procs=PROCS)
    gather = statistics.median(g50)
    if c50:
        emit_runs("py_cast_gather", "cpp_mesh", "p50", c50, "us", "lower", procs=PROCS,
                  note="bench_procs PROCS_BENCH_ONLY=gather1, alternating with the Python runs")
        per_run = [g / c for g, c in zip(g50, c50)]
        vs_cpp = ", %.2fx cpp_mesh [%.2f..%.2f] (median of %d alternating runs; target <= 2x)" % (
            statistics.median(per_run), min(per_run), max(per_run), len(per_run))
    else:
        cpp = cpp_row("cast_gather_procs", "monarch", "p50", procs=PROCS, actors_per_proc=1)
        if cpp is not None:
            emit("py_cast_gather", "cpp_mesh", "p50", cpp, "us", "lower",
                 note="bench_procs cast_gather_procs, 1 actor per proc, this run", procs=PROCS)
            vs_cpp = ", %.2fx cpp_mesh (target <= 2x)" % (gather / cpp)
        else:
            print("py_bench: no cast_gather_procs row in $MONARCH_BENCH_OUT (bench_procs not run "
                  "before this); py_cast_gather cpp_mesh left out")
            vs_cpp = ""
    procs16.stop().get(timeout=60)

    rtt, pipe, rate = statistics.median(m50), statistics.median(p50), statistics.median(mr)
    print("py_bench: py_call_rtt p50 %.1f us (target <= 60), %.2fx mp_pipe (target <= 3x); "
          "py_call_rate %.0f calls/s (target >= 30000); py_cast_gather p50 %.0f us%s"
          % (rtt, rtt / pipe, rate, gather, vs_cpp))
    return 0


if __name__ == "__main__":
    sys.exit(main())

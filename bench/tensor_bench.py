#!/usr/bin/env python3
"""Tensor engine benchmarks (issue 19), run by scripts/run-bench.sh after py_bench.py.

  tensor_dispatch     small elementwise ops (t = t + 1 on a 4-element float tensor) issued by
                      the controller inside procs.activate() to a {gpus: 4} mesh, one shard
                      fetched at the end (which waits for every op before it on that proc);
                      ops/s over TENSOR_BENCH_OPS ops. Peer "target": issue 19's 20k ops/s.
  tensor_matmul_step  a 1024x1024 matmul sharded over 4 procs along the contraction dim (each
                      proc: x[:, 256-wide shard] @ w[256-row shard, :], 1024x1024 partial), the
                      partials summed over "gpus" (an all-reduce of 4 MiB), then the result's sum
                      fetched from proc 0, so each step includes one controller round trip
                      (ms/step). Peer local_torch: the same math (one 1024x1024x1024 matmul and
                      the sum) in this process. "overhead" is monarch minus local_torch, in ms.
                      Each worker runs with torch.set_num_threads(1) like this process does for
                      its peer: on a small host 4 procs with all threads each would only contend.

Each figure is the median over TENSOR_BENCH_RUNS runs (default 3; monarch and its peer alternate
run by run); "spread" is [min, max] of the runs. Appends JSON lines to $MONARCH_BENCH_OUT like
the other benches. Skips (exit 0, a line saying so) where monarch.tensor is missing.

Usage: PYTHONPATH=build/python /usr/bin/python3 bench/tensor_bench.py [BUILD]
"""
import os
import statistics
import sys
import time

from bench_json import emit, emit_runs  # bench/ is the script's dir: on sys.path

RUNS = int(os.environ.get("TENSOR_BENCH_RUNS", "3"))
DISPATCH_OPS = int(os.environ.get("TENSOR_BENCH_OPS", "20000"))
MATMUL_STEPS = int(os.environ.get("TENSOR_BENCH_STEPS", "20"))
PROCS = 4
N = 1024
TARGET_RATE = 20000.0


def _one_thread():
    import torch

    torch.set_num_threads(1)


def dispatch_run(procs, torch, fetch_shard, ops):
    """ops/s of ``ops`` chained elementwise ops on every proc, with one fetch at the end."""
    with procs.activate():
        t = torch.zeros(4)
        fetch_shard(t, gpus=PROCS - 1).get(timeout=60)  # the workers are up
        t0 = time.perf_counter()
        for _ in range(ops):
            t = t + 1
        got = fetch_shard(t, gpus=PROCS - 1).get(timeout=300)
        dt = time.perf_counter() - t0
    if float(got[0]) != float(ops):
        raise RuntimeError("tensor_dispatch: the shard holds %s after %d increments"
                           % (got[0].item(), ops))
    return ops / dt


def matmul_mesh_run(procs, torch, fetch_shard, remote, steps):
    """ms per sharded matmul step (matmul, all-reduce over gpus, sum fetched)."""
    k = N // PROCS

    def shard(seed):
        from monarch.actor import current_rank

        g = torch.Generator().manual_seed(seed)
        x, w = torch.randn(N, N, generator=g), torch.randn(N, N, generator=g)
        i = current_rank()["gpus"]
        return x[:, i * k:(i + 1) * k].contiguous(), w[i * k:(i + 1) * k, :].contiguous()

    def shard_meta(seed):
        return torch.empty(N, k, device="meta"), torch.empty(k, N, device="meta")

    with procs.activate():
        x, w = remote(shard, propagate=shard_meta)(0)
        y = (x @ w).reduce("gpus", reduction="sum")  # warm: groups formed, kernels loaded
        fetch_shard(y.sum(), gpus=0).get(timeout=120)
        t0 = time.perf_counter()
        for _ in range(steps):
            y = (x @ w).reduce("gpus", reduction="sum")
            fetch_shard(y.sum(), gpus=0).get(timeout=120)
        return (time.perf_counter() - t0) * 1e3 / steps


def matmul_local_run(torch, steps):
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(N, N, generator=g), torch.randn(N, N, generator=g)
    (x @ w).sum().item()
    t0 = time.perf_counter()
    for _ in range(steps):
        (x @ w).sum().item()
    return (time.perf_counter() - t0) * 1e3 / steps


def main():
    try:
        import torch
        from monarch.tensor import fetch_shard, remote
    except ImportError as e:
        print("tensor_bench: skipped, the tensor engine is not importable here (%s)" % e)
        return 0
    from monarch.actor import this_host

    torch.set_num_threads(1)
    procs = this_host().spawn_procs(per_host={"gpus": PROCS}, bootstrap=_one_thread)
    try:
        rates = [dispatch_run(procs, torch, fetch_shard, DISPATCH_OPS) for _ in range(RUNS)]
        emit_runs("tensor_dispatch", "monarch", "rate", rates, "ops/s", "higher", procs=PROCS,
                  ops=DISPATCH_OPS)
        emit("tensor_dispatch", "target", "rate", TARGET_RATE, "ops/s", "higher", procs=PROCS,
             ops=DISPATCH_OPS, note="issue 19's target")
        mesh_ms, local_ms = [], []
        for _ in range(RUNS):
            mesh_ms.append(matmul_mesh_run(procs, torch, fetch_shard, remote, MATMUL_STEPS))
            local_ms.append(matmul_local_run(torch, MATMUL_STEPS))
        params = dict(n=N, procs=PROCS, steps=MATMUL_STEPS)
        emit_runs("tensor_matmul_step", "monarch", "step", mesh_ms, "ms", "lower", **params)
        emit_runs("tensor_matmul_step", "local_torch", "step", local_ms, "ms", "lower", **params)
        over = [m - l for m, l in zip(mesh_ms, local_ms)]
        emit_runs("tensor_matmul_step", "monarch", "overhead", over, "ms", "lower", **params)
        med_rate = statistics.median(rates)
        print("tensor_bench: tensor_dispatch %.0f ops/s (%.2fx the 20k target); "
              "tensor_matmul_step %.1f ms/step vs %.1f ms local torch (%.2fx, overhead %.1f ms)"
              % (med_rate, med_rate / TARGET_RATE, statistics.median(mesh_ms),
                 statistics.median(local_ms),
                 statistics.median(mesh_ms) / statistics.median(local_ms),
                 statistics.median(over)))
    finally:
        procs.stop().get(timeout=60)
    return 0


if __name__ == "__main__":
    sys.exit(main())

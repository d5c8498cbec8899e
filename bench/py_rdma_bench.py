#!/usr/bin/env python3
"""py_rdma_read (issue 17): RDMABuffer.read_into of 64 MiB between two processes, from Python.

    /usr/bin/python3 bench/py_rdma_bench.py [BUILD]        # BUILD defaults to build

impl monarch: an actor in a worker proc owns 64 MiB and hands out an RDMABuffer of it; the
client reads the whole buffer into its own 64 MiB tensor (buf.read_into(dst).get()), one read at
a time. Two kinds of memory, param "memory": "tensor", a plain torch tensor registered in place
(the cma route: process_vm_readv), and "allocate", a tensor over RDMABuffer.allocate()d shared
memory (the shm route: one memcpy from the owner's mapping). impl memcpy: numpy.copyto of 64 MiB
between two tensors of the client (a plain single-threaded memcpy, as the C++ rdma bench's peer),
into the same destination. Every page of both sides is warm; they are interleaved run by run.
Target: monarch >= 0.9x memcpy (met by "allocate"; "tensor" is bound by process_vm_readv pinning
the owner's pages, docs/data-plane.md "Measured").

Output: JSON lines as the C++ benches (bench/common/report.hpp), also appended to
$MONARCH_BENCH_OUT when set: for each kind of memory, metrics median, min and max of
BENCH_PY_RDMA_RUNS runs (default 9, at least 5) for each impl, GB/s (10^9 B/s), with equal params
so that scripts/bench-report.py prints the ratios (the memcpy lines repeat for each kind); then
one line, metric x_memcpy, the ratio of the medians. The routes the reads took
(docs/data-plane.md) and every run's figure are printed to stderr.
"""
import json
import os
import statistics
import sys
import time


def emit(out, **r):
    line = json.dumps(r)
    print(line, flush=True)
    if out:
        with open(out, "a") as f:
            f.write(line + "\n")


def main(build):
    sys.path.insert(0, os.path.join(build, "python"))
    import numpy as np
    import torch

    from monarch.actor import Actor, endpoint, this_host
    from monarch.rdma import RDMABuffer

    nbytes = 64 << 20
    runs = max(5, int(os.environ.get("BENCH_PY_RDMA_RUNS", "9")))
    out = os.environ.get("MONARCH_BENCH_OUT")

    class Owner(Actor):
        def __init__(self, n):
            self.plain = torch.arange(n, dtype=torch.int32)  # every page written: warm
            self.shm = RDMABuffer.allocate(n * 4, name="py_rdma_bench_allocate")
            torch.frombuffer(self.shm.memory(), dtype=torch.int32).copy_(self.plain)

        @endpoint
        def buffers(self):
            return {"tensor": RDMABuffer(self.plain, name="py_rdma_bench_tensor"),
                    "allocate": self.shm}

    procs = this_host().spawn_procs(per_host={"procs": 1}, name="py_rdma_bench")
    owner = procs.spawn("owner", Owner, nbytes // 4)
    bufs = owner.buffers.call_one().get(timeout=60)
    dst = torch.zeros(nbytes // 4, dtype=torch.int32)
    src = torch.arange(nbytes // 4, dtype=torch.int32)
    dst_np, src_np = dst.numpy(), src.numpy()

    for kind, buf in bufs.items():  # warm-up, and a check that the bytes arrived
        dst.zero_()
        buf.read_into(dst).get(timeout=60)
        if not torch.equal(dst, src):
            raise SystemExit("py_rdma_bench: the bytes read (%s) differ from the owner's" % kind)
    np.copyto(dst_np, src_np)

    def gbps(fn):
        t0 = time.perf_counter()
        fn()
        return nbytes / (time.perf_counter() - t0) / 1e9

    peer = []
    mine = {kind: [] for kind in bufs}
    for _ in range(runs):
        peer.append(gbps(lambda: np.copyto(dst_np, src_np)))
        for kind, buf in bufs.items():
            mine[kind].append(gbps(lambda: buf.read_into(dst).get(timeout=60)))
    routes = {kind: buf.route() for kind, buf in bufs.items()}
    procs.stop().get(timeout=60)

    for kind, v in mine.items():
        p = {"bytes": nbytes, "runs": runs, "memory": kind}
        for impl, xs in (("monarch", v), ("memcpy", peer)):
            for metric, x in (("median", statistics.median(xs)), ("min", min(xs)),
                              ("max", max(xs))):
                emit(out, bench="py_rdma_read", impl=impl, metric=metric, value=round(x, 3),
                     unit="GB/s", better="higher", **p)
        ratio = statistics.median(v) / statistics.median(peer)
        emit(out, bench="py_rdma_read", impl="monarch", metric="x_memcpy", value=round(ratio, 3),
             unit="x", better="higher", target=0.9, **p)
        print("py_rdma_read (memory %s): route %s, monarch %s GB/s" % (
            kind, routes[kind], [round(x, 2) for x in v]), file=sys.stderr)
    print("py_rdma_read: memcpy %s GB/s" % [round(x, 2) for x in peer], file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "build"))

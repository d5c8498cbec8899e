#!/usr/bin/env python3
"""Fault-tolerant training benchmarks (issue 8), run by scripts/run-bench.sh.

1. FT overhead per step with no faults: ft_train --no-faults against ddp_baseline (plain static
   gloo data parallelism, same model, data, batch and replicas), samples/s. Target: <= 5 %.
2. Committed samples/s under faults divided by the fault-free rate (same ft_train run). Target >= 90 %.
3. Heal bandwidth (donor state read through RdmaBuffer) against memcpy of the same size.
Appends JSON lines to $MONARCH_BENCH_OUT like the C++ benchmarks."""
import json
import os
import subprocess
import sys
import tempfile


def emit(out, **r):
    line = json.dumps(r)
    print(line)
    if out:
        with open(out, "a") as f:
            f.write(line + "\n")


def run(cmd):
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def main(build):
    out = os.environ.get("MONARCH_BENCH_OUT")
    ft, ddp = f"{build}/bin/ft_train", f"{build}/bin/ddp_baseline"
    if not (os.path.exists(ft) and os.path.exists(ddp)):
        print("bench_ft: ft_train/ddp_baseline not built (MONARCH_BUILD_FT=OFF); skipped")
        return 0
    steps, replicas = int(os.environ.get("BENCH_FT_STEPS", "1000")), 4
    with tempfile.TemporaryDirectory() as d:
        run([ddp, "--replicas", str(replicas), "--steps", str(steps), "--json-summary", f"{d}/ddp.json"])
        run([ft, "--no-faults", "--no-progress", "--replicas", str(replicas), "--steps", str(steps),
             "--out", d, "--json-summary", f"{d}/ff.json"])
        run([ft, "--no-progress", "--replicas", str(replicas), "--steps", str(steps), "--faults", "6",
             "--out", d, "--json-summary", f"{d}/faulty.json"])
        ddp_s, ff_s, fr_s = (json.load(open(f"{d}/{n}.json")) for n in ("ddp", "ff", "faulty"))
    p = {"replicas": replicas, "steps": steps}
    emit(out, bench="ft_no_faults", metric="samples_s", impl="monarch", value=ff_s["committed_samples_per_s"],
         unit="samples/s", better="higher", **p)
    emit(out, bench="ft_no_faults", metric="samples_s", impl="static_ddp", value=ddp_s["samples_per_s"],
         unit="samples/s", better="higher", **p)
    emit(out, bench="ft_no_faults", metric="step_ms_p50", impl="monarch", value=ff_s["step_ms_p50"],
         unit="ms", better="lower", **p)
    emit(out, bench="ft_no_faults", metric="step_ms_p50", impl="static_ddp", value=ddp_s["step_ms_p50"],
         unit="ms", better="lower", **p)
    emit(out, bench="ft_faults", metric="samples_s", impl="monarch", value=fr_s["committed_samples_per_s"],
         unit="samples/s", better="higher", faults=fr_s["faults_injected"], **p)
    emit(out, bench="ft_faults", metric="samples_s", impl="fault_free", value=fr_s["committed_samples_per_s_fault_free"],
         unit="samples/s", better="higher", faults=fr_s["faults_injected"], **p)
    emit(out, bench="ft_heal", metric="GB_s", impl="monarch", value=fr_s["heal_gbps"], unit="GB/s", better="higher",
         bytes=fr_s["state_bytes"])
    emit(out, bench="ft_heal", metric="GB_s", impl="memcpy", value=fr_s["memcpy_gbps"], unit="GB/s", better="higher",
         bytes=fr_s["state_bytes"])
    # Per-step time (median time between committed steps) is the fair comparison: ddp_baseline's
    # samples/s also counts its start-up.
    overhead = ff_s["step_ms_p50"] / ddp_s["step_ms_p50"] - 1
    under = fr_s["committed_samples_per_s"] / fr_s["committed_samples_per_s_fault_free"]
    print(f"bench_ft: FT overhead per step vs static DDP {overhead * 100:+.1f} % (target <= 5 %); "
          f"samples/s under {fr_s['faults_injected']} faults = {under * 100:.1f} % of fault-free (target >= 90 %); "
          f"heal {fr_s['heal_gbps']:.2f} GB/s vs memcpy {fr_s['memcpy_gbps']:.1f} GB/s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "build"))

"""The JSON lines of the Python benchmarks (bench/py_bench.py, bench/tensor_bench.py): one object
per figure, printed and appended to $MONARCH_BENCH_OUT, as the C++ benchmarks write them."""

import json
import os
import statistics


def emit(bench, impl, metric, value, unit, better, spread=None, note=None, **params):
    r = {"bench": bench, "impl": impl, "metric": metric, "value": round(value, 3), "unit": unit,
         "better": better}
    r.update(params)
    if spread is not None:
        r["spread"] = [round(spread[0], 3), round(spread[1], 3)]
    if note is not None:
        r["note"] = note
    line = json.dumps(r)
    print(line, flush=True)
    out = os.environ.get("MONARCH_BENCH_OUT")
    if out:
        with open(out, "a") as f:
            f.write(line + "\n")


def emit_runs(bench, impl, metric, runs, unit, better, **params):
    """The median of the per-run figures, with their [min, max] as the spread."""
    emit(bench, impl, metric, statistics.median(runs), unit, better,
         spread=(min(runs), max(runs)), **params)

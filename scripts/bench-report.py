#!/usr/bin/env python3
"""Prints a table of benchmark results (JSON lines) with monarch/peer ratios.

A ratio is monarch's value divided by the peer's for the same (bench, metric, params).
The 'verdict' column says whether monarch is ahead, oriented by the 'better' key."""
import json
import sys
from collections import OrderedDict

# "spread" ([min, max] over runs) and "note" (where a copied figure came from) describe a row;
# they are not parameters of the measurement.
RESERVED = {"bench", "impl", "metric", "value", "unit", "better", "spread", "note"}


def key_of(r):
    params = tuple(sorted((k, str(v)) for k, v in r.items() if k not in RESERVED))
    return (r["bench"], r["metric"], params)


def main(path):
    rows = [json.loads(line) for line in open(path) if line.strip()]
    groups = OrderedDict()
    for r in rows:
        groups.setdefault(key_of(r), []).append(r)
    header = f"{'bench':<28} {'metric':<10} {'params':<34} {'impl':<12} {'value':>14} {'unit':<9} {'ratio':>8}  verdict"
    print(header)
    print("-" * len(header))
    for (bench, metric, params), rs in groups.items():
        mine = next((r for r in rs if r["impl"] == "monarch"), None)
        ptxt = ",".join(f"{k}={v}" for k, v in params)[:34]
        for r in rs:
            ratio, verdict = "", ""
            if mine is not None and r is not mine and r["value"]:
                q = mine["value"] / r["value"]
                ratio = f"{q:.2f}x"
                ahead = q <= 1.0 if r.get("better") == "lower" else q >= 1.0
                verdict = f"monarch {'ahead of' if ahead else 'behind'} {r['impl']}"
            print(f"{bench:<28} {metric:<10} {ptxt:<34} {r['impl']:<12} {r['value']:>14.4g} {r['unit']:<9} {ratio:>8}  {verdict}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "build/bench/results.jsonl")

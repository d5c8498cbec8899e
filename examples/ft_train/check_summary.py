#!/usr/bin/env python3
"""Checks an ft_train --json-summary against the job's acceptance rules (issue 8).

Usage: check_summary.py SUMMARY.json [--min-faults N] [--min-accuracy A] [--max-accuracy-gap G]
                        [--max-perplexity P] [--max-perplexity-gap R]
                        [--require-kinds K,K,...] [--all-recovered] [--min-overlaps N]
The accuracy rules apply to the MLP (metric "accuracy"), the perplexity rules to llama-tiny
(metric "perplexity": at most P, and within the relative gap R of the fault-free run).
The last three check a --chaos run's fault timeline (docs/ft.md, "Chaos mode"): every listed kind
injected (a fault-point kind only counts when its point fired), every fault recovered, and faults
injected while another fault's recovery was open.
Exits 1 naming every rule that failed."""
import argparse
import json
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("summary")
    ap.add_argument("--min-faults", type=int, default=6)
    ap.add_argument("--min-accuracy", type=float, default=0.85)
    ap.add_argument("--max-accuracy-gap", type=float, default=0.01)
    ap.add_argument("--max-perplexity", type=float, default=20.0)
    ap.add_argument("--max-perplexity-gap", type=float, default=0.02)
    ap.add_argument("--stall-slack", type=float, default=0.5,
                    help="allowed survivor stall beyond the detection timeout, s (sanitizer builds: more)")
    ap.add_argument("--no-stall-check", action="store_true",
                    help="do not bound max_survivor_stall_s (chaos: overlapping faults add up in one stall)")
    ap.add_argument("--require-kinds", default="",
                    help="comma-separated fault kinds that must each be in the timeline (fired)")
    ap.add_argument("--all-recovered", action="store_true",
                    help="every fault in the timeline has a recovery_s")
    ap.add_argument("--min-overlaps", type=int, default=0,
                    help="faults injected while an earlier fault was still open")
    a = ap.parse_args()
    s = json.load(open(a.summary))
    failed = []

    def rule(ok, text):
        print(("ok   " if ok else "FAIL ") + text)
        if not ok:
            failed.append(text)

    rule(s["faults_injected"] >= a.min_faults, f"faults_injected {s['faults_injected']} >= {a.min_faults}")
    rule(s["survivor_restarts"] == 0, f"survivor_restarts {s['survivor_restarts']} == 0")
    rule(s["replicas_bitwise_equal"] is True, f"replicas_bitwise_equal {s['replicas_bitwise_equal']}")
    if s.get("metric", "accuracy") == "perplexity":
        p, ff = s["metric_value"], s.get("metric_value_fault_free")
        rule(0 < p <= a.max_perplexity, f"perplexity {p:.4f} <= {a.max_perplexity}")
        rule(ff is not None and ff > 0 and abs(p - ff) / ff <= a.max_perplexity_gap,
             f"|perplexity - fault_free {ff}| / fault_free <= {a.max_perplexity_gap}")
    else:
        rule(s["test_accuracy"] >= a.min_accuracy, f"test_accuracy {s['test_accuracy']:.4f} >= {a.min_accuracy}")
        ff = s.get("test_accuracy_fault_free")
        rule(ff is not None and abs(s["test_accuracy"] - ff) <= a.max_accuracy_gap,
             f"|test_accuracy - fault_free {ff}| <= {a.max_accuracy_gap}")
    bound = s["detection_timeout_s"] + a.stall_slack
    if a.no_stall_check:
        print(f"skip max_survivor_stall_s {s['max_survivor_stall_s']:.3f} (not bounded: --no-stall-check;"
              f" at {s.get('max_survivor_stall_at', '?')})")
    else:
        rule(s["max_survivor_stall_s"] <= bound,
             f"max_survivor_stall_s {s['max_survivor_stall_s']:.3f} <= detection timeout + {a.stall_slack} = {bound:.2f}"
             f" (at {s.get('max_survivor_stall_at', '?')})")
    rule(s["recoveries"] >= 1, f"recoveries {s['recoveries']} >= 1")
    faults = s.get("faults", [])
    for kind in filter(None, a.require_kinds.split(",")):
        hits = [f for f in faults if f["fault"] == kind and f.get("fired") is not False]
        rule(len(hits) >= 1, f"fault kind {kind} injected (and its fault point fired): {len(hits)} time(s)")
    if a.all_recovered:
        open_ = [f"{f['fault']}@{f['step']}: {f.get('unrecovered')}" for f in faults
                 if f.get("recovery_s") is None]
        rule(not open_ and s["recoveries"] == len(faults),
             f"all {len(faults)} faults recovered ({s['recoveries']} recoveries){'; open: ' + '; '.join(open_) if open_ else ''}")
    if a.min_overlaps:
        def overlaps(f):
            return any(g is not f and g["injected_s"] < f["injected_s"] and
                       (g["rejoined_s"] is None or f["injected_s"] < g["rejoined_s"]) for g in faults)
        n = sum(1 for f in faults if overlaps(f))
        rule(n >= a.min_overlaps, f"faults injected during another's recovery: {n} >= {a.min_overlaps}")
    if failed:
        print(f"check_summary: {len(failed)} rule(s) failed", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

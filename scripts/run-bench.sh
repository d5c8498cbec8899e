#!/usr/bin/env bash
# Runs every benchmark binary in BUILD/bench (bench_*), collecting JSON lines in
# BUILD/bench/results.jsonl, then prints a table with ratios against each peer.
set -euo pipefail
BUILD=${1:-build}
out="$BUILD/bench/results.jsonl"
mkdir -p "$BUILD/bench"
: > "$out"
export MONARCH_BENCH_OUT="$out"
for b in "$BUILD"/bench/bench_*; do
  [ -x "$b" ] || continue
  echo "== $(basename "$b")"
  "$b" > "$BUILD/bench/$(basename "$b").log"
done
echo "== bench_ft (fault-tolerant training)"
python3 "$(dirname "$0")/../bench/ft_bench.py" "$BUILD"
python3 "$(dirname "$0")/bench-report.py" "$out"

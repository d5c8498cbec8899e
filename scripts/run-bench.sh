#!/usr/bin/env bash
# Runs every benchmark binary in BUILD/bench (bench_*), then bench/ft_bench.py and the Python
# front end's bench/py_bench.py (and py_rdma_bench.py), collecting JSON lines in
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
/usr/bin/python3 "$(dirname "$0")/../bench/ft_bench.py" "$BUILD"
# The Python front end (issue 17), after the C++ benches: py_bench.py copies their cpp_actor and
# cast_gather_procs figures from this run's results. Debian's interpreter (the one the package is
# built for), not a python3 earlier on PATH. py_rdma_bench.py and the tensor engine's
# tensor_bench.py (issue 19) run too where they exist.
bench_dir="$(dirname "$0")/../bench"
if ls "$BUILD"/python/monarch/_native*.so >/dev/null 2>&1; then
  for py in py_bench py_rdma_bench tensor_bench; do
    [ -f "$bench_dir/$py.py" ] || continue
    echo "== $py (Python front end)"
    PYTHONPATH="$BUILD/python" /usr/bin/python3 "$bench_dir/$py.py" "$BUILD"
  done
else
  echo "== py_bench: $BUILD/python has no monarch._native (MONARCH_BUILD_PYTHON=OFF?); skipped"
fi
/usr/bin/python3 "$(dirname "$0")/bench-report.py" "$out"

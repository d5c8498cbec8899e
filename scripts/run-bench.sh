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
# A bench that leaves processes behind (orphans, reparented to init) would steal the cores of
# every bench after it: each is named on stderr, with the bench that left it, and the run goes on.
# Zombies (state Z) use no CPU and are left out: this VM's init does not reap the ones it adopts.
orphans() { ps -eo pid=,ppid=,stat=,args= | awk '$2 == 1 && $3 !~ /^Z/ { $2 = $3 = ""; print }' | sort; }
orphans_before=$(orphans)
check_orphans() {
  local left
  left=$(comm -13 <(echo "$orphans_before") <(orphans) | grep -v -E ' (ps|sort|awk)( |$)' || true)
  [ -z "$left" ] || { echo "run-bench: processes left running after $1:"; echo "$left" | cut -c1-160; } >&2
}
for b in "$BUILD"/bench/bench_*; do
  [ -x "$b" ] || continue
  echo "== $(basename "$b")"
  "$b" > "$BUILD/bench/$(basename "$b").log"
  check_orphans "$(basename "$b")"
done
echo "== bench_ft (fault-tolerant training)"
/usr/bin/python3 "$(dirname "$0")/../bench/ft_bench.py" "$BUILD"
check_orphans bench_ft
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

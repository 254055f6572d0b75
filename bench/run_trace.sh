#!/bin/sh
# bench/run_trace.sh — what the execution trace costs, colony beside Go
# 1.19's runtime/trace, on the switch benchmark (two coroutines taking
# turns with co_yield on one P): off and on alternating in one run.
# With the trace off, what its compiled-in sites cost: the hot-path rows
# beside a build with every site compiled out (<builddir>-nosites, made
# here with -DCO_TRACE_NO_SITES and the same compiler, flags and type).
# Writes bench/results/trace.md (through bench/trace.sh).
#   sh bench/run_trace.sh <builddir>      (BENCH_RUNS=N, default 5; BENCH_QUICK=1: small, 3 runs
#                                          and 15 pairs for the off table)
set -u
BUILD=${1:-build}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT" || exit 1
case "$BUILD" in /*) ;; *) BUILD="$ROOT/$BUILD" ;; esac
RUNS=${BENCH_RUNS:-5}
N=1000000
if [ -n "${BENCH_QUICK:-}" ]; then RUNS=3; N=200000; fi
command -v go >/dev/null || { echo "run_trace: go not found: skipped"; exit 0; }
if [ -n "${BENCH_QUICK:-}" ]; then OFF_PAIRS=${OFF_PAIRS:-15}; export OFF_PAIRS; fi
NOSITES="$BUILD-nosites"
cache() { sed -n "s/^$1:[A-Z]*=//p" "$BUILD/CMakeCache.txt"; }
if cmake -S "$ROOT" -B "$NOSITES" -DCMAKE_C_COMPILER="$(cache CMAKE_C_COMPILER)" \
    -DCMAKE_BUILD_TYPE="$(cache CMAKE_BUILD_TYPE)" -DCMAKE_C_FLAGS="$(cache CMAKE_C_FLAGS) -DCO_TRACE_NO_SITES" \
    >/dev/null && cmake --build "$NOSITES" -j 2 --target bench_runtime bench_chan bench_pool >/dev/null; then
    exec sh bench/trace.sh "$BUILD" "$RUNS" "$N" "$NOSITES"
fi
echo "run_trace: the build without sites failed: the off table is left out"
exec sh bench/trace.sh "$BUILD" "$RUNS" "$N"

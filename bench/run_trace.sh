#!/bin/sh
# bench/run_trace.sh — what the execution trace costs, colony beside Go
# 1.19's runtime/trace, on the switch benchmark (two coroutines taking
# turns with co_yield on one P): off and on alternating in one run.
# Writes bench/results/trace.md (through bench/trace.sh).
#   sh bench/run_trace.sh <builddir>      (BENCH_RUNS=N, default 5; BENCH_QUICK=1: small, 3 runs)
set -u
BUILD=${1:-build}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT" || exit 1
case "$BUILD" in /*) ;; *) BUILD="$ROOT/$BUILD" ;; esac
RUNS=${BENCH_RUNS:-5}
N=1000000
if [ -n "${BENCH_QUICK:-}" ]; then RUNS=3; N=200000; fi
command -v go >/dev/null || { echo "run_trace: go not found: skipped"; exit 0; }
exec sh bench/trace.sh "$BUILD" "$RUNS" "$N"

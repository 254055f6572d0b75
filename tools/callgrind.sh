#!/bin/sh
# tools/callgrind.sh — instruction counts of the fixed 1-P workloads.
#
#   sh tools/callgrind.sh <builddir>
#
# Each hot path runs once under valgrind's callgrind on one P, and the
# total instructions executed (Ir) are printed, one line per workload.
# Instruction counts are stable where wall-clock times are not (2 shared
# cores): compare two builds' lines to see what a change costs the hot
# paths. A refactor that moves code must keep every line within 1%.
# Only workloads whose count repeats run to run are here: a plain thread
# submitting, or mutex contention, depend on when threads run and vary by
# several percent between two runs of one binary.
set -eu
BUILD=${1:-build}
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
run() {
    name=$1; shift
    COLONY_PROCS=1 valgrind --tool=callgrind --callgrind-out-file="$OUT/$name.out" "$@" >/dev/null 2>"$OUT/$name.err" ||
        { echo "$name: failed"; cat "$OUT/$name.err"; exit 1; }
    ir=$(grep -E "^(summary|totals):" "$OUT/$name.out" | head -1 | awk '{print $2}')
    printf '%-18s %12s Ir\n' "$name" "$ir"
}
run yield       "$BUILD/bench_runtime" yield 1 1000000
run spawn       "$BUILD/bench_runtime" spawn 1 200000
run park        "$BUILD/bench_runtime" park 1 200000
run chan_ping   "$BUILD/bench_chan" pingpong 1 500000
run chan_buf    "$BUILD/bench_chan" buffered 1 1 1 1000000
run select      "$BUILD/bench_chan" select_ready 1 1000000
run pool_tiny   "$BUILD/bench_pool" tiny 1 500000 1000

#!/bin/sh
# bench/trace.sh — what an execution trace costs: the yield row (two
# coroutines ping-pong co_yield on one P) with tracing off and on, colony
# (COLONY_TRACE) beside Go 1.19 (runtime/trace, GO_TRACE in
# bench/go/runtime), alternating, medians and ranges over ROUNDS runs.
# Writes bench/results/trace.md.
#
#   sh bench/trace.sh <builddir> [rounds=5] [yields=1000000]
set -eu
BUILD=${1:-build}
ROUNDS=${2:-5}
N=${3:-1000000}
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
(cd bench/go/runtime && go build -o "$OUT/gort" .) || { echo "go build failed"; exit 1; }
load0=$(cut -d' ' -f1-3 /proc/loadavg)
ns() { sed -n 's/.*ns_per_op=\([0-9.]*\).*/\1/p'; }
for r in $(seq "$ROUNDS"); do
    COLONY_PROCS=1 "$BUILD/bench_runtime" yield 1 "$N" | ns >>"$OUT/c_off"
    COLONY_PROCS=1 COLONY_TRACE="$OUT/t.json" "$BUILD/bench_runtime" yield 1 "$N" | ns >>"$OUT/c_on"
    ls -l "$OUT/t.json" | awk '{print $5}' >>"$OUT/c_size"
    GOMAXPROCS=1 "$OUT/gort" yield 1 "$N" | ns >>"$OUT/g_off"
    GOMAXPROCS=1 GO_TRACE="$OUT/g.trace" "$OUT/gort" yield 1 "$N" | ns >>"$OUT/g_on"
    ls -l "$OUT/g.trace" | awk '{print $5}' >>"$OUT/g_size"
done
stat() { sort -n "$1" | awk '{a[NR]=$1} END {m=(NR%2)?a[(NR+1)/2]:(a[NR/2]+a[NR/2+1])/2; printf "%.2f [%.2f-%.2f]", m, a[1], a[NR]}'; }
med() { sort -n "$1" | awk '{a[NR]=$1} END {print (NR%2)?a[(NR+1)/2]:(a[NR/2]+a[NR/2+1])/2}'; }
ratio() { awk -v a="$(med "$1")" -v b="$(med "$2")" 'BEGIN {printf "%.2fx", a/b}'; }
mkdir -p bench/results
{
    echo "# The execution trace's cost: colony vs Go 1.19"
    echo
    echo "Command: \`sh bench/trace.sh $BUILD $ROUNDS $N\`; $ROUNDS alternating runs of each, medians [min-max]."
    echo
    echo "- Date: $(date -u '+%Y-%m-%d %H:%M UTC'); commit $(git rev-parse --short HEAD)"
    echo "- Machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) logical CPUs; load average before $load0, after $(cut -d' ' -f1-3 /proc/loadavg) (shared machine: expect tens of per cent of noise)"
    echo "- Go: $(go version | cut -d' ' -f3-)"
    echo
    echo "Workload: the yield row, two coroutines (goroutines) on one P taking turns, $N yields each."
    echo "Trace on: colony COLONY_TRACE=file (one 16-byte record per switch, stamped with rdtsc; JSON written at exit, not timed);"
    echo "Go runtime/trace.Start to a file."
    echo "Where a hypervisor traps rdtsc (tens of ns or more a read), both tracers pay it per event; see docs/perf-notes.md."
    echo
    echo "| | off ns/yield | on ns/yield | on/off | trace file |"
    echo "|---|---|---|---|---|"
    echo "| colony | $(stat "$OUT/c_off") | $(stat "$OUT/c_on") | $(ratio "$OUT/c_on" "$OUT/c_off") | $(($(med "$OUT/c_size") / 1048576)) MiB JSON |"
    echo "| Go 1.19 | $(stat "$OUT/g_off") | $(stat "$OUT/g_on") | $(ratio "$OUT/g_on" "$OUT/g_off") | $(($(med "$OUT/g_size") / 1048576)) MiB binary |"
} >bench/results/trace.md
cat bench/results/trace.md

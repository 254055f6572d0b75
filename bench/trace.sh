#!/bin/sh
# bench/trace.sh — what an execution trace costs: the yield row (two
# coroutines ping-pong co_yield on one P) with tracing off and on, colony
# (COLONY_TRACE) beside Go 1.19 (runtime/trace, GO_TRACE in
# bench/go/runtime), alternating, medians and ranges over ROUNDS runs.
# Writes bench/results/trace.md.
#
# With a second build dir made with the event sites compiled out
# (CFLAGS=-DCO_TRACE_NO_SITES; bench/run_trace.sh makes one), it also
# weighs what the sites cost with the trace off: the hot-path rows of
# tools/callgrind.sh, each run with the sites in and out in turn (order
# swapped every pair), OFF_PAIRS pairs (default 41), each run short (10-50
# ms); per row the median of the pairs' ratios with a 95% interval for it
# (binomial ranks), and the ratio of the two builds' fastest runs (on a
# shared machine the noise only ever adds time, so the fastest runs are
# the least disturbed).
#
#   sh bench/trace.sh <builddir> [rounds=5] [yields=1000000] [nosites-builddir]
set -eu
BUILD=${1:-build}
ROUNDS=${2:-5}
N=${3:-1000000}
NOSITES=${4:-}
PAIRS=${OFF_PAIRS:-41}
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
# the off table: name, then the arguments (after the builddir's binary)
OFFROWS="yield:bench_runtime yield 1 1000000
spawn:bench_runtime spawn 1 200000
park:bench_runtime park 1 20000
chan_ping:bench_chan pingpong 1 300000
chan_buf:bench_chan buffered 1 1 1 1000000
select:bench_chan select_ready 1 1000000
pool_tiny:bench_pool tiny 1 300000 1000"
if [ -n "$NOSITES" ]; then
    for r in $(seq "$PAIRS"); do
        echo "$OFFROWS" | while IFS=: read -r name cmd; do
            set -- $cmd
            bin=$1
            shift
            order="in out"
            [ $((r % 2)) = 0 ] && order="out in"
            for which in $order; do
                d=$BUILD
                [ "$which" = out ] && d=$NOSITES
                COLONY_PROCS=1 "$d/$bin" "$@" | ns >>"$OUT/off_${name}_$which"
            done
        done
    done
fi
# Instructions, which the machine's load does not move: tools/callgrind.sh
# on both builds (needs valgrind)
if [ -n "$NOSITES" ] && command -v valgrind >/dev/null; then
    sh tools/callgrind.sh "$BUILD" >"$OUT/ir_in" && sh tools/callgrind.sh "$NOSITES" >"$OUT/ir_out" || rm -f "$OUT/ir_in"
fi
stat() { sort -n "$1" | awk '{a[NR]=$1} END {m=(NR%2)?a[(NR+1)/2]:(a[NR/2]+a[NR/2+1])/2; printf "%.2f [%.2f-%.2f]", m, a[1], a[NR]}'; }
med() { sort -n "$1" | awk '{a[NR]=$1} END {print (NR%2)?a[(NR+1)/2]:(a[NR/2]+a[NR/2+1])/2}'; }
fastratio() { awk -v a="$(sort -n "$1" | head -1)" -v b="$(sort -n "$2" | head -1)" 'BEGIN {printf "%.2fx", a/b}'; }
# a build dir as the results show it: relative to the repository
disp() { case $1 in "$PWD"/*) echo "${1#"$PWD"/}" ;; *) echo "$1" ;; esac; }
ratio() { awk -v a="$(med "$1")" -v b="$(med "$2")" 'BEGIN {printf "%.2fx", a/b}'; }
mkdir -p bench/results
{
    echo "# The execution trace's cost: colony vs Go 1.19"
    echo
    echo "Command: \`sh bench/trace.sh $(disp "$BUILD") $ROUNDS $N${NOSITES:+ $(disp "$NOSITES")}\`; $ROUNDS alternating runs of each, medians [min-max]."
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
    echo "| | off ns/yield | on ns/yield | on/off (medians) | on/off (fastest runs) | trace file |"
    echo "|---|---|---|---|---|---|"
    echo "| colony | $(stat "$OUT/c_off") | $(stat "$OUT/c_on") | $(ratio "$OUT/c_on" "$OUT/c_off") | $(fastratio "$OUT/c_on" "$OUT/c_off") | $(($(med "$OUT/c_size") / 1048576)) MiB JSON |"
    echo "| Go 1.19 | $(stat "$OUT/g_off") | $(stat "$OUT/g_on") | $(ratio "$OUT/g_on" "$OUT/g_off") | $(fastratio "$OUT/g_on" "$OUT/g_off") | $(($(med "$OUT/g_size") / 1048576)) MiB binary |"
    if [ -n "$NOSITES" ]; then
        echo
        echo "## Trace off: what the compiled-in sites cost"
        echo
        echo "Each row run with the event sites compiled in ($(disp "$BUILD")) and compiled out ($(disp "$NOSITES"), built with -DCO_TRACE_NO_SITES), one P, $PAIRS pairs, the order swapped every pair; ns/op medians [min-max]. Cost: the median of the pairs' in/out ratios, with a 95% interval for that median."
        echo
        echo "| row | sites in ns/op | sites out ns/op | cost (median of pairs) | 95% interval | cost (fastest runs) |"
        echo "|---|---|---|---|---|---|"
        echo "$OFFROWS" | while IFS=: read -r name cmd; do
            paste "$OUT/off_${name}_in" "$OUT/off_${name}_out" | awk '{print $1 / $2}' | sort -n |
                awk -v name="$name" -v a="$(stat "$OUT/off_${name}_in")" -v b="$(stat "$OUT/off_${name}_out")" \
                    -v fa="$(sort -n "$OUT/off_${name}_in" | head -1)" -v fb="$(sort -n "$OUT/off_${name}_out" | head -1)" '
                    {r[NR] = $1}
                    END {
                        n = NR; m = (n % 2) ? r[(n + 1) / 2] : (r[n / 2] + r[n / 2 + 1]) / 2
                        k = int((n - 1.96 * sqrt(n)) / 2); if (k < 1) k = 1
                        printf "| %s | %s | %s | %+.1f%% | %+.1f%% to %+.1f%% | %+.1f%% |\n", name, a, b, (m - 1) * 100, (r[k] - 1) * 100, (r[n - k + 1] - 1) * 100, (fa / fb - 1) * 100
                    }'
        done
        if [ -f "$OUT/ir_in" ]; then
            echo
            echo "Instructions (\`sh tools/callgrind.sh\`, Ir, one run of each build; the load does not move these):"
            echo
            echo "| workload | sites in | sites out | cost |"
            echo "|---|---|---|---|"
            paste "$OUT/ir_in" "$OUT/ir_out" | awk '{printf "| %s | %s | %s | %+.2f%% |\n", $1, $2, $5, ($2 / $5 - 1) * 100}'
            echo
            echo "park's count depends on when sysmon and the timers run and moves by several per cent between two runs of one binary: it is no measure of the sites."
        fi
    fi
} >bench/results/trace.md
cat bench/results/trace.md

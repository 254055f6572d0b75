#!/bin/sh
# bench/run_forkjoin.sh — a CPU-bound fork-join (parallel fib, a coroutine
# per call above a depth cut-off, joined by waitgroups) on 1 and 2 Ps,
# against Go's goroutines on GOMAXPROCS 1 and 2, with the host's own 2-CPU
# speedup (the same loop on 1 thread and on 2) measured in the same
# alternation. Writes bench/results/forkjoin.md.
#   sh bench/run_forkjoin.sh <builddir>   (BENCH_RUNS=N, default 5; BENCH_QUICK=1: fib(32), 1 run;
#   BENCH_FORKJOIN_BASELINE=<another build's bench_forkjoin>, e.g. one from before a change:
#   measured too, in the same alternation, as "colony-base")
set -u
. "$(dirname "$0")/lib.sh"
bench_init "${1:-build}"
RUNS=${BENCH_RUNS:-5}
N=40 FINE=11 COARSE=22 SPIN=300000000
OUT=bench/results/forkjoin.md
if [ -n "${BENCH_QUICK:-}" ]; then RUNS=1 N=32 FINE=8 COARSE=16 SPIN=30000000 OUT="$BUILD/bench-forkjoin-quick.md"; fi
TMP=$(mktemp -d "${TMPDIR:-/tmp}/colony-forkjoin.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
GO=""
if command -v go >/dev/null 2>&1 && bench_go_build forkjoin "$TMP/goforkjoin" >"$TMP/go.log" 2>&1; then
    GO="$TMP/goforkjoin"
fi
[ -x "$BUILD/bench_forkjoin" ] || { echo "bench/run_forkjoin.sh: $BUILD/bench_forkjoin missing" >&2; exit 1; }
BASE=${BENCH_FORKJOIN_BASELINE:-}
if [ -n "$BASE" ] && [ ! -x "$BASE" ]; then echo "bench/run_forkjoin.sh: $BASE is not executable" >&2; exit 1; fi

# one "ms cpu_ms rss_kib" line per run into $TMP/<row>
run() { # row cmd...
    f="$TMP/$1"
    shift
    if "$@" >"$TMP/o" 2>"$TMP/e"; then
        sed -n 's/.* peak_rss_kb=\([0-9]*\).* ms=\([0-9.]*\).*/\2 \1/p' "$TMP/o" | head -1 >"$TMP/l"
        cpu=$(sed -n 's/.* cpu_ms=\([0-9.]*\).*/\1/p' "$TMP/o")
        read -r ms rss <"$TMP/l"
        echo "$ms ${cpu:-0} $rss" >>"$f"
    else
        echo "bench/run_forkjoin.sh: $* failed: $(head -c 300 "$TMP/e")" >&2
    fi
}
load0=$(bench_load)
i=0
while [ "$i" -lt "$RUNS" ]; do
    for g in fine coarse; do
        c=$FINE; [ "$g" = coarse ] && c=$COARSE
        run "c1_$g" "$BUILD/bench_forkjoin" fib 1 "$N" "$c"
        run "c2_$g" "$BUILD/bench_forkjoin" fib 2 "$N" "$c"
        if [ -n "$BASE" ]; then
            run "b1_$g" "$BASE" fib 1 "$N" "$c"
            run "b2_$g" "$BASE" fib 2 "$N" "$c"
        fi
        if [ -n "$GO" ]; then
            run "g1_$g" "$GO" fib 1 "$N" "$c"
            run "g2_$g" "$GO" fib 2 "$N" "$c"
        fi
    done
    run s1 "$BUILD/bench_forkjoin" spin 1 "$SPIN"
    run s2 "$BUILD/bench_forkjoin" spin 2 "$SPIN"
    i=$((i + 1))
done

# the median of column ${2:-1} of file $1 (nothing if it has no lines)
med() { [ -s "$1" ] && awk -v k="${2:-1}" '{ print $k }' "$1" | bench_median; }
# "wall median [min-max] | CPU median | largest peak RSS MiB"
stat() {
    [ -s "$1" ] || { echo "n/a | n/a | n/a"; return; }
    w=$(awk '{ print $1 }' "$1" | bench_med_range 0 -)
    r=$(awk '$3>r {r=$3} END {printf "%.0f", r/1024}' "$1")
    echo "$w | $(med "$1" 2) | $r"
}
div() { # median of $2 / median of $1
    a=$(med "$1"); b=$(med "$2")
    if [ -n "$a" ] && [ -n "$b" ]; then awk -v a="$a" -v b="$b" 'BEGIN{printf "%.2f", b/a}'; else echo n/a; fi
}
btype=$(sed -n 's/^CMAKE_BUILD_TYPE:[A-Z]*=//p' "$BUILD/CMakeCache.txt" 2>/dev/null)
host=$(div "$TMP/s1" "$TMP/s2")
{
    echo "## forkjoin: parallel fib on 1 and 2 Ps, against Go"
    echo
    echo "\`sh bench/run_forkjoin.sh $(basename "$BUILD")\` on $(date -u '+%Y-%m-%d %H:%M UTC'), $(bench_machine),"
    echo "load average $load0 at the start and $(bench_load) at the end"
    echo "(the host is shared with other builds and tests), $RUNS alternating runs per row, build type ${btype:-unknown}."
    echo "fib($N), a coroutine (goroutine) per call above the cut-off, each parent joining its children with a"
    echo "waitgroup, plain recursion at or below it: cut-off $FINE (fine) and $COARSE (coarse). Wall ms median [range],"
    echo "CPU ms median (user + system), largest peak RSS. $(go version 2>/dev/null || echo 'Go: not installed')."
    echo
    echo "The host's own speedup, measured in the same alternation (the same loop as 1 thread, then split over"
    echo "2 threads): 2 threads take **$host** of 1 thread's time (0.50 on two free CPUs)."
    echo "\"2 P / 1 P\" below is the fork-join's; \"vs host\" divides it by the host's, so 1.00 means it scales"
    echo "as well as the machine let two plain threads scale at the time."
    echo
    echo "| grain | impl | 1 P wall ms | 1 P CPU ms | 1 P RSS MiB | 2 P wall ms | 2 P CPU ms | 2 P RSS MiB | 2 P / 1 P | vs host |"
    echo "|---|---|---|---|---|---|---|---|---|---|"
    for g in fine coarse; do
        c=$FINE; [ "$g" = coarse ] && c=$COARSE
        impls="colony go"; [ -n "$BASE" ] && impls="colony colony-base go"
        for impl in $impls; do
            k=c; [ "$impl" = go ] && k=g; [ "$impl" = colony-base ] && k=b
            r=$(div "$TMP/${k}1_$g" "$TMP/${k}2_$g")
            vs=$(awk -v r="$r" -v h="$host" 'BEGIN{ if (r+0>0 && h+0>0) printf "%.2f", r/h; else print "n/a" }')
            echo "| $g (cut-off $c) | $impl | $(stat "$TMP/${k}1_$g") | $(stat "$TMP/${k}2_$g") | $r | $vs |"
        done
    done
    echo
    echo "Go / colony, wall time (above 1: colony is faster): fine 1 P $(div "$TMP/c1_fine" "$TMP/g1_fine"),"
    echo "fine 2 P $(div "$TMP/c2_fine" "$TMP/g2_fine"), coarse 1 P $(div "$TMP/c1_coarse" "$TMP/g1_coarse"),"
    echo "coarse 2 P $(div "$TMP/c2_coarse" "$TMP/g2_coarse"). Host spin loop: 1 thread $(med "$TMP/s1") ms, 2 threads $(med "$TMP/s2") ms."
    [ -n "$BASE" ] && echo "colony-base: $(basename "$(dirname "$BASE")")/$(basename "$BASE") (another build, e.g. from before a change), the same commands."
    echo "Where the second P's time goes, and the spawn order: docs/perf-notes.md (fork-join)."
} >"$OUT"
echo "bench/run_forkjoin.sh: wrote $OUT" >&2

#!/bin/sh
# bench/run_mem.sh — what a live coroutine costs, side by side with Go 1.19.
#
#   sh bench/run_mem.sh <builddir>
#
# colony: <builddir>/bench_mem (bench/bench_mem.c) and <builddir>/bench_pool;
# Go: bench/go/mem and bench/go/pool. Every colony run alternates with its
# Go peer (odd rounds colony first, even rounds Go first), each a fresh
# process:
#   parked    1k, 10k, 100k and 1M coroutines parked at once in a channel
#             receive: start time per coroutine (first spawn to all
#             started), RSS and page tables (VmRSS, VmPTE) per coroutine;
#             colony also with 64 KiB stacks (BENCH_STACK_KB=64), and
#             both opted in to stack compaction (BENCH_COMPACT=1: measured
#             once all are compacted, threshold 200 ms), with the median
#             wake-up latency of 1,000 of them woken one at a time
#   pool      1,000,000 tasks of 10 ms through a pool of 50,000 (colony),
#             one co_go per task (colony_raw), raw goroutines (Go): wall,
#             peak RSS
#   idle      100,000 idle TCP echo connections on loopback, each held by
#             a coroutine (goroutine) parked in a read: server RSS per
#             connection (scaled down to the fd hard limit when it is
#             lower; the report says so); colony also compacted
# Writes bench/results/mem.md (BENCH_QUICK=1: <builddir>/bench-mem-quick.md,
# small sizes, 1 run).
#
# Environment: BENCH_RUNS (default 3), BENCH_QUICK=1, BENCH_GO_CACHE
# (GOCACHE/GOPATH root, default $TMPDIR/colony-bench-go).
set -u
. "$(dirname "$0")/lib.sh" # (bench_rounds)

BUILD=${1:-build}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT" || exit 1
case "$BUILD" in /*) ;; *) BUILD="$ROOT/$BUILD" ;; esac

QUICK=${BENCH_QUICK:-0}
RUNS=${BENCH_RUNS:-3}
if [ "$QUICK" = 1 ]; then
    RUNS=${BENCH_RUNS:-1}
    COUNTS="1000 10000" N_POOL=100000 CAP_POOL=5000 N_IDLE=2000
    RESULT="$BUILD/bench-mem-quick.md"
else
    COUNTS="1000 10000 100000 1000000" N_POOL=1000000 CAP_POOL=50000 N_IDLE=100000
    RESULT="$ROOT/bench/results/mem.md"
fi

for b in bench_mem bench_pool; do
    if [ ! -x "$BUILD/$b" ]; then
        echo "bench/run_mem.sh: $BUILD/$b is missing: build first (make BUILD=...)" >&2
        exit 1
    fi
done
OUT="$BUILD/bench-mem"
mkdir -p "$OUT"
RAW="$OUT/raw.txt"
ERR="$OUT/stderr.txt"
: >"$RAW"
: >"$ERR"

# ---- the Go peers ----------------------------------------------------------------
TMP=${TMPDIR:-/tmp}
BENCH_GO_CACHE=${BENCH_GO_CACHE:-$TMP/colony-bench-go}
mkdir -p "$BUILD/bench-go"
GO_OK=0
GO_VERSION="not installed"
if command -v go >/dev/null 2>&1; then
    GO_VERSION=$(go version 2>/dev/null)
    GO_OK=1
    for d in mem pool; do
        if ! (cd bench/go/$d && GOCACHE="$BENCH_GO_CACHE/cache" GOPATH="$BENCH_GO_CACHE/path" \
            GOFLAGS=-mod=mod GOPROXY=off GOTOOLCHAIN=local go build -o "$BUILD/bench-go/$d" .) >>"$ERR" 2>&1; then
            echo "bench/run_mem.sh: building bench/go/$d failed (see $ERR)" >&2
            GO_OK=0
        fi
    done
fi

# ---- running ---------------------------------------------------------------------
LOAD_MAX=0
one() { # id run impl env bin args... (env: "-" or VAR=value[,VAR=value])
    id=$1 run=$2 impl=$3 env=$4 bin=$5
    shift 5
    l1=$(cut -d' ' -f1 /proc/loadavg 2>/dev/null || echo 0)
    LOAD_MAX=$(echo "$l1 $LOAD_MAX" | awk '{ print ($1 > $2) ? $1 : $2 }')
    if [ "$env" = - ]; then
        out=$(timeout 600 "$bin" "$@" 2>>"$ERR")
    else
        out=$(env $(echo "$env" | tr ',' ' ') timeout 600 "$bin" "$@" 2>>"$ERR")
    fi
    rc=$?
    line=$(printf '%s\n' "$out" | grep '^bench=' | tail -n 1)
    if [ "$rc" -ne 0 ] || [ -z "$line" ]; then
        echo "id=$id run=$run who=$impl status=failed rc=$rc" >>"$RAW"
        echo "  $id #$run $impl: FAILED (rc=$rc)" >&2
    else
        echo "id=$id run=$run who=$impl $line" >>"$RAW"
        echo "  $id #$run $impl: $line" >&2
    fi
}
C="$BUILD/bench_mem"
CP="$BUILD/bench_pool"
GM="$BUILD/bench-go/mem"
GP="$BUILD/bench-go/pool"

MACHINE="$(lscpu 2>/dev/null | sed -n 's/^Model name:[[:space:]]*//p' | head -1), $(nproc) logical CPUs, $(awk '/MemTotal/ { printf "%.0f GiB", $2 / 1048576 }' /proc/meminfo), Linux $(uname -r)"
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
FD_HARD=$(ulimit -Hn)
T0=$(date +%s)
echo "bench/run_mem.sh: $MACHINE; load $LOAD_BEFORE; $RUNS runs" >&2

for n in $COUNTS; do
    set -- "colony - $C parked 2 $n" "colony_64k BENCH_STACK_KB=64 $C parked 2 $n" \
        "colony_compact BENCH_COMPACT=1 $C parked 2 $n" \
        "colony_compact_64k BENCH_COMPACT=1,BENCH_STACK_KB=64 $C parked 2 $n"
    [ "$GO_OK" = 1 ] && set -- "$@" "go - $GM parked 2 $n"
    # A 1k or 10k start takes 2-50 ms, where one run's page-cache and
    # scheduler luck is a large share: more runs there, at little cost.
    runs=$RUNS
    [ "$QUICK" != 1 ] && [ "$n" -le 10000 ] && [ "$runs" -lt 11 ] && runs=11
    bench_rounds "parked$n" "$runs" "$@"
done
set -- "colony - $CP sleep 2 $N_POOL $CAP_POOL 10" "colony_raw - $CP raw_sleep 2 $N_POOL 10"
[ "$GO_OK" = 1 ] && set -- "$@" "go_raw - $GP raw_sleep 2 $N_POOL 10"
bench_rounds pool "$RUNS" "$@"
set -- "colony - $C idle 2 $N_IDLE" "colony_compact BENCH_COMPACT=1 $C idle 2 $N_IDLE"
[ "$GO_OK" = 1 ] && set -- "$@" "go - $GM idle 2 $N_IDLE $C"
bench_rounds idle "$RUNS" "$@"
ELAPSED=$(( $(date +%s) - T0 ))
LOAD_AFTER=$(cut -d' ' -f1-3 /proc/loadavg)

# ---- the report --------------------------------------------------------------------
REPORT_AWK='
function sorted(id, impl, f, a,    n, k, i, j, t) {
    n = 0
    for (k = 1; k <= N; k++) if (ID[k] == id && IM[k] == impl && ((k, f) in V)) a[++n] = V[k, f] + 0
    for (i = 2; i <= n; i++) { t = a[i]; for (j = i - 1; j >= 1 && a[j] > t; j--) a[j + 1] = a[j]; a[j + 1] = t }
    return n
}
function med(id, impl, f,    n, a) {
    n = sorted(id, impl, f, a)
    if (n == 0) return ""
    return (n % 2) ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
}
function rng(id, impl, f, d, sc,    n, a) {
    n = sorted(id, impl, f, a)
    if (n < 2) return ""
    return sprintf(" (%." d "f-%." d "f)", a[1] / sc, a[n] / sc)
}
function cnt(id, impl,    n, k) { n = 0; for (k = 1; k <= N; k++) if (ID[k] == id && IM[k] == impl && !FAILED[k]) n++; return n }
function fmt(x, d) { return (x == "") ? "n/a" : sprintf("%." d "f", x) }
function ratio(a, b, d) { return (a == "" || b == "" || b == 0) ? "n/a" : sprintf("%." d "f", a / b) }
function yes(c) { return c ? "**met**" : "not met" }
{
    N++
    for (i = 1; i <= NF; i++) { split($i, kv, "="); V[N, kv[1]] = kv[2] }
    ID[N] = V[N, "id"]; IM[N] = V[N, "who"]; FAILED[N] = (V[N, "status"] == "failed")
    LINE[N] = $0
}
END {
    print "# Memory per coroutine"
    print ""
    if (quick != "") { print quick; print "" }
    print "Command: `" cmd "` (driver: bench/run_mem.sh; C: bench/bench_mem.c, bench/bench_pool.c; Go: bench/go/mem, bench/go/pool)."
    print "Machine: " machine ". " gov ". colony " rev ", " date "."
    print "Load average before " lb ", after " la ", highest seen at a process start " lmax " (a shared machine: other"
    print "jobs ran at the same time). Medians of " runs " runs each (the runs column says where more: the short 1k and 10k"
    print "starts), ranges in brackets, run alternately colony / Go,"
    print "each a fresh process, 2 Ps / GOMAXPROCS=2. Total " el " s."
    print ""
    print "## Coroutines parked at once in a channel receive"
    print ""
    print "Start: from the first spawn until the last coroutine has begun its receive, per coroutine."
    print "RSS and page tables: VmRSS and VmPTE of /proc/self/status with all of them parked, less the same"
    print "before the first spawn, per coroutine (page tables are not part of RSS). `colony_64k`: the same"
    print "program with 64 KiB stacks (co_config_t.stack_size) instead of the default 256 KiB. `_compact`:"
    print "every coroutine opted in to stack compaction (co_stack_compactable, docs/stacks.md), measured once"
    print "all of them are compacted (threshold 200 ms; compact s: from the last start until all were)."
    print ""
    print "| live | | start us | compact s | RSS B | page tables B | total B | total vs Go | runs |"
    print "|---:|---|---:|---:|---:|---:|---:|---:|---:|"
    split(counts, cs, " ")
    split("colony colony_64k colony_compact colony_compact_64k go", im, " ")
    for (c = 1; c in cs; c++) {
        id = "parked" cs[c]
        gt = med(id, "go", "total_b")
        for (i = 1; i <= 5; i++) {
            t = med(id, im[i], "total_b")
            cm = (im[i] ~ /compact/) ? fmt(med(id, im[i], "compact_ms") / 1000, 1) : ""
            printf "| %s | %s | %s%s | %s | %s | %s | %s | %s | %d |\n", cs[c], im[i], fmt(med(id, im[i], "start_ns") / 1000, 2), rng(id, im[i], "start_ns", 2, 1000), cm, fmt(med(id, im[i], "rss_b"), 0), fmt(med(id, im[i], "pte_b"), 0), fmt(t, 0), (im[i] == "go") ? "" : ratio(t, gt, 2), cnt(id, im[i])
        }
    }
    print ""
    big = "parked" cs[length(cs)]
    t = med(big, "colony", "total_b"); s = med(big, "colony", "start_ns"); gs = med(big, "go", "start_ns")
    printf "Targets at %s: <= 2,000 B per parked coroutine, page tables included: %s B -> %s. Start <= Go: %s vs %s us -> %s.\n", cs[length(cs)], fmt(t, 0), (t != "") ? yes(t <= 2000) : "n/a", fmt(s / 1000, 2), fmt(gs / 1000, 2), (s != "" && gs != "") ? yes(s <= gs) : "n/a"
    printf "\nStart <= Go at each count:"
    for (c = 1; c in cs; c++) {
        id = "parked" cs[c]; s = med(id, "colony", "start_ns"); gs = med(id, "go", "start_ns")
        printf "%s %s: %s vs %s us -> %s", (c > 1) ? ";" : "", cs[c], fmt(s / 1000, 2), fmt(gs / 1000, 2), (s != "" && gs != "") ? yes(s <= gs) : "n/a"
    }
    printf ".\n"
    tc = med(big, "colony_compact", "total_b"); tc64 = med(big, "colony_compact_64k", "total_b")
    printf "\nCompacted (opted in, parked past the threshold), at %s: <= 2,000 B: %s B -> %s; <= 1,200 B: %s -> %s (64 KiB stacks: %s B -> %s).\n", cs[length(cs)], fmt(tc, 0), (tc != "") ? yes(tc <= 2000) : "n/a", fmt(tc, 0), (tc != "") ? yes(tc <= 1200) : "n/a", fmt(tc64, 0), (tc64 != "") ? yes(tc64 <= 1200) : "n/a"
    print ""
    print "Wake-up latency: 1,000 of the parked coroutines woken one at a time, each by a send carrying the"
    print "time, read by the woken coroutine as it runs; median per run, then the median of the runs. A"
    print "compacted one first has its stack copied back (a page fault and a copy of its live part)."
    print ""
    print "| live | | wake us | runs |"
    print "|---:|---|---:|---:|"
    split("colony colony_64k colony_compact colony_compact_64k", iw, " ")
    for (c = 1; c in cs; c++)
        for (i = 1; i <= 4; i++)
            printf "| %s | %s | %s%s | %d |\n", cs[c], iw[i], fmt(med("parked" cs[c], iw[i], "wake_us"), 2), rng("parked" cs[c], iw[i], "wake_us", 2, 1), cnt("parked" cs[c], iw[i])
    print ""
    printf "## %d tasks of 10 ms, capacity %d\n", npool, cappool
    print ""
    print "| | wall ms | peak RSS MB | runs |"
    print "|---|---:|---:|---:|"
    split("colony colony_raw go_raw", ip, " ")
    for (i = 1; i <= 3; i++)
        printf "| %s | %s%s | %s%s | %d |\n", ip[i], fmt(med("pool", ip[i], "wall_ms"), 0), rng("pool", ip[i], "wall_ms", 0, 1), fmt(med("pool", ip[i], "peak_rss_kb") / 1024, 1), rng("pool", ip[i], "peak_rss_kb", 1, 1024), cnt("pool", ip[i])
    w = med("pool", "colony", "wall_ms"); wg = med("pool", "go_raw", "wall_ms")
    r = med("pool", "colony", "peak_rss_kb"); rg = med("pool", "go_raw", "peak_rss_kb")
    print ""
    printf "Targets: peak RSS <= Go raw goroutines: %s vs %s MB -> %s; wall <= 1/2 of Go raw: %s -> %s.\n", fmt(r / 1024, 1), fmt(rg / 1024, 1), (r != "" && rg != "") ? yes(r <= rg) : "n/a", ratio(w, wg, 2), (w != "" && wg != "") ? yes(w <= wg / 2) : "n/a"
    print ""
    print "## Idle TCP connections (echo server, a coroutine per connection parked in a read)"
    print ""
    ni = med("idle", "colony", "n"); lim = med("idle", "colony", "limited")
    if (lim == 1)
        printf "**Scaled down**: %s connections were asked for, but the fd hard limit here is %s (the server and its client, a separate process, each hold one fd per connection), so each run held %s.\n\n", nidle, fdhard, fmt(ni, 0)
    print "Server RSS and page tables with every connection open and idle, less the same before the first, per"
    print "connection (the client is another process, not counted)."
    print ""
    print "| | connections | connect ms | RSS B | page tables B | total B | total vs Go | runs |"
    print "|---|---:|---:|---:|---:|---:|---:|---:|"
    gt = med("idle", "go", "total_b")
    split("colony colony_compact go", ii, " ")
    for (i = 1; i <= 3; i++) {
        t = med("idle", ii[i], "total_b")
        printf "| %s | %s | %s | %s%s | %s | %s | %s | %d |\n", ii[i], fmt(med("idle", ii[i], "n"), 0), fmt(med("idle", ii[i], "connect_ms"), 0), fmt(med("idle", ii[i], "rss_b"), 0), rng("idle", ii[i], "rss_b", 0, 1), fmt(med("idle", ii[i], "pte_b"), 0), fmt(t, 0), (ii[i] == "go") ? "" : ratio(t, gt, 2), cnt("idle", ii[i])
    }
    print ""
    print "## Raw lines"
    print ""
    print "```"
    for (k = 1; k <= N; k++) print LINE[k]
    print "```"
}
'

REV=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
[ -n "$(git status --porcelain -- src include bench/bench_mem.c bench/bench_pool.c 2>/dev/null)" ] && REV="$REV plus uncommitted changes"
QUICK_NOTE=""
[ "$QUICK" = 1 ] && QUICK_NOTE="SMOKE RUN (BENCH_QUICK=1): small sizes, not figures to quote."
mkdir -p "$(dirname "$RESULT")"
awk -v machine="$MACHINE" -v gov="$GO_VERSION" -v rev="$REV" -v runs="$RUNS" -v counts="$COUNTS" \
    -v nidle="$N_IDLE" -v fdhard="$FD_HARD" -v npool="$N_POOL" -v cappool="$CAP_POOL" \
    -v lb="$LOAD_BEFORE" -v la="$LOAD_AFTER" -v lmax="$LOAD_MAX" -v el="$ELAPSED" -v quick="$QUICK_NOTE" \
    -v date="$(date -u '+%Y-%m-%d %H:%M UTC')" -v cmd="sh bench/run_mem.sh $(basename "$BUILD")" \
    "$REPORT_AWK" "$RAW" >"$RESULT"
echo "bench/run_mem.sh: wrote $RESULT ($ELAPSED s)" >&2

#!/bin/sh
# bench/run_pool.sh — the pool benchmarks, side by side with Go 1.19.
#
#   sh bench/run_pool.sh <builddir>
#
# colony: <builddir>/bench_pool (bench/bench_pool.c). Go: bench/go/pool, which
# has raw goroutines + sync.WaitGroup and `antsPool`, a small stand-in for
# ants v2.11 written for this benchmark (ants itself cannot be downloaded
# here: no module proxy). Every colony run alternates with its Go peers
# (odd runs colony first, even runs Go first), each a fresh process:
#   sleep10   1,000,000 tasks of 10 ms, capacity 50,000: wall, peak RSS
#   tiny_co   1,000,000 tiny tasks (an atomic add), capacity 1,000, one
#             submitting coroutine (colony) and one submitting plain thread
#             (colony_thread), in the same rounds as Go's
#   latency   a blocking submit on a full pool (capacity 1,000, tasks of
#             1 ms), 200,000 submits: p50 / p99
#   sleep1s   1,000,000 tasks of 1 s, capacity 50,000 (>20 s a run: runs
#             BENCH_SLOW_RUNS times, default 1)
#   locks     tiny_co, tiny_thread and latency again with the pool built on
#             ants' spinlock (-DCOLONY_POOL_SPINLOCK) and on co__lock_t
#             (-DCOLONY_POOL_FUTEXLOCK), each a CMake build of the library in
#             the run's folder
# Writes bench/results/pool.md (BENCH_QUICK=1: <builddir>/bench-pool-quick.md,
# small sizes, 1 run).
#
# Environment: BENCH_RUNS (default 3), BENCH_FAST_RUNS (the tiny-task and
# latency rows, a fraction of a second each, as single runs of
# them spread by 2-4x on this shared machine; default 11), BENCH_SLOW_RUNS (default 1),
# BENCH_QUICK=1, BENCH_GO_CACHE (GOCACHE/GOPATH root, default
# $TMPDIR/colony-bench-go), BENCH_NO_LOCKS=1 (skip the lock variants).
set -u
. "$(dirname "$0")/lib.sh"
bench_init "${1:-build}"

QUICK=${BENCH_QUICK:-0}
RUNS=${BENCH_RUNS:-3}
FAST_RUNS=${BENCH_FAST_RUNS:-11}
SLOW_RUNS=${BENCH_SLOW_RUNS:-1}
if [ "$QUICK" = 1 ]; then
    RUNS=${BENCH_RUNS:-1} FAST_RUNS=${BENCH_FAST_RUNS:-1} SLOW_RUNS=1
    N_SLEEP=100000 CAP_SLEEP=5000 N_TINY=200000 N_LAT=20000 N_1S=20000 CAP_1S=5000
    RESULT="$BUILD/bench-pool-quick.md"
else
    N_SLEEP=1000000 CAP_SLEEP=50000 N_TINY=1000000 N_LAT=200000 N_1S=1000000 CAP_1S=50000
    RESULT="$ROOT/bench/results/pool.md"
fi

if [ ! -x "$BUILD/bench_pool" ]; then
    echo "bench/run_pool.sh: $BUILD/bench_pool is missing: build first (make BUILD=...)" >&2
    exit 1
fi
OUT="$BUILD/bench-pool"
mkdir -p "$OUT"
RAW="$OUT/raw.txt"
ERR="$OUT/stderr.txt"
: >"$RAW"
: >"$ERR"

# ---- the Go peer ---------------------------------------------------------------
GOBIN="$BUILD/bench-go/pool"
mkdir -p "$BUILD/bench-go"
GO_OK=0
bench_go_peer "$ERR" pool "$GOBIN" && GO_OK=1

# ---- the lock variants -----------------------------------------------------------
LOCKS_OK=0
if [ "${BENCH_NO_LOCKS:-0}" != 1 ]; then
    LOCKS_OK=1
    for v in SPINLOCK FUTEXLOCK; do
        # The whole library again with the pool's lock swapped (a CMake
        # build, so every layer and optional library is as in BUILD's).
        VB="$OUT/build-$v"
        if ! { cmake -S . -B "$VB" -DCMAKE_C_FLAGS="-DCOLONY_POOL_$v" \
                   -DCOLONY_BUILD_BENCH=ON >>"$ERR" 2>&1 &&
               cmake --build "$VB" -j2 --target bench_pool >>"$ERR" 2>&1 &&
               cp "$VB/bench_pool" "$OUT/bench_pool_$v"; }; then
            echo "bench/run_pool.sh: building the $v variant failed (see $ERR)" >&2
            LOCKS_OK=0
        fi
    done
fi

# ---- running ---------------------------------------------------------------------
LOAD_MAX=0
one() { # id run impl bin args...
    id=$1 run=$2 impl=$3 bin=$4
    shift 4
    l1=$(cut -d' ' -f1 /proc/loadavg 2>/dev/null || echo 0)
    LOAD_MAX=$(echo "$l1 $LOAD_MAX" | awk '{ print ($1 > $2) ? $1 : $2 }')
    out=$(timeout 600 "$bin" "$@" 2>>"$ERR")
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
C="$BUILD/bench_pool"
G="$GOBIN"
go_spec() { [ "$GO_OK" = 1 ] && echo "$1"; }

MACHINE=$(bench_machine)
LOAD_BEFORE=$(bench_load)
T0=$(date +%s)
echo "bench/run_pool.sh: $MACHINE; load $LOAD_BEFORE; $RUNS runs" >&2

# each benchmark: colony first, then its Go peers (when Go built)
set -- "colony $C sleep 2 $N_SLEEP $CAP_SLEEP 10" "colony_raw $C raw_sleep 2 $N_SLEEP 10"
[ "$GO_OK" = 1 ] && set -- "$@" "go_raw $G raw_sleep 2 $N_SLEEP 10" "go_ants $G ants_sleep 2 $N_SLEEP $CAP_SLEEP 10"
bench_rounds sleep10 "$RUNS" "$@"
# both submitters in the same alternating rounds as Go's, so that each ratio
# compares runs taken side by side
set -- "colony $C tiny 2 $N_TINY 1000 0" "colony_thread $C tiny 2 $N_TINY 1000 1"
[ "$GO_OK" = 1 ] && set -- "$@" "go_raw $G raw_tiny 2 $N_TINY" "go_ants $G ants_tiny 2 $N_TINY 1000"
bench_rounds tiny_co "$FAST_RUNS" "$@"
set -- "colony $C latency 2 $N_LAT 1000 1000"
[ "$GO_OK" = 1 ] && set -- "$@" "go_ants $G ants_latency 2 $N_LAT 1000 1000"
bench_rounds latency "$FAST_RUNS" "$@"
if [ "$LOCKS_OK" = 1 ]; then
    bench_rounds lock_tiny_co "$RUNS" "yield $C tiny 2 $N_TINY 1000 0" \
        "spin $OUT/bench_pool_SPINLOCK tiny 2 $N_TINY 1000 0" "futex $OUT/bench_pool_FUTEXLOCK tiny 2 $N_TINY 1000 0"
    bench_rounds lock_tiny_thread "$RUNS" "yield $C tiny 2 $N_TINY 1000 1" \
        "spin $OUT/bench_pool_SPINLOCK tiny 2 $N_TINY 1000 1" "futex $OUT/bench_pool_FUTEXLOCK tiny 2 $N_TINY 1000 1"
    bench_rounds lock_latency "$RUNS" "yield $C latency 2 $N_LAT 1000 1000" \
        "spin $OUT/bench_pool_SPINLOCK latency 2 $N_LAT 1000 1000" "futex $OUT/bench_pool_FUTEXLOCK latency 2 $N_LAT 1000 1000"
    bench_rounds lock_sleep10 1 "yield $C sleep 2 $N_SLEEP $CAP_SLEEP 10" \
        "spin $OUT/bench_pool_SPINLOCK sleep 2 $N_SLEEP $CAP_SLEEP 10" "futex $OUT/bench_pool_FUTEXLOCK sleep 2 $N_SLEEP $CAP_SLEEP 10"
fi
set -- "colony $C sleep 2 $N_1S $CAP_1S 1000"
[ "$GO_OK" = 1 ] && set -- "$@" "go_ants $G ants_sleep 2 $N_1S $CAP_1S 1000"
bench_rounds sleep1s "$SLOW_RUNS" "$@"
ELAPSED=$(( $(date +%s) - T0 ))
LOAD_AFTER=$(bench_load)

# ---- the report --------------------------------------------------------------------
# Medians per (benchmark, implementation, field) over the runs that completed.
REPORT_AWK=$BENCH_AWK'
function med(id, impl, f,    n, k, a) {
    n = 0
    for (k = 1; k <= N; k++) if (ID[k] == id && IM[k] == impl && ((k, f) in V)) a[++n] = V[k, f] + 0
    if (n == 0) return ""
    return bench_median(a, n)
}
function cnt(id, impl,    n, k) { n = 0; for (k = 1; k <= N; k++) if (ID[k] == id && IM[k] == impl && !FAILED[k]) n++; return n }
function fmt(x, d) { return (x == "") ? "n/a" : sprintf("%." d "f", x) }
function ratio(a, b, d) { return (a == "" || b == "" || b == 0) ? "n/a" : sprintf("%." d "f", a / b) }
function yes(c) { return c ? "**met**" : "not met" }
{
    N++
    for (i = 1; i <= NF; i++) { split($i, kv, "="); V[N, kv[1]] = kv[2] }
    ID[N] = V[N, "id"]; IM[N] = V[N, "who"]; FAILED[N] = (V[N, "status"] == "failed")
}
END {
    print "# Pool benchmarks"
    print ""
    if (quick != "") { print quick; print "" }
    print "Command: `" cmd "` (driver: bench/run_pool.sh; C: bench/bench_pool.c; Go: bench/go/pool)."
    print "Machine: " machine ". " gov ". colony " rev ", " date "."
    print "Load average before " lb ", after " la ", highest seen at a process start " lmax " (a shared machine: other"
    print "jobs ran at the same time, so single figures move a lot; the medians are of " runs " runs each (" fast " for the tiny-task"
    print "and latency rows), run alternately colony / Go, each a fresh process; the 1 s benchmark ran " slow " time(s)). Total " el " s."
    print ""
    print "The Go side: **ants itself could not be used** (the Go module proxy is unreachable here), so"
    print "`go_raw` is raw goroutines + sync.WaitGroup and `go_ants` is a small ants-like pool written for"
    print "this benchmark (bench/go/pool/ants.go: a goroutine per worker parked on its task channel, LIFO"
    print "idle stack, ants backoff spinlock + sync.Cond, worker cache, purge and ticktock goroutines)."
    print "Peak RSS is getrusage ru_maxrss of the whole process; cpu is user + system time of the process"
    print "during the measurement, per task."
    print ""
    print "## 1,000,000 tasks of 10 ms, capacity 50,000"
    print ""
    print "| | wall ms | peak RSS MB | cpu ns/task | runs |"
    print "|---|---:|---:|---:|---:|"
    split("colony colony_raw go_raw go_ants", im, " ")
    for (i = 1; i <= 4; i++)
        printf "| %s | %s | %s | %s | %d |\n", im[i], fmt(med("sleep10", im[i], "wall_ms"), 0), fmt(med("sleep10", im[i], "peak_rss_kb") / 1024, 1), fmt(med("sleep10", im[i], "cpu_ns_per_op"), 0), cnt("sleep10", im[i])
    w = med("sleep10", "colony", "wall_ms"); wg = med("sleep10", "go_raw", "wall_ms")
    r = med("sleep10", "colony", "peak_rss_kb"); rg = med("sleep10", "go_raw", "peak_rss_kb")
    print ""
    printf "Target: wall <= 1/2 of Go raw goroutines: colony/Go raw = %s -> %s. Peak RSS <= Go raw: %s vs %s MB -> %s.\n", ratio(w, wg, 2), (w != "" && wg != "") ? yes(w <= wg / 2) : "n/a", fmt(r / 1024, 1), fmt(rg / 1024, 1), (r != "" && rg != "") ? yes(r <= rg) : "n/a"
    print ""
    print "`colony_raw` is one co_go per task + a waitgroup (colony without the pool). Per task the pool"
    print "takes its lock once (the submit) and the worker finishes with one CAS (the chute); the rest is"
    print "the runtime: spawning, arming and firing the sleep timer among thousands of pending ones, and"
    print "switching to coroutines whose stacks are cold."
    if (w != "" && w > 0)
        printf "At %s M tasks/s, about %d tasks of 10 ms are asleep at a time (capacity %d: %s).\n", fmt(nsleep / w / 1000, 2), nsleep * 10 / w, capsleep, (nsleep * 10 / w < capsleep * 0.9) ? "the two CPUs are the limit, not the capacity" : "the pool is full"
    print "Each sleeping task holds at least one 4 KiB stack page; Go starts goroutines on 2 KiB stacks."
    print ""
    print "## 1,000,000 tiny tasks (an atomic add), capacity 1,000"
    print ""
    print "| | M tasks/s | cpu ns/task | runs |"
    print "|---|---:|---:|---:|"
    printf "| colony, submitted from one coroutine | %s | %s | %d |\n", fmt(med("tiny_co", "colony", "mtasks_per_s"), 2), fmt(med("tiny_co", "colony", "cpu_ns_per_op"), 0), cnt("tiny_co", "colony")
    printf "| colony, submitted from one plain thread | %s | %s | %d |\n", fmt(med("tiny_co", "colony_thread", "mtasks_per_s"), 2), fmt(med("tiny_co", "colony_thread", "cpu_ns_per_op"), 0), cnt("tiny_co", "colony_thread")
    printf "| go_raw (a goroutine per task) | %s | | %d |\n", fmt(med("tiny_co", "go_raw", "mtasks_per_s"), 2), cnt("tiny_co", "go_raw")
    printf "| go_ants (capacity 1,000) | %s | | %d |\n", fmt(med("tiny_co", "go_ants", "mtasks_per_s"), 2), cnt("tiny_co", "go_ants")
    a = med("tiny_co", "colony", "mtasks_per_s"); b = med("tiny_co", "colony_thread", "mtasks_per_s"); g = med("tiny_co", "go_raw", "mtasks_per_s")
    print ""
    printf "Target: >= 4x Go raw goroutines and >= 5 M/s. Coroutine submitter: %sx Go raw, %s M/s -> %s. Plain thread: %sx, %s M/s -> %s.\n", ratio(a, g, 2), fmt(a, 2), (a != "" && g != "") ? yes(a >= 4 * g && a >= 5) : "n/a", ratio(b, g, 2), fmt(b, 2), (b != "" && g != "") ? yes(b >= 4 * g && b >= 5) : "n/a"
    print ""
    print "## Submit latency with the pool full (blocking mode, capacity 1,000, tasks of 1 ms)"
    print ""
    print "| | p50 us | p99 us | runs |"
    print "|---|---:|---:|---:|"
    split("colony go_ants", im2, " ")
    for (i = 1; i <= 2; i++)
        printf "| %s | %s | %s | %d |\n", im2[i], fmt(med("latency", im2[i], "p50_ns") / 1000, 2), fmt(med("latency", im2[i], "p99_ns") / 1000, 2), cnt("latency", im2[i])
    print ""
    print "Every worker is sleeping, so a submit on the full pool parks at once and the first worker to"
    print "finish hands its slot straight to it (and runs the task on its own coroutine): p50 is that park"
    print "and wake; the tail is the wait for the next task timer to fire and its worker to run."
    print ""
    print "## The pool lock: yield (default) vs ants spinlock vs co__lock_t"
    print ""
    print "The same pool code built three ways (bench/run_pool.sh compiles the two alternatives from src/)."
    print "yield: the default; a contended coroutine spins briefly then co_yield()s its P to other coroutines,"
    print "a contended plain thread spins then sleeps on a futex. spin: ants backoff spinlock (always yield:"
    print "sched_yield on a thread). futex: the runtime co__lock_t (spin then sleep the M, and with it the P)."
    print "Since task ends go through the lock-free chute, the lock is taken about once per task and the three"
    print "differ by less than the run-to-run noise of this shared machine; compare the medians below."
    print ""
    print "| lock | tiny, coroutine: M/s (cpu ns) | tiny, thread: M/s (cpu ns) | latency p50 / p99 us | 10 ms x 1M wall ms (1 run) |"
    print "|---|---:|---:|---:|---:|"
    split("yield spin futex", lk, " ")
    for (i = 1; i <= 3; i++)
        printf "| %s | %s (%s) | %s (%s) | %s / %s | %s |\n", lk[i], fmt(med("lock_tiny_co", lk[i], "mtasks_per_s"), 2), fmt(med("lock_tiny_co", lk[i], "cpu_ns_per_op"), 0), fmt(med("lock_tiny_thread", lk[i], "mtasks_per_s"), 2), fmt(med("lock_tiny_thread", lk[i], "cpu_ns_per_op"), 0), fmt(med("lock_latency", lk[i], "p50_ns") / 1000, 2), fmt(med("lock_latency", lk[i], "p99_ns") / 1000, 2), fmt(med("lock_sleep10", lk[i], "wall_ms"), 0)
    print ""
    print "## 1,000,000 tasks of 1 s, capacity 50,000 (20 waves: floor 20 s)"
    print ""
    print "| | wall ms | over the floor | peak RSS MB | RSS per busy worker | runs |"
    print "|---|---:|---:|---:|---:|---:|"
    split("colony go_ants", im3, " ")
    for (i = 1; i <= 2; i++) {
        w = med("sleep1s", im3[i], "wall_ms"); fl = med("sleep1s", im3[i], "floor_ms")
        printf "| %s | %s | %s | %s | %s B | %d |\n", im3[i], fmt(w, 0), (w != "" && fl != "") ? sprintf("%+.1f%%", (w / fl - 1) * 100) : "n/a", fmt(med("sleep1s", im3[i], "peak_rss_kb") / 1024, 1), fmt(med("sleep1s", im3[i], "rss_per_worker_b"), 0), cnt("sleep1s", im3[i])
    }
    w = med("sleep1s", "colony", "wall_ms"); fl = med("sleep1s", "colony", "floor_ms")
    print ""
    printf "Target: wall within 3%% of the floor -> %s. ants published 153 MB for this run on its authors machine,\n", (w != "" && fl != "") ? yes(w <= fl * 1.03) : "n/a"
    print "about 3 KB per parked worker; colony RSS per busy worker is (peak RSS - RSS before) / 50,000."
    print ""
    print "## Raw lines"
    print ""
    print "```"
    for (k = 1; k <= N; k++) print LINE[k]
    print "```"
}
{ LINE[N] = $0 }
'

REV=$(bench_rev src include bench/bench_pool.c)
QUICK_NOTE=""
[ "$QUICK" = 1 ] && QUICK_NOTE="SMOKE RUN (BENCH_QUICK=1): small sizes, not figures to quote."
mkdir -p "$(dirname "$RESULT")"
awk -v machine="$MACHINE" -v gov="$GO_VERSION" -v rev="$REV" -v runs="$RUNS" -v fast="$FAST_RUNS" -v nsleep="$N_SLEEP" -v capsleep="$CAP_SLEEP" -v slow="$SLOW_RUNS" \
    -v lb="$LOAD_BEFORE" -v la="$LOAD_AFTER" -v lmax="$LOAD_MAX" -v el="$ELAPSED" -v quick="$QUICK_NOTE" \
    -v date="$(date -u '+%Y-%m-%d %H:%M UTC')" -v cmd="sh bench/run_pool.sh $(basename "$BUILD")" \
    "$REPORT_AWK" "$RAW" >"$RESULT"
echo "bench/run_pool.sh: wrote $RESULT ($ELAPSED s)" >&2

#!/bin/sh
# bench/run_hook.sh — foreign blocking libraries on coroutines, side by side.
#
#   sh bench/run_hook.sh <builddir>
#
# Starts its own redis-server and PostgreSQL cluster (initdb into a temp
# dir, as nobody when run as root) on free loopback ports and stops them.
# Each round runs, alternating the order (odd rounds forward, even rounds
# backward), each in a fresh process:
#   redis  1,000 clients sharing 100,000 INCR/GET, ten of them first doing
#          a 300 ms BLPOP, a heartbeat sleeping 1 ms at a time:
#            colony+hook  hiredis's blocking API on coroutines, libcolony_hook.so
#            pthreads     the same on 1,000 threads
#            nb+wait_fd   non-blocking hiredis driven with co_wait_fd
#            redis-benchmark -c 1000 -t incr,get (redis's own event loop)
#   pg     1,000 clients sharing 20,000 SELECT 1, then 20,000 of a prepared
#          point query on a 100k-row table (pg point):
#            colony+hook (libpq), pthreads (libpq), Go 1.19 database/sql +
#            lib/pq (a pool of 1,000)
#   co_blocking  1,000 concurrent co_blocking(usleep(200 ms)) (default cap)
#   blpop  ten concurrent 300 ms BLPOPs and nothing else (hook, pthreads)
# Each row: ops/s, heartbeat worst lateness, the floor (a plain thread of
# the same process sleeping 1 ms at a time: what the kernel alone adds),
# peak OS threads, peak RSS, client CPU (user+sys) per operation; medians
# and ranges over the rounds.
# Writes bench/results/hook.md (BENCH_QUICK=1: <builddir>/bench-hook-quick.md).
# Environment: BENCH_RUNS (default 3), BENCH_QUICK=1 (1 round, a tenth of
# the operations), BENCH_GO_CACHE (default $TMPDIR/colony-bench-go).
set -u

BUILD=${1:-build}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT" || exit 1
case "$BUILD" in /*) ;; *) BUILD="$ROOT/$BUILD" ;; esac
QUICK=${BENCH_QUICK:-0}
RUNS=${BENCH_RUNS:-3}
ROPS=100000 POPS=20000
if [ "$QUICK" = 1 ]; then RUNS=${BENCH_RUNS:-1} ROPS=10000 POPS=2000; fi
OUT="$ROOT/bench/results/hook.md"
[ "$QUICK" = 1 ] && OUT="$BUILD/bench-hook-quick.md"
HOOK="$BUILD/libcolony_hook.so"
BH="$BUILD/bench_hook"
for f in "$HOOK" "$BH"; do
    [ -e "$f" ] || { echo "bench/run_hook.sh: $f missing (built with hiredis and libpq?)" >&2; exit 1; }
done
command -v redis-server >/dev/null || { echo "bench/run_hook.sh: no redis-server" >&2; exit 1; }
PGBIN=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | tail -1)
[ -x "$PGBIN/initdb" ] || { echo "bench/run_hook.sh: no PostgreSQL server" >&2; exit 1; }

TMP=$(mktemp -d "${TMPDIR:-/tmp}/colony-hook-bench.XXXXXX")
chmod 755 "$TMP"
LOG="$TMP/log"
ulimit -n 8192 2>/dev/null || ulimit -n 4096 2>/dev/null
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

RPORT=$(free_port)
redis-server --port "$RPORT" --bind 127.0.0.1 --save "" --appendonly no --maxclients 4000 \
    --dir "$TMP" --daemonize no >"$TMP/redis.log" 2>&1 &
RPID=$!

PGPORT=$(free_port)
AS=""
[ "$(id -u)" = 0 ] && AS="runuser -u nobody --" && chown nobody "$TMP"
PGDATA="$TMP/pg"
$AS "$PGBIN/initdb" -D "$PGDATA" -A trust -U postgres --no-sync >>"$LOG" 2>&1 &&
    $AS "$PGBIN/pg_ctl" -D "$PGDATA" -l "$TMP/pg.log" -w -t 30 \
        -o "-p $PGPORT -k $TMP -c listen_addresses=127.0.0.1 -c max_connections=1100 -c fsync=off" \
        start >>"$LOG" 2>&1 || { echo "bench/run_hook.sh: PostgreSQL did not start (see $LOG)" >&2; }
# the point query's table: 100k rows, id -> 2 * id
"$PGBIN/psql" -q -h 127.0.0.1 -p "$PGPORT" -U postgres -d postgres -c \
    "CREATE TABLE bench_t(id int PRIMARY KEY, v int); INSERT INTO bench_t SELECT g, 2 * g FROM generate_series(1, 100000) g; ANALYZE bench_t;" \
    >>"$LOG" 2>&1 || echo "bench/run_hook.sh: could not create bench_t" >&2
cleanup() {
    kill "$RPID" 2>/dev/null
    $AS "$PGBIN/pg_ctl" -D "$PGDATA" -m immediate -w stop >/dev/null 2>&1
    rm -rf "$TMP"
}
trap cleanup EXIT INT TERM
sleep 1

GOC=${BENCH_GO_CACHE:-${TMPDIR:-/tmp}/colony-bench-go}
mkdir -p "$GOC"
GOPQ="$GOC/hook-pq"
(cd bench/go/hook/pq && GOCACHE="$GOC/cache" GOPATH=/usr/share/gocode GO111MODULE=off GOFLAGS= \
    go build -o "$GOPQ" .) >>"$LOG" 2>&1 || GOPQ=""

export BENCH_REDIS_PORT=$RPORT
# as lib/pq does: no GSSAPI encryption or SSL negotiation (libpq's
# gssencmode=prefer initialises Kerberos at each connect, blocking its thread)
export BENCH_PG_CONNINFO="hostaddr=127.0.0.1 port=$PGPORT user=postgres dbname=postgres gssencmode=disable sslmode=disable"
export BENCH_PG_DSN="host=127.0.0.1 port=$PGPORT user=postgres dbname=postgres sslmode=disable"
RES="$TMP/results"
: >"$RES"

# one run: NAME OPS CMD...; appends "name=NAME ... cpu_s=..." to $RES
run() {
    name=$1 ops=$2
    shift 2
    /usr/bin/time -f "cpu_s=%U+%S rss_time_kb=%M" -o "$TMP/time" "$@" >"$TMP/out" 2>>"$LOG"
    line=$(grep -h "ops_s=" "$TMP/out" | tail -1)
    [ -n "$line" ] || { echo "run $name failed" >>"$LOG"; return; }
    echo "name=$name ops=$ops $line $(cat "$TMP/time")" >>"$RES"
}
rbench() {
    /usr/bin/time -f "cpu_s=%U+%S rss_time_kb=%M" -o "$TMP/time" \
        redis-benchmark -p "$RPORT" -c 1000 -n "$ROPS" -t incr,get --csv >"$TMP/rb" 2>>"$LOG"
    # mean of the two commands' requests per second
    ops=$(python3 -c '
import csv,sys
rows=[r for r in csv.reader(open(sys.argv[1])) if len(r)>1 and r[0] in ("INCR","GET")]
print(int(sum(float(r[1]) for r in rows)/len(rows)) if rows else 0)' "$TMP/rb")
    echo "name=redis-benchmark ops=$((ROPS * 2)) mode=rb ops_s=$ops hb_worst_ms=- threads_max=1 rss_kb=- errors=0 secs=- $(cat "$TMP/time")" >>"$RES"
}
redis_set() {
    run "colony+hook" "$ROPS" env LD_PRELOAD="$HOOK" "$BH" redis-co 1000 "$ROPS" 10
    run "pthreads" "$ROPS" "$BH" redis-pt 1000 "$ROPS" 10
    run "nb+wait_fd" "$ROPS" "$BH" redis-nb 1000 "$ROPS" 10
    rbench
}
redis_set_rev() {
    rbench
    run "nb+wait_fd" "$ROPS" "$BH" redis-nb 1000 "$ROPS" 10
    run "pthreads" "$ROPS" "$BH" redis-pt 1000 "$ROPS" 10
    run "colony+hook" "$ROPS" env LD_PRELOAD="$HOOK" "$BH" redis-co 1000 "$ROPS" 10
}
pg_set() {
    run "pg colony+hook" "$POPS" env LD_PRELOAD="$HOOK" "$BH" pg-co 1000 "$POPS"
    run "pg pthreads" "$POPS" "$BH" pg-pt 1000 "$POPS"
    [ -n "$GOPQ" ] && run "pg Go+lib/pq" "$POPS" "$GOPQ" 1000 "$POPS"
    run "pg point colony+hook" "$POPS" env LD_PRELOAD="$HOOK" "$BH" pgprep-co 1000 "$POPS"
    run "pg point pthreads" "$POPS" "$BH" pgprep-pt 1000 "$POPS"
    [ -n "$GOPQ" ] && run "pg point Go+lib/pq" "$POPS" "$GOPQ" 1000 "$POPS" prep
}
pg_set_rev() {
    [ -n "$GOPQ" ] && run "pg point Go+lib/pq" "$POPS" "$GOPQ" 1000 "$POPS" prep
    run "pg point pthreads" "$POPS" "$BH" pgprep-pt 1000 "$POPS"
    run "pg point colony+hook" "$POPS" env LD_PRELOAD="$HOOK" "$BH" pgprep-co 1000 "$POPS"
    [ -n "$GOPQ" ] && run "pg Go+lib/pq" "$POPS" "$GOPQ" 1000 "$POPS"
    run "pg pthreads" "$POPS" "$BH" pg-pt 1000 "$POPS"
    run "pg colony+hook" "$POPS" env LD_PRELOAD="$HOOK" "$BH" pg-co 1000 "$POPS"
}
LOAD0=$(cut -d' ' -f1-3 /proc/loadavg)
i=1
while [ "$i" -le "$RUNS" ]; do
    if [ $((i % 2)) = 1 ]; then redis_set; pg_set; else redis_set_rev; pg_set_rev; fi
    run "co_blocking usleep 200ms" 1000 "$BH" blocking 1000 200
    run "BLPOP x10 colony+hook" 10 env LD_PRELOAD="$HOOK" "$BH" redis-co 10 0 10
    run "BLPOP x10 pthreads" 10 "$BH" redis-pt 10 0 10
    i=$((i + 1))
done
LOAD1=$(cut -d' ' -f1-3 /proc/loadavg)

python3 - "$RES" "$OUT" "$RUNS" "$LOAD0" "$LOAD1" "$ROPS" "$POPS" <<'PY'
import sys, statistics, platform, os, subprocess
res, out, runs, l0, l1, rops, pops = sys.argv[1:8]
rows = {}
order = []
for line in open(res):
    kv = {}
    name = line.split(" ops=")[0][5:]
    for tok in line.split()[1:]:
        if "=" in tok:
            k, v = tok.split("=", 1)
            kv[k] = v
    if name not in rows:
        rows[name] = []
        order.append(name)
    rows[name].append(kv)
def num(v):
    try:
        if "+" in v:
            return sum(float(x) for x in v.split("+"))
        return float(v)
    except Exception:
        return None
def stat(name, key, fmt="%.0f"):
    vs = [num(r.get(key, "-")) for r in rows[name]]
    vs = [v for v in vs if v is not None]
    if not vs:
        return "-"
    m = statistics.median(vs)
    if len(vs) == 1:
        return fmt % m
    return (fmt % m) + " (" + (fmt % min(vs)) + "-" + (fmt % max(vs)) + ")"
def cpu_per_op(name):
    vs = []
    for r in rows[name]:
        c, o = num(r.get("cpu_s", "-")), num(r.get("ops", "-"))
        if c is not None and o:
            vs.append(c / o * 1e6)
    return "%.1f" % statistics.median(vs) if vs else "-"
def med(name, key):
    vs = [num(r.get(key, "-")) for r in rows.get(name, [])]
    vs = [v for v in vs if v is not None]
    return statistics.median(vs) if vs else None
try:
    cpu = [l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")][0]
except Exception:
    cpu = platform.processor()
with open(out, "w") as f:
    import datetime
    f.write("# Foreign blocking libraries on coroutines (bench/run_hook.sh)\n\n")
    f.write("Command: `BENCH_RUNS=%s sh bench/run_hook.sh <builddir>`, finished %s UTC.\n\n"
            % (runs, datetime.datetime.utcnow().strftime("%Y-%m-%d %H:%M")))
    f.write("Machine: %s, %d CPUs, Linux %s. Shared with other builds: load average %s "
            "before, %s after. %s round(s), medians (ranges). redis: 1,000 clients "
            "sharing %s INCR/GET plus ten 300 ms BLPOPs; pg: 1,000 clients sharing %s "
            "SELECT 1 (pg point: 20,000 of a prepared point query on a 100k-row table); ops/s and CPU us/op include the 1,000 connects (every client, Go's pool too, opens its connection first); the connected columns time the queries alone, from the moment every client is connected to the last reply, and the client's CPU per query meanwhile; in every pg row the clock stops at the last reply and the connections close after it (Go's pool closes in db.Close, after its clock; a backend's exit costs the server about 1 ms of CPU); the heartbeat sleeps 1 ms at a time; its floor is the worst lateness of a plain "
            "thread of the same process sleeping 1 ms at a time beside it (what the kernel "
            "alone adds on this machine at that moment; it is also the thread that samples "
            "the thread count). Threads: the peak of the client process less the bench's "
            "own measuring threads (that sampler, and the pthread rows' heartbeat thread): "
            "its main thread and every thread colony or a library made are counted; RSS: its peak (VmHWM, or time's for redis-benchmark); CPU: "
            "the client's user+sys per operation.\n\n"
            % (cpu, os.cpu_count(), platform.release(), l0, l1, runs, rops, pops))
    f.write("| client | ops/s | connected ops/s | heartbeat worst (ms) | floor (ms) | threads | peak RSS (KiB) | CPU us/op | connected CPU us/op | errors |\n")
    f.write("|---|---|---|---|---|---|---|---|---|---|\n")
    for n in order:
        rss = stat(n, "rss_kb") if rows[n][0].get("rss_kb", "-") != "-" else stat(n, "rss_time_kb")
        f.write("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n" % (
            n, stat(n, "ops_s"), stat(n, "q_ops_s"), stat(n, "hb_worst_ms", "%.1f"),
            stat(n, "hb_floor_ms", "%.1f"), stat(n, "threads_max"), rss, cpu_per_op(n),
            stat(n, "q_cpu_us", "%.1f"), stat(n, "errors")))
    f.write("\nRatios of medians (ops/s):\n\n")
    pairs = [("colony+hook", "pthreads"), ("colony+hook", "nb+wait_fd"),
             ("colony+hook", "redis-benchmark"), ("pg colony+hook", "pg pthreads"),
             ("pg colony+hook", "pg Go+lib/pq"), ("pg point colony+hook", "pg point pthreads"),
             ("pg point colony+hook", "pg point Go+lib/pq")]
    for a, b in pairs:
        x, y = med(a, "ops_s"), med(b, "ops_s")
        if x and y:
            f.write("- %s / %s: %.2f\n" % (a, b, x / y))
    f.write("\nThe same, connected (pg: the queries alone, once every client is connected):\n\n")
    for a, b in pairs:
        x, y = med(a, "q_ops_s"), med(b, "q_ops_s")
        if x and y:
            f.write("- %s / %s: %.2f\n" % (a, b, x / y))
    f.write("\nco_blocking row: ops/s is calls completed per second (1,000 calls of "
            "200 ms under the default cap of 128 threads; the bound is cap + procs + 2 = %d "
            "threads). BLPOP rows: ten clients, each one "
            "BLPOP of 300 ms and nothing else (ops/s is 0 by construction).\n" % (128 + os.cpu_count() + 2))
print(open(out).read())
PY

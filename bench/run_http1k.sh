#!/bin/sh
# bench/run_http1k.sh — the HTTP example at 1,000 and 100 connections, side
# by side with a libuv responder, nginx and Go's net/http.
#
#   sh bench/run_http1k.sh <builddir>
#
# Servers, each answering GET / with "Hello, World!\n" (text/plain;
# charset=utf-8, Content-Length, Date), on 127.0.0.1:
#   colony  examples/http_server (pool 1000)
#   libuv   bench/peers/uv_http.c: one loop on one thread (built here with
#           -luv; skipped without uv.h)
#   nginx   Debian's nginx, 2 workers, from a config in a temp dir
#           (bench/peers/nginx.conf.in), `return 200` (skipped without it)
#   go      bench/go/net/http (net/http; skipped without go)
# For each connection count (1000, then 100) and each run, every server is
# started fresh, in an order that rotates from run to run, warmed with a
# 1 s wrk, then measured with wrk -t2 -c<n> -d<dur>s --latency: requests/s,
# p99 latency, and the server's peak RSS (VmHWM; nginx: master and workers
# summed). Writes bench/results/http1k.md: medians and ranges.
# Environment: BENCH_RUNS (default 5), BENCH_DUR (seconds, default 5),
# BENCH_CONNS (default "1000 100"), BENCH_QUICK=1 (1 run of 3 s, written to
# <builddir>/bench-http1k-quick.md), BENCH_GO_CACHE as bench/run_net.sh,
# BENCH_HTTP_BASELINE (another build's http_server, e.g. one from before a
# change: measured too, as "colony-base").
set -u

BUILD=${1:-build}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT" || exit 1
case "$BUILD" in /*) ;; *) BUILD="$ROOT/$BUILD" ;; esac

QUICK=${BENCH_QUICK:-0}
RUNS=${BENCH_RUNS:-5}
DUR=${BENCH_DUR:-5}
CONNS=${BENCH_CONNS:-1000 100}
RESULT="$ROOT/bench/results/http1k.md"
if [ "$QUICK" = 1 ]; then
    RUNS=${BENCH_RUNS:-1} DUR=${BENCH_DUR:-3}
    RESULT="$BUILD/bench-http1k-quick.md"
fi
[ "$RUNS" -lt 1 ] && RUNS=1

if [ ! -x "$BUILD/http_server" ]; then
    echo "bench/run_http1k.sh: $BUILD/http_server is missing: build first" >&2
    exit 1
fi
if ! command -v wrk >/dev/null 2>&1; then
    echo "bench/run_http1k.sh: wrk is not installed" >&2
    exit 1
fi

OUT="$BUILD/bench-http1k"
mkdir -p "$OUT"
RAW="$OUT/raw.txt"
LOG="$OUT/log.txt"
: >"$RAW"
: >"$LOG"
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)" 2>/dev/null

# ---- the peers ------------------------------------------------------------------
IMPLS="colony"
BASELINE=${BENCH_HTTP_BASELINE:-}
if [ -n "$BASELINE" ] && [ -x "$BASELINE" ]; then
    IMPLS="$IMPLS colony-base"
elif [ -n "$BASELINE" ]; then
    echo "bench/run_http1k.sh: BENCH_HTTP_BASELINE=$BASELINE is not an executable: ignored" >&2
fi
if cc -O2 -o "$OUT/uv_http" bench/peers/uv_http.c -luv >>"$LOG" 2>&1; then
    IMPLS="$IMPLS libuv"
else
    echo "bench/run_http1k.sh: libuv (uv.h, -luv) missing: no libuv row" >&2
fi
NGINX=$(command -v nginx 2>/dev/null || ls /usr/sbin/nginx 2>/dev/null)
if [ -n "$NGINX" ]; then
    IMPLS="$IMPLS nginx"
else
    echo "bench/run_http1k.sh: nginx missing: no nginx row" >&2
fi
TMP=${TMPDIR:-/tmp}
BENCH_GO_CACHE=${BENCH_GO_CACHE:-$TMP/colony-bench-go}
GO_VERSION="not installed"
if command -v go >/dev/null 2>&1 &&
    (cd bench/go/net && GOCACHE="$BENCH_GO_CACHE/cache" GOPATH="$BENCH_GO_CACHE/path" \
        GOFLAGS=-mod=mod GOPROXY=off GOTOOLCHAIN=local go build -o "$OUT/go_http" ./http) >>"$LOG" 2>&1; then
    GO_VERSION=$(go version 2>/dev/null)
    IMPLS="$IMPLS go"
else
    echo "bench/run_http1k.sh: go or bench/go/net/http unavailable: no Go row" >&2
fi

# ---- helpers --------------------------------------------------------------------
SPID="" PORT="" NGDIR=""
free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}
start_server() { # impl
    : >"$OUT/$1.out"
    PORT=""
    case $1 in
    colony) "$BUILD/http_server" 0 1000 >"$OUT/$1.out" 2>&1 & SPID=$! ;;
    colony-base) "$BASELINE" 0 1000 >"$OUT/$1.out" 2>&1 & SPID=$! ;;
    libuv) "$OUT/uv_http" 0 >"$OUT/$1.out" 2>&1 & SPID=$! ;;
    go) "$OUT/go_http" 0 >"$OUT/$1.out" 2>&1 & SPID=$! ;;
    nginx)
        NGDIR=$(mktemp -d "$TMP/colony-nginx.XXXXXX")
        PORT=$(free_port)
        sed -e "s|@DIR@|$NGDIR|g" -e "s|@PORT@|$PORT|g" bench/peers/nginx.conf.in >"$NGDIR/nginx.conf"
        "$NGINX" -p "$NGDIR" -c "$NGDIR/nginx.conf" -e "$NGDIR/error.log" >"$OUT/$1.out" 2>&1 &
        SPID=$!
        ;;
    esac
    tries=0
    while [ $tries -lt 100 ]; do
        if [ "$1" = nginx ]; then
            curl -s -o /dev/null "http://127.0.0.1:$PORT/" && return 0
        else
            PORT=$(sed -n 's/.*127\.0\.0\.1:\([0-9][0-9]*\).*/\1/p' "$OUT/$1.out" | head -n 1)
            [ -n "$PORT" ] && return 0
        fi
        sleep 0.05
        tries=$((tries + 1))
    done
    echo "bench/run_http1k.sh: $1 did not start" >&2
    stop_server
    return 1
}
# cpu_ticks: user + system clock ticks of the server and its children
cpu_ticks() {
    t=0
    for p in $SPID $(cat /proc/$SPID/task/*/children 2>/dev/null); do
        c=$(sed 's/.*) //' "/proc/$p/stat" 2>/dev/null | awk '{ print $12 + $13 }')
        t=$((t + ${c:-0}))
    done
    echo "$t"
}
stop_server() { # sets HWM (KiB): the server's peak RSS, its children's added
    HWM=0
    for p in $SPID $(cat /proc/$SPID/task/*/children 2>/dev/null); do
        h=$(sed -n 's/^VmHWM:[[:space:]]*\([0-9]*\).*/\1/p' "/proc/$p/status" 2>/dev/null)
        HWM=$((HWM + ${h:-0}))
    done
    kill -TERM "$SPID" 2>/dev/null
    wait "$SPID" 2>/dev/null
    SPID=""
    [ -n "$NGDIR" ] && rm -rf "$NGDIR"
    NGDIR=""
}
to_us() {
    echo "$1" | awk '{ v = $1 + 0; if ($1 ~ /ms$/) v *= 1000; else if ($1 ~ /us$/) v *= 1; else if ($1 ~ /s$/) v *= 1000000; printf "%.0f", v }'
}
run_one() { # impl conns run
    start_server "$1" || { echo "id=http c=$2 impl=$1 run=$3 status=failed" >>"$RAW"; return; }
    url="http://127.0.0.1:$PORT/"
    wrk -t2 -c"$2" -d1s "$url" >/dev/null 2>&1
    t0=$(cpu_ticks)
    res=$(wrk -t2 -c"$2" -d"${DUR}s" --timeout 5s --latency "$url" 2>&1)
    t1=$(cpu_ticks)
    stop_server
    printf '== %s c=%s run %s\n%s\n' "$1" "$2" "$3" "$res" >>"$LOG"
    rps=$(printf '%s\n' "$res" | sed -n 's/^Requests\/sec:[[:space:]]*\([0-9.]*\).*/\1/p')
    p99=$(printf '%s\n' "$res" | awk '$1 == "99%" { print $2 }')
    errs=$(printf '%s\n' "$res" | awk '/Socket errors/ { n += $4 + $6 + $8 + $10 } /Non-2xx/ { n += $NF } END { print n + 0 }')
    if [ -z "$rps" ] || [ -z "$p99" ]; then
        echo "id=http c=$2 impl=$1 run=$3 status=failed" >>"$RAW"
        echo "  c=$2 #$3 $1: FAILED" >&2
        return
    fi
    p99=$(to_us "$p99")
    # the server's CPU time per request (µs): less hostage to the host's
    # load than requests/s, as the load generator's share does not count
    cpu=$(awk -v d=$((t1 - t0)) -v hz="$(getconf CLK_TCK)" -v r="$rps" -v s="$DUR" \
        'BEGIN { printf "%.2f", d / hz * 1e6 / (r * s) }')
    echo "id=http c=$2 impl=$1 run=$3 rps=$rps p99_us=$p99 rss_kib=$HWM errors=$errs cpu_us=$cpu" >>"$RAW"
    echo "  c=$2 #$3 $1: $rps req/s, p99 $p99 us, peak RSS $HWM KiB, errors $errs, CPU $cpu us/req" >&2
}
loadavg() { cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo '?'; }
machine() {
    m=$(lscpu 2>/dev/null | sed -n 's/^Model name:[[:space:]]*//p' | head -1)
    echo "${m:-$(uname -m)}, $(nproc) logical CPUs, $(awk '/MemTotal/ {printf "%.0f GiB RAM", $2/1048576}' /proc/meminfo), Linux $(uname -r)"
}

DATE=$(date -u '+%Y-%m-%d %H:%M UTC')
LOAD_BEFORE=$(loadavg)
T0=$(date +%s)
echo "bench/run_http1k.sh: $(machine); load $LOAD_BEFORE; $RUNS runs of ${DUR}s; $IMPLS" >&2
for c in $CONNS; do
    r=1
    while [ $r -le "$RUNS" ]; do
        # rotate the order: each server goes first in turn
        set -- $IMPLS
        k=$(( (r - 1) % $# ))
        while [ $k -gt 0 ]; do x=$1; shift; set -- "$@" "$x"; k=$((k - 1)); done
        for impl in "$@"; do run_one "$impl" "$c" "$r"; done
        r=$((r + 1))
    done
done
LOAD_AFTER=$(loadavg)
ELAPSED=$(( $(date +%s) - T0 ))
REV=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
[ -n "$(git status --porcelain -- src include examples 2>/dev/null)" ] && REV="$REV plus uncommitted changes"
NGV=$([ -n "$NGINX" ] && "$NGINX" -v 2>&1 | sed 's/.*version: //')
UVV=$(pkg-config --modversion libuv 2>/dev/null || echo '?')

mkdir -p "$(dirname "$RESULT")"
awk -v date="$DATE" -v machine="$(machine)" -v lb="$LOAD_BEFORE" -v la="$LOAD_AFTER" \
    -v runs="$RUNS" -v dur="$DUR" -v rev="$REV" -v el="$ELAPSED" -v gov="$GO_VERSION" \
    -v base="$([ "${IMPLS#*colony-base}" != "$IMPLS" ] && echo "$BASELINE")" -v ngv="${NGV:-not installed}" -v uvv="$UVV" -v wrkv="$(wrk -v 2>&1 | head -n 1 | sed 's/ Copyright.*//')" '
function med(a, n,   i, j, t) {
    for (i = 2; i <= n; i++) { t = a[i]; for (j = i - 1; j >= 1 && a[j] > t; j--) a[j + 1] = a[j]; a[j + 1] = t }
    return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
}
function lo(a, n,   i, m) { m = a[1]; for (i = 2; i <= n; i++) if (a[i] < m) m = a[i]; return m }
function hi(a, n,   i, m) { m = a[1]; for (i = 2; i <= n; i++) if (a[i] > m) m = a[i]; return m }
{
    delete f
    for (i = 1; i <= NF; i++) { split($i, kv, "="); f[kv[1]] = kv[2] }
    key = f["c"] SUBSEP f["impl"]
    if (!(f["c"] in seenc)) { seenc[f["c"]] = 1; cs[++nc] = f["c"] }
    if (!(f["impl"] in seeni)) { seeni[f["impl"]] = 1; is[++ni] = f["impl"] }
    if (f["status"] == "failed") { failed[key]++; next }
    n[key]++
    rps[key, n[key]] = f["rps"]; p99[key, n[key]] = f["p99_us"] / 1000
    rss[key, n[key]] = f["rss_kib"] / 1024; err[key] += f["errors"]; cpu[key, n[key]] = f["cpu_us"]
}
END {
    print "# HTTP at 1,000 connections"
    print ""
    print "Written by `sh bench/run_http1k.sh " "<builddir>" "` on " date ", colony " rev "."
    print ""
    print "- Machine: " machine "; load average " lb " before, " la " after (" el " s)."
    print "- The load generator (wrk -t2) shares the CPUs with the server, and the host with"
    print "  other builds: absolute figures are low and spread; compare within a run."
    print "- " runs " run(s) of " dur " s per server and connection count, each server fresh,"
    print "  the order rotating from run to run, after a 1 s warm-up; medians [min-max]."
    print "- Peers: libuv " uvv " (bench/peers/uv_http.c, one loop), nginx " ngv " (2 workers,"
    print "  bench/peers/nginx.conf.in), " gov " (bench/go/net/http); " wrkv "."
    if (base != "") print "- colony-base: " base " (BENCH_HTTP_BASELINE), started as colony is."
    print "- Peak RSS: the VmHWM of each server (nginx: master and workers summed). CPU/req:"
    print "  the server processes\47 user+system time during the measured run over the requests"
    print "  wrk counted (clock ticks: a few per cent of resolution)."
    for (ci = 1; ci <= nc; ci++) {
        c = cs[ci]
        print ""
        print "## wrk -t2 -c" c " --latency"
        print ""
        print "| server | requests/s | p99 (ms) | CPU/req (µs) | peak RSS (MB) | errors | req/s vs colony |"
        print "|---|---|---|---|---|---|---|"
        ck = c SUBSEP "colony"
        for (k = 1; k <= n[ck]; k++) t[k] = rps[ck, k]
        cmed = n[ck] ? med(t, n[ck]) : 0
        for (ii = 1; ii <= ni; ii++) {
            key = c SUBSEP is[ii]; m = n[key]
            if (!m) { printf "| %s | failed | | | | | |\n", is[ii]; continue }
            for (k = 1; k <= m; k++) { a[k] = rps[key, k]; b[k] = p99[key, k]; d[k] = rss[key, k]; u[k] = cpu[key, k] }
            r = med(a, m)
            printf "| %s | %.0f [%.0f-%.0f] | %.1f [%.1f-%.1f] | %.2f [%.2f-%.2f] | %.1f | %d | %s |\n", is[ii], r, lo(a, m), hi(a, m), med(b, m), lo(b, m), hi(b, m), med(u, m), lo(u, m), hi(u, m), med(d, m), err[key], cmed ? sprintf("%.2f", r / cmed) : "n/a"
        }
    }
}' "$RAW" >"$RESULT"
echo "bench/run_http1k.sh: wrote $RESULT" >&2

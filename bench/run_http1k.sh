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
. "$(dirname "$0")/lib.sh"
bench_init "${1:-build}"

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
GO_VERSION="not installed"
if command -v go >/dev/null 2>&1 && bench_go_build net "$OUT/go_http" ./http >>"$LOG" 2>&1; then
    GO_VERSION=$(go version 2>/dev/null)
    IMPLS="$IMPLS go"
else
    echo "bench/run_http1k.sh: go or bench/go/net/http unavailable: no Go row" >&2
fi

# ---- helpers --------------------------------------------------------------------
NGDIR=""
free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}
start_server() { # impl
    case $1 in
    colony) bench_start_server "$1" "$BUILD/http_server" 0 1000 ;;
    colony-base) bench_start_server "$1" "$BASELINE" 0 1000 ;;
    libuv) bench_start_server "$1" "$OUT/uv_http" 0 ;;
    go) bench_start_server "$1" "$OUT/go_http" 0 ;;
    nginx) # it prints no port: one is chosen for it, and asked until it answers
        : >"$OUT/$1.out"
        NGDIR=$(mktemp -d "$TMP/colony-nginx.XXXXXX")
        PORT=$(free_port)
        sed -e "s|@DIR@|$NGDIR|g" -e "s|@PORT@|$PORT|g" bench/peers/nginx.conf.in >"$NGDIR/nginx.conf"
        "$NGINX" -p "$NGDIR" -c "$NGDIR/nginx.conf" -e "$NGDIR/error.log" >"$OUT/$1.out" 2>&1 &
        SPID=$!
        tries=0
        while [ $tries -lt 100 ]; do
            curl -s -o /dev/null "http://127.0.0.1:$PORT/" && return 0
            sleep 0.05
            tries=$((tries + 1))
        done
        echo "$ME: $1 did not start" >&2
        stop_server
        return 1
        ;;
    esac
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
    bench_stop_server
    [ -n "$NGDIR" ] && rm -rf "$NGDIR"
    NGDIR=""
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
    bench_wrk "$res"
    rps=$WRK_RPS p99=$WRK_P99
    errs=$(printf '%s\n' "$res" | awk '/Socket errors/ { n += $4 + $6 + $8 + $10 } /Non-2xx/ { n += $NF } END { print n + 0 }')
    if [ -z "$rps" ] || [ -z "$p99" ]; then
        bench_failed "id=http c=$2 impl=$1 run=$3" "c=$2 #$3 $1"
        return
    fi
    p99=$(bench_to_us "$p99")
    # the server's CPU time per request (µs): less hostage to the host's
    # load than requests/s, as the load generator's share does not count
    cpu=$(awk -v d=$((t1 - t0)) -v hz="$(getconf CLK_TCK)" -v r="$rps" -v s="$DUR" \
        'BEGIN { printf "%.2f", d / hz * 1e6 / (r * s) }')
    echo "id=http c=$2 impl=$1 run=$3 rps=$rps p99_us=$p99 rss_kib=$HWM errors=$errs cpu_us=$cpu" >>"$RAW"
    echo "  c=$2 #$3 $1: $rps req/s, p99 $p99 us, peak RSS $HWM KiB, errors $errs, CPU $cpu us/req" >&2
}
DATE=$(date -u '+%Y-%m-%d %H:%M UTC')
LOAD_BEFORE=$(bench_load)
T0=$(date +%s)
echo "bench/run_http1k.sh: $(bench_machine); load $LOAD_BEFORE; $RUNS runs of ${DUR}s; $IMPLS" >&2
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
LOAD_AFTER=$(bench_load)
ELAPSED=$(( $(date +%s) - T0 ))
REV=$(bench_rev src include examples)
NGV=$([ -n "$NGINX" ] && "$NGINX" -v 2>&1 | sed 's/.*version: //')
UVV=$(pkg-config --modversion libuv 2>/dev/null || echo '?')

mkdir -p "$(dirname "$RESULT")"
awk -v date="$DATE" -v machine="$(bench_machine)" -v lb="$LOAD_BEFORE" -v la="$LOAD_AFTER" \
    -v runs="$RUNS" -v dur="$DUR" -v rev="$REV" -v el="$ELAPSED" -v gov="$GO_VERSION" \
    -v base="$([ "${IMPLS#*colony-base}" != "$IMPLS" ] && echo "$BASELINE")" -v ngv="${NGV:-not installed}" -v uvv="$UVV" -v wrkv="$(wrk -v 2>&1 | head -n 1 | sed 's/ Copyright.*//')" "$BENCH_AWK"'
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
        cmed = n[ck] ? bench_median(t, n[ck]) : 0
        for (ii = 1; ii <= ni; ii++) {
            key = c SUBSEP is[ii]; m = n[key]
            if (!m) { printf "| %s | failed | | | | | |\n", is[ii]; continue }
            for (k = 1; k <= m; k++) { a[k] = rps[key, k]; b[k] = p99[key, k]; d[k] = rss[key, k]; u[k] = cpu[key, k] }
            r = bench_median(a, m)
            printf "| %s | %.0f [%.0f-%.0f] | %.1f [%.1f-%.1f] | %.2f [%.2f-%.2f] | %.1f | %d | %s |\n", is[ii], r, lo(a, m), hi(a, m), bench_median(b, m), lo(b, m), hi(b, m), bench_median(u, m), lo(u, m), hi(u, m), bench_median(d, m), err[key], cmed ? sprintf("%.2f", r / cmed) : "n/a"
        }
    }
}' "$RAW" >"$RESULT"
echo "bench/run_http1k.sh: wrote $RESULT" >&2

#!/bin/sh
# bench/run_net.sh — servers under load, side by side with Go 1.19.
#
#   sh bench/run_net.sh <builddir>
#
# Loopback only (127.0.0.1), bounded in count and time. For each run the
# colony server and its Go peer are started alternately (odd runs colony
# first, even runs Go first), each in a fresh process:
#   http   examples/http_server (pool 1000) vs bench/go/net/http (net/http),
#          wrk -t2 -c100 -d10s --latency on "/" after a 1 s warm-up:
#          requests/s and p99 latency
#   echo   examples/echo_server (pool 1000) vs bench/go/net/echo (a goroutine
#          per connection), examples/echo_client -c 100 -s 64 -d 10:
#          round trips/s and p99 latency
#   flood  examples/echo_server with a pool of 1000 (and the unbounded Go
#          server for comparison) against echo_client -f 10000 -H 500:
#          10,000 connections at once, each sends 64 bytes, waits for the
#          echo, holds the connection 500 ms; every connection is counted as
#          served / refused / reset / connect error / timeout; the server's
#          peak RSS (VmHWM) is read before it is stopped, and it must still
#          answer afterwards.
#   slowloris  examples/http_server (pool 1000) vs the Go net/http peer,
#          examples/slowloris -s 1000 -c 50 -d 10: 1,000 slow connections
#          (each trickles a header line a second and never ends its head;
#          one the server closes is reopened) held open while 50 clients
#          send normal keep-alive requests: requests/s answered 200, other
#          answers (503), failures, timeouts, p99; and the same 50 clients
#          with no slow connections, for the ratio.
# Writes bench/results/net.md (BENCH_QUICK=1: <builddir>/bench-net-quick.md).
#
# Environment: BENCH_RUNS (default 5: single runs of these spread by tens of
# per cent on a shared machine), BENCH_QUICK=1 (2 s runs, a flood of
# 1,000 at a pool of 100), BENCH_GO_CACHE
# (GOCACHE/GOPATH root, default $TMPDIR/colony-bench-go),
# BENCH_HTTP_BASELINE (another build's http_server, e.g. one from before a
# change: the slowloris rows are measured for it too, as "colony
# (baseline)").
set -u
. "$(dirname "$0")/lib.sh"
bench_init "${1:-build}"

QUICK=${BENCH_QUICK:-0}
RUNS=${BENCH_RUNS:-5}
[ "$RUNS" -lt 1 ] && RUNS=1
if [ "$QUICK" = 1 ]; then
    DUR=2 FLOOD=1000 FPOOL=100 SLOW=1000 RUNS=${BENCH_RUNS:-1}
else
    DUR=10 FLOOD=10000 FPOOL=1000 SLOW=1000
fi
BASELINE=${BENCH_HTTP_BASELINE:-}
if [ -n "$BASELINE" ] && [ ! -x "$BASELINE" ]; then
    echo "bench/run_net.sh: BENCH_HTTP_BASELINE=$BASELINE is not an executable: ignored" >&2
    BASELINE=""
fi

for b in http_server echo_server echo_client slowloris; do
    if [ ! -x "$BUILD/$b" ]; then
        echo "bench/run_net.sh: $BUILD/$b is missing: build first (make BUILD=...)" >&2
        exit 1
    fi
done
if ! command -v wrk >/dev/null 2>&1; then
    echo "bench/run_net.sh: wrk is not installed: the http rows will read n/a" >&2
fi

OUT="$BUILD/bench-net"
mkdir -p "$OUT"
RAW="$OUT/raw.txt"
LOG="$OUT/log.txt"
: >"$RAW"
: >"$LOG"

# ---- the Go peers ------------------------------------------------------------
GOBIN_DIR="$BUILD/bench-go"
mkdir -p "$GOBIN_DIR"
GO_OK=1
for p in http echo; do
    bench_go_peer "$LOG" net "$GOBIN_DIR/net-$p" "./$p" || GO_OK=0
done

# ---- helpers ------------------------------------------------------------------
# start_impl KIND IMPL PROGRAM POOL PEER: for IMPL colony, examples/PROGRAM
# with a pool of POOL; for go, the Go peer bench/go/net/PEER (1 if it was
# not built)
start_impl() {
    if [ "$2" = colony ]; then
        bench_start_server "$1-$2" "$BUILD/$3" 0 "$4"
    else
        [ "$GO_OK" = 1 ] || return 1
        bench_start_server "$1-$2" "$GOBIN_DIR/net-$5" 0
    fi
}

run_http() { # impl run
    impl=$1 run=$2
    start_impl http "$impl" http_server 1000 http || return
    url="http://127.0.0.1:$PORT/"
    wrk -t2 -c100 -d1s "$url" >/dev/null 2>&1
    res=$(wrk -t2 -c100 -d"${DUR}s" --latency "$url" 2>&1)
    bench_stop_server
    printf '%s\n' "$res" >>"$LOG"
    bench_wrk "$res"
    rps=$WRK_RPS p99=$WRK_P99
    errs=$(printf '%s\n' "$res" | awk '/Socket errors|Non-2xx/ { n++ } END { print n + 0 }')
    if [ -z "$rps" ] || [ -z "$p99" ]; then
        bench_failed "id=http impl=$impl run=$run" "http #$run $impl"
        return
    fi
    p99=$(bench_to_us "$p99")
    echo "id=http impl=$impl run=$run rps=$rps p99_us=$p99 rss_kib=$HWM error_lines=$errs" >>"$RAW"
    echo "  http #$run $impl: $rps req/s, p99 $p99 us, peak RSS $HWM KiB" >&2
}

run_echo() { # impl run
    impl=$1 run=$2
    start_impl echo "$impl" echo_server 1000 echo || return
    res=$("$BUILD/echo_client" -p "$PORT" -c 100 -s 64 -d "$DUR" 2>&1)
    bench_stop_server
    printf '%s\n' "$res" >>"$LOG"
    rts=$(printf '%s\n' "$res" | sed -n 's/.* round trips, \([0-9.]*\)\/s.*/\1/p')
    p99=$(printf '%s\n' "$res" | sed -n 's/.* p99 \([0-9.]*\) us.*/\1/p')
    cerr=$(printf '%s\n' "$res" | sed -n 's/.* \([0-9]*\) connection errors.*/\1/p')
    if [ -z "$rts" ]; then
        bench_failed "id=echo impl=$impl run=$run" "echo #$run $impl"
        return
    fi
    echo "id=echo impl=$impl run=$run rts=$rts p99_us=$p99 rss_kib=$HWM conn_errors=$cerr" >>"$RAW"
    echo "  echo #$run $impl: $rts round trips/s, p99 $p99 us, peak RSS $HWM KiB" >&2
}

run_flood() { # impl run
    impl=$1 run=$2
    start_impl flood "$impl" echo_server "$FPOOL" echo || return
    res=$("$BUILD/echo_client" -p "$PORT" -f "$FLOOD" -H 500 -t 20000 2>&1)
    # still up? one connection, one second of round trips
    after=$("$BUILD/echo_client" -p "$PORT" -c 1 -d 1 2>&1)
    alive=0
    printf '%s\n' "$after" | grep -q ' 0 connection errors' && alive=1
    bench_stop_server
    printf '%s\n%s\n' "$res" "$after" >>"$LOG"
    line=$(printf '%s\n' "$res" | grep '^flood:')
    if [ -z "$line" ]; then
        bench_failed "id=flood impl=$impl run=$run" "flood #$run $impl"
        return
    fi
    f() { printf '%s\n' "$line" | sed -n "s/.* $1 \([0-9]*\).*/\1/p"; }
    secs=$(printf '%s\n' "$line" | sed -n 's/.* in \([0-9.]*\) s:.*/\1/p')
    echo "id=flood impl=$impl run=$run served=$(f served) refused=$(f refused) reset=$(f reset) connerr=$(f error) timeout=$(f timeout) other=$(f other) secs=$secs rss_kib=$HWM alive=$alive" >>"$RAW"
    echo "  flood #$run $impl: $line; peak RSS $HWM KiB; alive after: $alive" >&2
    if [ "$impl" = colony ]; then
        sed -n 's/^echo_server: accepted/server: accepted/p' "$OUT/flood-$impl.out" >>"$LOG"
    fi
}

run_slow() { # impl run slow-connections
    impl=$1 run=$2 nslow=$3
    case "$impl" in
    colony) bench_start_server "slow-$impl" "$BUILD/http_server" 0 1000 || return ;;
    baseline) bench_start_server "slow-$impl" "$BASELINE" 0 1000 || return ;;
    go)
        [ "$GO_OK" = 1 ] || return
        bench_start_server "slow-$impl" "$GOBIN_DIR/net-http" 0 || return
        ;;
    esac
    res=$("$BUILD/slowloris" -p "$PORT" -s "$nslow" -c 50 -d "$DUR" 2>&1)
    bench_stop_server
    printf '%s\n' "$res" >>"$LOG"
    line=$(printf '%s\n' "$res" | grep '^slowloris:')
    if [ -z "$line" ]; then
        bench_failed "id=slow impl=$impl slow=$nslow run=$run" "slowloris #$run $impl $nslow"
        return
    fi
    g() { printf '%s\n' "$line" | sed -n "s/$1/\\1/p"; }
    ok=$(g '.* \([0-9]*\) answered 200.*')
    rps=$(g '.* answered 200 (\([0-9.]*\)\/s).*')
    other=$(g '.* \([0-9]*\) other status.*')
    failed=$(g '.* \([0-9]*\) failed.*')
    tmo=$(g '.* \([0-9]*\) timed out.*')
    p99=$(g '.* p99 \([0-9]*\) us.*')
    closed=$(g '.* \([0-9]*\) closed by the server.*')
    echo "id=slow impl=$impl slow=$nslow run=$run ok=$ok rps=$rps other=$other failed=$failed timeout=$tmo p99_us=$p99 closed=$closed rss_kib=$HWM" >>"$RAW"
    echo "  slowloris #$run $impl, $nslow slow: $rps req/s answered 200, $other other, $failed failed, $tmo timed out; p99 $p99 us; $closed slow closed by the server; peak RSS $HWM KiB" >&2
}

# slow_pairs: RUNS rounds of colony and Go, with and without the slow
# connections, alternating the order (and the baseline build's, if any).
slow_pairs() {
    pr=1
    while [ "$pr" -le "$RUNS" ]; do
        if [ $((pr % 2)) -eq 1 ]; then order="colony go"; else order="go colony"; fi
        [ -n "$BASELINE" ] && order="$order baseline"
        for im in $order; do
            run_slow "$im" "$pr" 0
            run_slow "$im" "$pr" "$SLOW"
        done
        pr=$((pr + 1))
    done
}

# pair KIND: RUNS runs of each implementation, alternating the order.
pair() {
    kind=$1
    pr=1
    while [ "$pr" -le "$RUNS" ]; do
        if [ $((pr % 2)) -eq 1 ]; then
            "run_$kind" colony "$pr"
            "run_$kind" go "$pr"
        else
            "run_$kind" go "$pr"
            "run_$kind" colony "$pr"
        fi
        pr=$((pr + 1))
    done
}

DATE=$(date -u '+%Y-%m-%d %H:%M UTC')
MACHINE=$(bench_machine)
LOAD_BEFORE=$(bench_load)
T0=$(date +%s)
echo "bench/run_net.sh: $MACHINE; load $LOAD_BEFORE; $RUNS runs each" >&2
command -v wrk >/dev/null 2>&1 && pair http
pair echo
pair flood
slow_pairs
LOAD_AFTER=$(bench_load)
ELAPSED=$(( $(date +%s) - T0 ))
REV=$(bench_rev src include examples)
BUILD_TYPE=$(sed -n 's/^CMAKE_BUILD_TYPE:STRING=//p' "$BUILD/CMakeCache.txt" 2>/dev/null)
[ -n "$BUILD_TYPE" ] || BUILD_TYPE=RelWithDebInfo
WRK_VERSION=$(wrk -v 2>&1 | head -n 1 | sed 's/ Copyright.*//')

# ---- the report --------------------------------------------------------------
if [ "$QUICK" = 1 ]; then
    MD="$BUILD/bench-net-quick.md"
else
    MD="bench/results/net.md"
    mkdir -p bench/results
fi

awk -v date="$DATE" -v machine="$MACHINE" -v lb="$LOAD_BEFORE" -v la="$LOAD_AFTER" \
    -v runs="$RUNS" -v rev="$REV" -v goversion="$GO_VERSION" -v wrkv="$WRK_VERSION" \
    -v elapsed="$ELAPSED" -v btype="$BUILD_TYPE" -v quick="$QUICK" -v dur="$DUR" \
    -v base="$([ -n "$BASELINE" ] && echo 1 || echo 0)" \
    -v flood="$FLOOD" -v fpool="$FPOOL" -v slow="$SLOW" "$BENCH_AWK"'
function med(id, impl, key, nslow,    a, n, k, m) {
    n = 0
    for (k = 1; k <= nl; k++) if (I[k] == id && M[k] == impl && (k, key) in V && (nslow == "" || V[k, "slow"] == nslow)) a[++n] = V[k, key] + 0
    N = n
    if (n == 0) return ""
    m = bench_median(a, n); MIN = a[1]; MAX = a[n]
    return m
}
function f0(v) { return v == "" ? "n/a" : sprintf("%.0f", v) }
function rngs() { return N > 1 ? sprintf(" [%.0f–%.0f]", MIN, MAX) : "" }
{
    nl++
    n = split($0, w, " ")
    for (i = 1; i <= n; i++) { p = index(w[i], "="); if (p) V[nl, substr(w[i], 1, p - 1)] = substr(w[i], p + 1) }
    I[nl] = V[nl, "id"]; M[nl] = V[nl, "impl"]
    if (V[nl, "status"] == "failed") fails++
}
END {
    print "# Servers under load: colony vs Go 1.19"
    print ""
    if (quick == 1) { print "SMOKE RUN (BENCH_QUICK=1): short runs and a small flood; not figures to quote."; print "" }
    print "Command: `sh bench/run_net.sh <builddir>` (also run by `make bench`), " runs " run(s) of each"
    print "implementation, alternating which goes first; medians, [min–max] over the runs."
    print ""
    print "- Date: " date "; commit " rev "; build " btype
    print "- Machine: " machine "; load average before " lb ", after " la "; " elapsed " s in all"
    print "- Go: " goversion "; load generators: " wrkv ", examples/echo_client and examples/slowloris (colony)"
    print "- Everything on 127.0.0.1; client and server share the same CPUs."
    print ""
    print "**Noise.** This machine is shared by several builds and tests running at the"
    print "same time, and the load generator runs on the same 2 CPUs as the server, so"
    print "single runs can differ by tens of per cent; compare the medians, and re-run"
    print "before quoting a figure."
    print ""
    print "## Throughput and latency"
    print ""
    print "Since the slowloris change (examples/pooled_server.h) a colony connection reads its"
    print "requests on a coroutine of its own and hands each to a pool worker: the rows below"
    print "include that hand-off (the Go server reads and serves on one goroutine)."
    print ""
    print "| benchmark | colony | Go | colony / Go | target | met |"
    print "|---|---|---|---|---|---|"
    c = med("http", "colony", "rps"); cr = rngs(); g = med("http", "go", "rps"); gr = rngs()
    r = (c != "" && g != "" && g > 0) ? c / g : ""
    printf "| HTTP `/`, wrk -t2 -c100 -d%ss: requests/s | %s%s | %s%s | %s | ≥ 1.2× | %s |\n", dur, f0(c), cr, f0(g), gr, r == "" ? "n/a" : sprintf("%.2f×", r), r == "" ? "n/a" : (r >= 1.2 ? "yes" : "no")
    c = med("http", "colony", "p99_us"); cr = rngs(); g = med("http", "go", "p99_us"); gr = rngs()
    r = (c != "" && g != "" && g > 0) ? c / g : ""
    printf "| HTTP: p99 latency (µs) | %s%s | %s%s | %s | ≤ Go | %s |\n", f0(c), cr, f0(g), gr, r == "" ? "n/a" : sprintf("%.2f×", r), r == "" ? "n/a" : (r <= 1 ? "yes" : "no")
    c = med("http", "colony", "rss_kib"); g = med("http", "go", "rss_kib")
    printf "| HTTP: server peak RSS (KiB) | %s | %s | | report | |\n", f0(c), f0(g)
    c = med("echo", "colony", "rts"); cr = rngs(); g = med("echo", "go", "rts"); gr = rngs()
    r = (c != "" && g != "" && g > 0) ? c / g : ""
    printf "| echo, 100 connections × 64 B, %s s: round trips/s | %s%s | %s%s | %s | ≥ 1.2× | %s |\n", dur, f0(c), cr, f0(g), gr, r == "" ? "n/a" : sprintf("%.2f×", r), r == "" ? "n/a" : (r >= 1.2 ? "yes" : "no")
    c = med("echo", "colony", "p99_us"); cr = rngs(); g = med("echo", "go", "p99_us"); gr = rngs()
    r = (c != "" && g != "" && g > 0) ? c / g : ""
    printf "| echo: p99 round trip (µs) | %s%s | %s%s | %s | report | |\n", f0(c), cr, f0(g), gr, r == "" ? "n/a" : sprintf("%.2f×", r)
    c = med("echo", "colony", "rss_kib"); g = med("echo", "go", "rss_kib")
    printf "| echo: server peak RSS (KiB) | %s | %s | | report | |\n", f0(c), f0(g)
    print ""
    printf "## Flood: %d connections at once, colony pool of %d\n", flood, fpool
    print ""
    print "Each connection sends 64 bytes, waits for the echo, holds the connection 500 ms,"
    print "closes. colony: a connection waits for data on a coroutine of its own, at most"
    print "10,000 at once (the default read cap; beyond it refused: closed before any echo), and"
    print "is echoed by one of " fpool " workers (data may wait 1 s for one, behind at most " fpool " others)."
    print "Go: a goroutine per connection, no bound (for comparison of memory, not a target)."
    print ""
    print "| run | server | served | refused | reset | connect error | timeout | other | seconds | server peak RSS (KiB) | answers afterwards |"
    print "|---|---|---|---|---|---|---|---|---|---|---|"
    ok = 1; any = 0
    for (k = 1; k <= nl; k++) {
        if (I[k] != "flood" || V[k, "status"] == "failed") continue
        printf "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", V[k, "run"], M[k] == "go" ? "Go (unbounded)" : "colony", V[k, "served"], V[k, "refused"], V[k, "reset"], V[k, "connerr"], V[k, "timeout"], V[k, "other"], V[k, "secs"], V[k, "rss_kib"], V[k, "alive"] == 1 ? "yes" : "NO"
        if (M[k] == "colony") {
            any = 1
            if (V[k, "alive"] != 1 || V[k, "served"] + V[k, "refused"] != flood) ok = 0
        }
    }
    print ""
    if (any) printf "colony: every connection served or refused cleanly, server up afterwards: **%s**.\n", ok ? "yes" : "NO"
    print ""
    printf "## Slowloris: %d slow connections beside normal requests\n", slow
    print ""
    print "examples/slowloris: " slow " connections each send the start of a request head, then a"
    print "header line a second, never the blank line that ends it; one the server closes is"
    print "opened again at once. Once all are open, 50 clients send `GET /` (kept alive) for " dur " s;"
    print "every request is answered 200, answered otherwise (colony: 503), failed, or timed out"
    print "(5 s). The same clients without slow connections give the ratio. colony: http_server,"
    print "pool 1000, each head read on a coroutine per connection (first byte 3 s, head 5 s,"
    print "10,000 reading at once); Go: net/http with no timeouts (it keeps every slow"
    print "connection, a goroutine each)."
    if (base == 1) print "colony (baseline): the BENCH_HTTP_BASELINE build, run the same way."
    print ""
    print "| server | slow connections | requests/s answered 200 | other answers | failed | timed out | p99 (µs) | slow closed by the server | server peak RSS (KiB) |"
    print "|---|---|---|---|---|---|---|---|---|"
    split("colony go baseline", im, " ")
    for (q = 1; q <= 3; q++) {
        for (sv = 0; sv <= 1; sv++) {
            ns = sv ? slow : 0
            rp = med("slow", im[q], "rps", ns); if (N == 0) continue
            rr = rngs()
            ot = med("slow", im[q], "other", ns); otr = rngs()
            fa = med("slow", im[q], "failed", ns); far = rngs()
            to = med("slow", im[q], "timeout", ns); tor = rngs()
            pp = med("slow", im[q], "p99_us", ns)
            cl = med("slow", im[q], "closed", ns)
            rs = med("slow", im[q], "rss_kib", ns)
            label = im[q] == "go" ? "Go" : (im[q] == "baseline" ? "colony (baseline)" : "colony")
            printf "| %s | %d | %s%s | %s%s | %s%s | %s%s | %s | %s | %s |\n", label, ns, f0(rp), rr, f0(ot), otr, f0(fa), far, f0(to), tor, f0(pp), f0(cl), f0(rs)
            if (sv == 0) base0[im[q]] = rp
            else if (base0[im[q]] != "" && base0[im[q]] > 0) ratio[im[q]] = rp / base0[im[q]]
        }
    }
    print ""
    for (q = 1; q <= 3; q++) if (im[q] in ratio) printf "%s: with %d slow connections, %.0f%% of the requests/s without them.\n", im[q] == "go" ? "Go" : (im[q] == "baseline" ? "colony (baseline)" : "colony"), slow, 100 * ratio[im[q]]
    if (fails) { print ""; printf "%d run(s) failed; see the build directory'"'"'s bench-net/log.txt.\n", fails }
}' "$RAW" >"$MD"
echo "bench/run_net.sh: wrote $MD" >&2

#!/bin/sh
# bench/run_tls.sh — TLS, colony (OpenSSL 3) side by side with Go 1.19's
# crypto/tls.
#
#   sh bench/run_tls.sh <builddir>
#
# Loopback only (127.0.0.1). Each implementation is both ends: bench/bench_tls
# (colony) and bench/go/tls (Go), started alternately (odd runs colony first,
# even runs Go first), each server in a fresh process. Both use TLS 1.3 with
# their defaults (X25519 key exchange) and one ECDSA P-256 certificate made
# here with openssl; clients do not verify and keep no session cache, so
# every handshake is a full one.
#   handshakes  100 client coroutines/goroutines connect, handshake, close,
#               for DUR seconds: handshakes/s (client and server on the same
#               2 CPUs: each handshake costs both sides)
#   echo        100 connections, each writes a 16 KiB record's worth and
#               reads it back, for DUR seconds: MiB/s echoed
#   https       examples/http_server with HTTP_TLS_CERT/KEY (pool 1000) vs
#               Go's net/http ServeTLS (bench/go/tls https), wrk -t2 -c100
#               -d DUR --latency on "/" after a 1 s warm-up (keep-alive: the
#               handshakes are few, the records many): requests/s and p99
# and the servers' peak RSS (VmHWM). Writes bench/results/tls.md
# (BENCH_QUICK=1: <builddir>/bench-tls-quick.md).
#
# Environment: BENCH_RUNS (default 3), BENCH_QUICK=1 (2 s runs, 1 run),
# BENCH_GO_CACHE (GOCACHE/GOPATH root, default $TMPDIR/colony-bench-go).
set -u
. "$(dirname "$0")/lib.sh"
bench_init "${1:-build}"

QUICK=${BENCH_QUICK:-0}
RUNS=${BENCH_RUNS:-3}
DUR=5
if [ "$QUICK" = 1 ]; then
    DUR=2 RUNS=${BENCH_RUNS:-1}
fi
[ "$RUNS" -lt 1 ] && RUNS=1
CONNS=100
SIZE=16384

if [ ! -x "$BUILD/bench_tls" ] || [ ! -x "$BUILD/http_server" ]; then
    echo "bench/run_tls.sh: $BUILD/bench_tls or http_server is missing: build first" >&2
    exit 1
fi
"$BUILD/bench_tls" >/dev/null 2>&1
if [ $? -eq 77 ]; then
    echo "bench/run_tls.sh: colony was built without OpenSSL: nothing to measure" >&2
    exit 0
fi

OUT="$BUILD/bench-tls"
mkdir -p "$OUT"
RAW="$OUT/raw.txt"
LOG="$OUT/log.txt"
: >"$RAW"
: >"$LOG"

GO_OK=0
bench_go_peer "$LOG" tls "$OUT/go-tls" && GO_OK=1

openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "$OUT/key.pem" \
    -out "$OUT/cert.pem" -days 30 -subj /CN=localhost \
    -addext subjectAltName=DNS:localhost,IP:127.0.0.1 >>"$LOG" 2>&1 || {
    echo "bench/run_tls.sh: openssl could not make a certificate" >&2
    exit 1
}

srv_ms() { # the server's CPU time so far, ms (user + system)
    awk -v hz="$(getconf CLK_TCK)" '{ printf "%d", ($14 + $15) * 1000 / hz }' "/proc/$SPID/stat" 2>/dev/null || echo 0
}

run_impl() { # impl run
    impl=$1 run=$2
    if [ "$impl" = colony ]; then
        bin="$BUILD/bench_tls"
    else
        [ "$GO_OK" = 1 ] || return
        bin="$OUT/go-tls"
    fi
    bench_start_server "tls-$impl" "$bin" server "$OUT/cert.pem" "$OUT/key.pem" || return
    s0=$(srv_ms)
    hs=$("$bin" handshakes "$PORT" "$CONNS" "$DUR" 2>&1)
    s1=$(srv_ms)
    ec=$("$bin" echo "$PORT" "$CONNS" "$DUR" "$SIZE" 2>&1)
    s2=$(srv_ms)
    bench_stop_server
    printf '%s %s\n%s\n%s\n' "$impl" "$run" "$hs" "$ec" >>"$LOG"
    hps=$(printf '%s\n' "$hs" | sed -n 's/^handshakes: .*, \([0-9.]*\)\/s.*/\1/p')
    herr=$(printf '%s\n' "$hs" | sed -n 's/.* \([0-9]*\) errors$/\1/p')
    mib=$(printf '%s\n' "$ec" | sed -n 's/^echo: .*, \([0-9.]*\) MiB\/s.*/\1/p')
    eerr=$(printf '%s\n' "$ec" | sed -n 's/.* \([0-9]*\) errors$/\1/p')
    # CPU time of client and server per handshake and per MiB echoed (µs)
    hcnt=$(printf '%s\n' "$hs" | sed -n 's/^handshakes: \([0-9]*\) .*/\1/p')
    hcpu=$(printf '%s\n' "$hs" | sed -n 's/^cpu: client_ms=\([0-9]*\).*/\1/p')
    ebytes=$(printf '%s\n' "$ec" | sed -n 's/^echo: \([0-9]*\) round trips of \([0-9]*\) B.*/\1 \2/p')
    ecpu=$(printf '%s\n' "$ec" | sed -n 's/^cpu: client_ms=\([0-9]*\).*/\1/p')
    hs_us=$(awk -v n="${hcnt:-0}" -v c="${hcpu:-0}" -v s="$((s1 - s0))" 'BEGIN { if (n > 0) printf "%.0f", (c + s) * 1000 / n; else print 0 }')
    mib_ms=$(echo "${ebytes:-0 0}" | awk -v c="${ecpu:-0}" -v s="$((s2 - s1))" '{ m = $1 * $2 * 2 / 1048576; if (m > 0) printf "%.0f", (c + s) * 1000 / m; else print 0 }')
    echo "id=tls impl=$impl run=$run hps=${hps:-0} hs_errors=${herr:-?} mibs=${mib:-0} echo_errors=${eerr:-?} rss_kib=$HWM hs_cpu_us=$hs_us mib_cpu_us=$mib_ms" >>"$RAW"
    echo "  #$run $impl: ${hps:-FAILED} handshakes/s (errors ${herr:-?}), ${mib:-FAILED} MiB/s echo (errors ${eerr:-?}), server peak RSS $HWM KiB" >&2
}


run_https() { # impl run
    impl=$1 run=$2
    command -v wrk >/dev/null 2>&1 || return
    if [ "$impl" = colony ]; then
        HTTP_TLS_CERT="$OUT/cert.pem" HTTP_TLS_KEY="$OUT/key.pem" \
            bench_start_server "https-$impl" "$BUILD/http_server" 0 1000 || return
    else
        [ "$GO_OK" = 1 ] || return
        bench_start_server "https-$impl" "$OUT/go-tls" https "$OUT/cert.pem" "$OUT/key.pem" || return
    fi
    url="https://127.0.0.1:$PORT/"
    wrk -t2 -c100 -d1s "$url" >/dev/null 2>&1
    res=$(wrk -t2 -c100 -d"${DUR}s" --latency "$url" 2>&1)
    bench_stop_server
    printf '%s %s https\n%s\n' "$impl" "$run" "$res" >>"$LOG"
    bench_wrk "$res"
    rps=$WRK_RPS p99=$WRK_P99
    if [ -z "$rps" ] || [ -z "$p99" ]; then
        bench_failed "id=https impl=$impl run=$run" "#$run $impl https"
        return
    fi
    p99=$(bench_to_us "$p99")
    echo "id=https impl=$impl run=$run rps=$rps p99_us=$p99 https_rss_kib=$HWM" >>"$RAW"
    echo "  #$run $impl https: $rps req/s, p99 $p99 us, server peak RSS $HWM KiB" >&2
}

T0=$(date +%s)
LOAD_BEFORE=$(bench_load)
r=1
while [ $r -le "$RUNS" ]; do
    if [ $((r % 2)) = 1 ]; then
        run_impl colony $r
        run_impl go $r
        run_https colony $r
        run_https go $r
    else
        run_impl go $r
        run_impl colony $r
        run_https go $r
        run_https colony $r
    fi
    r=$((r + 1))
done
LOAD_AFTER=$(bench_load)
SECS=$(($(date +%s) - T0))

# ---- the report -----------------------------------------------------------
# stats KEY IMPL: "median [min–max]" of KEY over the runs of IMPL
stats() {
    grep "impl=$2 " "$RAW" | grep -v status=failed | sed -n "s/.* $1=\([0-9.]*\).*/\1/p" | bench_med_range
}
med() { stats "$1" "$2" | awk '{ print $1 }'; }
ratio() { # a b
    awk -v a="$1" -v b="$2" 'BEGIN { if (b + 0 > 0 && a != "n/a") printf "%.2f×", a / b; else print "n/a" }'
}
met() { # ratio-number target
    awk -v r="$1" -v t="$2" 'BEGIN { if (r == "n/a") print "n/a"; else print ((r + 0 >= t) ? "yes" : "no") }'
}

if [ "$QUICK" = 1 ]; then MD="$BUILD/bench-tls-quick.md"; else MD="bench/results/tls.md"; fi
REV=$(bench_rev)
OSSL=$(openssl version 2>/dev/null)
hc=$(med hps colony) hg=$(med hps go)
ec=$(med mibs colony) eg=$(med mibs go)
hr=$(ratio "$hc" "$hg")
er=$(ratio "$ec" "$eg")
rc=$(med rps colony) rg=$(med rps go)
rr=$(ratio "$rc" "$rg")
pc=$(med p99_us colony) pg=$(med p99_us go)
pr=$(ratio "$pc" "$pg")
{
    echo "# TLS: colony (OpenSSL) vs Go 1.19 crypto/tls"
    echo
    echo "Command: \`sh bench/run_tls.sh <builddir>\`, $RUNS run(s) of each implementation,"
    echo "alternating which goes first; medians, [min–max] over the runs."
    echo
    echo "- Date: $(date -u '+%Y-%m-%d %H:%M UTC'); commit $REV"
    echo "- Machine: $(bench_machine); load average before $LOAD_BEFORE, after $LOAD_AFTER; $SECS s in all"
    echo "- colony: $OSSL; Go: $GO_VERSION"
    echo "- TLS 1.3, X25519, ECDSA P-256 certificate; everything on 127.0.0.1, each implementation"
    echo "  is both client and server, on the same CPUs; $CONNS connections; ${DUR} s per measurement."
    echo
    echo "**Noise.** This machine is shared with other builds and tests running at the"
    echo "same time (see the load averages), and client and server share its 2 CPUs: single"
    echo "runs can differ by tens of per cent."
    echo
    echo "| benchmark | colony | Go | colony / Go | target | met |"
    echo "|---|---|---|---|---|---|"
    echo "| full handshakes/s, $CONNS clients | $(stats hps colony) | $(stats hps go) | $hr | ≥ 1.5× | $(met "${hr%×}" 1.5) |"
    echo "| echo of 16 KiB, $CONNS connections: MiB/s | $(stats mibs colony) | $(stats mibs go) | $er | ≥ 1.5× | $(met "${er%×}" 1.5) |"
    echo "| CPU µs per full handshake, client + server (Go / colony) | $(stats hs_cpu_us colony) | $(stats hs_cpu_us go) | $(ratio "$(med hs_cpu_us go)" "$(med hs_cpu_us colony)") | report | |"
    echo "| CPU µs per MiB echoed (each way), client + server (Go / colony) | $(stats mib_cpu_us colony) | $(stats mib_cpu_us go) | $(ratio "$(med mib_cpu_us go)" "$(med mib_cpu_us colony)") | report | |"
    echo "| server peak RSS (KiB), median | $(med rss_kib colony) | $(med rss_kib go) | | report | |"
    echo "| HTTPS \`/\`, wrk -t2 -c100 keep-alive: requests/s | $(stats rps colony) | $(stats rps go) | $rr | report | |"
    echo "| HTTPS: p99 latency (µs) | $(stats p99_us colony) | $(stats p99_us go) | $pr | report | |"
    echo "| HTTPS: server peak RSS (KiB), median | $(med https_rss_kib colony) | $(med https_rss_kib go) | | report | |"
    echo
    echo "**Reading.** The CPU rows say where the gap is: per full handshake colony's"
    echo "client and server together use 1.4-2x the CPU time of Go's, and that time is"
    echo "OpenSSL's. perf record on colony's handshake client (2026-11-27, 100 clients):"
    echo "libcrypto 48%, the kernel 27%, libc 19% (malloc/free, and the rwlocks of OpenSSL 3's"
    echo "provider and property stores), libssl 5%, colony and the benchmark about 1%. The raw"
    echo "primitives are not it (\`openssl speed\`: about 0.3 ms of CPU per handshake for both"
    echo "ends): the rest is OpenSSL 3.0's per-handshake framework work (decoders for the peer's"
    echo "key, algorithm fetches, allocation), which Go's crypto/tls does not have. What was"
    echo "colony's to cut is cut: one SSL_CTX per config shared by all connections, the"
    echo "certificate and key decoded once, no trust-store chain building when verification is"
    echo "off (a verify callback) nor for our own certificate (SSL_MODE_NO_AUTO_CHAIN), read-ahead,"
    echo "AES-128-GCM first, a BIO straight on the socket. The 16 KiB echo: both sides make the"
    echo "same system calls per record as Go (one send, two recvs: ~205 per MiB each side, perf"
    echo "stat), one record each way, one wake per record. perf on colony's client: AES-GCM's"
    echo "assembly 26% (Go's: 27%), the kernel 41% (Go: 49%), the two plaintext copies of"
    echo "OpenSSL's API 8% (Go's memmove: 9%), OpenSSL 3.0's per-record framework ~14%, colony"
    echo "5%; the first three alone are ~960 µs of colony's ~1,300 µs per MiB, so 1.5x Go's"
    echo "~1,360 µs (910 µs) is out of reach on this path (docs/perf-notes.md, TLS). The CPU row"
    echo "per MiB compares the two without the machine's load in it, which the MiB/s row cannot."
    echo "A resumed handshake (colony's client cache, co_tls_resumed)"
    echo "skips the certificate and signature work and is not measured here."
    echo "Peak RSS of colony's handshake server includes OpenSSL's per-connection buffers and"
    echo "glibc's per-thread malloc arenas."
    echo
    echo "Errors (handshakes failed / echo connections broken), per run:"
    echo
    echo '```'
    cat "$RAW"
    echo '```'
} >"$MD"
echo "bench/run_tls.sh: wrote $MD" >&2

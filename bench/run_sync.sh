#!/bin/sh
# bench/run_sync.sh — the concurrent map against Go's sync.Map and
# Concurrency Kit's ck_ht, and the object cache against Go's sync.Pool and
# malloc/free, side by side: every run alternates the contenders'
# processes. Writes bench/results/sync.md.
#   sh bench/run_sync.sh <builddir>      (BENCH_RUNS=N, default 5; BENCH_QUICK=1: small, 1 run)
set -u
. "$(dirname "$0")/lib.sh"
bench_init "${1:-build}"
RUNS=${BENCH_RUNS:-5}
KEYS=1000000
OPS=2000000
OUT=bench/results/sync.md
if [ -n "${BENCH_QUICK:-}" ]; then RUNS=1 KEYS=100000 OPS=200000 OUT="$BUILD/bench-sync-quick.md"; fi
TMP=$(mktemp -d "${TMPDIR:-/tmp}/colony-sync.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
GO=""
if command -v go >/dev/null 2>&1 && bench_go_build map "$TMP/gomap" >"$TMP/go.log" 2>&1; then
    GO="$TMP/gomap"
fi
GOC=""
if [ -n "$GO" ] && bench_go_build cache "$TMP/gocache" >>"$TMP/go.log" 2>&1; then
    GOC="$TMP/gocache"
fi
CK=1
"$BUILD/bench_map" ck 99 1 1000 10 >/dev/null 2>&1 || CK=0
COPS=20000000 BOPS=10000000
if [ -n "${BENCH_QUICK:-}" ]; then COPS=2000000 BOPS=1000000; fi

# one "value rss_kib" line per run into $TMP/<impl>_<mix>
run() { # impl mix cmd...
    f="$TMP/$1_$2"
    shift 2
    /usr/bin/time -f 'RSS %M' -o "$TMP/t" "$@" >"$TMP/o" 2>/dev/null || { echo "n/a 0" >>"$f"; return; }
    printf '%s %s\n' "$(awk '{print $2}' "$TMP/o")" "$(awk '/^RSS/{print $2}' "$TMP/t")" >>"$f"
}
for mix in 99 50; do
    i=0
    while [ "$i" -lt "$RUNS" ]; do
        run colony "$mix" "$BUILD/bench_map" colony "$mix" 2 "$KEYS" "$OPS"
        [ -n "$GO" ] && run go "$mix" "$GO" "$mix" 2 "$KEYS" "$OPS"
        [ "$CK" = 1 ] && run ck "$mix" "$BUILD/bench_map" ck "$mix" 2 "$KEYS" "$OPS"
        i=$((i + 1))
    done
done

i=0
while [ "$i" -lt "$RUNS" ]; do
    run colony getput "$BUILD/bench_cache" getput 2 "$COPS"
    [ -n "$GOC" ] && run go getput "$GOC" getput 2 "$COPS"
    run colony buf1k "$BUILD/bench_cache" buf1k 2 "$BOPS"
    run malloc buf1k "$BUILD/bench_cache" malloc 2 "$BOPS"
    i=$((i + 1))
done

# median [min-max] of column 1, and the largest column 2
stat() {
    [ -s "$1" ] || { echo "n/a|n/a"; return; }
    echo "$(awk '{ print $1 }' "$1" | bench_med_range 1 -)|$(awk '$2 > r { r = $2 } END { printf "%.0f", r / 1024 }' "$1")"
}
med() { [ -s "$1" ] && awk '{ print $1 }' "$1" | bench_median; }
ratio() { # b / a, "n/a" if either is missing
    a=$(med "$1"); b=$(med "$2")
    if [ -n "$a" ] && [ -n "$b" ]; then awk -v a="$a" -v b="$b" 'BEGIN{printf "%.2fx", b/a}'; else echo n/a; fi
}
{
    echo "## sync: the concurrent map (co_map) against Go's sync.Map and ck_ht"
    echo
    echo "\`sh bench/run_sync.sh $(basename "$BUILD")\` on $(date -u '+%Y-%m-%d %H:%M UTC'), $(bench_machine),"
    echo "load average $(bench_load) at the end (the host is shared with other builds and tests),"
    echo "$RUNS alternating runs per implementation. $KEYS string keys of 8 bytes, 2 workers (colony: coroutines on 2 Ps;"
    echo "Go: goroutines, GOMAXPROCS=2; ck: threads, writers under a mutex as ck_ht is single-writer), $OPS random operations"
    echo "each; a store writes a present key. Both maps are warmed with one load per key first (Go's sync.Map promotes"
    echo "stored keys to its read-only map only after that many misses). ns per operation (wall / total), median [range];"
    echo "ratios above 1 mean colony is faster. $(go version 2>/dev/null || echo 'Go: not installed')."
    echo
    echo "| mix | colony ns/op | Go sync.Map ns/op | ck_ht ns/op | Go / colony | ck / colony | peak RSS MiB colony / Go / ck |"
    echo "|---|---|---|---|---|---|---|"
    for mix in 99 50; do
        c=$(stat "$TMP/colony_$mix"); g=$(stat "$TMP/go_$mix"); k=$(stat "$TMP/ck_$mix")
        echo "| $mix% loads | ${c%%|*} | ${g%%|*} | ${k%%|*} | $(ratio "$TMP/colony_$mix" "$TMP/go_$mix") | $(ratio "$TMP/colony_$mix" "$TMP/ck_$mix") | ${c##*|} / ${g##*|} / ${k##*|} |"
    done
    echo
    echo "### The object cache (co_cache) against Go's sync.Pool, and against malloc/free"
    echo
    echo "Same run. get+put of one object per operation, 2 workers (coroutines on 2 Ps; Go: goroutines,"
    echo "GOMAXPROCS=2), $COPS operations each. Then a request loop that takes a 1 KiB buffer, writes 64 bytes and"
    echo "its last byte, and gives it back: through the cache, and with glibc's malloc/free, $BOPS requests per"
    echo "worker. ns per operation, median [range]; ratios above 1 mean the cache is faster."
    echo
    echo "| row | co_cache ns/op | peer ns/op | peer / co_cache | peak RSS MiB cache / peer |"
    echo "|---|---|---|---|---|"
    c=$(stat "$TMP/colony_getput"); g=$(stat "$TMP/go_getput")
    echo "| get+put, peer Go sync.Pool | ${c%%|*} | ${g%%|*} | $(ratio "$TMP/colony_getput" "$TMP/go_getput") | ${c##*|} / ${g##*|} |"
    c=$(stat "$TMP/colony_buf1k"); g=$(stat "$TMP/malloc_buf1k")
    echo "| 1 KiB buffer per request, peer malloc/free | ${c%%|*} | ${g%%|*} | $(ratio "$TMP/colony_buf1k" "$TMP/malloc_buf1k") | ${c##*|} / ${g##*|} |"
} >"$OUT"
echo "bench/run_sync.sh: wrote $OUT" >&2

#!/bin/sh
# bench/ab.sh — paired A/B timing of two colony builds.
#
#   sh bench/ab.sh <build-A> <build-B> [rounds=9]
#
# For each benchmark, runs A and B alternately `rounds` times and prints
# the median ns/op of each, their ratio (B/A) and how many pairs B won.
# Use it to check that a change moves no benchmark row beyond noise; the
# Go peer comparison is bench/run.sh's job.
set -eu
A=$1
B=$2
ROUNDS=${3:-9}
ns() { "$@" 2>/dev/null | sed -n 's/.*ns_per_op=\([0-9.]*\).*/\1/p' | tail -1; }
median() { sort -g | awk '{v[NR]=$1} END {print (NR%2) ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2}'; }
row() {
    name=$1; shift
    : >"$TMP/a"; : >"$TMP/b"; won=0
    i=0
    while [ $i -lt "$ROUNDS" ]; do
        a=$(ns "$A/$@"); b=$(ns "$B/$@")
        echo "$a" >>"$TMP/a"; echo "$b" >>"$TMP/b"
        won=$(awk -v a="$a" -v b="$b" -v w="$won" 'BEGIN{print (b<a)?w+1:w}')
        i=$((i + 1))
    done
    ma=$(median <"$TMP/a"); mb=$(median <"$TMP/b")
    printf '%-22s A %8s  B %8s  B/A %5.3f  B faster %d/%d\n' "$name" "$ma" "$mb" \
        "$(awk -v a="$ma" -v b="$mb" 'BEGIN{print b/a}')" "$won" "$ROUNDS"
}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
echo "A=$A B=$B rounds=$ROUNDS host=$(uname -n) cpus=$(nproc) $(date -u '+%Y-%m-%d %H:%M UTC')"
row "yield 1P"            bench_runtime yield 1 2000000
row "spawn 2P"            bench_runtime spawn 2 1000000
row "spawn 1P"            bench_runtime spawn 1 1000000
row "chan ping-pong 1P"   bench_chan pingpong 1 1000000
row "chan buffered 2P 4x4" bench_chan buffered 2 4 4 2000000
row "select ready 1P"     bench_chan select_ready 1 2000000
row "pool tiny co 2P"     bench_pool tiny 2 1000000 1000
row "pool tiny thread 2P" bench_pool tiny 2 1000000 1000 1
row "mutex 2P 4 workers"  bench_sync mutex 2 4 500000

#!/bin/sh
# bench/run.sh — the driver behind `make bench`.
#
#   sh bench/run.sh <builddir>
#
# Runs the runtime / channel / sync benchmarks side by side
# with their Go 1.19 peers (bench/go/*), alternating a colony process and a Go
# process for every run, then every other bench/run_*.sh (pool, net, sync, ...) if they
# exist, assembles bench/RESULTS.md from bench/results/*.md and draws
# bench/charts/*.png from them (bench/plot.sh).
#
# Environment:
#   BENCH_RUNS=N     runs per benchmark and implementation (default 5; the
#                    1,000,000-coroutine RSS benchmark runs min(N, 3) times)
#   BENCH_QUICK=1    smoke run: small sizes, 1 run, writes <builddir>/bench-quick.md
#                    and leaves bench/RESULTS.md and bench/results/ alone
#   BENCH_ONLY=ids   space-separated benchmark ids to run (e.g. "yield chan_pingpong");
#                    writes <builddir>/bench-only.md, leaves bench/ alone
#   BENCH_NO_OTHERS=1  do not run the other bench/run_*.sh scripts
#   BENCH_ASSEMBLE_ONLY=1  measure nothing: rebuild bench/RESULTS.md from bench/results/*.md
#                    (and the charts)
# The helper scripts get the build directory as $1 and BENCH_RUNS, BENCH_QUICK,
# BENCH_GO_CACHE in the environment; each writes its own bench/results/<area>.md.
set -u

BUILD=${1:-build}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT" || exit 1
case "$BUILD" in /*) ;; *) BUILD="$ROOT/$BUILD" ;; esac

# bench/RESULTS.md = a header + bench/results/runtime.md + the other
# bench/results/*.md (each written by its own script, with its own command,
# date and run count).
assemble() {
    {
        echo "# colony benchmark results"
        echo
        echo "Assembled by \`sh bench/run.sh $(basename "$BUILD")\` (\`make bench\`) on $(date -u '+%Y-%m-%d %H:%M UTC')"
        echo "from bench/results/*.md. Each section below was written by the script"
        echo "that measured it and states its own command, date, load and run count."
        echo "How to run and how to read these tables: docs/bench.md."
        for f in bench/results/runtime.md bench/results/*.md; do
            [ -f "$f" ] || continue
            [ "$f" = bench/results/runtime.md ] && [ -n "${seen_runtime:-}" ] && continue
            [ "$f" = bench/results/runtime.md ] && seen_runtime=1
            echo
            cat "$f"
        done
    } >bench/RESULTS.md
}
# bench/charts/*.png from bench/results/*.md (bench/plot.sh skips, with a
# message, where gnuplot is missing: a chart never fails the benchmarks)
charts() {
    sh bench/plot.sh bench/charts || echo "bench/run.sh: bench/plot.sh failed (rc=$?); tables written, charts not" >&2
}
if [ -n "${BENCH_ASSEMBLE_ONLY:-}" ]; then
    assemble
    echo "bench/run.sh: reassembled bench/RESULTS.md from bench/results/*.md (nothing measured)" >&2
    charts
    exit 0
fi

QUICK=${BENCH_QUICK:-0}
RUNS=${BENCH_RUNS:-5}
[ "$QUICK" = 1 ] && RUNS=${BENCH_RUNS:-1}
SLOW_RUNS=$RUNS
[ "$RUNS" -gt 3 ] && SLOW_RUNS=3

for b in bench_runtime bench_chan bench_sync; do
    if [ ! -x "$BUILD/$b" ]; then
        echo "bench/run.sh: $BUILD/$b is missing: build first (make BUILD=...)" >&2
        exit 1
    fi
done

OUTDIR="$BUILD/bench-out"
mkdir -p "$OUTDIR"
RAW="$OUTDIR/raw.txt"
ERR="$OUTDIR/stderr.txt"
: >"$RAW"
: >"$ERR"

# ---- the Go peers --------------------------------------------------------
TMP=${TMPDIR:-/tmp}
BENCH_GO_CACHE=${BENCH_GO_CACHE:-$TMP/colony-bench-go}
export BENCH_GO_CACHE
GOBIN_DIR="$BUILD/bench-go"
mkdir -p "$GOBIN_DIR"
GO_OK=0
GO_VERSION="not installed"
if command -v go >/dev/null 2>&1; then
    GO_VERSION=$(go version 2>/dev/null)
    GO_OK=1
    for p in runtime chan; do
        if ! (cd "bench/go/$p" && GOCACHE="$BENCH_GO_CACHE/cache" GOPATH="$BENCH_GO_CACHE/path" \
              GOFLAGS=-mod=mod GOPROXY=off GOTOOLCHAIN=local go build -o "$GOBIN_DIR/$p" .) >>"$ERR" 2>&1; then
            echo "bench/run.sh: building the Go peer bench/go/$p failed (see $ERR)" >&2
            GO_OK=0
        fi
    done
fi
[ "$GO_OK" = 1 ] || echo "bench/run.sh: no Go peers: the Go columns will read n/a" >&2

# ---- running -------------------------------------------------------------
machine() {
    m=$(lscpu 2>/dev/null | sed -n 's/^Model name:[[:space:]]*//p' | head -1)
    [ -n "$m" ] || m=$(uname -m)
    echo "$m, $(nproc 2>/dev/null || echo '?') logical CPUs, Linux $(uname -r)"
}
loadavg() { cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo '?'; }

# one ID RUN IMPL BIN ARGS...: runs one process, appends its line to $RAW.
one() {
    id=$1 run=$2 impl=$3 bin=$4
    shift 4
    if [ "$impl" = go ] && [ "$GO_OK" != 1 ]; then
        return
    fi
    l1=$(cut -d' ' -f1 /proc/loadavg 2>/dev/null || echo 0)
    LOAD_MAX=$(echo "$l1 $LOAD_MAX" | awk '{ print ($1 > $2) ? $1 : $2 }')
    out=$(timeout 600 "$bin" "$@" 2>>"$ERR")
    rc=$?
    line=$(printf '%s\n' "$out" | grep '^bench=' | tail -n 1)
    if [ "$rc" -ne 0 ] || [ -z "$line" ]; then
        echo "id=$id run=$run impl=$impl status=failed rc=$rc" >>"$RAW"
        echo "  $id #$run $impl: FAILED (rc=$rc, see $ERR)" >&2
    else
        echo "id=$id run=$run $line" >>"$RAW"
        echo "  $id #$run $line" >&2
    fi
}

# pair ID RUNS CBIN GOBIN ARGS...: RUNS runs of each implementation,
# alternating; odd runs start with colony, even runs with Go.
pair() {
    id=$1 n=$2 cbin=$3 gbin=$4
    shift 4
    if [ -n "${BENCH_ONLY:-}" ]; then
        case " $BENCH_ONLY " in *" $id "*) ;; *) return ;; esac
    fi
    i=1
    while [ "$i" -le "$n" ]; do
        if [ $((i % 2)) -eq 1 ]; then
            one "$id" "$i" colony "$BUILD/$cbin" "$@"
            one "$id" "$i" go "$GOBIN_DIR/$gbin" "$@"
        else
            one "$id" "$i" go "$GOBIN_DIR/$gbin" "$@"
            one "$id" "$i" colony "$BUILD/$cbin" "$@"
        fi
        i=$((i + 1))
    done
}

if [ "$QUICK" = 1 ]; then
    N_YIELD=500000 N_SPAWN=100000 N_PARK=100000 N_SLEEP=10000 N_TIMER=200
    N_TASKS=4000 N_CHUNKS=400 N_PP=200000 N_BUF=400000 N_SEL=1000000 N_MUTEX=100000
else
    N_YIELD=5000000 N_SPAWN=1000000 N_PARK=1000000 N_SLEEP=100000 N_TIMER=1000
    N_TASKS=20000 N_CHUNKS=2000 N_PP=2000000 N_BUF=4000000 N_SEL=10000000 N_MUTEX=1000000
fi

DATE=$(date -u '+%Y-%m-%d %H:%M UTC')
ENVSET=""
for v in BENCH_RUNS BENCH_ONLY BENCH_NO_OTHERS; do
    eval "val=\${$v:-}"
    [ -n "$val" ] && ENVSET="$ENVSET$v=\"$val\" "
done
MACHINE=$(machine)
LOAD_BEFORE=$(loadavg)
LOAD_MAX=0
T_START=$(date +%s)
echo "bench/run.sh: $MACHINE; load $LOAD_BEFORE; $RUNS runs each" >&2

# The runtime
pair yield           "$RUNS"      bench_runtime runtime yield 1 "$N_YIELD"
pair spawn_1p        "$RUNS"      bench_runtime runtime spawn 1 "$N_SPAWN"
pair spawn_2p        "$RUNS"      bench_runtime runtime spawn 2 "$N_SPAWN"
pair park            "$SLOW_RUNS" bench_runtime runtime park 2 "$N_PARK"
pair sleep           "$RUNS"      bench_runtime runtime sleep 2 "$N_SLEEP" 10
pair timer           "$RUNS"      bench_runtime runtime timer 2 "$N_TIMER" 100
pair spread_1p       "$RUNS"      bench_runtime runtime spread 1 "$N_TASKS" 20000
pair spread_2p       "$RUNS"      bench_runtime runtime spread 2 "$N_TASKS" 20000
pair spread_long_1p  "$RUNS"      bench_runtime runtime spread_long 1 "$N_CHUNKS" 200000
pair spread_long_2p  "$RUNS"      bench_runtime runtime spread_long 2 "$N_CHUNKS" 200000
# Channels, select, mutex
pair chan_pingpong   "$RUNS"      bench_chan chan pingpong 1 "$N_PP"
pair buf_1p1c        "$RUNS"      bench_chan chan buffered 2 1 1 "$N_BUF"
pair buf_4p4c        "$RUNS"      bench_chan chan buffered 2 4 4 "$N_BUF"
pair select_default  "$RUNS"      bench_chan chan select_default 1 "$N_SEL"
pair select_ready    "$RUNS"      bench_chan chan select_ready 1 "$((N_SEL / 2))"
pair mutex           "$RUNS"      bench_sync chan mutex 2 4 "$N_MUTEX"

LOAD_AFTER=$(loadavg)
REV=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
if [ -n "$(git status --porcelain -- src include 2>/dev/null)" ]; then
    REV="$REV plus uncommitted changes in src/ or include/"
fi
# CMakeLists.txt defaults an empty CMAKE_BUILD_TYPE to RelWithDebInfo.
BUILD_TYPE=$(sed -n 's/^CMAKE_BUILD_TYPE:STRING=//p' "$BUILD/CMakeCache.txt" 2>/dev/null)
[ -n "$BUILD_TYPE" ] || BUILD_TYPE=RelWithDebInfo
QUICK_NOTE=""
[ "$QUICK" = 1 ] && QUICK_NOTE="
SMOKE RUN (BENCH_QUICK=1): sizes are 1/10 or less of those in the labels; not figures to quote."
ELAPSED=$(( $(date +%s) - T_START ))

# ---- the table -------------------------------------------------------------
# Rows: id | label | field | unit | target (machine) | target (text)
# Targets: abs<=X (colony median), ratio<=X (colony/Go medians), ok (every
# colony run completed), speedup:ID1:ID2>=X (median of ID1 / median of ID2).
ROWS='yield|yield round trip, 2 coroutines on 1 P (per switch)|ns_per_op|ns|abs<=10 ratio<=0.1|<= 10 ns and <= 1/10 Go
spawn_1p|spawn+run+exit, 1M coroutines + waitgroup, 1 P (per coroutine)|ns_per_op|ns|abs<=60 ratio<=0.1|<= 60 ns and <= 1/10 Go
spawn_2p|spawn+run+exit, 1M coroutines + waitgroup, 2 P (per coroutine)|ns_per_op|ns|abs<=60 ratio<=0.1|<= 60 ns and <= 1/10 Go
park|1M coroutines parked at once, 2 P: peak RSS per coroutine|bytes_per_co|B|ok|completes (report; Go measured 2,732 B)
sleep|100,000 coroutines x 10 ms sleep, 2 P: wall time from release|wall_ms|ms|ratio<=1 ok|<= Go
timer|100 us sleep overshoot, p50, 2 P|p50_ns|us|abs<=100000|p50 <= 100 us
timer|100 us sleep overshoot, p99, 2 P|p99_ns|us|report|report
spread|2 streams of small CPU tasks: throughput 2 P / 1 P|speedup:spread_1p:spread_2p|x|speedup>=1.8|>= 1.8x
spread_long|2 long computations yielding per chunk: throughput 2 P / 1 P|speedup:spread_long_1p:spread_long_2p|x|speedup>=1.8|>= 1.8x
chan_pingpong|unbuffered ping-pong, 1 P (per one-way message)|ns_per_op|ns|abs<=40 ratio<=0.3334|<= 40 ns and <= 1/3 Go
buf_1p1c|buffered chan cap 1024, 1 producer / 1 consumer, 2 P (per item)|ns_per_op|ns|ratio<=0.5|>= 2x Go throughput
buf_4p4c|buffered chan cap 1024, 4 producers / 4 consumers, 2 P (per item)|ns_per_op|ns|ratio<=0.5|>= 2x Go throughput
select_default|select, 2 empty channels + default, 1 P (per select)|ns_per_op|ns|ratio<=0.5|<= 1/2 Go
select_ready|select, 2 ready channels + refill send, 1 P (per select)|ns_per_op|ns|ratio<=0.5|<= 1/2 Go
mutex|contended mutex, 4 coroutines on 2 P (per lock+unlock)|ns_per_op|ns|ratio<=1|>= Go throughput (<= Go ns)'

AWK_PROG='
function num(s) { return s + 0 }
function sortv(a, n,    i, j, t) {
    for (i = 2; i <= n; i++) { t = a[i]; for (j = i - 1; j >= 1 && a[j] > t; j--) a[j + 1] = a[j]; a[j + 1] = t }
}
# median of the values of (id, impl, field); sets G_n, G_min, G_max, G_fail
function stat(id, impl, field,    a, n, k, v, m) {
    n = 0
    for (k = 1; k <= nline; k++) {
        if (L_id[k] != id || L_impl[k] != impl) continue
        v = L[k, field]
        if (v == "") continue
        a[++n] = num(v)
    }
    G_fail = fails[id, impl] + 0
    G_n = n
    if (n == 0) return ""
    sortv(a, n)
    G_min = a[1]; G_max = a[n]
    if (n % 2) m = a[(n + 1) / 2]; else m = (a[n / 2] + a[n / 2 + 1]) / 2
    return m
}
function fmtv(v, unit) {
    if (v == "") return "n/a"
    if (unit == "us") { v = v / 1000 }
    if (unit == "x") return sprintf("%.2fx", v)
    if (v >= 10000) return sprintf("%.0f", v)
    if (v >= 100) return sprintf("%.0f", v)
    if (v >= 10) return sprintf("%.1f", v)
    return sprintf("%.2f", v)
}
function ufmt(v, unit) { r = fmtv(v, unit); if (r == "n/a" || unit == "x") return r; return r " " (unit == "us" ? "µs" : unit) }
function rng(unit) { if (G_n < 2) return ""; return " [" fmtv(G_min, unit) "–" fmtv(G_max, unit) "]" }
BEGIN { FS = "|" }
FNR == NR {
    # raw log: key=value words
    nline++
    n = split($0, w, " ")
    for (i = 1; i <= n; i++) {
        p = index(w[i], "=")
        if (p == 0) continue
        key = substr(w[i], 1, p - 1); val = substr(w[i], p + 1)
        L[nline, key] = val
    }
    L_id[nline] = L[nline, "id"]; L_impl[nline] = L[nline, "impl"]
    if (L[nline, "status"] == "failed") { fails[L_id[nline], L_impl[nline]]++; nfail++ }
    runs[L_id[nline], L_impl[nline]]++
    next
}
{
    id = $1; label = $2; field = $3; unit = $4; tgt = $5; ttext = $6
    if (field ~ /^speedup:/) {
        split(field, s, ":")
        if (runs[s[2], "colony"] + runs[s[2], "go"] + runs[s[3], "colony"] + runs[s[3], "go"] == 0) next
        c1 = stat(s[2], "colony", "ns_per_op"); cf = G_fail; cn1 = G_n
        c2 = stat(s[3], "colony", "ns_per_op"); cf += G_fail; cn2 = G_n
        g1 = stat(s[2], "go", "ns_per_op"); g2 = stat(s[3], "go", "ns_per_op")
        cv = (c1 != "" && c2 != "" && c2 > 0) ? c1 / c2 : ""
        gv = (g1 != "" && g2 != "" && g2 > 0) ? g1 / g2 : ""
        crange = ""; grange = ""; nr = cn1 < cn2 ? cn1 : cn2
        ratio = "—"; rss = "—"
    } else {
        if (runs[id, "colony"] + runs[id, "go"] == 0) next   # not run (BENCH_ONLY)
        cv = stat(id, "colony", field); cf = G_fail; nr = G_n; crange = rng(unit)
        gv = stat(id, "go", field); grange = rng(unit)
        ratio = (cv != "" && gv != "" && gv > 0) ? sprintf("%.3f", cv / gv) : "n/a"
        cr = stat(id, "colony", "peak_rss_kb"); gr = stat(id, "go", "peak_rss_kb")
        rss = fmtv(cr / 1024, "") " / " (gr == "" ? "n/a" : fmtv(gr / 1024, "")) " MiB"
    }
    # evaluate the target
    met = "yes"; why = ""
    nt = split(tgt, t, " ")
    if (cv == "") { met = "no"; why = "no successful run" }
    for (i = 1; i <= nt && cv != ""; i++) {
        if (t[i] == "report") { met = "(report)"; continue }
        if (t[i] == "ok") { if (cf > 0) { met = "no"; why = why (why ? "; " : "") cf " failed run(s)" } continue }
        split(t[i], c, "<=|>=")
        lim = num(c[2]); ge = index(t[i], ">=") > 0
        if (c[1] == "abs") v = cv
        else if (c[1] == "speedup") v = cv
        else if (c[1] == "ratio") { if (ratio == "n/a") { if (met == "yes") met = "n/a (no Go)"; continue } v = cv / gv }
        ok = ge ? (v >= lim) : (v <= lim)
        if (!ok) {
            met = "no"
            if (c[1] == "ratio") d = sprintf("ratio %.3f vs %s %.2g", v, ge ? ">=" : "<=", lim)
            else d = sprintf("%s vs %s %s", ufmt(v, unit), ge ? ">=" : "<=", ufmt(lim, unit))
            why = why (why ? "; " : "") d
        }
    }
    if (cf > 0 && met != "no") { met = "no"; why = cf " failed run(s)" }
    if (why != "") met = met " (" why ")"
    printf("| %s | %s%s | %s%s | %s | %s | %s | %s | %d |\n", label, ufmt(cv, unit), crange, ufmt(gv, unit), grange, ratio, ttext, met, rss, nr)
}
'

TABLE=$(printf '%s\n' "$ROWS" | awk "$AWK_PROG" "$RAW" -)

# Extra figures worth reading next to the table, one per benchmark.
extras() {
    for id in yield park sleep timer select_ready; do
        for impl in colony go; do
            grep "^id=$id .*impl=$impl " "$RAW" | head -n 1 | \
                sed -e 's/^id=[^ ]* run=[^ ]* //' -e 's/^/    /'
        done
    done
}

SECTION="# Runtime, channels and sync

Produced by \`${ENVSET}sh bench/run.sh $(basename "$BUILD")\` (\`make bench\`) on $DATE, $RUNS run(s) per
implementation for each benchmark ($SLOW_RUNS for the 1M-coroutine RSS one),
colony and Go processes alternating. Machine: $MACHINE. $GO_VERSION;
colony at commit $REV, built with $(cc --version 2>/dev/null | head -n 1) ($BUILD_TYPE).$QUICK_NOTE
Load average before / after: $LOAD_BEFORE / $LOAD_AFTER; highest 1-minute load seen
before a measurement: $LOAD_MAX (2 means both vCPUs busy); the run took ${ELAPSED} s.
The machine is shared (2 vCPUs, other builds and tests running): a
range [min–max] wider than a few percent means the run was disturbed.

Cells: median [min–max] over the runs. Ratio = colony median / Go median (lower is
better for time, bytes and ms). Spread rows compare each implementation with
itself (median time per task on 1 P / on 2 P). n = successful colony runs.

| benchmark | colony | Go 1.19 | colony/Go | target | met? | peak RSS colony / Go | n |
|---|---|---|---|---|---|---|---|
$TABLE

The side figures of the first run of each (alive
coroutines, sleepers pending at once, timer p99 and maximum, select fairness):

\`\`\`
$(extras)
\`\`\`
"

if [ "$QUICK" = 1 ]; then
    printf '%s\n' "$SECTION" >"$BUILD/bench-quick.md"
    echo "bench/run.sh: smoke run written to $BUILD/bench-quick.md (raw: $RAW)" >&2
    printf '%s\n' "$SECTION"
    exit 0
fi

if [ -n "${BENCH_ONLY:-}" ]; then
    # a subset: the committed tables stay whole
    printf '%s\n' "$SECTION" >"$BUILD/bench-only.md"
    echo "bench/run.sh: BENCH_ONLY run written to $BUILD/bench-only.md (raw: $RAW)" >&2
    printf '%s\n' "$SECTION"
    exit 0
fi

mkdir -p bench/results
printf '%s\n' "$SECTION" >bench/results/runtime.md

# ---- the other benchmark scripts ---------------------------------------------
if [ -z "${BENCH_NO_OTHERS:-}" ] && [ -z "${BENCH_ONLY:-}" ]; then
    export BENCH_RUNS BENCH_QUICK
    for s in $(cd bench && ls run_*.sh); do
        if [ -f "bench/$s" ]; then
            echo "bench/run.sh: running bench/$s" >&2
            sh "bench/$s" "$BUILD" || echo "bench/run.sh: bench/$s failed (rc=$?)" >&2
        fi
    done
fi

# ---- bench/RESULTS.md ---------------------------------------------------------
assemble
echo "bench/run.sh: wrote bench/RESULTS.md (raw lines: $RAW)" >&2
charts

# bench/lib.sh — what the bench/run_*.sh drivers share: their setup, the Go
# peers' offline build, the machine and its load, medians and ranges, and
# a server started in the background on a port it prints.
#
# Sourced, not run: each driver begins
#   . "$(dirname "$0")/lib.sh"
#   bench_init "${1:-build}"
# sh has no local variables: every helper here names its own with a bl_
# prefix, so that none overwrites a driver's.

# bench_init BUILD: ROOT (the repository), the working directory made ROOT,
# BUILD made absolute, ME (the driver's name for messages) and
# BENCH_GO_CACHE (the Go peers' GOCACHE/GOPATH root).
bench_init() {
    BUILD=${1:-build}
    ROOT=$(cd "$(dirname "$0")/.." && pwd)
    cd "$ROOT" || exit 1
    case "$BUILD" in /*) ;; *) BUILD="$ROOT/$BUILD" ;; esac
    ME="bench/$(basename "$0")"
    BENCH_GO_CACHE=${BENCH_GO_CACHE:-${TMPDIR:-/tmp}/colony-bench-go}
}

# bench_go_build DIR OUTPUT [PACKAGE]: builds bench/go/DIR's PACKAGE
# (default: DIR itself) into OUTPUT, offline (nothing can be downloaded:
# GOPROXY=off) and with the shared cache. go's own output goes to stdout
# and stderr, for the caller to log; the status is go build's.
bench_go_build() {
    (cd "bench/go/$1" && GOCACHE="$BENCH_GO_CACHE/cache" GOPATH="$BENCH_GO_CACHE/path" \
        GOFLAGS=-mod=mod GOPROXY=off GOTOOLCHAIN=local go build -o "$2" "${3:-.}")
}

# bench_go_peer LOG DIR OUTPUT [PACKAGE]: the Go peer built where go is
# installed (bench_go_build, its output appended to LOG), and GO_VERSION
# set (else it stays "not installed"); 1 where go is missing or the build
# failed, which it says.
GO_VERSION="not installed"
bench_go_peer() {
    command -v go >/dev/null 2>&1 || return 1
    GO_VERSION=$(go version 2>/dev/null)
    bench_go_build "$2" "$3" ${4:+"$4"} >>"$1" 2>&1 && return 0
    echo "$ME: building bench/go/$2${4:+/${4#./}} failed (see $1)" >&2
    return 1
}

# bench_machine: "<CPU model>, <n> logical CPUs, <n> GiB RAM, Linux <release>"
bench_machine() {
    bl_m=$(lscpu 2>/dev/null | sed -n 's/^Model name:[[:space:]]*//p' | head -n 1)
    echo "${bl_m:-$(uname -m)}, $(nproc 2>/dev/null || echo '?') logical CPUs, $(awk '/MemTotal/ { printf "%.0f GiB RAM", $2 / 1048576 }' /proc/meminfo 2>/dev/null), Linux $(uname -r)"
}

# bench_load: the 1, 5 and 15 minute load averages
bench_load() { cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo '?'; }

# bench_rev [PATH...]: the commit, "plus uncommitted changes" where any
# PATH named has some
bench_rev() {
    bl_rev=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
    [ $# -gt 0 ] && [ -n "$(git status --porcelain -- "$@" 2>/dev/null)" ] &&
        bl_rev="$bl_rev plus uncommitted changes"
    echo "$bl_rev"
}

# bench_median: the median of the numbers on stdin, one a line, as awk
# prints a number; nothing if there are none.
bench_median() {
    sort -g | awk '{ v[NR] = $1 } END { if (NR) print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

# bench_med_range [DECIMALS [DASH]]: "median [min<DASH>max]" of the numbers
# on stdin (DECIMALS places, default 0; DASH default an en dash), or "n/a"
# if there are none.
bench_med_range() {
    sort -g | awk -v d="${1:-0}" -v dash="${2:-–}" '
        { v[NR] = $1 }
        END {
            if (NR == 0) { print "n/a"; exit }
            f = "%." d "f"
            printf f " [" f dash f "]\n", (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2, v[1], v[NR]
        }'
}

# The same for the drivers' awk report programs: prepend it to the
# program ("$BENCH_AWK"'...'). bench_median(a, n) sorts a[1..n] in place
# (a[1] is then the least, a[n] the greatest) and returns its median.
BENCH_AWK='
function bench_sort(a, n,    i, j, t) {
    for (i = 2; i <= n; i++) { t = a[i]; for (j = i - 1; j >= 1 && a[j] > t; j--) a[j + 1] = a[j]; a[j + 1] = t }
}
function bench_median(a, n) {
    bench_sort(a, n)
    return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
}
'

# bench_failed FIELDS LABEL: a run that gave no figures: "FIELDS
# status=failed" in $RAW, and "LABEL: FAILED" on stderr.
bench_failed() {
    echo "$1 status=failed" >>"$RAW"
    echo "  $2: FAILED" >&2
}

# bench_rounds ID N SPEC...: N rounds of the driver's own `one ID ROUND
# SPEC-words` for each SPEC, in SPEC order in odd rounds and the reverse
# in even ones (so neither side always runs first). SPECs are split on
# blanks, not globbed.
bench_rounds() {
    bl_id=$1 bl_n=$2
    shift 2
    bl_i=1
    while [ "$bl_i" -le "$bl_n" ]; do
        if [ $((bl_i % 2)) -eq 1 ]; then
            for bl_spec in "$@"; do set -f; one "$bl_id" "$bl_i" $bl_spec; set +f; done
        else
            bl_k=$#
            while [ "$bl_k" -ge 1 ]; do
                eval "bl_spec=\${$bl_k}"
                set -f; one "$bl_id" "$bl_i" $bl_spec; set +f
                bl_k=$((bl_k - 1))
            done
        fi
        bl_i=$((bl_i + 1))
    done
}

# bench_to_us VALUE: wrk's time with its unit (812.00us, 1.23ms, 1.01s)
# in whole microseconds
bench_to_us() {
    echo "$1" | awk '{ v = $1 + 0; if ($1 ~ /ms$/) v *= 1000; else if ($1 ~ /us$/) v *= 1; else if ($1 ~ /s$/) v *= 1000000; printf "%.0f", v }'
}

# bench_wrk TEXT: from wrk --latency's output, WRK_RPS (requests/s) and
# WRK_P99 (as wrk writes it, unit and all): each empty where it is missing.
bench_wrk() {
    WRK_RPS=$(printf '%s\n' "$1" | sed -n 's/^Requests\/sec:[[:space:]]*\([0-9.]*\).*/\1/p')
    WRK_P99=$(printf '%s\n' "$1" | awk '$1 == "99%" { print $2 }')
}

# ---- a server in the background ------------------------------------------------
# The server started last: SPID (its pid, empty when none runs), PORT.
SPID=""
PORT=""

# bench_wait_port NAME: PORT, read from $OUT/NAME.out (the first
# "127.0.0.1:<port>" the server prints), waiting up to 5 s for it; 1 if
# none came.
bench_wait_port() {
    PORT=""
    bl_tries=0
    while [ $bl_tries -lt 100 ] && [ -z "$PORT" ]; do
        PORT=$(sed -n 's/.*127\.0\.0\.1:\([0-9][0-9]*\).*/\1/p' "$OUT/$1.out" | head -n 1)
        [ -z "$PORT" ] && sleep 0.05
        bl_tries=$((bl_tries + 1))
    done
    [ -n "$PORT" ]
}

# bench_start_server NAME CMD...: CMD in the background, its output in
# $OUT/NAME.out, and its port (bench_wait_port). A server that prints none
# is stopped, with a message: 1.
bench_start_server() {
    bl_name=$1
    shift
    # emptied here, not only by the child's redirection: the wait could
    # otherwise read the previous run's file, and its port
    : >"$OUT/$bl_name.out"
    "$@" >"$OUT/$bl_name.out" 2>&1 &
    SPID=$!
    if ! bench_wait_port "$bl_name"; then
        echo "$ME: $bl_name did not start" >&2
        kill "$SPID" 2>/dev/null
        wait "$SPID" 2>/dev/null
        SPID=""
        return 1
    fi
    return 0
}

# bench_stop_server: HWM, the peak RSS (VmHWM, KiB) of the server and of
# its child processes summed, then SIGTERM and a wait for it.
bench_stop_server() {
    HWM=0
    for bl_p in $SPID $(cat /proc/$SPID/task/*/children 2>/dev/null); do
        bl_h=$(sed -n 's/^VmHWM:[[:space:]]*\([0-9]*\).*/\1/p' "/proc/$bl_p/status" 2>/dev/null)
        HWM=$((HWM + ${bl_h:-0}))
    done
    kill -TERM "$SPID" 2>/dev/null
    wait "$SPID" 2>/dev/null
    SPID=""
}

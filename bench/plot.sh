#!/bin/sh
# bench/plot.sh — draws bench/results/*.md as charts of colony against Go.
#
#   sh bench/plot.sh [outdir] [results.md ...]
#
# Defaults: outdir bench/charts, inputs bench/results/*.md. Writes one PNG
# per benchmark family (<outdir>/<family>.png) and <outdir>/overview.png,
# every row's colony/Go ratio turned into "how many times better" on one
# axis. Called at the end of bench/run.sh; needs gnuplot (Debian:
# gnuplot-nox) and exits 0 with a message when it is missing, so that a
# benchmark run never fails for want of a chart. GNUPLOT=path picks the
# gnuplot to run.
#
# What is read (the two table shapes that bench/results/*.md use):
#  - a table whose header has a "colony" column and a "Go..." column: one
#    row per benchmark, label in the first column;
#  - a table whose first column names the implementation (colony..., go...,
#    each once): every numeric column is one benchmark, under the "## "
#    heading above the table.
# Other tables (run numbers, a single implementation, repeated rows) are
# left out. A cell's number is its first number ("8.84 ns [7.26–11.9]" is
# 8.84 ns). Lower is better unless the unit or label says a rate ("/s",
# "throughput", "x"); log scale where the values span more than 10x. Rows of bench/results/runtime.md are split into the
# families runtime, channels and sync by their labels; the other files are
# one family each, named after the file.
set -u

ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${1:-$ROOT/bench/charts}
[ $# -gt 0 ] && shift
if [ $# -eq 0 ]; then
    set -- "$ROOT"/bench/results/*.md
fi

GNUPLOT=${GNUPLOT:-gnuplot}
if ! command -v "$GNUPLOT" >/dev/null 2>&1; then
    echo "bench/plot.sh: gnuplot not found (Debian: apt-get install gnuplot-nox); no charts drawn" >&2
    exit 0
fi
if ! "$GNUPLOT" -e 'set terminal pngcairo' </dev/null >/dev/null 2>&1; then
    echo "bench/plot.sh: this gnuplot has no pngcairo terminal; no charts drawn" >&2
    exit 0
fi

TMP=$(mktemp -d "${TMPDIR:-/tmp}/colony-plot.XXXXXX") || exit 1
trap 'rm -rf "$TMP"' EXIT INT TERM
mkdir -p "$OUT" || exit 1

# ---- 1. tables -> records: family, group, series, value, unit, better ----
# (tab separated; better = lo or hi)
awk -v OFS='\t' '
function trim(s) { gsub(/^[ \t]+|[ \t]+$/, "", s); return s }
function ncells(line, arr,   n, i) {
    sub(/^[ \t]*\|/, "", line); sub(/\|[ \t]*$/, "", line)
    n = split(line, arr, "|")
    for (i = 1; i <= n; i++) arr[i] = trim(arr[i])
    return n
}
# first number of a cell -> NUM, the word after it -> UNIT; 0 if none
function num(cell,   m, rest) {
    gsub(/\*/, "", cell)
    if (!match(cell, /^[+-]?[0-9][0-9,]*(\.[0-9]+)?/)) return 0
    m = substr(cell, RSTART, RLENGTH); gsub(/[,+]/, "", m)
    rest = trim(substr(cell, RLENGTH + 1))
    sub(/[ \t]*[\[(\/].*$/, "", rest)
    NUM = m + 0; UNIT = rest
    return 1
}
function better(unit, label) {
    if (unit ~ /^(x|×)$/ || unit ~ /\/s$/ || label ~ /\/s([^a-z]|$)|throughput|per second/) return "hi"
    return "lo"
}
function family(label,   l) {
    if (FBASE != "runtime") return FBASE
    l = tolower(label)
    if (l ~ /chan|select|ping-pong/) return "channels"
    if (l ~ /mutex|rwlock|semaphore|sync\.|sync map|object cache/) return "sync"
    return "runtime"
}
# "wall ms" -> "ms", "cpu ns/task" -> "ns/task", "M tasks/s" stays
function hunit(h,   w, n) {
    n = split(h, w, " ")
    if (n > 1 && w[n] ~ /^(ns|us|µs|ms|s|B|KiB|MiB|GiB|KB|MB|GB)(\/.*)?$/) return w[n]
    return h
}
function is_impl(s) { s = tolower(s); return s ~ /^(colony|go)/ }
function emit(fam, grp, ser, v, u, b) {
    if (v <= 0) return
    gsub(/\t/, " ", grp); gsub(/\t/, " ", ser)
    print fam, grp, ser, v, u, b, FREL
}
function flush_table(   i, j, r, n, ok, seen, hasc, hasg, grp, c, g, u, b, cnt) {
    if (NROWS == 0) { NHDR = 0; return }
    if (COLC && COLG) {
        for (r = 1; r <= NROWS; r++) {
            n = split(ROW[r], cell, SUBSEP)
            if (!num(cell[COLC])) continue; c = NUM; u = UNIT
            if (!num(cell[COLG])) continue; g = NUM
            if (u == "" && match(cell[1], /\(([^)]*)\)[ \t]*$/)) u = substr(cell[1], RSTART + 1, RLENGTH - 2)
            if (u == "" && match(cell[1], /[A-Za-z ]+\/s$/)) u = trim(substr(cell[1], RSTART))
            b = better(u, cell[1])
            emit(family(cell[1]), cell[1], "colony", c, u, b)
            emit(family(cell[1]), cell[1], HDR[COLG], g, u, b)
        }
    } else {
        ok = 1; delete seen; hasc = 0; hasg = 0
        for (r = 1; r <= NROWS; r++) {
            split(ROW[r], cell, SUBSEP)
            if (!is_impl(cell[1]) || (cell[1] in seen)) { ok = 0; break }
            seen[cell[1]] = 1
            if (tolower(cell[1]) ~ /^colony/) hasc = 1; else hasg = 1
        }
        if (ok && hasc && hasg) {
            for (j = 2; j <= NHDR; j++) {
                if (HDR[j] ~ /^(runs|n)$/ || HDR[j] == "") continue
                cnt = 0; hasc = 0; hasg = 0
                for (r = 1; r <= NROWS; r++) {
                    split(ROW[r], cell, SUBSEP)
                    if (num(cell[j]) && NUM > 0) { cnt++; if (tolower(cell[1]) ~ /^colony/) hasc = 1; else hasg = 1 }
                }
                if (!hasc || !hasg) continue
                grp = SECTION ": " HDR[j]
                for (r = 1; r <= NROWS; r++) {
                    split(ROW[r], cell, SUBSEP)
                    if (!num(cell[j])) continue
                    u = UNIT
                    if (u == "") u = hunit(HDR[j])
                    emit(family(grp), grp, cell[1], NUM, u, better(HDR[j], HDR[j]))
                }
            }
        }
    }
    NROWS = 0; NHDR = 0; COLC = 0; COLG = 0
}
FNR == 1 {
    flush_table()
    FBASE = FILENAME; sub(/^.*\//, "", FBASE); sub(/\.md$/, "", FBASE)
    FREL = FILENAME; if (index(FREL, ROOT "/") == 1) FREL = substr(FREL, length(ROOT) + 2)
    SECTION = FBASE; PREV = ""
}
/^## / { flush_table(); SECTION = trim(substr($0, 4)); PREV = ""; next }
/^[ \t]*\|/ {
    if ($0 ~ /^[ \t]*\|[ \t:|-]+$/ && PREV != "") {
        # separator: the previous line was the header
        NHDR = ncells(PREV, HDR); COLC = 0; COLG = 0; NROWS = 0
        for (i = 1; i <= NHDR; i++) {
            if (tolower(HDR[i]) == "colony" && !COLC) COLC = i
            else if (HDR[i] ~ /^Go([ \t]|$)/ && !COLG) COLG = i
        }
        PREV = ""; next
    }
    if (NHDR) {
        n = ncells($0, cell); s = cell[1]
        for (i = 2; i <= n; i++) s = s SUBSEP cell[i]
        ROW[++NROWS] = s
    } else PREV = $0
    next
}
{ flush_table(); PREV = "" }
END { flush_table() }
' ROOT="$ROOT" "$@" >"$TMP/records" || exit 1

if [ ! -s "$TMP/records" ]; then
    echo "bench/plot.sh: no colony/Go rows found in $*; no charts drawn" >&2
    exit 0
fi

# ---- 2. records -> one data file + gnuplot script per chart ----------------
# Family charts: a group of bars per benchmark (one per implementation, the
# value as its label, colony's ratio to the first Go bar after it).
# Overview: one bar per benchmark, colony's advantage = Go/colony for
# lower-is-better rows, colony/Go for rates; right of 1 = colony better.
awk -F '\t' -v TMP="$TMP" -v OUT="$OUT" '
function fmt(v) {
    if (v >= 100000) return sprintf("%.0f", v)
    if (v >= 100) return sprintf("%.0f", v)
    if (v >= 10) return sprintf("%.1f", v)
    if (v >= 1) return sprintf("%.2f", v)
    return sprintf("%.3g", v)
}
function q(s) { gsub(/`/, "\047", s); gsub(/\\/, "\\\\", s); gsub(/"/, "\\\"", s); return "\"" s "\"" }
function short(s) { sub(/[ ,(].*$/, "", s); return s }
# long tic labels on two lines, broken at a space near the middle
function wrap(s,   n, i, best) {
    n = length(s); if (n <= 58) return s
    best = 0
    for (i = 1; i < n; i++)
        if (substr(s, i, 1) == " " && (best == 0 || (i - n / 2) ^ 2 < (best - n / 2) ^ 2)) best = i
    return best ? substr(s, 1, best - 1) "\n" substr(s, best + 1) : s
}
function qq(s) { s = q(s); gsub(/\n/, "\\n", s); return s }
function color(ser, k) {
    if (tolower(ser) ~ /^colony/) return k == 0 ? 2062260 : 7380164   # #1f77b4 #709cc4
    return k == 0 ? 16744206 : 16037454                                 # #ff7f0e #f4b54e
}
{
    fam = $1; grp = $2
    if (!(fam in FSEEN)) { FSEEN[fam] = 1; FAM[++NFAM] = fam; FSRC[fam] = $7 }
    key = fam SUBSEP grp
    if (!(key in GSEEN)) { GSEEN[key] = 1; GRP[fam, ++NG[fam]] = grp }
    nb = ++NB[key]
    SER[key, nb] = $3; VAL[key, nb] = $4; UNI[key, nb] = $5; BET[key] = $6
}
END {
    # runtime, channels, sync first, the others in file order
    n = 0
    for (k = 1; k <= 3; k++) { want = k == 1 ? "runtime" : (k == 2 ? "channels" : "sync")
        if (want in FSEEN) ORD[++n] = want }
    for (f = 1; f <= NFAM; f++) if (FAM[f] !~ /^(runtime|channels|sync)$/) ORD[++n] = FAM[f]
    for (f = 1; f <= n; f++) FAM[f] = ORD[f]
    ov = TMP "/overview.dat"; novr = 0
    for (f = 1; f <= NFAM; f++) {
        fam = FAM[f]; dat = TMP "/" fam ".dat"; gp = TMP "/" fam ".gp"
        y = 0; vmin = 1e300; vmax = 0; tics = ""
        for (g = 1; g <= NG[fam]; g++) {
            grp = GRP[fam, g]; key = fam SUBSEP grp
            y0 = y
            nc = 0; ngo = 0; cidx = 0; gidx = 0
            for (b = 1; b <= NB[key]; b++) {
                v = VAL[key, b]; ser = SER[key, b]
                if (v < vmin) vmin = v; if (v > vmax) vmax = v
                isc = tolower(ser) ~ /^colony/
                if (isc && !cidx) cidx = b
                if (!isc && !gidx) gidx = b
                lab = fmt(v) (UNI[key, b] == "" ? "" : (UNI[key, b] == "%" ? "%" : " " UNI[key, b]))
                if (NB[key] > 2 || (ser != "colony" && ser !~ /^Go/)) lab = ser ": " lab
                LAB[b] = lab; COL[b] = color(ser, isc ? nc++ : ngo++)
            }
            if (cidx && gidx) {
                c = VAL[key, cidx]; o = VAL[key, gidx]; r = c / o
                adv = (BET[key] == "hi") ? r : 1 / r
                LAB[cidx] = LAB[cidx] sprintf("   colony/%s %s (%s)", (NB[key] > 2 ? short(SER[key, gidx]) : "Go"), fmt(r), adv >= 1 ? "colony better" : "Go better")
                printf "%s\t%s\t%s\n", fam ": " grp, adv, (adv >= 1 ? 3055136 : 14034728) >> ov   # #2e9e20 #d62728
                novr++
            }
            for (b = 1; b <= NB[key]; b++) {
                printf "%s\t%s\t%d\t%s\n", y, VAL[key, b], COL[b], LAB[b] >> dat
                y++
            }
            tics = tics (tics == "" ? "" : ", ") qq(wrap(grp) (BET[key] == "hi" ? "  (higher is better)" : "")) " " ((y0 + y - 1) / 2)
            y += 0.7
        }
        close(dat)
        logx = (vmax / vmin > 10)
        h = int(120 + 24 * y); if (h < 260) h = 260
        print "set terminal pngcairo size 1500," h " font \"DejaVu Sans,10\" noenhanced" > gp
        print "set output " q(OUT "/" fam ".png") > gp
        print "set datafile separator \"\\t\"" > gp
        print "set title " q("colony (blue) vs Go 1.19 (orange): " fam "   (medians from " FSRC[fam] ")") > gp
        print "set yrange [" (y - 0.2) ":-0.8]" > gp
        print "set ytics (" tics ") nomirror" > gp
        print "set grid xtics" > gp
        print "unset key" > gp
        print "set rmargin at screen 0.98" > gp
        if (logx) {
            print "set logscale x" > gp
            print "set xrange [" vmin / 3 ":" vmax * 150 "]" > gp
            print "set xlabel \"value (unit on each bar; log scale)\"" > gp
            base = vmin / 3; off = "($2*1.15)"
        } else {
            print "set xrange [0:" vmax * 2.2 "]" > gp
            print "set xlabel \"value (unit on each bar)\"" > gp
            base = 0; off = "($2+" vmax * 0.02 ")"
        }
        print "set style fill solid 0.9 noborder" > gp
        print "plot " q(dat) " using 2:1:(" base "):2:($1-0.42):($1+0.42):3 with boxxyerror lc rgb variable, \\" > gp
        print "     " q(dat) " using " off ":1:4 with labels left font \",9\"" > gp
        close(gp)
    }
    close(ov)
    if (novr == 0) exit 0
    gp = TMP "/overview.gp"
    h = int(140 + 22 * novr)
    print "set terminal pngcairo size 1500," h " font \"DejaVu Sans,10\" noenhanced" > gp
    print "set output " q(OUT "/overview.png") > gp
    print "set datafile separator \"\\t\"" > gp
    print "set title \"colony against Go 1.19: times better (Go time / colony time; for rates colony / Go), log scale\\n(medians from bench/results/*.md, drawn by bench/plot.sh)\"" > gp
    print "set yrange [" novr - 0.4 ":-0.6]" > gp
    print "set logscale x" > gp
    print "set xrange [0.1:300]" > gp
    print "set xtics (\"1/10\" 0.1, \"1/3\" 0.333, \"1 (same)\" 1, \"3x\" 3, \"10x\" 10, \"30x\" 30, \"100x\" 100)" > gp
    print "set xlabel \"<- Go better      colony better ->\"" > gp
    print "set grid xtics" > gp
    print "unset key" > gp
    print "set rmargin at screen 0.97" > gp
    print "set style fill solid 0.9 noborder" > gp
    print "set arrow from 1, graph 0 to 1, graph 1 nohead lw 1.5 lc rgb \"black\"" > gp
    print "plot " q(ov) " using 2:0:(1):2:($0-0.38):($0+0.38):3:ytic(1) with boxxyerror lc rgb variable, \\" > gp
    print "     " q(ov) " using ($2 >= 1 ? $2*1.08 : 1.08):0:($2 >= 1 ? sprintf($2 >= 10 ? \"%.0fx\" : \"%.2fx\", $2) : sprintf(1/$2 >= 10 ? \"Go %.0fx\" : \"Go %.2fx\", 1/$2)) with labels left font \",9\"" > gp
    close(gp)
}
' "$TMP/records" || exit 1

rc=0
for gp in "$TMP"/*.gp; do
    [ -f "$gp" ] || continue
    if ! "$GNUPLOT" "$gp" 2>"$TMP/err"; then
        echo "bench/plot.sh: gnuplot failed on $(basename "$gp" .gp):" >&2
        cat "$TMP/err" >&2
        rc=1
        continue
    fi
    echo "bench/plot.sh: wrote $OUT/$(basename "$gp" .gp).png" >&2
done
exit $rc

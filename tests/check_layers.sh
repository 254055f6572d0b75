#!/bin/sh
# The layer rules, checked (CTest: test_layers). Exit 0 if every file keeps
# them; else one line per violation, "file:line: what (rule)", and exit 1.
#
#   sh tests/check_layers.sh [BUILD_DIR [NM]]
#
# Reads every C, header and assembly file under src/ and tests/:
#  layers    A file in src/<layer>/ includes only headers of its own folder
#            and of lower layers (LAYERS below): not a higher layer, not a
#            peer on its floor (sync, chan and io include none of each
#            other). So base never includes the runtime, and arch nothing
#            of src/ outside arch. Every folder of src/ must have a rank,
#            and every file of src/ must be in one.
#  private   Only src/runtime/ includes the runtime's private headers
#            (RUNTIME_PRIVATE), and tests/t_internal.h, the tests' door.
#  names     Nothing in src/ outside src/runtime/ names the runtime's
#            private records or calls (RUNTIME_NAMES, whole words, outside
#            comments and strings): the layers above use runtime/runtime.h.
#  tests     A file in tests/ reaches src/ only through tests/t_internal.h:
#            it includes no header that resolves into src/ (colony.h, t.h,
#            t_internal.h, its own tests/ helpers and ../examples/ are
#            fine), and declares no co__ symbol by hand (a line with
#            `extern` or CO_HIDDEN and a co__ name; at file scope, a co__
#            name declared or defined as a function or variable).
#  calls     With BUILD_DIR: no object of src/<layer>/ in the built static
#            library refers to a symbol that an object of a higher layer or
#            a peer defines (nm; NM names the tool, default nm): so the
#            runtime calls nothing of sync, chan, io, context or pool; a
#            hook it is handed at run time is a pointer, not a reference,
#            and is fine. arch is not checked for calls: its context
#            switch enters the scheduler by design (co__g_entry,
#            co__switch_post). Without BUILD_DIR, or with no objects built
#            there, this check is skipped, and says so.
# Includes are resolved as the compiler does: "x" against the including
# file's folder first, then src/, include/ and tests/; <x> against those
# three only (a header found in none of them is the system's). What a
# macro or an #if hides from a plain reading is not seen.
set -u

# The layers, lowest first: folder of src/ and rank. Folders of one rank
# are peers on one floor. Ranks go in tens so that a layer can be put
# between two (net above context: 65); a new folder needs a line here.
LAYERS='
arch     10
base     20
runtime  30
sync     40
chan     40
io       40
net      65
context  60
pool     70
hook     80
'
RUNTIME_PRIVATE='runtime/proc.h runtime/yslot.h'
RUNTIME_NAMES='co_g_t co_p_t co_m_t co__getm co__park_m co__sched'
TEST_DOOR='tests/t_internal.h'

build=${1:-}
case $build in /* | '') ;; *) build=$PWD/$build ;; esac
root=$(cd "$(dirname "$0")/.." && pwd) || exit 2
cd "$root" || exit 2
nm=${2:-${NM:-nm}}
me=tests/check_layers.sh

files=$(find src tests -type f \( -name '*.c' -o -name '*.h' -o -name '*.S' \) | LC_ALL=C sort)
[ -n "$files" ] || { echo "$me: no sources under $root/src" >&2; exit 2; }

tmp=$(mktemp -d "${TMPDIR:-/tmp}/check_layers.XXXXXX") || exit 2
trap 'rm -rf "$tmp"' EXIT HUP INT TERM
: >"$tmp/syms"

# calls: the built objects' symbols, as "source type name" lines.
objdir=$build/CMakeFiles/colony_static.dir/src
if [ -z "$build" ]; then
    echo "$me: note: calls not checked (no build directory given)"
elif [ ! -d "$objdir" ]; then
    echo "$me: note: calls not checked (no objects in $objdir)"
else
    for o in $(find "$objdir" -name '*.o' -o -name '*.obj' | LC_ALL=C sort); do
        src=src/${o#"$objdir"/}
        src=${src%.*}
        [ -f "$src" ] || continue # a stale object of a file since moved
        if ! "$nm" -P "$o" >"$tmp/one" 2>"$tmp/err"; then
            echo "$me: note: calls not checked for $src ($nm: $(head -n 1 "$tmp/err"))"
            continue
        fi
        awk -v src="$src" 'NF >= 2 { print src, $2, $1 }' "$tmp/one" >>"$tmp/syms"
    done
fi

# Folders of src/ with no rank.
for d in src/*/; do
    d=${d%/}
    name=${d#src/}
    [ -d "$d" ] || continue
    if ! printf '%s\n' "$LAYERS" | awk -v n="$name" '$1 == n { f = 1 } END { exit !f }'; then
        echo "$d:1: folder has no rank in the layer table (rule layers: add it to LAYERS in $me)"
        echo x >>"$tmp/bad"
    fi
done

# (the paths split into words: none has a blank)
# shellcheck disable=SC2086
CL_LAYERS=$LAYERS CL_PRIVATE=$RUNTIME_PRIVATE CL_NAMES=$RUNTIME_NAMES CL_DOOR=$TEST_DOOR \
    awk '
function strip(s,   out, i, n, c, q) {
    out = ""; n = length(s); i = 1
    while (i <= n) {
        c = substr(s, i, 1)
        if (incomment) {
            if (c == "*" && substr(s, i + 1, 1) == "/") { incomment = 0; out = out "  "; i += 2; continue }
            out = out " "; i++; continue
        }
        if (c == "/" && substr(s, i + 1, 1) == "*") { incomment = 1; out = out "  "; i += 2; continue }
        if (c == "/" && substr(s, i + 1, 1) == "/") break
        if (c == "\"" || c == "\047") {
            q = c; out = out c; i++
            while (i <= n) {
                c = substr(s, i, 1)
                if (c == "\\") { out = out "  "; i += 2; continue }
                if (c == q) break
                out = out " "; i++
            }
            if (i <= n) { out = out q; i++ }
            continue
        }
        out = out c; i++
    }
    return out
}
function exists(p,   r, x) {
    if (p in known) return known[p]
    r = (getline x < p)
    if (r >= 0) close(p)
    known[p] = (r > 0)
    return known[p]
}
function norm(p,   n, a, i, k, out, st) {
    n = split(p, a, "/"); k = 0
    for (i = 1; i <= n; i++) {
        if (a[i] == "" || a[i] == ".") continue
        if (a[i] == ".." && k > 0 && st[k] != "..") { k--; continue }
        st[++k] = a[i]
    }
    out = ""
    for (i = 1; i <= k; i++) out = out (i > 1 ? "/" : "") st[i]
    return out
}
function dirname(p) { sub(/\/[^\/]*$/, "", p); return p }
function resolve(from, path, quoted,   c) {
    if (quoted && exists(c = norm(dirname(from) "/" path))) return c
    if (exists(c = norm("src/" path))) return c
    if (exists(c = norm("include/" path))) return c
    if (exists(c = norm("tests/" path))) return c
    return ""
}
# The layer folder of a path in src/ ("" if it is in none).
function layer(p,   a) {
    if (split(p, a, "/") < 3 || a[1] != "src") return ""
    return a[2]
}
function report(file, line, msg) {
    print file ":" line ": " msg
    bad++
}
function at(s, i) { return i < 1 ? "" : substr(s, i, 1) } # (mawk: substr(s, 0, 1) is s[1])
function isid(c) { return c != "" && index("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_", c) > 0 }
# Start of the first whole-word occurrence of w in s at or after from, or 0.
function word(s, w, from,   i, t) {
    while (from <= length(s)) {
        t = substr(s, from)
        i = index(t, w)
        if (!i) return 0
        i += from - 1
        if (!isid(at(s, i - 1)) && !isid(at(s, i + length(w)))) return i
        from = i + 1
    }
    return 0
}
function lastnb(s, i,   c) { # last non-blank character of s before position i
    while (i > 1) { c = substr(s, --i, 1); if (c != " " && c != "\t") return c }
    return ""
}
function firstnb(s, i,   c) { # first non-blank character of s at or after i
    while (i <= length(s)) { c = substr(s, i++, 1); if (c != " " && c != "\t") return c }
    return ""
}
# A line of a test that declares a co__ symbol by hand: returns the name.
# depth: the braces open where the line starts.
function handdecl(s, depth,   i, j, name, b, a, pre) {
    if (!(s ~ /co__/)) return ""
    j = 1
    while ((i = index(substr(s, j), "co__"))) {
        i += j - 1
        j = i + 4
        if (isid(at(s, i - 1))) continue
        name = substr(s, i)
        match(name, /^[A-Za-z0-9_]+/)
        name = substr(name, 1, RLENGTH)
        if (word(s, "extern", 1) || word(s, "CO_HIDDEN", 1)) return name
        # at file scope, as the declarator: after a type (or nothing, when
        # the type is on the line before) and before ( ; [ = or ,
        pre = substr(s, 1, i - 1)
        if (depth + gsub(/{/, "{", pre) - gsub(/}/, "}", pre) > 0 || s ~ /^[ \t]*#/) continue
        b = lastnb(s, i); a = firstnb(s, i + length(name))
        if ((b == "" || b == "*" || isid(b)) && a != "" && index("(;[=,", a)) return name
    }
    return ""
}
BEGIN {
    nl = split(ENVIRON["CL_LAYERS"], t, "\n")
    for (i = 1; i <= nl; i++) if (split(t[i], f, " ") >= 2) rank[f[1]] = f[2] + 0
    n = split(ENVIRON["CL_PRIVATE"], t, " "); for (i = 1; i <= n; i++) private["src/" t[i]] = 1
    nnames = split(ENVIRON["CL_NAMES"], names, " ")
    door = ENVIRON["CL_DOOR"]
    bad = 0
}
# The objects symbols: who defines what, and who refers to what.
FILENAME == ARGV[1] {
    if ($2 == "U" || $2 == "w" || $2 == "v") { nref++; rsrc[nref] = $1; rsym[nref] = $3 }
    else if ($2 ~ /^[A-Z]$/) def[$3] = $1
    next
}
FNR == 1 {
    if (!started) {
        started = 1
        # calls: references from a layer to a higher one or a peer; their
        # lines are looked up as the sources are read.
        for (i = 1; i <= nref; i++) {
            if (!(rsym[i] in def)) continue
            a = layer(rsrc[i]); b = layer(def[rsym[i]])
            if (a == b || a == "arch" || !(a in rank) || !(b in rank) || rank[b] < rank[a]) continue
            k = rsrc[i] SUBSEP rsym[i]
            if (k in callto) continue
            callto[k] = def[rsym[i]]
            calls[rsrc[i]] = calls[rsrc[i]] " " rsym[i]
        }
    }
    incomment = 0; depth = 0
    file = FILENAME
    lay = layer(file)
    insrc = file ~ /^src\//
    intests = file ~ /^tests\//
    if (insrc && lay == "")
        report(file, 1, "file of src/ outside a layer folder (rule layers: each file is in one src/<layer>/)")
    nc = split(calls[file], want, " ")
}
{
    raw = $0
    s = strip(raw)
    # includes
    if (s ~ /^[ \t]*#[ \t]*include/ && match(raw, /["<][^">]*[">]/)) {
        quoted = substr(raw, RSTART, 1) == "\""
        path = substr(raw, RSTART + 1, RLENGTH - 2)
        tgt = resolve(file, path, quoted)
        tl = layer(tgt)
        if (insrc && lay != "" && tl != "" && tl != lay && (lay in rank) && (tl in rank)) {
            if (rank[tl] > rank[lay])
                report(file, FNR, "includes \"" path "\" of src/" tl ", a higher layer than src/" lay " (rule layers: a layer includes only itself and lower layers)")
            else if (rank[tl] == rank[lay])
                report(file, FNR, "includes \"" path "\" of src/" tl ", a peer of src/" lay " on its floor (rule layers: peers include none of each other)")
        }
        if ((tgt in private) && lay != "runtime" && file != door)
            report(file, FNR, "includes \"" path "\", private to src/runtime (rule private: upper layers use runtime/runtime.h; tests use " door ")")
        if (intests && file != door && tgt ~ /^src\//)
            report(file, FNR, "includes \"" path "\" of src/ (rule tests: a test reaches internals only through " door ")")
    }
    # names
    if (insrc && lay != "runtime")
        for (i = 1; i <= nnames; i++)
            if (word(s, names[i], 1))
                report(file, FNR, "names " names[i] ", private to src/runtime (rule names: the layers above use runtime/runtime.h)")
    # hand declarations in tests
    if (intests && file != door && (name = handdecl(s, depth)) != "")
        report(file, FNR, "declares " name " by hand (rule tests: internals come from " door ")")
    # calls: the first line of code naming each symbol referred to
    for (i = 1; i <= nc; i++)
        if (!((file, want[i]) in callline) && word(s, want[i], 1)) callline[file, want[i]] = FNR
    depth += gsub(/{/, "{", s) - gsub(/}/, "}", s)
    if (depth < 0) depth = 0
}
END {
    # calls, once every source has been read
    for (k in callto) {
        split(k, kk, SUBSEP)
        line = (k in callline) ? callline[k] : 1
        print kk[1] ":" line ": refers to " kk[2] ", defined in " callto[k] " (rule calls: a layer calls only itself and lower layers)" | "LC_ALL=C sort -t: -k1,1 -k2,2n"
        bad++
    }
    close("LC_ALL=C sort -t: -k1,1 -k2,2n")
    exit (bad > 0)
}
' "$tmp/syms" $files >"$tmp/out"
st=$?
cat "$tmp/out"
if [ "$st" -ne 0 ] || [ -s "$tmp/bad" ]; then
    n=$(grep -c . "$tmp/out")
    [ -s "$tmp/bad" ] && n=$((n + $(grep -c . "$tmp/bad")))
    echo "$me: $n layer rule violation(s); the rules are at the top of $me" >&2
    exit 1
fi
exit 0

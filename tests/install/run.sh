#!/bin/sh
# Installs the build into a scratch prefix, then builds and runs a user's
# program against it: CMake's find_package(colony) (the static, shared and
# default targets), pkg-config (shared, shared with an rpath, and
# colony-static.pc); `make install PREFIX=` must honour the prefix.
#   sh tests/install/run.sh <builddir>      (CTest runs it as test_install)
set -eu
BUILD=$1
HERE=$(cd "$(dirname "$0")" && pwd)
TMP=$(mktemp -d "${TMPDIR:-/tmp}/colony-install.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
PREFIX="$TMP/prefix"

cmake --install "$BUILD" --prefix "$PREFIX" >"$TMP/install.log"
test -f "$PREFIX/include/colony.h"
test -f "$PREFIX/share/colony/colony-gdb.py"
# `make install PREFIX=dir` (the README's form) goes to dir too.
ROOT=$(cd "$HERE/../.." && pwd)
make -s -C "$ROOT" install BUILD="$(cd "$BUILD" && pwd)" PREFIX="$TMP/prefix2" >"$TMP/make-install.log" 2>&1 ||
    { cat "$TMP/make-install.log" >&2; exit 1; }
test -f "$TMP/prefix2/include/colony.h" || { echo "make install PREFIX= did not install there" >&2; exit 1; }

cmake -S "$HERE" -B "$TMP/cmake" -DCMAKE_PREFIX_PATH="$PREFIX" >"$TMP/cfg.log"
cmake --build "$TMP/cmake" >"$TMP/build.log"
for t in static shared default; do
    out=$("$TMP/cmake/consumer_$t")
    [ "$out" = "consumer ok 4950" ] || { echo "find_package, colony::$t: '$out'" >&2; exit 1; }
done

# pkg-config: the .pc file names the installed prefix and libdir.
pc=$(find "$PREFIX" -name colony.pc | head -n 1)
[ -n "$pc" ] || { echo "colony.pc was not installed" >&2; exit 1; }
export PKG_CONFIG_PATH="$(dirname "$pc")"
libdir=$(pkg-config --variable=libdir colony)
# The README's three forms: shared with LD_LIBRARY_PATH, shared with an
# rpath (a prefix the loader does not search), and colony-static.pc.
cc -std=c11 "$HERE/consumer.c" -o "$TMP/pc_shared" $(pkg-config --cflags --libs colony)
out=$(LD_LIBRARY_PATH="$libdir" "$TMP/pc_shared")
[ "$out" = "consumer ok 4950" ] || { echo "pkg-config: '$out'" >&2; exit 1; }
cc -std=c11 "$HERE/consumer.c" -o "$TMP/pc_rpath" $(pkg-config --cflags --libs colony) -Wl,-rpath,"$libdir"
out=$(env -u LD_LIBRARY_PATH "$TMP/pc_rpath")
[ "$out" = "consumer ok 4950" ] || { echo "pkg-config with -Wl,-rpath: '$out'" >&2; exit 1; }
cc -std=c11 "$HERE/consumer.c" -o "$TMP/pc_static" $(pkg-config --cflags --libs colony-static)
if command -v readelf >/dev/null 2>&1 && readelf -d "$TMP/pc_static" | grep -q 'libcolony\.so'; then
    echo "colony-static.pc linked libcolony.so" >&2
    exit 1
fi
out=$(env -u LD_LIBRARY_PATH "$TMP/pc_static")
[ "$out" = "consumer ok 4950" ] || { echo "pkg-config colony-static: '$out'" >&2; exit 1; }
# The header from C++ (extern "C", no C-only keyword in a declaration,
# no C++20 keyword: co_yield is hidden there) in every standard from C++11
# to C++23, with each C++ compiler installed; a standard a compiler does
# not know is skipped and named.
cxx_note=""
for cxx in g++ clang++; do
    command -v "$cxx" >/dev/null 2>&1 || { echo "note: $cxx not installed, skipped" >&2; continue; }
    for std in 11 14 17 20 23; do
        # an older compiler knows C++23 by its draft name
        if [ $std = 23 ] && ! echo 'int main(void){return 0;}' | "$cxx" -x c++ -std=c++23 -fsyntax-only - 2>/dev/null; then
            std=2b
        fi
        if ! echo 'int main(void){return 0;}' | "$cxx" -x c++ -std=c++$std -fsyntax-only - 2>/dev/null; then
            echo "note: $cxx has no -std=c++$std, skipped" >&2
            continue
        fi
        "$cxx" -x c++ -std=c++$std -Wall -Werror "$HERE/consumer.c" -x none -o "$TMP/pc_cxx" $(pkg-config --cflags --libs colony-static) ||
            { echo "the header does not build as C++$std with $cxx" >&2; exit 1; }
        out=$("$TMP/pc_cxx")
        [ "$out" = "consumer ok 4950" ] || { echo "C++$std consumer ($cxx): '$out'" >&2; exit 1; }
        cxx_note="$cxx_note $cxx:c++$std"
    done
done
[ -z "$cxx_note" ] || cxx_note=", C++:$cxx_note"
echo "install: find_package (static, shared, default) and pkg-config (shared, rpath, static$cxx_note), make install PREFIX= ok"

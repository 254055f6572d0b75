#!/bin/sh
# Installs the build into a scratch prefix, then builds and runs a user's
# program against it three ways: CMake's find_package(colony) (the static,
# shared and default targets), pkg-config (shared), and pkg-config --static.
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
cc -std=c11 "$HERE/consumer.c" -o "$TMP/pc_shared" $(pkg-config --cflags --libs colony)
out=$(LD_LIBRARY_PATH="$libdir" "$TMP/pc_shared")
[ "$out" = "consumer ok 4950" ] || { echo "pkg-config: '$out'" >&2; exit 1; }
cc -std=c11 "$HERE/consumer.c" -o "$TMP/pc_static" $(pkg-config --cflags colony) \
    "$libdir/libcolony.a" $(pkg-config --static --libs-only-other --libs-only-l colony | sed 's/-lcolony//')
out=$("$TMP/pc_static")
[ "$out" = "consumer ok 4950" ] || { echo "pkg-config --static: '$out'" >&2; exit 1; }
# The header from C++ (extern "C", no C-only keyword in a declaration),
# where a C++ compiler is installed.
cxx_note=""
if command -v c++ >/dev/null 2>&1; then
    c++ -x c++ -std=c++11 -Wall -Werror "$HERE/consumer.c" -x none -o "$TMP/pc_cxx" $(pkg-config --cflags colony) \
        "$libdir/libcolony.a" $(pkg-config --static --libs-only-other --libs-only-l colony | sed 's/-lcolony//') ||
        { echo "the header does not build as C++" >&2; exit 1; }
    out=$("$TMP/pc_cxx")
    [ "$out" = "consumer ok 4950" ] || { echo "C++ consumer: '$out'" >&2; exit 1; }
    cxx_note=", C++"
fi
echo "install: find_package (static, shared, default) and pkg-config (shared, static$cxx_note) ok"

#!/bin/sh
# Installs what the build needs on a fresh Debian machine, only if missing.
need=""
command -v cmake >/dev/null 2>&1 || need="$need cmake"
command -v cc >/dev/null 2>&1 || need="$need gcc"
command -v clang >/dev/null 2>&1 || need="$need clang"
command -v make >/dev/null 2>&1 || need="$need make"
[ -f /usr/include/valgrind/valgrind.h ] || need="$need valgrind"
command -v gdb >/dev/null 2>&1 || need="$need gdb" # tests/test_gdb.c (tools/colony-gdb.py)
# TLS (src/net/tls.c, optional: compiled out without it) and its tests' peers
[ -f /usr/include/openssl/ssl.h ] || need="$need libssl-dev"
command -v openssl >/dev/null 2>&1 || need="$need openssl"
command -v curl >/dev/null 2>&1 || need="$need curl"
[ -f /usr/include/ares.h ] || need="$need libc-ares-dev pkg-config" # the resolver (docs/net.md)
command -v chromium >/dev/null 2>&1 || need="$need chromium" # tests/test_trace_html.c renders tools/colony-trace's page
# The real-server tests and benchmarks of libcolony_hook.so (docs/hook.md):
# client libraries, the servers they start themselves, pkg-config to find them.
command -v pkg-config >/dev/null 2>&1 || need="$need pkg-config"
[ -f /usr/include/hiredis/hiredis.h ] || need="$need libhiredis-dev"
[ -f /usr/include/postgresql/libpq-fe.h ] || need="$need libpq-dev"
[ -n "$(ls /usr/include/*/curl/curl.h /usr/include/curl/curl.h 2>/dev/null)" ] || need="$need libcurl4-openssl-dev"
command -v redis-server >/dev/null 2>&1 || need="$need redis-server"
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need="$need postgresql"
# `sh scripts/deps.sh aarch64` (make aarch64): the AArch64 cross compiler and
# qemu-user, which runs the cross-built tests on this machine.
if [ "${1:-}" = aarch64 ]; then
    command -v aarch64-linux-gnu-gcc >/dev/null 2>&1 || need="$need gcc-aarch64-linux-gnu libc6-dev-arm64-cross"
    command -v qemu-aarch64 >/dev/null 2>&1 || need="$need qemu-user"
fi
# `sh scripts/deps.sh bench` (make bench): gnuplot draws bench/charts/*.png
# (bench/plot.sh; without it the benchmarks run and the charts are skipped).
if [ "${1:-}" = bench ]; then
    command -v gnuplot >/dev/null 2>&1 || need="$need gnuplot-nox"
    # bench/run_http1k.sh's peers: a libuv responder, nginx
    [ -f /usr/include/uv.h ] || need="$need libuv1-dev"
    [ -x /usr/sbin/nginx ] || command -v nginx >/dev/null 2>&1 || need="$need nginx-light"
fi
if [ -n "$need" ]; then
    echo "colony: installing build dependencies:$need"
    SUDO=""
    [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1 && SUDO=sudo
    $SUDO apt-get update -qq && $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $need >/dev/null ||
        { echo "colony: could not install:$need" >&2; exit 1; }
fi
exit 0

#!/bin/sh
# Installs what the build needs on a fresh Debian machine, only if missing.
need=""
command -v cmake >/dev/null 2>&1 || need="$need cmake"
command -v cc >/dev/null 2>&1 || need="$need gcc"
command -v clang >/dev/null 2>&1 || need="$need clang"
command -v make >/dev/null 2>&1 || need="$need make"
[ -f /usr/include/valgrind/valgrind.h ] || need="$need valgrind"
if [ -n "$need" ]; then
    echo "colony: installing build dependencies:$need"
    SUDO=""
    [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1 && SUDO=sudo
    $SUDO apt-get update -qq && $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $need >/dev/null
fi
exit 0

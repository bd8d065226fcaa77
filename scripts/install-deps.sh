#!/usr/bin/env bash
# Installs what hakmem's tests (and benchmarks) need on a fresh Debian machine.
# Usage: install-deps.sh test|bench|real
set -euo pipefail
what=${1:-test}
need=()
have_pkg() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
case "$what" in
  test)  pkgs=(cmake ninja-build g++ clang libclang-rt-14-dev python3 coreutils sqlite3 git valgrind pkgconf binutils libunwind8) ;;
  bench) pkgs=(libmimalloc2.0 libjemalloc2 libtcmalloc-minimal4 libtbbmalloc2 strace valgrind libunwind8 time) ;;
  real)  pkgs=(redis-server redis-tools sqlite3 git) ;;
  *) echo "usage: $0 test|bench|real" >&2; exit 2 ;;
esac
for p in "${pkgs[@]}"; do have_pkg "$p" || need+=("$p"); done
if [ ${#need[@]} -gt 0 ]; then
  echo "install-deps: installing ${need[*]}"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi

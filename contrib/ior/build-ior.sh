#!/usr/bin/env bash
# Builds IOR and mdtest with the BenchFS backend (docs/ior.md):
#
#   contrib/ior/build-ior.sh IOR_SOURCE_DIR PREFIX
#
# IOR_SOURCE_DIR is a clone of https://github.com/hpc/ior (tested at 5fcf0ba995fd, 2026-04-03);
# ior and mdtest go to PREFIX/bin. It copies aiori-BENCHFS.c into the sources, applies
# benchfs-ior.patch (the backend in configure.ac, src/Makefile.am, src/aiori.[ch], and in the
# list of backends that may fsync in src/ior.c), configures against BenchFS's benchfs.pc and
# builds. Run it again after changing either side: it patches once and rebuilds what changed.
# BenchFS's pkg-config file is found on PKG_CONFIG_PATH, else through benchfs-config, else in
# the source tree's .venv (make build).
set -euo pipefail
die() { echo "build-ior: $*" >&2; exit 1; }
[ $# -eq 2 ] || { echo "usage: $0 IOR_SOURCE_DIR PREFIX" >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
[ -f "$1/src/aiori.c" ] && [ -f "$1/configure.ac" ] || die "$1 is not an IOR source tree (no src/aiori.c)"
src=$(cd "$1" && pwd)
mkdir -p "$2"
prefix=$(cd "$2" && pwd)

for tool in mpicc autoreconf automake pkg-config make patch; do
  command -v "$tool" >/dev/null || die "needs $tool (Debian: apt-get install openmpi-bin libopenmpi-dev autoconf automake pkg-config make patch)"
done
if ! pkg-config --exists benchfs; then
  if command -v benchfs-config >/dev/null; then
    PKG_CONFIG_PATH=$(benchfs-config --pkg-config-path)${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
  elif [ -f "$here/../../.venv/lib/pkgconfig/benchfs.pc" ]; then
    PKG_CONFIG_PATH=$(cd "$here/../../.venv/lib/pkgconfig" && pwd)${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
  fi
  export PKG_CONFIG_PATH
  pkg-config --exists benchfs || die "benchfs.pc not found: set PKG_CONFIG_PATH, install BenchFS (make install) or run make build"
fi
echo "build-ior: BenchFS $(pkg-config --modversion benchfs) from $(pkg-config --variable=libdir benchfs)"

install -m 0644 "$here/aiori-BENCHFS.c" "$src/src/aiori-BENCHFS.c"
cd "$src"
if patch -p1 -R --dry-run -s -f < "$here/benchfs-ior.patch" >/dev/null 2>&1; then
  echo "build-ior: $src is already patched"
else
  patch -p1 -s -f --no-backup-if-mismatch < "$here/benchfs-ior.patch" \
    || die "benchfs-ior.patch does not apply to $src (written for hpc/ior 5fcf0ba995fd; see docs/ior.md for its five edits)"
fi
if [ ! -x configure ] || [ configure.ac -nt configure ] || [ src/Makefile.am -nt configure ]; then
  ./bootstrap >/dev/null 2>&1 || die "IOR's ./bootstrap failed (autoconf, automake)"
fi
./configure -q --prefix="$prefix" >/dev/null
grep -q '^#define USE_BENCHFS_AIORI' src/config.h || die "IOR's configure did not find benchfs.pc"
log=$src/build-ior.log
{ make -s -j"$(nproc)" && make -s install; } >"$log" 2>&1 || { tail -n 30 "$log" >&2; die "make failed (whole log: $log)"; }
help=$("$prefix/bin/ior" -h 2>&1 || true)
grep -q 'Module BENCHFS' <<<"$help" || die "$prefix/bin/ior has no BENCHFS backend"
echo "build-ior: ior and mdtest with the BENCHFS backend in $prefix/bin"
echo "export BENCHFS_IOR_PREFIX=$prefix"

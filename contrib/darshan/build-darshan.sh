#!/usr/bin/env bash
# Builds Darshan's runtime (with MPI, and DXT) and its utilities from source (docs/darshan.md):
#
#   contrib/darshan/build-darshan.sh DARSHAN_SOURCE_DIR PREFIX
#
# DARSHAN_SOURCE_DIR is a clone of https://github.com/darshan-hpc/darshan at tag darshan-3.4.7
# (the release PyDarshan 3.4.7.0 reads; other 3.4.x releases build the same way). The runtime is
# built with the mpicc on PATH, so its MPI is the launcher's; logs go where DARSHAN_LOGPATH or
# DARSHAN_LOGFILE say (no site log directory: --with-log-path-by-env), the job id from
# SLURM_JOB_ID or PBS_JOBID. Run it again to rebuild. Prints the `export` line of the prefix.
set -euo pipefail
die() { echo "build-darshan: $*" >&2; exit 1; }
[ $# -eq 2 ] || { echo "usage: $0 DARSHAN_SOURCE_DIR PREFIX" >&2; exit 2; }
[ -f "$1/darshan-runtime/lib/darshan-core.c" ] || die "$1 is not a Darshan source tree (no darshan-runtime/lib/darshan-core.c)"
src=$(cd "$1" && pwd)
mkdir -p "$2"
prefix=$(cd "$2" && pwd)
for tool in mpicc autoreconf automake libtoolize make; do
  command -v "$tool" >/dev/null || die "needs $tool (Debian: apt-get install openmpi-bin libopenmpi-dev autoconf automake libtool make zlib1g-dev)"
done
version=$(cat "$src/darshan.version" 2>/dev/null || echo unknown)
echo "build-darshan: Darshan $version from $src, MPI $(mpicc --showme:version 2>/dev/null || mpicc -v 2>&1 | head -n 1)"
cd "$src"
[ -x configure ] || ./prepare.sh >/dev/null 2>&1 || die "Darshan's ./prepare.sh failed (autoconf, automake, libtool)"
build=$src/build-benchfs
mkdir -p "$build"
cd "$build"
log=$build/build-darshan.log
{
  ../configure --prefix="$prefix" --with-log-path-by-env=DARSHAN_LOGPATH \
    --with-jobid-env=SLURM_JOB_ID --with-username-env=SLURM_JOB_USER CC=mpicc &&
  make -j"$(nproc)" && make install
} >"$log" 2>&1 || { tail -n 30 "$log" >&2; die "the build failed (whole log: $log)"; }
[ -f "$prefix/lib/libdarshan.so" ] || die "no $prefix/lib/libdarshan.so after the build"
[ -x "$prefix/bin/darshan-parser" ] || die "no $prefix/bin/darshan-parser after the build"
echo "build-darshan: libdarshan.so and darshan-parser in $prefix"
echo "export BENCHFS_DARSHAN_PREFIX=$prefix"

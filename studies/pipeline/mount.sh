#!/bin/bash
# One writer through the mount, as programs write: dd of 256 MiB in 4 KiB, 64 KiB and 1 MiB
# writes (then fsync), and tar of a tree of small files (Python's standard library) into one
# archive, with client.write_behind off and on, interleaved repeats. Started as a user does
# (benchfs start --mount); the servers keep their data under the directory given (the disk).
#
#   studies/pipeline/mount.sh [DIR (default /var/tmp/benchfs-mount-study)] [REPEATS (2)]
set -euo pipefail
BENCHFS=$(cd "$(dirname "$0")/../.." && pwd)/.venv/bin/benchfs
DIR=${1:-/var/tmp/benchfs-mount-study}
REPEATS=${2:-2}
TREE=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["stdlib"])')
mkdir -p "$DIR"
cd "$DIR"
for rep in $(seq "$REPEATS"); do
  for wb in 0 32M; do
    rm -rf res
    mkdir -p m
    eval "$("$BENCHFS" start --servers 2 --mount "$PWD/m" --results-root "$PWD/res" \
      --set "client.write_behind=$wb" 2>>start.err)"
    mountpoint -q m || { echo "the mount did not come up (see $DIR/start.err)"; exit 1; }
    for bs in 4K 64K 1M; do
      n=$((268435456 / $(numfmt --from=iec "$bs")))
      t0=$(date +%s.%N)
      dd if=/dev/zero of="m/f-$bs" bs="$bs" count="$n" conv=fsync status=none
      t1=$(date +%s.%N)
      echo "write_behind=$wb repeat=$rep dd bs=$bs MiB/s=$(python3 -c "print(round(256/($t1-$t0)))")"
    done
    t0=$(date +%s.%N)
    tar cf m/tree.tar -C "$(dirname "$TREE")" "$(basename "$TREE")"
    sync m/tree.tar
    t1=$(date +%s.%N)
    echo "write_behind=$wb repeat=$rep tar s=$(python3 -c "print(round($t1-$t0, 2))") bytes=$(stat -c %s m/tree.tar)"
    "$BENCHFS" stop >/dev/null 2>>stop.err
    unset BENCHFS_CONFIG BENCHFS_JOB_DIR BENCHFS_REGISTRY BENCHFS_EXPECTED_SERVERS BENCHFS_MOUNT
  done
done
rm -rf res m

#!/bin/sh
# Build repro.c against the bundled UCX and run it N times.
#
#   ./run.sh [BUILD_DIR] [N] [repro args...]
#
#   BUILD_DIR  where the binary (and core files) go; default: a new temp dir
#   N          number of runs (default 10)
#   repro args e.g. "--flush-close" and/or a round count (default 10)
#
#   CHECK=glibc     (default) glibc malloc checks as in the BenchFS churn test
#   CHECK=fastbin   perturb + fastbins only: freed ep keeps 0xa5, crashes every run
#   CHECK=valgrind  run under valgrind memcheck, count runs with invalid accesses
#   CHECK=none      no checks
set -eu
src=$(cd "$(dirname "$0")" && pwd)
ucx=${UCX_PREFIX:-$src/../../.venv/ucx}
ucx=$(cd "$ucx" && pwd)
out=${1:-}; [ $# -gt 0 ] && shift
[ -n "$out" ] || out=$(mktemp -d /tmp/ucx-tcp-force-close.XXXXXX)
n=${1:-10}; [ $# -gt 0 ] && shift
[ $# -gt 0 ] || set -- 10
mkdir -p "$out"
case "$(cd "$out" && pwd)/" in "$(cd "$src/../.." && pwd)/"*)
    echo "refusing to build inside the repository: $out" >&2; exit 1;; esac

cc -O1 -g -Wall -o "$out/repro" "$src/repro.c" -I"$ucx/include" \
   -L"$ucx/lib" -Wl,-rpath,"$ucx/lib" -lucp -lucs

export UCX_TLS=tcp UCX_TCP_SNDBUF=65536 UCX_TCP_RCVBUF=65536 UCX_PROTO_ENABLE=n
pre=""
case "${CHECK:-glibc}" in
glibc)    export GLIBC_TUNABLES=glibc.malloc.tcache_count=0:glibc.malloc.perturb=165
          export LD_PRELOAD=libc_malloc_debug.so.0 MALLOC_CHECK_=3 ;;
fastbin)  export GLIBC_TUNABLES=glibc.malloc.tcache_count=0:glibc.malloc.perturb=165:glibc.malloc.mxfast=160 ;;
valgrind) pre="valgrind -q --error-exitcode=42" ;;
none)     ;;
*)        echo "unknown CHECK=$CHECK" >&2; exit 1 ;;
esac

cd "$out"
ulimit -c unlimited 2>/dev/null || true
bad=0
i=1
while [ "$i" -le "$n" ]; do
    rm -f core
    rc=0
    timeout 120 $pre ./repro "$@" > "run$i.log" 2>&1 || rc=$?
    [ -f core ] && mv core "core.$i"
    if [ "$rc" -ne 0 ]; then bad=$((bad + 1)); fi
    echo "run $i: rc=$rc: $(grep -v -e '^round' -e '^==' "run$i.log" | tail -1)" \
         "[$(grep -c '^round' "run$i.log") rounds ok]"
    i=$((i + 1))
done
echo "$bad / $n runs failed (CHECK=${CHECK:-glibc}, args: $*); logs and cores in $out"

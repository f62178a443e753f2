"""Benchmarks that explain BenchFS performance (`benchfs-bench`).

- `storage`: the chunk store alone against fio on the same directory (`benchfs.bench.storage`),
  then the whole path through one `benchfsd` (`benchfs.bench.wholepath`): in-flight depth at the
  device, idle CPU and telemetry overhead.
- `rpc`: the network layer on tmpfs beside `ucx_perftest` (`benchfs.bench.rpc`, with the
  client process `benchfs.clients.calls` and `benchfs.probes.perftest`), over TCP and shared
  memory, then an overload (many clients, deep windows, few buffers) against the peak of small
  windows.

Method and how to read the numbers: docs/bench.md.
"""

from benchfs.errors import BenchError

__all__ = ["BenchError"]

"""Benchmarks that explain BenchFS performance (`benchfs-bench`).

- `storage`: the chunk store alone against fio on the same directory (`benchfs.bench.storage`),
  then the whole path through one `benchfsd` (`benchfs.bench.wholepath`): in-flight depth at the
  device, idle CPU and telemetry overhead.

Method and how to read the numbers: docs/bench.md.
"""

from benchfs.bench.system import BenchError

__all__ = ["BenchError"]

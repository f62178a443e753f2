"""The fio probes of a screen, written as job files and parsed with `benchfs.probes.fio`.

- `seqwrite`, `seqread`: one file, 1 MiB blocks, 32 in flight, direct I/O.
- `workload`: shaped like BenchFS's chunk reads: many files in a deep directory
  tree, random 1-4 MiB reads, 16 in flight, direct I/O, for `seconds` (60 s by default).
- `rand4k`: 4 KiB random reads, 1 in flight: the device's latency alone.

Every probe is time based; its job file and JSON output are kept in the screen's raw
directory.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from benchfs.probes.fio import FioResult, find_fio, parse_fio_json
from benchfs.units import MIB

__all__ = ["PROBES", "ProbeSizes", "job_file", "prepare_tree", "result_of"]

PROBES = ("seqwrite", "seqread", "workload", "rand4k")
TREE_FANOUT = 4
TREE_DEPTH = 3
WORK_DIR = "benchfs-diagnose"
"""The probes' directory under a node's scratch (removed after the screen)."""


@dataclass(frozen=True)
class ProbeSizes:
    """Bytes the probes lay out on each node."""

    seq_file: int
    files: int
    file_size: int

    @staticmethod
    def full(total: int = 9 * 1024 * MIB) -> ProbeSizes:
        """`total` bytes (diagnose.probe_size): a ninth of it, 64 MiB to 1 GiB, as the
        sequential file, the rest as 4 MiB files (9 GiB: 1 GiB and 2048 files)."""
        seq = min(1024 * MIB, max(64 * MIB, total // 9 // MIB * MIB))
        return ProbeSizes(
            seq_file=seq, files=max(32, (total - seq) // (4 * MIB)), file_size=4 * MIB
        )

    @staticmethod
    def quick() -> ProbeSizes:
        return ProbeSizes(seq_file=64 * MIB, files=32, file_size=4 * MIB)

    def need(self) -> int:
        return self.seq_file + self.files * self.file_size


def tree_paths(root: Path, files: int) -> list[Path]:
    """`files` paths spread over a tree TREE_DEPTH deep, TREE_FANOUT wide at every level."""
    out = []
    for i in range(files):
        parts = [f"d{(i // TREE_FANOUT**level) % TREE_FANOUT}" for level in range(TREE_DEPTH)]
        out.append(root.joinpath(*parts, f"f{i:06d}"))
    return out


def prepare_tree(work: Path, sizes: ProbeSizes) -> list[Path]:
    """Create the directories of the workload probe's tree; return its file paths."""
    paths = tree_paths(work / "tree", sizes.files)
    for p in {p.parent for p in paths}:
        p.mkdir(parents=True, exist_ok=True)
    return paths


def job_file(probe: str, work: Path, seconds: float, sizes: ProbeSizes, files: list[Path]) -> str:
    """The fio job file of `probe` on a node whose probe directory is `work`."""
    runtime = max(1, round(seconds))
    common = [
        "[global]",
        "ioengine=io_uring",
        "direct=1",
        "time_based=1",
        f"runtime={runtime}",
        "ramp_time=0",
        "lat_percentiles=1",
        "group_reporting=1",
        "randrepeat=0",
        "",
        f"[{probe}]",
    ]
    seq = work / "seq.dat"
    if probe == "seqwrite":
        body = [f"filename={seq}", "rw=write", "bs=1M", "iodepth=32", f"size={sizes.seq_file}"]
    elif probe == "seqread":
        body = [f"filename={seq}", "rw=read", "bs=1M", "iodepth=32", f"size={sizes.seq_file}"]
    elif probe == "workload":
        if any(":" in str(p) for p in files):
            raise ValueError(f"{work}: fio file lists cannot hold paths with ':'")
        body = [
            "filename=" + ":".join(map(str, files)),
            f"nrfiles={len(files)}",
            f"filesize={sizes.file_size}",
            f"size={len(files) * sizes.file_size}",
            "file_service_type=random",
            "openfiles=64",
            "rw=randread",
            "bsrange=1M-4M",
            "norandommap=1",
            "iodepth=16",
        ]
    elif probe == "rand4k":
        body = [f"filename={seq}", "rw=randread", "bs=4k", "iodepth=1", "norandommap=1"]
        body.append(f"size={sizes.seq_file}")
    else:
        raise ValueError(f"unknown probe {probe!r} (one of {', '.join(PROBES)})")
    return "\n".join(common + body) + "\n"


def fio_argv(job: Path, output: Path) -> list[str]:
    return [find_fio(), "--output-format=json", f"--output={output}", str(job)]


def result_of(output: Path, probe: str) -> FioResult:
    """Parse a probe's JSON output (FioError, a BenchError, names the file)."""
    direction = "write" if probe == "seqwrite" else "read"
    return parse_fio_json(output.read_text(errors="replace"), str(output), direction)


def scratch_free(path: str) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize

"""Darshan logs, the application's own view of its I/O: the job's times, its files and, with
DXT, every read and write (rank, file, offset, length, start, end), read with PyDarshan.

PyDarshan's reader is C (darshan-util's), and a damaged log can crash it: `read_log` reads in
a child process (`python -m benchfs.analysis.darshanlog LOG`, which prints one JSON object)
and turns every failure into one line naming the log. Times are seconds since the job's start
(`DarshanLog.start_ns`, the epoch in ns), as DXT records them.
"""

from __future__ import annotations

import json
import os
import re
import resource
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchfs.errors import AnalyzeError

READ_TIMEOUT_S = 120.0
MAGIC = re.compile(rb"^\d\.\d\d\x00")
"""A Darshan log begins with its format version, e.g. b"3.41\\0"."""
FORMATS = ("3.41",)
"""The log formats this reader was tested on (Darshan 3.4's)."""


@dataclass(frozen=True)
class DxtOp:
    """One read or write the application made, as DXT traced it."""

    rank: int
    host: str
    path: str
    op: str
    offset: int
    length: int
    start_s: float
    end_s: float
    module: str = "POSIX"
    """Which layer's call: POSIX (read, write, pread...) or MPIIO (MPI_File_write_at...,
    whose POSIX calls beneath are traced too)."""


@dataclass(frozen=True)
class DarshanLog:
    path: str
    format: str
    library: str
    exe: str
    nprocs: int
    jobid: int
    start_ns: int
    end_ns: int
    modules: tuple[str, ...]
    files: tuple[str, ...]
    ops: tuple[DxtOp, ...]
    posix: tuple[dict[str, Any], ...] = ()
    """The POSIX module's record of each file and rank (rank -1: a file every rank opened,
    reduced): `rank`, `path` and Darshan's counters by their names (POSIX_WRITES,
    POSIX_F_META_TIME, ...)."""

    @property
    def run_time_s(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9


def read_log(path: str | os.PathLike[str]) -> DarshanLog:
    """The log at `path`; AnalyzeError with one line when it is missing, not a Darshan log, of
    a format this reader does not know, truncated or damaged."""
    log = Path(path)
    try:
        head = log.read_bytes()[:8]
    except OSError as e:
        raise AnalyzeError("ENOENT", f"{log}: {e.strerror}") from e
    if not MAGIC.match(head):
        raise AnalyzeError("EINVAL", f"{log}: not a Darshan log (no version at its start)")
    version = head.split(b"\x00", 1)[0].decode()
    if version not in FORMATS:
        raise AnalyzeError(
            "EINVAL",
            f"{log}: a Darshan log of format {version}; this reader reads {', '.join(FORMATS)} "
            "(Darshan 3.4)",
        )
    try:
        done = subprocess.run(
            [sys.executable, "-m", "benchfs.analysis.darshanlog", str(log)],
            capture_output=True,
            text=True,
            timeout=READ_TIMEOUT_S,
            check=False,
            preexec_fn=_no_core,  # a crash on a damaged log is reported, not dumped
        )
    except subprocess.TimeoutExpired as e:
        raise AnalyzeError("ETIMEDOUT", f"{log}: reading took over {READ_TIMEOUT_S:.0f} s") from e
    if done.returncode < 0:
        name = signal.Signals(-done.returncode).name
        raise AnalyzeError("EINVAL", f"{log}: the Darshan reader crashed ({name}): a damaged log?")
    if done.returncode != 0:
        said = (done.stderr.strip().splitlines() or ["failed"])[-1]
        raise AnalyzeError("EINVAL", f"{log}: {said}")
    data = json.loads(done.stdout)
    data["ops"] = tuple(DxtOp(**op) for op in data["ops"])
    data["modules"], data["files"] = tuple(data["modules"]), tuple(data["files"])
    data["posix"] = tuple(data["posix"])
    return DarshanLog(**data)


def _no_core() -> None:
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _read(path: str) -> dict[str, Any]:
    """In the child: the log as plain data (PyDarshan, pinned in requirements.txt)."""
    import darshan

    with darshan.DarshanReport(path, read_all=True) as report:
        job = report.metadata["job"]
        names = report.name_records
        ops: list[dict[str, Any]] = []
        for module in ("DXT_POSIX", "DXT_MPIIO"):
            if module not in report.records:
                continue
            for rec in report.records[module].to_df():
                for op in ("write", "read"):
                    for seg in rec[f"{op}_segments"].itertuples(index=False):
                        ops.append(
                            {
                                "rank": int(rec["rank"]),
                                "host": str(rec["hostname"]),
                                "path": names.get(rec["id"], str(rec["id"])),
                                "op": op,
                                "offset": int(seg.offset),
                                "length": int(seg.length),
                                "start_s": float(seg.start_time),
                                "end_s": float(seg.end_time),
                                "module": module.removeprefix("DXT_"),
                            }
                        )
        ops.sort(key=lambda o: (o["start_s"], o["rank"]))
        posix: list[dict[str, Any]] = []
        if "POSIX" in report.records:
            frames = report.records["POSIX"].to_df()
            both = frames["counters"].merge(frames["fcounters"], on=["rank", "id"])
            for row in both.to_dict("records"):
                row["path"] = names.get(row.pop("id"), "")
                posix.append({k: v.item() if hasattr(v, "item") else v for k, v in row.items()})
        start = job["start_time_sec"] * 10**9 + job.get("start_time_nsec", 0)
        end = job["end_time_sec"] * 10**9 + job.get("end_time_nsec", 0)
        return {
            "path": path,
            "format": job["log_ver"],
            "library": job["metadata"].get("lib_ver", ""),
            "exe": report.metadata.get("exe", ""),
            "nprocs": int(job["nprocs"]),
            "jobid": int(job["jobid"]),
            "start_ns": int(start),
            "end_ns": int(end),
            "modules": sorted(report.records),
            "files": sorted({o["path"] for o in ops}),
            "ops": ops,
            "posix": posix,
        }


def main(argv: list[str]) -> int:
    try:
        print(json.dumps(_read(argv[0])))
    except Exception as e:  # the one line the parent shows, whatever PyDarshan raised
        print(f"unreadable Darshan log: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

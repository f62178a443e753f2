"""What the benchmarks need from the operating system: page cache, CPU time, free space."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from benchfs.errors import ProbeError

__all__ = [
    "cpu_seconds",
    "drop_caches",
    "filesystem_type",
    "free_bytes",
    "remove_path",
    "tool_version",
]

DROP_CACHES = Path("/proc/sys/vm/drop_caches")


def drop_caches() -> bool:
    """Write back dirty pages, then drop the page cache; False if not permitted (not root)."""
    os.sync()
    try:
        DROP_CACHES.write_text("3\n")
    except OSError:
        return False
    return True


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of a process (all its threads, living and exited), in seconds.

    From /proc/<pid>/stat (utime and stime, in clock ticks: 10 ms resolution at 100 Hz).
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError as e:
        raise ProbeError("ESRCH", f"cannot read CPU time of process {pid}: {e}") from e
    # Fields after the parenthesised command name; utime and stime are fields 14 and 15.
    fields = stat.rsplit(")", 1)[1].split()
    ticks = int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


def free_bytes(path: Path) -> int:
    """Bytes an unprivileged writer may still use on the filesystem holding `path`."""
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def remove_path(path: Path) -> None:
    """Remove a file or directory tree if it exists."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def tool_version(argv: list[str], timeout_s: float = 10.0) -> str | None:
    """The first non-empty line of a tool's version output (stdout, then stderr), or None if
    it cannot be run."""
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    for line in (out.stdout + out.stderr).splitlines():
        if line.strip():
            return line.strip()
    return None


def filesystem_type(path: Path) -> str | None:
    """The type of the file system holding `path` (longest mount point of /proc/self/mounts)."""
    try:
        mounts = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return None
    target = os.path.realpath(path)
    best, kind = "", None
    for line in mounts:
        fields = line.split()
        if len(fields) < 3:
            continue
        point = fields[1].replace("\\040", " ")
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, kind = point, fields[2]
    return kind

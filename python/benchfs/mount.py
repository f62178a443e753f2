"""Mount a running cluster with `benchfs-mount` for the length of a `with` block.

Tests and benchmarks use the same lifecycle: start the mount process, wait (bounded) until the
mount point shows up in /proc/self/mountinfo, and always unmount afterwards, even when the
block failed: SIGTERM (the process unmounts and exits 0), a bounded wait, then a lazy
`fusermount3 -uz` / `umount -l` and SIGKILL as a last resort, so no mount and no process
outlives the block.

    with mounted(cluster.registry_dir, tmp / "mnt", config_path=cluster.config_path) as m:
        subprocess.run(["fio", f"--directory={m.mountpoint}", ...], check=True)
    assert m.returncode == 0
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from benchfs.errors import BenchfsError
from benchfs.native import find_binary

__all__ = ["MountError", "Mounted", "find_benchfs_mount", "is_mounted", "mount_fstype", "mounted"]

POLL_S = 0.05


class MountError(BenchfsError, RuntimeError):
    """The mount did not come up (the process's own message is included)."""

    def __init__(self, message: str) -> None:
        super().__init__("EIO", message)


def find_benchfs_mount() -> str:
    """Path of `benchfs-mount` (`benchfs.native.find_binary`)."""
    return find_binary("benchfs-mount")


def _unescape(field: str) -> str:
    """Mountinfo escapes space, tab, newline and backslash as 3-digit octal (`\\040`)."""
    out, i = [], 0
    while i < len(field):
        digits = field[i + 1 : i + 4]
        if field[i] == "\\" and len(digits) == 3 and all(c in "01234567" for c in digits):
            out.append(chr(int(digits, 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def mount_fstype(mountpoint: str | os.PathLike[str]) -> str | None:
    """The file system type mounted at `mountpoint` (e.g. "fuse"), or None if none is."""
    want = os.path.abspath(os.fspath(mountpoint))
    found = None
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split(" ")
        if len(fields) > 4 and _unescape(fields[4]) == want and "-" in fields:
            found = fields[fields.index("-") + 1]  # the last (topmost) mount wins
    return found


def is_mounted(mountpoint: str | os.PathLike[str]) -> bool:
    return mount_fstype(mountpoint) is not None


def detach_command(mountpoint: str | os.PathLike[str]) -> list[str]:
    """A command (for any node) that detaches the mount at `mountpoint` if there is one, also
    a disconnected one (its process died: `mountpoint` itself then fails with ENOTCONN), and
    fails only if it is still mounted afterwards."""
    p = shlex.quote(os.fspath(mountpoint))
    script = (
        f"fusermount3 -uz {p} 2>/dev/null || umount -l {p} 2>/dev/null; "
        f"awk -v p={p} '$2 == p {{ found = 1 }} END {{ exit found }}' /proc/self/mounts"
    )
    return ["sh", "-c", script]


@dataclass
class Mounted:
    """A running `benchfs-mount`; `returncode` is set once the `with` block has ended."""

    mountpoint: Path
    proc: subprocess.Popen[bytes]
    log: IO[bytes]
    returncode: int | None = None
    forced: list[str] = field(default_factory=list)
    """Last-resort steps the teardown needed (empty when SIGTERM alone unmounted cleanly)."""
    final_output: str | None = None

    def output(self) -> str:
        """What the process wrote to stderr (so far, or in all once the block has ended)."""
        if self.final_output is not None:
            return self.final_output
        self.log.flush()
        self.log.seek(0)
        return self.log.read().decode(errors="replace")


def _wait_mounted(m: Mounted, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not is_mounted(m.mountpoint):
        if m.proc.poll() is not None:
            raise MountError(
                f"benchfs-mount exited with code {m.proc.returncode} before mounting "
                f"{m.mountpoint}: {m.output().strip()}"
            )
        if time.monotonic() > deadline:
            raise MountError(
                f"{m.mountpoint} not mounted after {timeout_s:.0f}s: {m.output().strip()}"
            )
        time.sleep(POLL_S)


def _teardown(m: Mounted, grace_s: float) -> None:
    """Unmount and reap, whatever state the mount is in; records what had to be forced."""
    if m.proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            m.proc.send_signal(signal.SIGTERM)
        try:
            m.proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            m.forced.append("process ignored SIGTERM")
    if is_mounted(m.mountpoint):
        m.forced.append("mount remained")
        for cmd in (["fusermount3", "-uz", str(m.mountpoint)], ["umount", "-l", str(m.mountpoint)]):
            if not is_mounted(m.mountpoint):
                break
            with contextlib.suppress(OSError, subprocess.TimeoutExpired):
                subprocess.run(cmd, capture_output=True, timeout=10, check=False)
    if m.proc.poll() is None:
        m.proc.kill()
        m.proc.wait(timeout=10)
    m.returncode = m.proc.returncode


@contextlib.contextmanager
def mounted(
    registry_dir: str | os.PathLike[str],
    mountpoint: str | os.PathLike[str],
    config_path: str | os.PathLike[str] | None = None,
    overrides: Iterable[str] = (),
    threads: int | None = None,
    timeout_s: float = 30.0,
    grace_s: float = 10.0,
) -> Iterator[Mounted]:
    """Mount the cluster of `registry_dir` at `mountpoint` (an existing directory).

    `config_path` and `overrides` ("section.key=value") are passed to benchfs-mount as
    `--config`/`--set`; the cluster's expected server count must come from one of them (or
    the environment). Raises MountError if the mount is not up within `timeout_s`.
    """
    argv = [find_benchfs_mount(), "--registry", os.fspath(registry_dir)]
    if config_path is not None:
        argv += ["--config", os.fspath(config_path)]
    for item in overrides:
        argv += ["--set", item]
    if threads is not None:
        argv += ["--threads", str(threads)]
    point = Path(os.path.abspath(os.fspath(mountpoint)))
    if is_mounted(point):
        # Waiting would see the old mount; benchfs-mount would refuse it anyway.
        raise MountError(f"{point} is already a mount point ({mount_fstype(point)})")
    argv.append(str(point))
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        m = Mounted(point, proc, log)
        try:
            _wait_mounted(m, timeout_s)
            yield m
        finally:
            _teardown(m, grace_s)
            m.final_output = m.output()

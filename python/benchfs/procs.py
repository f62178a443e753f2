"""Process helpers for launching and tearing down what a run starts.

A run only ever signals processes it started, by their PID (or the process group it created
for them), so it can never hit an unrelated process of the same name.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchfs.errors import BenchfsError

__all__ = [
    "ProcessRef",
    "descendants",
    "kill_pids",
    "pid_alive",
    "start_time",
    "stop_process",
    "stop_refs",
    "tail",
]


def pid_alive(pid: int) -> bool:
    """True if `pid` names a process that still runs (a zombie awaiting its reap does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    # The state follows the parenthesised command name, which may itself contain spaces.
    state = stat.rsplit(")", 1)[1].split()[0]
    return state not in ("Z", "X")


def start_time(pid: int) -> int | None:
    """When `pid` started (clock ticks since boot, field 22 of /proc/PID/stat); None if no
    such process. With the pid it names one process for good, however pids are reused."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


@dataclass(frozen=True)
class ProcessRef:
    """A process recorded by one program and signalled by another (`benchfs stop`): its pid
    and start time, so a pid reused by an unrelated process is never signalled."""

    pid: int
    start: int

    @classmethod
    def of(cls, pid: int) -> ProcessRef | None:
        start = start_time(pid)
        return None if start is None else cls(pid, start)

    def alive(self) -> bool:
        return start_time(self.pid) == self.start and pid_alive(self.pid)

    def signal(self, sig: int) -> None:
        if self.alive():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(self.pid, sig)


def stop_refs(refs: list[ProcessRef], sig: int, grace_s: float) -> list[ProcessRef]:
    """Send `sig` to the live `refs`, SIGKILL those alive after `grace_s`; return the ones
    that outlived SIGKILL too."""
    for ref in refs:
        ref.signal(sig)
    deadline = time.monotonic() + grace_s
    alive = [r for r in refs if r.alive()]
    while alive and time.monotonic() < deadline:
        time.sleep(0.05)
        alive = [r for r in alive if r.alive()]
    for ref in alive:
        ref.signal(signal.SIGKILL)
    deadline = time.monotonic() + 2.0
    while alive and time.monotonic() < deadline:
        time.sleep(0.02)
        alive = [r for r in alive if r.alive()]
    return alive


def descendants(pid: int) -> list[int]:
    """PIDs of all live descendants of `pid` (from /proc), so they can be stopped by PID."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        children.setdefault(int(fields[1]), []).append(int(entry.name))
    found: list[int] = []
    stack = [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            found.append(child)
            stack.append(child)
    return found


def _signal(proc: subprocess.Popen[Any], sig: int, group: bool) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if group:
            os.killpg(proc.pid, sig)
        else:
            proc.send_signal(sig)


def stop_process(
    proc: subprocess.Popen[Any],
    grace_s: float,
    group: bool = False,
    sig: int | None = signal.SIGTERM,
) -> int:
    """Send `sig` (None: it was sent already), wait up to `grace_s`, then SIGKILL.

    Returns the exit status. With `group`, the process group that `start_new_session=True`
    created for `proc` is signalled, so its children are reached too.
    """
    if proc.poll() is None:
        if sig is not None:
            _signal(proc, sig, group)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            _signal(proc, signal.SIGKILL, group)
            proc.wait()
    elif group:
        # The leader is gone, but children in its group may remain.
        _signal(proc, signal.SIGKILL, group)
    assert proc.returncode is not None
    return proc.returncode


def kill_pids(pids: list[int], grace_s: float) -> list[int]:
    """SIGTERM the still-running `pids`, SIGKILL whatever outlives `grace_s`; return survivors."""
    alive = [p for p in pids if pid_alive(p)]
    for pid in alive:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while alive and time.monotonic() < deadline:
        time.sleep(0.05)
        alive = [p for p in alive if pid_alive(p)]
    for pid in alive:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 2.0
    while alive and time.monotonic() < deadline:
        time.sleep(0.02)
        alive = [p for p in alive if pid_alive(p)]
    return alive


def tail(path: Path, lines: int = 20) -> str:
    """The last lines of a log file, for error messages that point at the cause."""
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return ""
    return "\n".join(text.rstrip().splitlines()[-lines:])


class LineProcess:
    """A child process spoken to one JSON line at a time: a command on its stdin, one JSON
    object back on its stdout (`{"error": ...}` for a failure); stderr goes to `log_path`.
    Failures are `BenchfsError` EIO naming the process (`label`) with the end of its log."""

    def __init__(self, argv: list[str], log_path: Path, label: str, env: dict[str, str]) -> None:
        self.log_path = log_path
        self.label = label
        with open(log_path, "ab") as log:
            self.proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                env=env,
                start_new_session=True,
            )

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(line.encode() + b"\n")
            self.proc.stdin.flush()
        except BrokenPipeError as e:
            raise self._failed("exited") from e

    def receive(self, timeout_s: float) -> dict[str, Any]:
        assert self.proc.stdout is not None
        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            if not sel.select(timeout_s):
                raise self._failed(f"did not answer within {timeout_s:.0f} s")
        line = self.proc.stdout.readline()
        if not line:
            raise self._failed("exited")
        answer = json.loads(line)
        if "error" in answer:
            raise self._failed(f"failed: {answer['error']}")
        return answer

    def _failed(self, what: str) -> BenchfsError:
        log = tail(self.log_path, 5)
        return BenchfsError(
            "EIO",
            f"{self.label} {self.proc.pid} {what}" + (f"; its log:\n{log}" if log else ""),
        )

    def close(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(BenchfsError):
                self.send("quit")
        with contextlib.suppress(OSError):
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        stop_process(self.proc, 5.0, group=True, sig=None)
        if self.proc.stdout is not None:
            self.proc.stdout.close()

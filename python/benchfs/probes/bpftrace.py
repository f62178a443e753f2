"""bpftrace: whether it can run here, and one program running into a file until stopped.

Programs print JSON (`bpftrace -f json`: one record per line, `{"type": ..., "data": ...}`).
Stopping sends SIGINT, so that END blocks print what is left; then the tracer's own cost is
appended as a `tracer` record: its CPU time (user and system of the bpftrace process) to
compile and attach, and while attached, over its wall time. The time the programs themselves
run in the kernel is spent by the traced tasks and is not in it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from benchfs.errors import ParseError, ProbeError
from benchfs.probes.system import cpu_seconds
from benchfs.procs import stop_process

__all__ = ["COST", "TRACEFS", "Capture", "read_lines", "records", "unavailable"]

TRACEFS = Path("/sys/kernel/tracing")
COST = "tracer"
"""The record type of a capture's cost."""


def read_lines(path: str | os.PathLike[str]) -> list[str]:
    """A capture's lines; ParseError naming the file when it cannot be read."""
    p = Path(path)
    try:
        return p.read_text(errors="replace").splitlines()
    except OSError as e:
        raise ParseError(f"{p}: {e.strerror}", "ENOENT") from e


def records(lines: Sequence[str], where: str) -> Iterator[tuple[int, str, Any]]:
    """(line number, type, data) of each bpftrace JSON record; a last line cut off while
    being written is skipped, a malformed one elsewhere is a ParseError naming `where`."""
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            doc = json.loads(line)
            kind, data = doc["type"], doc["data"]
        except (ValueError, KeyError, TypeError) as e:
            if number == len(lines):
                return
            raise ParseError(f"{where}:{number}: not a bpftrace JSON line ({e})") from e
        yield number, kind, data


def unavailable() -> str | None:
    """Why kernel tracing cannot run here (one line), or None when it can."""
    if os.geteuid() != 0:
        return "kernel tracing unavailable: it needs root"
    if not (TRACEFS / "events").is_dir():
        return (
            f"kernel tracing unavailable: tracefs is not mounted at {TRACEFS} "
            f"(mount -t tracefs nodev {TRACEFS})"
        )
    if shutil.which("bpftrace") is None:
        return "kernel tracing unavailable: bpftrace not found on PATH (apt-get install bpftrace)"
    return None


class Capture:
    """One bpftrace program (written next to `path` as .bt) printing into `path` until `stop`;
    its messages go to the .log beside it."""

    def __init__(self, path: str | os.PathLike[str], program: str) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.program = self.path.with_suffix(".bt")
        self.program.write_text(program)
        self.argv = ["bpftrace", "-f", "json", str(self.program)]
        self.log = self.path.with_suffix(".log")
        self.started = time.monotonic()
        self.attached: tuple[float, float] | None = None
        """(monotonic time, the tracer's CPU seconds) when its probes were attached."""
        with open(self.path, "wb") as out, open(self.log, "wb") as err:
            self.proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                start_new_session=True,
            )

    def wait_attached(self, timeout_s: float = 30.0) -> None:
        """Wait until bpftrace has attached its probes (it compiles first: a second or more);
        ParseError with its messages when it exits or does not attach in time."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ParseError(f"bpftrace exited {self.proc.returncode}: {self.messages()}")
            with contextlib.suppress(OSError), open(self.path, "rb") as f:
                if b'"attached_probes"' in f.read(4096):
                    with contextlib.suppress(ProbeError):
                        self.attached = (time.monotonic(), cpu_seconds(self.proc.pid))
                    return
            time.sleep(0.05)
        self.stop()
        raise ParseError(f"bpftrace did not attach within {timeout_s:g} s: {self.messages()}")

    def messages(self) -> str:
        """bpftrace's messages, but the warning about RLIMIT_MEMLOCK (the kernel accounts BPF
        memory to the cgroup since Linux 5.11: the limit does not matter)."""
        with contextlib.suppress(OSError):
            lines = [
                line
                for line in self.log.read_text(errors="replace").splitlines()
                if line.strip() and "RLIMIT_MEMLOCK" not in line
            ]
            return " ".join(lines)[-400:] or "no message"
        return "no message"

    def stop(self, grace_s: float = 10.0) -> int:
        """Stop bpftrace (END printed), append its cost; its exit status."""
        if self.proc.poll() is not None:
            return self.proc.returncode
        cost: dict[str, float | None] = {"startup_cpu_s": None, "cpu_s": None, "wall_s": None}
        with contextlib.suppress(ProbeError):
            cpu = cpu_seconds(self.proc.pid)
            if self.attached is not None:
                at, at_cpu = self.attached
                cost.update(startup_cpu_s=at_cpu, cpu_s=cpu - at_cpu, wall_s=time.monotonic() - at)
        status = stop_process(self.proc, grace_s, group=True, sig=signal.SIGINT)
        with open(self.path, "a") as out:
            out.write(json.dumps({"type": COST, "data": cost}) + "\n")
        return status

    def __enter__(self) -> Capture:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

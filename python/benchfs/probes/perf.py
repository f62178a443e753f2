"""On-CPU profiles with Linux perf: every CPU sampled at 99 Hz with call stacks, folded per
process (`benchfs._core.fold_perf_script`, inferno) for flame graphs and top-frames tables.

Stacks are unwound with DWARF (`--call-graph dwarf`: perf copies 8 KiB of each sampled
thread's stack and unwinds it afterwards with the binaries' .eh_frame), because the release
builds keep no frame pointers; the builds carry line tables (`debug = 1`), so frames have
names. Python ranks show the interpreter's C frames (`_PyEval_EvalFrameDefault` and the
BenchFS extension's Rust frames beneath it), not Python functions: Python 3.11 has no perf
trampolines (3.12's `-X perf`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from benchfs.errors import ParseError, ProbeError
from benchfs.probes.system import cpu_seconds
from benchfs.procs import stop_process

__all__ = ["HZ", "Folded", "Recording", "parse_folded", "unavailable"]

HZ = 99
"""Samples per second per CPU: not a multiple of common timer rates, so no lockstep."""
STACK_BYTES = 8192
MAX_SIZE = "1G"
"""perf stops writing samples at this size: a sample with its stack copy is about 8.5 KiB, so
about 10 minutes of a 2-CPU host at 99 Hz (less with more CPUs); the rest of a longer run is
not profiled, and the file stays bounded."""
SCRIPT_FIELDS = "comm,pid,tid,cpu,time,event,ip,sym,dso"
"""perf script's fields: without the period, so a folded count is a number of samples."""


def unavailable() -> str | None:
    """Why perf cannot profile every CPU here (one line), or None."""
    if shutil.which("perf") is None:
        return "CPU profiles unavailable: perf not found on PATH (apt-get install linux-perf)"
    paranoid = Path("/proc/sys/kernel/perf_event_paranoid")
    with contextlib.suppress(OSError, ValueError):
        if os.geteuid() != 0 and int(paranoid.read_text()) > 0:
            return (
                "CPU profiles unavailable: profiling every CPU needs root "
                "(or kernel.perf_event_paranoid <= 0)"
            )
    return None


class Recording:
    """`perf record` of every CPU into `data` until `stop`; `fold` turns it into stacks."""

    def __init__(self, data: str | os.PathLike[str]) -> None:
        self.data = Path(data)
        self.data.parent.mkdir(parents=True, exist_ok=True)
        self.log = self.data.with_suffix(".log")
        argv = ["perf", "record", "-F", str(HZ), "-a", "-e", "cpu-clock"]
        argv += ["--call-graph", f"dwarf,{STACK_BYTES}", "--max-size", MAX_SIZE]
        argv += ["-o", str(self.data)]
        self.argv = argv
        self.started = time.monotonic()
        self.cpu_s: float | None = None
        self.wall_s: float | None = None
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True
            )

    def stop(self, grace_s: float = 30.0) -> int:
        """SIGINT (perf writes its data out and exits); its exit status."""
        if self.proc.poll() is not None:
            return self.proc.returncode
        with contextlib.suppress(ProbeError):
            self.cpu_s = cpu_seconds(self.proc.pid)
        self.wall_s = time.monotonic() - self.started
        return stop_process(self.proc, grace_s, group=True, sig=signal.SIGINT)

    def fold(self, timeout_s: float = 600.0) -> str:
        """The recording's samples folded per process (`comm-pid;outer;...;leaf COUNT`);
        ParseError when perf cannot read it."""
        from benchfs import _core

        argv = ["perf", "script", "-i", str(self.data), "-F", SCRIPT_FIELDS]
        try:
            out = subprocess.run(
                argv, capture_output=True, timeout=timeout_s, check=False, stdin=subprocess.DEVNULL
            )
        except subprocess.TimeoutExpired as e:
            raise ParseError(f"perf script of {self.data} took over {timeout_s:g} s") from e
        if out.returncode != 0:
            why = out.stderr.decode(errors="replace").strip()[-300:]
            raise ParseError(f"perf script of {self.data} exited {out.returncode}: {why}")
        try:
            return _core.fold_perf_script(out.stdout)
        except ValueError as e:
            raise ParseError(str(e)) from e


@dataclass(frozen=True)
class Folded:
    """One process's folded stacks: `stacks` maps `thread;outer;...;leaf` (the thread's name
    first) to samples."""

    pid: int
    stacks: dict[str, int]

    @property
    def samples(self) -> int:
        return sum(self.stacks.values())

    @property
    def threads(self) -> list[str]:
        """Its threads' names, most samples first."""
        per: dict[str, int] = {}
        for stack, count in self.stacks.items():
            thread = stack.split(";", 1)[0]
            per[thread] = per.get(thread, 0) + count
        return sorted(per, key=lambda t: (-per[t], t))

    @property
    def comm(self) -> str:
        """The name of its busiest thread."""
        return self.threads[0] if self.stacks else ""

    def lines(self) -> list[str]:
        return [f"{stack} {count}" for stack, count in sorted(self.stacks.items())]

    def top_frames(self, n: int = 15) -> list[tuple[str, int, int]]:
        """The `n` functions with the most samples on CPU themselves (the leaf): (function,
        self samples, total samples with the function anywhere in the stack, thread names
        aside)."""
        own: dict[str, int] = {}
        anywhere: dict[str, int] = {}
        for stack, count in self.stacks.items():
            frames = stack.split(";")[1:] or ["[unknown]"]
            own[frames[-1]] = own.get(frames[-1], 0) + count
            for f in set(frames):
                anywhere[f] = anywhere.get(f, 0) + count
        ranked = sorted(own.items(), key=lambda kv: (-kv[1], kv[0]))[:n]
        return [(f, c, anywhere[f]) for f, c in ranked]


def parse_folded(lines: Iterable[str]) -> dict[int, Folded]:
    """Folded stacks with the thread and process first (`comm-pid;...`, as
    `fold_perf_script` writes them), per process id; ParseError on a line that is not
    `STACK COUNT` with that head."""
    per: dict[int, dict[str, int]] = {}
    for line in lines:
        if not line.strip():
            continue
        stack, _, count = line.rstrip().rpartition(" ")
        head, _, rest = stack.partition(";")
        comm, _, pid = head.rpartition("-")
        try:
            n, p = int(count), int(pid)
        except ValueError as e:
            raise ParseError(f"not a folded stack with its process first: {line[:120]!r}") from e
        stacks = per.setdefault(p, {})
        key = f"{comm};{rest or '[unknown]'}"
        stacks[key] = stacks.get(key, 0) + n
    return {p: Folded(p, stacks) for p, stacks in per.items()}

"""A node's first-minute triage: one summary row per node.

Load average, vmstat (runnable and blocked tasks, iowait), mpstat (the busiest CPU's iowait),
free (available memory), df (use and file-system type of the scratch directory), recent kernel
errors (dmesg) and tasks in uninterruptible sleep (state D). Every tool's text is parsed by its
header names (LC_ALL=C), so column order and the columns a version adds do not matter.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from benchfs.errors import ParseError
from benchfs.procs import stop_process

__all__ = [
    "TRIAGE_COMMANDS",
    "d_state_tasks",
    "parse_df",
    "parse_dmesg",
    "parse_free",
    "parse_loadavg",
    "parse_mpstat",
    "parse_vmstat",
    "run_triage",
]


def _header_rows(text: str, source: str, first: str) -> tuple[list[str], list[list[str]]]:
    """The header line whose first word is `first` (case-insensitive) and the lines after it."""
    lines = [line for line in text.splitlines() if line.strip()]
    for i, line in enumerate(lines):
        words = line.split()
        if words and words[0].lower().rstrip(":") == first.lower():
            return words, [x.split() for x in lines[i + 1 :]]
    raise ParseError(f"{source}: no header line starting with {first!r}")


def _num(raw: str, source: str, name: str) -> float:
    try:
        return float(raw.replace(",", "."))
    except ValueError as e:
        raise ParseError(f"{source}: {name} = {raw!r} is not a number") from e


def parse_loadavg(text: str, source: str) -> dict[str, float]:
    fields = text.split()
    if len(fields) < 4 or "/" not in fields[3]:
        raise ParseError(f"{source}: not /proc/loadavg: {text[:80]!r}")
    running = fields[3].split("/")[0]
    return {
        "load1": _num(fields[0], source, "load1"),
        "load5": _num(fields[1], source, "load5"),
        "runnable": _num(running, source, "runnable"),
    }


def parse_vmstat(text: str, source: str) -> dict[str, float]:
    """The last line of `vmstat 1 2` (the first is the average since boot)."""
    lines = [x for x in text.splitlines() if x.strip()]
    header_at = next((i for i, x in enumerate(lines) if x.split()[:2] == ["r", "b"]), None)
    if header_at is None or header_at + 1 >= len(lines):
        raise ParseError(f"{source}: no `r b ...` header followed by values (vmstat)")
    header = lines[header_at].split()
    row = lines[-1].split()
    if len(row) != len(header):
        raise ParseError(f"{source}: vmstat row has {len(row)} fields, header {len(header)}")
    values = dict(zip(header, row, strict=True))
    out = {}
    for key, name in (("r", "runq"), ("b", "blocked"), ("wa", "iowait_pct"), ("id", "idle_pct")):
        if key not in values:
            raise ParseError(f"{source}: vmstat has no {key!r} column")
        out[name] = _num(values[key], source, key)
    return out


def parse_mpstat(text: str, source: str) -> dict[str, float]:
    """`mpstat -P ALL 1 1` text: the busiest CPU's %iowait and the lowest %idle (Average)."""
    header: list[str] | None = None
    iowait: list[float] = []
    idle: list[float] = []
    for line in text.splitlines():
        words = line.split()
        if "CPU" in words and any(w.endswith("iowait") for w in words):
            header = words
            continue
        if header is None or not words or not words[0].startswith("Average"):
            continue
        # "Average:" is one word where the header has a time (one or two words: "12:00:01 AM").
        row = words[1:]
        cols = header[len(header) - len(row) :]
        if len(row) != len(cols) or "CPU" not in cols:
            raise ParseError(f"{source}: mpstat row {line.strip()[:80]!r} does not fit its header")
        values = dict(zip(cols, row, strict=True))
        if values["CPU"] == "all":
            continue
        io = next((v for k, v in values.items() if k.endswith("iowait")), None)
        idl = next((v for k, v in values.items() if k.endswith("idle")), None)
        if io is None or idl is None:
            raise ParseError(f"{source}: mpstat has no %iowait or %idle column")
        iowait.append(_num(io, source, "%iowait"))
        idle.append(_num(idl, source, "%idle"))
    if not iowait:
        raise ParseError(f"{source}: no per-CPU 'Average' rows (mpstat -P ALL 1 1)")
    return {"cpu_iowait_max_pct": max(iowait), "cpu_idle_min_pct": min(idle)}


def parse_free(text: str, source: str) -> dict[str, float]:
    """`free -b`: available memory (free + buffers + cache before procps 3.3.10)."""
    lines = [x.split() for x in text.splitlines() if x.strip()]
    if not lines:
        raise ParseError(f"{source}: empty free output")
    header = lines[0]
    mem = next((x for x in lines[1:] if x and x[0] == "Mem:"), None)
    if mem is None or len(mem) - 1 != len(header):
        raise ParseError(f"{source}: no `Mem:` row matching the header (free -b)")
    values = {k: _num(v, source, k) for k, v in zip(header, mem[1:], strict=True)}
    if "available" in values:
        available = values["available"]
    else:
        available = values.get("free", 0) + values.get("buffers", 0) + values.get("cached", 0)
    return {"mem_total_mib": values["total"] / 2**20, "mem_available_mib": available / 2**20}


def parse_df(text: str, source: str) -> dict[str, Any]:
    """`df -PT PATH`: file-system type, use and free space of the scratch directory."""
    header, rows = _header_rows(text, source, "Filesystem")
    if not rows:
        raise ParseError(f"{source}: df printed no file system")
    row = rows[0]
    # "Mounted on" is two header words for one field.
    names = [*header[:-2], "Mounted"] if header[-2:] == ["Mounted", "on"] else header
    if len(row) < len(names):
        raise ParseError(f"{source}: df row {' '.join(row)!r} is shorter than its header")
    row = [*row[: len(names) - 1], " ".join(row[len(names) - 1 :])]
    values = dict(zip(names, row, strict=True))
    kind = values.get("Type")
    capacity = values.get("Capacity") or values.get("Use%")
    avail = values.get("Available") or values.get("Avail")
    if kind is None or capacity is None or avail is None:
        raise ParseError(f"{source}: df has no Type, Capacity or Available column (use df -PT)")
    return {
        "fs_type": kind,
        "fs_use_pct": _num(capacity.rstrip("%"), source, "Capacity"),
        "fs_avail_mib": _num(avail, source, "Available") / 1024,
        "mount": values.get("Mounted", ""),
    }


def parse_dmesg(text: str) -> dict[str, Any]:
    """`dmesg --level=emerg,alert,crit,err`: how many lines, and the last three."""
    lines = [x.strip() for x in text.splitlines() if x.strip()]
    return {"kernel_errors": len(lines), "kernel_errors_last": lines[-3:]}


def d_state_tasks(proc: str | os.PathLike[str] = "/proc") -> list[str]:
    """`comm(pid)` of the processes in uninterruptible sleep (state D)."""
    found: list[str] = []
    for entry in Path(proc).iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        head, _, tail = stat.rpartition(")")
        if tail.split()[:1] == ["D"]:
            found.append(f"{head.partition('(')[2]}({entry.name})")
    return sorted(found)


TRIAGE_COMMANDS: dict[str, tuple[list[str], Callable[[str, str], dict[str, Any]] | None]] = {
    "loadavg": (["cat", "/proc/loadavg"], parse_loadavg),
    "vmstat": (["vmstat", "1", "2"], parse_vmstat),
    "mpstat": (["mpstat", "-P", "ALL", "1", "1"], parse_mpstat),
    "free": (["free", "-b"], parse_free),
    "dmesg": (["dmesg", "--level=emerg,alert,crit,err"], None),
}
#: The commands that sample over a second (the others read a snapshot).
SAMPLERS = frozenset({"vmstat", "mpstat"})


def run_triage(
    scratch: str,
    prefix: Sequence[str],
    raw_dir: Path,
    timeout_s: float = 30.0,
) -> tuple[dict[str, Any], list[str]]:
    """Run every triage command under `prefix`; (summary, problems). Raw outputs go to
    `raw_dir/triage-<name>.txt`. A missing tool is a problem noted, not a failure.

    The snapshots (load, memory, disk, kernel log) run one at a time, so none counts another
    as runnable; then the samplers run together: vmstat and mpstat sample the same second
    (one after the other they took two). The whole triage is bounded by `timeout_s`."""
    env = {**os.environ, "LC_ALL": "C"}
    summary: dict[str, Any] = {}
    problems: list[str] = []
    commands = dict(TRIAGE_COMMANDS)
    commands["df"] = (["df", "-PT", scratch], parse_df)
    deadline = time.monotonic() + timeout_s
    snapshots = [[name] for name in commands if name not in SAMPLERS]
    for wave in [*snapshots, [name for name in commands if name in SAMPLERS]]:
        running: dict[str, subprocess.Popen[str]] = {}
        for name in wave:
            try:
                running[name] = subprocess.Popen(
                    [*prefix, *commands[name][0]],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                    env=env,
                    start_new_session=True,  # a hung command is killed with what it started
                )
            except OSError as e:
                problems.append(f"{name}: {e}")
        for name, proc in running.items():
            argv, parse = commands[name]
            path = raw_dir / f"triage-{name}.txt"
            try:
                stdout, stderr = proc.communicate(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                stop_process(proc, 0, group=True, sig=signal.SIGKILL)
                proc.communicate()
                problems.append(f"{name}: `{' '.join(argv)}` took over {timeout_s:g} s")
                continue
            path.write_text(stdout + (f"\n# stderr:\n{stderr}" if stderr else ""))
            if proc.returncode != 0:
                problems.append(f"{name}: `{' '.join(argv)}` exited {proc.returncode}")
                continue
            try:
                summary.update(parse(stdout, str(path)) if parse else parse_dmesg(stdout))
            except ParseError as e:
                problems.append(str(e))
    tasks = d_state_tasks()
    summary["d_state_tasks"] = len(tasks)
    summary["d_state_names"] = tasks[:10]
    return summary, problems

"""md RAID state: /proc/mdstat, /sys/block/md*/md/sync_action, and the members of any array.

A resync, recovery, check or reshape competes with the workload for the members' bandwidth
and raises their latency; a degraded array ([U_]) reads from fewer devices. Members come from
/sys/block/<dev>/slaves (md and device-mapper alike).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchfs.errors import ParseError

__all__ = ["BUSY_ACTIONS", "MdArray", "member_devices", "parse_mdstat", "read_md_arrays"]

BUSY_ACTIONS = ("resync", "recover", "recovery", "check", "repair", "reshape")
"""sync_action values (and mdstat progress words) under which an array is busy."""

_ARRAY_RE = re.compile(r"^(md[\w/-]*)\s*:\s*(\S+)(.*)$")
_MEMBER_RE = re.compile(r"^([\w.:/-]+)\[(\d+)\](\([A-Za-z]\))?$")
_STATUS_RE = re.compile(r"\[(\d+)/(\d+)\]\s*\[([U_]+)\]")
_PROGRESS_RE = re.compile(
    r"(resync|recovery|recover|check|repair|reshape)\s*=\s*([\d.]+)%"
    r"(?:.*?finish=([\d.]+)min)?(?:.*?speed=(\d+)K/sec)?"
)
_PENDING_RE = re.compile(r"(resync|recovery|check|reshape)\s*=\s*(DELAYED|PENDING)")


@dataclass
class MdArray:
    """One array as /proc/mdstat (and sysfs) describe it."""

    name: str
    state: str
    level: str | None
    members: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    spares: list[str] = field(default_factory=list)
    degraded: bool = False
    action: str = "idle"
    progress_pct: float | None = None
    finish_min: float | None = None
    speed_kib_s: float | None = None

    @property
    def busy(self) -> bool:
        return self.action in BUSY_ACTIONS

    def describe(self) -> str:
        """One line of evidence, e.g. `md0 raid1 resync 8.6% (finish 150.2 min)`."""
        parts = [self.name, self.level or "?", self.action]
        if self.progress_pct is not None:
            parts.append(f"{self.progress_pct:g}%")
        if self.finish_min is not None:
            parts.append(f"(finish {self.finish_min:g} min)")
        if self.degraded:
            parts.append("degraded")
        if self.failed:
            parts.append(f"failed members {', '.join(self.failed)}")
        return " ".join(parts)

    def to_json(self) -> dict[str, Any]:
        return {**vars(self), "busy": self.busy}


def parse_mdstat(text: str, source: str) -> list[MdArray]:
    """Arrays in /proc/mdstat text; ParseError names `source` on anything unexpected."""
    lines = text.splitlines()
    if not lines or not lines[0].startswith("Personalities"):
        raise ParseError(f"{source}: not /proc/mdstat (no 'Personalities' line)")
    arrays: list[MdArray] = []
    current: MdArray | None = None
    status_seen = True
    for n, line in enumerate(lines[1:], start=2):
        where = f"{source}:{n}"
        if not line.strip():
            continue
        if line.startswith("unused devices"):
            current = None
            continue
        match = _ARRAY_RE.match(line)
        if match:
            if current is not None and not status_seen:
                raise ParseError(f"{where}: array {current.name} has no status line (truncated?)")
            name, state, rest = match.groups()
            words = rest.split()
            level = None
            while words and words[0].startswith("("):
                words.pop(0)  # (read-only), (auto-read-only)
            if words and not _MEMBER_RE.match(words[0]):
                level = words.pop(0)
            current = MdArray(name, state, level)
            for word in words:
                m = _MEMBER_RE.match(word)
                if m is None:
                    raise ParseError(f"{where}: member {word!r} of {name} is not `dev[n]`")
                dev, _, flag = m.groups()
                if flag == "(F)":
                    current.failed.append(dev)
                elif flag == "(S)":
                    current.spares.append(dev)
                else:
                    current.members.append(dev)
            arrays.append(current)
            status_seen = state == "inactive"
            continue
        if not line[0].isspace():
            raise ParseError(f"{where}: unexpected line {line.strip()[:80]!r}")
        if current is None:
            raise ParseError(f"{where}: detail line outside an array: {line.strip()[:80]!r}")
        if "blocks" in line:
            status_seen = True
            st = _STATUS_RE.search(line)
            if st:
                want, have, _ = st.groups()
                current.degraded = int(have) < int(want)
            continue
        prog = _PROGRESS_RE.search(line)
        if prog:
            action, pct, finish, speed = prog.groups()
            current.action = "recover" if action == "recovery" else action
            current.progress_pct = float(pct)
            current.finish_min = float(finish) if finish else None
            current.speed_kib_s = float(speed) if speed else None
            continue
        pending = _PENDING_RE.search(line)
        if pending:
            current.action = "recover" if pending.group(1) == "recovery" else pending.group(1)
            continue
        if "bitmap:" in line or "chunk" in line or "super" in line:
            continue
    if current is not None and not status_seen:
        raise ParseError(f"{source}: array {current.name} has no status line (truncated?)")
    return arrays


def read_md_arrays(
    mdstat: str | os.PathLike[str] = "/proc/mdstat",
    sys_block: str | os.PathLike[str] = "/sys/block",
) -> list[MdArray]:
    """Arrays of this host; sync_action from sysfs wins over mdstat. [] without md."""
    path = Path(mdstat)
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    arrays = parse_mdstat(text, str(path))
    for array in arrays:
        action = Path(sys_block) / array.name / "md" / "sync_action"
        try:
            value = action.read_text().strip()
        except OSError:
            continue
        if value:
            array.action = "recover" if value == "recovery" else value
    return arrays


def member_devices(device: str, sys_block: str | os.PathLike[str] = "/sys/block") -> list[str]:
    """The devices under `device` (md or dm members, recursively), [] for a plain device."""
    slaves = Path(sys_block) / device / "slaves"
    try:
        names = sorted(p.name for p in slaves.iterdir())
    except OSError:
        return []
    out: list[str] = []
    for name in names:
        below = member_devices(name, sys_block)
        out.extend(below or [name])
    return out

"""iostat: extended device statistics, captured as JSON where sysstat has it, parsed by name.

`iostat -x -y -t -k -o JSON INTERVAL` (sysstat >= 11.5) or its text form. Columns are selected
by their header names, whatever the version calls them: `aqu-sz` (sysstat >= 12) or
`avgqu-sz`, `%util` (text) or `util` (JSON keys carry no `%`), `r_await` or only `await`
(before sysstat 9.1.4), `rkB/s` or `rsec/s` (sectors without -k) or `rMB/s`; `svctm`, gone
since 12.x, is never needed. Timestamps (`-t`) are read in ISO 8601 (we run iostat with
S_TIME_FORMAT=ISO) or in the locale's `MM/DD/YY HH:MM:SS [AM|PM]` forms.

A sample is one device's line of one interval, reported at the interval's end.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shutil
import signal
import subprocess
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from benchfs.errors import DiagnoseError, ParseError

__all__ = [
    "Capture",
    "DeviceStats",
    "Sample",
    "capture",
    "iostat_command",
    "iostat_env",
    "parse_iostat",
    "read_iostat",
    "summarize",
]

METRICS = ("r_s", "w_s", "rkB_s", "wkB_s", "r_await", "w_await", "aqu_sz", "util")
"""The figures kept per sample (names without '/', '%' or '-')."""
REQUIRED = ("r_s", "r_await", "aqu_sz", "util")

# Column or key name (lower case, '%' and a trailing ':' removed) -> (metric, factor).
_COLUMNS: dict[str, tuple[str, float]] = {
    "device": ("device", 1.0),
    "disk_device": ("device", 1.0),
    "r/s": ("r_s", 1.0),
    "w/s": ("w_s", 1.0),
    "rkb/s": ("rkB_s", 1.0),
    "wkb/s": ("wkB_s", 1.0),
    "rmb/s": ("rkB_s", 1024.0),
    "wmb/s": ("wkB_s", 1024.0),
    "rsec/s": ("rkB_s", 0.5),
    "wsec/s": ("wkB_s", 0.5),
    "r_await": ("r_await", 1.0),
    "w_await": ("w_await", 1.0),
    "await": ("await", 1.0),
    "aqu-sz": ("aqu_sz", 1.0),
    "avgqu-sz": ("aqu_sz", 1.0),
    "util": ("util", 1.0),
}

_TIME_FORMATS = (
    "%Y-%m-%dT%H:%M:%S%z",
    "%Y-%m-%dT%H:%M:%S",
    "%m/%d/%y %H:%M:%S",
    "%m/%d/%Y %H:%M:%S",
    "%m/%d/%y %I:%M:%S %p",
    "%m/%d/%Y %I:%M:%S %p",
    "%d/%m/%y %H:%M:%S",
)
_TIME_RE = re.compile(
    r"^\s*(\d{4}-\d\d-\d\dT[\d:]+(?:[+-]\d{4}|Z)?|\d\d/\d\d/\d{2,4} [\d:]+(?: [AP]M)?)\s*$"
)


@dataclass(frozen=True)
class Sample:
    """One device in one interval; `t` is the interval's end (Unix seconds), None without -t."""

    t: float | None
    device: str
    values: Mapping[str, float]

    def get(self, metric: str) -> float:
        return float(self.values.get(metric, 0.0))


def _parse_time(text: str) -> float | None:
    text = text.strip().replace("Z", "+0000")
    for fmt in _TIME_FORMATS:
        try:
            return datetime.strptime(text, fmt).timestamp()  # naive: local time, as iostat
        except ValueError:
            continue
    return None


def _column(name: str) -> tuple[str, float] | None:
    key = name.strip().lower().rstrip(":").replace("%", "")
    return _COLUMNS.get(key)


def _finish(values: dict[str, float], where: str) -> dict[str, float]:
    if "r_await" not in values and "await" in values:
        values["r_await"] = values["await"]
        values.setdefault("w_await", values["await"])
    missing = [m for m in REQUIRED if m not in values]
    if missing:
        raise ParseError(f"{where}: no {', '.join(missing)} column (is this `iostat -x`?)")
    values.pop("await", None)
    for m in METRICS:
        values.setdefault(m, 0.0)
    return values


def _number(raw: Any, where: str, name: str) -> float:
    try:
        value = float(str(raw).replace(",", "."))
    except ValueError as e:
        raise ParseError(f"{where}: {name} = {raw!r} is not a number") from e
    if not math.isfinite(value):
        raise ParseError(f"{where}: {name} = {raw!r} is not a finite number")
    return value


def _parse_json(text: str, source: str, partial: bool) -> list[Sample]:
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        if not partial:
            raise ParseError(
                f"{source}: truncated or malformed iostat JSON ({e}); it ends {text[-80:]!r}"
            ) from e
        stats = _salvage_statistics(text, source)
    else:
        try:
            hosts = doc["sysstat"]["hosts"]
            stats = hosts[0]["statistics"]
        except (KeyError, IndexError, TypeError) as e:
            raise ParseError(f"{source}: not iostat JSON (no sysstat.hosts[0].statistics)") from e
    if not isinstance(stats, list):
        raise ParseError(f"{source}: iostat JSON statistics is not a list")
    samples: list[Sample] = []
    for i, entry in enumerate(stats):
        where = f"{source}: statistics[{i}]"
        if not isinstance(entry, Mapping):
            raise ParseError(f"{where} is not an object")
        stamp = entry.get("timestamp")
        t = _parse_time(stamp) if isinstance(stamp, str) else None
        if isinstance(stamp, str) and t is None:
            raise ParseError(f"{where}: unreadable timestamp {stamp!r}")
        disks = entry.get("disk", [])
        if not isinstance(disks, list):
            raise ParseError(f"{where}.disk is not a list")
        for j, disk in enumerate(disks):
            dwhere = f"{where}.disk[{j}]"
            if not isinstance(disk, Mapping):
                raise ParseError(f"{dwhere} is not an object")
            device: str | None = None
            values: dict[str, float] = {}
            for key, raw in disk.items():
                col = _column(key)
                if col is None:
                    continue
                metric, factor = col
                if metric == "device":
                    device = str(raw)
                else:
                    values[metric] = _number(raw, dwhere, key) * factor
            if not device:
                raise ParseError(f"{dwhere}: no disk_device")
            samples.append(Sample(t, device, _finish(values, dwhere)))
    return samples


def _salvage_statistics(text: str, source: str) -> list[Any]:
    """The complete entries of a JSON capture whose end is missing (iostat was killed)."""
    key = text.find('"statistics"')
    start = text.find("[", key) if key >= 0 else -1
    if start < 0:
        raise ParseError(f"{source}: truncated iostat JSON without any statistics")
    decoder = json.JSONDecoder()
    pos = start + 1
    found: list[Any] = []
    while True:
        while pos < len(text) and text[pos] in " \t\r\n,":
            pos += 1
        if pos >= len(text) or text[pos] != "{":
            return found
        try:
            value, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            return found
        found.append(value)


def _parse_text(text: str, source: str) -> list[Sample]:
    lines = text.splitlines()
    samples: list[Sample] = []
    t: float | None = None
    header: list[tuple[str, float] | None] | None = None
    saw_header = False
    for n, line in enumerate(lines, start=1):
        where = f"{source}:{n}"
        stripped = line.strip()
        if not stripped:
            header = None
            continue
        if _TIME_RE.match(stripped):
            t = _parse_time(stripped)
            continue
        first = stripped.split()[0]
        if first.lower().rstrip(":") == "device":
            header = [_column(c) for c in stripped.split()]
            saw_header = True
            continue
        if header is None:
            continue  # banner, avg-cpu block
        fields = stripped.split()
        if len(fields) != len(header):
            raise ParseError(
                f"{where}: {len(fields)} fields under a header of {len(header)} "
                f"(truncated or garbled line {stripped[:80]!r})"
            )
        values: dict[str, float] = {}
        device = ""
        for col, raw in zip(header, fields, strict=True):
            if col is None:
                continue
            metric, factor = col
            if metric == "device":
                device = raw
            else:
                values[metric] = _number(raw, where, metric) * factor
        samples.append(Sample(t, device, _finish(values, where)))
    if not saw_header:
        raise ParseError(f"{source}: no `Device` header line: not `iostat -x` output")
    return samples


def parse_iostat(text: str, source: str, partial: bool = False) -> list[Sample]:
    """Samples from `iostat -x` output, JSON or text. `partial` accepts a JSON capture whose
    end is missing (the complete intervals are returned); otherwise truncation is an error."""
    head = text.lstrip()
    if not head:
        raise ParseError(f"{source}: empty iostat output")
    if head.startswith("{"):
        return _parse_json(text, source, partial)
    return _parse_text(text, source)


def read_iostat(path: str | os.PathLike[str], partial: bool = False) -> list[Sample]:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8", errors="strict")
    except UnicodeDecodeError as e:
        raise ParseError(f"{p}: not text ({e})") from e
    return parse_iostat(text, str(p), partial)


@dataclass(frozen=True)
class DeviceStats:
    """One device over a window: r_await and w_await weighted by requests (total time over
    total requests, as over one long interval), the rest averaged over samples."""

    device: str
    samples: int
    r_s: float
    w_s: float
    rkB_s: float
    wkB_s: float
    r_await: float
    r_await_max: float
    w_await: float
    aqu_sz: float
    util: float

    def to_json(self) -> dict[str, Any]:
        return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in vars(self).items()}


def summarize(
    samples: Iterable[Sample],
    start: float | None = None,
    end: float | None = None,
    devices: Sequence[str] | None = None,
) -> dict[str, DeviceStats]:
    """Per device, the samples whose interval ended within (start, end] (all without times)."""
    chosen: dict[str, list[Sample]] = {}
    for s in samples:
        if devices is not None and s.device not in devices:
            continue
        if s.t is not None and (
            (start is not None and s.t <= start) or (end is not None and s.t > end)
        ):
            continue
        chosen.setdefault(s.device, []).append(s)
    out: dict[str, DeviceStats] = {}
    for device, group in chosen.items():
        n = len(group)

        def mean(metric: str, group: list[Sample] = group, n: int = n) -> float:
            return sum(s.get(metric) for s in group) / n

        def weighted(metric: str, weight: str, group: list[Sample] = group) -> float:
            total = sum(s.get(weight) for s in group)
            if total <= 0:
                return 0.0
            return sum(s.get(metric) * s.get(weight) for s in group) / total

        out[device] = DeviceStats(
            device=device,
            samples=n,
            r_s=mean("r_s"),
            w_s=mean("w_s"),
            rkB_s=mean("rkB_s"),
            wkB_s=mean("wkB_s"),
            r_await=weighted("r_await", "r_s"),
            r_await_max=max(s.get("r_await") for s in group),
            w_await=weighted("w_await", "w_s"),
            aqu_sz=mean("aqu_sz"),
            util=mean("util"),
        )
    return out


def find_iostat() -> str:
    found = shutil.which("iostat")
    if found is None:
        raise DiagnoseError("ENOENT", "iostat not found on PATH: install sysstat")
    return found


def iostat_command(
    interval_s: float = 1.0, devices: Sequence[str] = (), count: int | None = None
) -> list[str]:
    """`iostat -x -y -t -k -o JSON INTERVAL [COUNT] [DEVICES]` (whole seconds, at least 1)."""
    argv = [find_iostat(), "-x", "-y", "-t", "-k", "-o", "JSON", str(max(1, round(interval_s)))]
    if count is not None:
        argv.append(str(count))
    return argv + list(devices)


def iostat_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment for iostat: ISO 8601 timestamps, C locale numbers."""
    env = dict(os.environ if base is None else base)
    env["S_TIME_FORMAT"] = "ISO"
    env["LC_ALL"] = "C"
    return env


class Capture:
    """iostat running into a file until `stop` (SIGINT, so that it closes its JSON)."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        devices: Sequence[str] = (),
        interval_s: float = 1.0,
        prefix: Sequence[str] = (),
    ) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.argv = [*prefix, *iostat_command(interval_s, devices)]
        with open(self.path, "wb") as out:
            self.proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=iostat_env(),
                start_new_session=True,
            )

    def stop(self, grace_s: float = 5.0) -> int:
        """Stop iostat; return its exit status (0 when it closed its output cleanly)."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGINT)
            try:
                self.proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        return self.proc.returncode

    def samples(self) -> list[Sample]:
        return read_iostat(self.path, partial=True)

    def __enter__(self) -> Capture:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def capture(
    path: str | os.PathLike[str],
    devices: Sequence[str] = (),
    interval_s: float = 1.0,
    prefix: Sequence[str] = (),
) -> Iterator[Capture]:
    """Capture iostat into `path` while the block runs (for `benchfs-run`: one per node into
    `RunDir.iostat_capture(node)`, with the node's devices and prefix)."""
    cap = Capture(path, devices, interval_s, prefix)
    try:
        yield cap
    finally:
        cap.stop()

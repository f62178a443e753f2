"""Block I/O latency from the kernel: bpftrace on the block tracepoints, per device, per second.

What bcc's `biolatency -D` (issue to complete) and `-Q` (queued to complete) show, with
Debian's bpftrace and tracepoints only (no kprobes), as log2 histograms in microseconds:

- `device`: `block_rq_issue` to `block_rq_complete`, the time the driver and the device took;
- `block`: `block_io_start` to `block_io_done` (Linux >= 6.5), the whole time in the block layer,
  queueing included. `block_rq_insert` would miss requests issued directly, as loop devices
  issue theirs; `block_io_start` sees every request.

Histograms are kept per device, direction (from the request's rwbs flags: read, write, other
for flushes and discards) and size class: `small` is 128 KiB or less, the largest request a
FUSE file system serves whole, so a share of I/Os means the same above and below FUSE. Every
second the tracer prints them as JSON and clears them, so a capture is a time series (a heat
map per device) as well as a distribution. One tracer per host sees every device of it.

Tracing needs root, tracefs (`mount -t tracefs nodev /sys/kernel/tracing`) and bpftrace;
`unavailable()` says in one line what is missing. Requests are matched by device and sector,
as biolatency's tracepoint variant does: a request that completes in pieces counts once.

`slow_mode` finds a second, slow mode in one histogram (a device whose minority of I/Os takes
milliseconds while the rest take microseconds: the mean hides it, the distribution does not).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchfs.errors import ParseError
from benchfs.probes import bpftrace

__all__ = [
    "MEASURES",
    "SMALL_BYTES",
    "Capture",
    "Histogram",
    "Mode",
    "Sample",
    "bpftrace_program",
    "merge",
    "parse_capture",
    "read_capture",
    "slow_mode",
    "unavailable",
]

SMALL_BYTES = 128 * 1024
"""I/Os of at most this many bytes are `small`: FUSE serves them as one request."""
MEASURES = {
    "device": ("block_rq_issue", "block_rq_complete"),
    "block": ("block_io_start", "block_io_done"),
}
"""Each measure's start and end tracepoints (category block)."""


def _tracepoint(name: str) -> Path:
    return bpftrace.TRACEFS / "events" / "block" / name


def unavailable() -> str | None:
    """Why block tracing cannot run here (one line), or None when it can."""
    why = bpftrace.unavailable()
    if why is not None:
        return why
    start, end = MEASURES["device"]
    if not (_tracepoint(start).is_dir() and _tracepoint(end).is_dir()):
        return f"kernel tracing unavailable: no block:{start} tracepoint in this kernel"
    return None


def measures_here() -> list[str]:
    """The measures this kernel's tracepoints allow (`block` needs Linux >= 6.5)."""
    return [m for m, ends in MEASURES.items() if all(_tracepoint(e).is_dir() for e in ends)]


def bpftrace_program(measures: Sequence[str] = tuple(MEASURES), interval_s: int = 1) -> str:
    """The bpftrace program: per measure a start map keyed by (device, sector) and a log2
    histogram keyed by (device, rwbs, small); every `interval_s` a line with the wall clock,
    then the histograms, cleared. END prints the last partial interval the same way."""
    small_sectors = SMALL_BYTES // 512
    lines = []
    flush = []
    for m in measures:
        start, end = MEASURES[m]
        lines += [
            f"tracepoint:block:{start} {{ @{m}_t[args->dev, args->sector] = nsecs; }}",
            f"tracepoint:block:{end} /@{m}_t[args->dev, args->sector]/ {{",
            f"  @{m}[args->dev, args->rwbs, args->nr_sector <= {small_sectors}] =",
            f"    hist((nsecs - @{m}_t[args->dev, args->sector]) / 1000);",
            f"  delete(@{m}_t[args->dev, args->sector]);",
            "}",
        ]
        flush += [f"print(@{m});", f"clear(@{m});"]
    tick = 'printf("{\\"tick\\": \\"%s\\"}\\n", strftime("%s.%f", nsecs));'
    lines.append(f"interval:s:{interval_s} {{ {tick} {' '.join(flush)} }}")
    cleanup = " ".join(f"clear(@{m}_t);" for m in measures)
    lines.append(f"END {{ {tick} {' '.join(flush)} {cleanup} }}")
    return "\n".join(lines) + "\n"


def device_names() -> dict[str, str]:
    """The kernel's device numbers (MAJOR << 20 | MINOR, as tracepoints give them) of this
    host's block devices, to their names."""
    out = {}
    base = Path("/sys/class/block")
    with contextlib.suppress(OSError):
        for entry in base.iterdir():
            with contextlib.suppress(OSError, ValueError):
                major, minor = (entry / "dev").read_text().strip().split(":")
                out[str(int(major) << 20 | int(minor))] = entry.name
    return out


class Capture(bpftrace.Capture):
    """The block latency tracer into a file until `stop`; the file ends with this host's
    device names, so it can be read anywhere later."""

    def __init__(self, path: str | os.PathLike[str], interval_s: int = 1) -> None:
        super().__init__(path, bpftrace_program(measures_here(), interval_s))

    def stop(self, grace_s: float = 10.0) -> int:
        status = super().stop(grace_s)
        with open(self.path, "a") as out:
            out.write(json.dumps({"type": "devices", "data": device_names()}) + "\n")
        return status


@dataclass(frozen=True)
class Sample:
    """One histogram of one interval: a device, a measure, a direction, a size class."""

    time: float
    """The interval's end, seconds since the epoch."""
    device: str
    measure: str
    op: str
    """read, write or other (flushes, discards)."""
    small: bool
    buckets: tuple[tuple[int, int, int], ...]
    """(lowest us, highest us, count), ascending."""


def _op(rwbs: str) -> str:
    return "read" if "R" in rwbs else "write" if "W" in rwbs else "other"


def read_capture(path: str | os.PathLike[str]) -> tuple[list[Sample], dict[str, Any]]:
    """The samples of a capture file and what else it says (`tracer`: its cost,
    `bpftrace.Capture`); ParseError naming the file on a malformed line (a truncated last line
    is skipped)."""
    return parse_capture(bpftrace.read_lines(path), str(path))


def parse_capture(lines: Sequence[str], p: str) -> tuple[list[Sample], dict[str, Any]]:
    """`read_capture` of lines read from `p`."""
    names = None
    raw: list[tuple[float, str, str, str, bool, list[dict[str, int]]]] = []
    extra: dict[str, Any] = {}
    now = math.nan
    for number, kind, data in bpftrace.records(lines, p):
        try:
            if kind == "printf":
                now = float(json.loads(data)["tick"])
            elif kind == "hist":
                for name, per_key in data.items():
                    measure = name.lstrip("@")
                    if measure not in MEASURES:
                        continue
                    for key, buckets in per_key.items():
                        dev, rwbs, small = key.rsplit(",", 2)
                        raw.append((now, dev, measure, rwbs, small == "1", buckets))
            elif kind == "devices":
                names = dict(data)
            elif kind == bpftrace.COST:
                extra[bpftrace.COST] = data
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise ParseError(f"{p}:{number}: unexpected {kind} record ({e})") from e
    names = names if names is not None else device_names()
    samples = []
    for t, dev, measure, rwbs, small, buckets in raw:
        try:
            parsed = tuple(
                (int(b["min"]), int(b["max"]), int(b["count"])) for b in buckets if b["count"]
            )
        except (KeyError, TypeError, ValueError) as e:
            raise ParseError(f"{p}: a histogram bucket without min, max and count ({e})") from e
        name = names.get(dev) or f"{int(dev) >> 20}:{int(dev) & 0xFFFFF}"
        samples.append(Sample(t, name, measure, _op(rwbs), small, parsed))
    return samples, extra


@dataclass(frozen=True)
class Histogram:
    """Log2 buckets of microseconds: counts[i] holds latencies in [2^i, 2^(i+1)) us (i = 0
    holds 0 and 1 us)."""

    counts: tuple[int, ...]

    @staticmethod
    def of(buckets: Iterable[tuple[int, int, int]]) -> Histogram:
        counts: list[int] = []
        for lo, _hi, count in buckets:
            i = max(lo, 1).bit_length() - 1
            counts.extend([0] * (i + 1 - len(counts)))
            counts[i] += count
        return Histogram(tuple(counts))

    @staticmethod
    def from_json(doc: Sequence[Sequence[int]]) -> Histogram:
        return Histogram.of((int(lo), int(hi), int(c)) for lo, hi, c in doc)

    def to_json(self) -> list[list[int]]:
        """[[lowest us, highest us, count], ...] of the non-empty buckets."""
        return [[lo, hi, c] for lo, hi, c in self.buckets() if c]

    def buckets(self) -> list[tuple[int, int, int]]:
        return [(bucket_lo(i), bucket_hi(i), c) for i, c in enumerate(self.counts)]

    @property
    def total(self) -> int:
        return sum(self.counts)

    def __add__(self, other: Histogram) -> Histogram:
        n = max(len(self.counts), len(other.counts))
        a = self.counts + (0,) * (n - len(self.counts))
        b = other.counts + (0,) * (n - len(other.counts))
        return Histogram(tuple(x + y for x, y in zip(a, b, strict=True)))

    def share_from(self, us: int) -> float:
        """Share of the I/Os in buckets starting at `us` or above."""
        total = self.total
        return sum(c for lo, _, c in self.buckets() if lo >= us) / total if total else 0.0

    def mean_us(self) -> float:
        """Mean estimated at each bucket's middle (geometric), as far as log2 buckets allow."""
        total = self.total
        if not total:
            return math.nan
        return sum(c * math.sqrt(max(lo, 1) * (hi + 1)) for lo, hi, c in self.buckets()) / total


def bucket_lo(i: int) -> int:
    return 0 if i == 0 else 1 << i


def bucket_hi(i: int) -> int:
    return (1 << (i + 1)) - 1


def merge(
    samples: Iterable[Sample],
    start: float = -math.inf,
    end: float = math.inf,
    measure: str = "device",
    op: str | None = None,
    small: bool | None = None,
    devices: Iterable[str] | None = None,
) -> dict[str, Histogram]:
    """Per device, the sum of the intervals ending in [start, end] of one measure (of one
    direction and size class when given)."""
    wanted = None if devices is None else set(devices)
    out: dict[str, Histogram] = {}
    for s in samples:
        if s.measure != measure or not start <= s.time <= end:
            continue
        if (op is not None and s.op != op) or (small is not None and s.small != small):
            continue
        if wanted is not None and s.device not in wanted:
            continue
        h = Histogram.of(s.buckets)
        out[s.device] = out[s.device] + h if s.device in out else h
    return out


@dataclass(frozen=True)
class Mode:
    """A second, slow mode of a latency histogram: its share of the I/Os and its range, and the
    main mode's range, in microseconds."""

    share: float
    lo_us: int
    hi_us: int
    count: int
    total: int
    main_lo_us: int
    main_hi_us: int

    def describe(self) -> str:
        return (
            f"{self.share:.1%} of {self.total} I/Os at {_us(self.lo_us)}-{_us(self.hi_us + 1)} "
            f"(the rest around {_us(self.main_lo_us)}-{_us(self.main_hi_us + 1)})"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "share": round(self.share, 4),
            "lo_us": self.lo_us,
            "hi_us": self.hi_us,
            "count": self.count,
            "total": self.total,
            "main_lo_us": self.main_lo_us,
            "main_hi_us": self.main_hi_us,
        }


def _us(us: int) -> str:
    return f"{us / 1000:g} ms" if us >= 1000 else f"{us} us"


def slow_mode(
    h: Histogram, gap: float = 8.0, floor_us: int = 2000, min_count: int = 5
) -> Mode | None:
    """The slow mode of `h`, if it has one: above the main (most populated) bucket, a bucket
    at least `gap` times slower and at or above `floor_us`, holding at least `min_count` I/Os
    and at least twice the emptiest bucket between the two (a valley: two populations, not
    one tail that thins out). The mode is every I/O above that valley."""
    counts = h.counts
    if not counts or h.total == 0:
        return None
    main = max(range(len(counts)), key=lambda i: (counts[i], -i))
    best = None
    for q in range(main + 2, len(counts)):
        if bucket_lo(q) < max(floor_us, gap * bucket_lo(main)) or counts[q] < min_count:
            continue
        between = range(main + 1, q)
        valley = min(between, key=lambda i: (counts[i], -i))
        if counts[q] >= 2 * counts[valley]:
            best = (q, valley)
            break
    if best is None:
        return None
    _q, valley = best
    slow = [(i, c) for i, c in enumerate(counts) if i > valley and c]
    count = sum(c for _, c in slow)
    return Mode(
        share=count / h.total,
        lo_us=bucket_lo(slow[0][0]),
        hi_us=bucket_hi(slow[-1][0]),
        count=count,
        total=h.total,
        main_lo_us=bucket_lo(main),
        main_hi_us=bucket_hi(main),
    )


def histograms_json(hists: Mapping[str, Histogram]) -> dict[str, list[list[int]]]:
    return {d: h.to_json() for d, h in sorted(hists.items())}

"""The whole-path benchmark's view of server telemetry: what happened between two snapshots.

Servers write cumulative snapshots (docs/telemetry.md), one file per worker; this module loads
them with `benchfs.telemetry.load`, waits for a snapshot taken after a given moment, and turns
the difference of two such states into the figures the depth report needs.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from benchfs import telemetry
from benchfs.bench.stats import Bucket, histogram_mean, histogram_quantile, histogram_share
from benchfs.errors import BenchError

__all__ = ["Snapshot", "Window", "load_snapshots", "window"]

POLL_S = 0.1
HistKey = tuple[str, str | None]


@dataclass
class Snapshot:
    """One server's cumulative histograms at its workers' latest snapshots, summed over workers."""

    t_ns: dict[Any, int] = field(default_factory=dict)
    buckets: dict[HistKey, dict[int, int]] = field(default_factory=dict)
    sums: dict[HistKey, int] = field(default_factory=dict)
    bounds: dict[int, tuple[int, int]] = field(default_factory=dict)
    """Smallest and largest value (inclusive) of each bucket index seen."""


@dataclass(frozen=True)
class Window:
    """What the server's device saw between two snapshots (read operations only)."""

    mean_inflight: float
    share_depth1: float
    device_ops: int
    device_mean_us: float
    device_p50_us: float
    total_p50_us: float
    total_p99_us: float
    total_mean_us: float = 0.0
    queue_wait_mean_us: float = 0.0
    """Mean wait between a request's arrival and its submission (for a service slot, a buffer)."""


def _state(directory: Path, after_ns: int) -> Snapshot | None:
    """The latest state of every worker, if each has a snapshot at or after `after_ns`."""
    try:
        tel = telemetry.load(directory)
    except FileNotFoundError:
        return None  # no worker has created its file yet
    except ValueError as e:
        raise BenchError("EIO", f"telemetry in {directory}: {e}") from e
    if len(tel.counters) == 0:
        return None
    writers = ["server", "worker"]
    times = tel.counters.groupby(writers, observed=True)["t"].max()
    times_ns = pd.DatetimeIndex(times).asi8
    if times_ns.min() < after_ns:
        return None
    snap = Snapshot(t_ns={k: int(v) for k, v in zip(times.index, times_ns, strict=True)})
    hist = tel.latest_histograms()
    merged = hist.groupby(["metric", "op", "bucket", "bucket_lo", "bucket_hi"], observed=True)
    buckets: dict[HistKey, dict[int, int]] = defaultdict(dict)
    for (metric, op, bucket, lo, hi), count in merged["count"].sum().items():
        buckets[(str(metric), str(op) or None)][int(bucket)] = int(count)
        snap.bounds[int(bucket)] = (int(lo), int(hi))
    snap.buckets = dict(buckets)
    counters = tel.latest_counters()
    sums = counters[counters["metric"].astype(str).str.endswith(".sum")]
    for (metric, op), total in sums.groupby(["metric", "op"], observed=True)["value"].sum().items():
        snap.sums[(str(metric).removesuffix(".sum"), str(op) or None)] = int(total)
    return snap


def load_snapshots(directory: Path, after: float, timeout_s: float) -> Snapshot:
    """Wait until every worker has written a snapshot at or after `after` (Unix seconds)."""
    deadline = time.monotonic() + timeout_s
    after_ns = int(after * 1e9)
    while True:
        snap = _state(directory, after_ns)
        if snap is not None:
            return snap
        if time.monotonic() >= deadline:
            raise BenchError(
                "ETIMEDOUT",
                f"no telemetry snapshot in {directory} within {timeout_s:g} s "
                "(is telemetry.dir honoured and telemetry.interval_ms short enough?)",
            )
        time.sleep(POLL_S)


def _delta(before: Snapshot, after: Snapshot, key: HistKey) -> list[Bucket]:
    old = before.buckets.get(key, {})
    found = []
    for index, count in after.buckets.get(key, {}).items():
        diff = count - old.get(index, 0)
        if diff > 0:
            lo, hi = after.bounds[index]
            found.append(Bucket(lo, hi, diff))
    if not found:
        raise BenchError(
            "EIO", f"telemetry recorded no {key[0]}{f' ({key[1]})' if key[1] else ''} values"
        )
    return found


def _quantile_us(buckets: list[Bucket], q: float) -> float:
    """Quantile of a nanosecond histogram in µs, interpolated over each bucket's whole width."""
    widened = [Bucket(b.lo, b.hi + 1, b.count) if b.hi > b.lo else b for b in buckets]
    return histogram_quantile(widened, q) / 1000


def _mean_us(before: Snapshot, after: Snapshot, key: HistKey, count: int) -> float:
    """Mean of a nanosecond histogram over the window, in µs, from its sum (0 if it has none)."""
    total = after.sums.get(key, 0) - before.sums.get(key, 0)
    return total / count / 1000 if count and total > 0 else 0.0


def window(before: Snapshot, after: Snapshot) -> Window:
    """The difference of two cumulative states, as depth figures for read operations."""
    inflight = _delta(before, after, ("inflight_at_submit", None))
    device = _delta(before, after, ("device_ns", "read"))
    total = _delta(before, after, ("total_ns", "read"))
    device_ops = int(sum(b.count for b in device))
    key = ("device_ns", "read")
    device_sum = after.sums.get(key, 0) - before.sums.get(key, 0)
    depth_key = ("inflight_at_submit", None)
    depth_sum = after.sums.get(depth_key, 0) - before.sums.get(depth_key, 0)
    submits = sum(b.count for b in inflight)
    return Window(
        # Exact from the histogram's sum where it has one, else from the bucket midpoints.
        mean_inflight=depth_sum / submits if depth_sum > 0 else histogram_mean(inflight),
        share_depth1=histogram_share(inflight, 1, 1),
        device_ops=device_ops,
        device_mean_us=(device_sum / device_ops / 1000)
        if device_sum > 0
        else histogram_mean(device) / 1000,
        device_p50_us=_quantile_us(device, 0.5),
        total_p50_us=_quantile_us(total, 0.5),
        total_p99_us=_quantile_us(total, 0.99),
        total_mean_us=_mean_us(
            before, after, ("total_ns", "read"), int(sum(b.count for b in total))
        ),
        queue_wait_mean_us=_mean_us(before, after, ("queue_wait_ns", "read"), device_ops),
    )

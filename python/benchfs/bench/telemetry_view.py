"""The benchmarks' view of server telemetry: what happened between two snapshots.

Servers write cumulative snapshots (docs/telemetry.md), one file per worker; this module loads
them with `benchfs.telemetry.load`, waits for a snapshot taken after a given moment, and turns
the difference of two states into figures: the depth report of the whole-path benchmark
(`window`) and one op's throughput and times in the rpc benchmark (`op_window`).
"""

from __future__ import annotations

import dataclasses
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from benchfs import telemetry
from benchfs.bench.stats import Bucket, histogram_mean, histogram_share
from benchfs.errors import BenchError
from benchfs.units import MIB

__all__ = [
    "OpWindow",
    "Snapshot",
    "Window",
    "load_snapshots",
    "op_window",
    "wait_telemetry",
    "window",
]

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


def wait_telemetry(directory: Path, after: float, timeout_s: float) -> telemetry.Telemetry:
    """The servers' telemetry once every worker has a snapshot at or after `after` (Unix s)."""
    deadline = time.monotonic() + timeout_s
    after_ns = int(after * 1e9)
    while True:
        try:
            tel: telemetry.Telemetry | None = telemetry.load(directory)
        except FileNotFoundError:
            tel = None  # no worker has created its file yet
        except ValueError as e:
            raise BenchError("EIO", f"telemetry in {directory}: {e}") from e
        if tel is not None and len(tel.counters):
            last = tel.counters.groupby(["server", "worker"], observed=True)["t"].max()
            if pd.DatetimeIndex(last).asi8.min() >= after_ns:
                return tel
        if time.monotonic() >= deadline:
            raise BenchError(
                "ETIMEDOUT",
                f"no telemetry snapshot in {directory} within {timeout_s:g} s "
                "(is telemetry.dir honoured and telemetry.interval_ms short enough?)",
            )
        time.sleep(POLL_S)


def load_snapshots(directory: Path, after: float, timeout_s: float) -> Snapshot:
    """Every worker's latest state, once each has a snapshot at or after `after` (Unix s),
    summed over workers."""
    tel = wait_telemetry(directory, after, timeout_s)
    times = tel.counters.groupby(["server", "worker"], observed=True)["t"].max()
    times_ns = pd.DatetimeIndex(times).asi8
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
    """Quantile of a nanosecond histogram over a window, in µs, by the one rule that Rust and
    `benchfs-analyze` use (`telemetry.bucket_quantile`; the window has no exact extremes)."""
    ordered = sorted(buckets, key=lambda b: b.lo)
    lo, hi, counts = ([getattr(b, f) for b in ordered] for f in ("lo", "hi", "count"))
    return telemetry.bucket_quantile(lo, hi, counts, q) / 1000


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


@dataclass(frozen=True)
class OpWindow:
    """What the servers did for one op between two snapshots of each worker (telemetry)."""

    seconds: float
    bytes: int
    ops: int
    mib_s: float
    p50_us: float
    p99_us: float
    mean_us: float
    device_p50_us: float
    queue_wait_p50_us: float
    errors: int
    rejected_busy: int
    pool_waits: int

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


HISTOGRAMS = {"total": "total_ns", "device": "device_ns", "queue_wait": "queue_wait_ns"}


def op_window(
    tel: telemetry.Telemetry, start: float, end: float, op: str, enclose: bool
) -> OpWindow:
    """The servers' work on `op` ("write", "read", "meta") between `start` and `end`.

    Each server worker's window is bounded by two of its snapshots: with `enclose`, the last at
    or before `start` (none: its start, when all was zero) and the first at or after `end`, so
    that everything between the two moments is counted; without, the first at or after `start`
    and the last at or before `end`, so that only the time in between is (a steady part of a
    load). Counters and histograms are differenced between the two; the throughput is the sum
    over workers of bytes / time between their snapshots.
    """
    c, h = tel.counters, tel.histograms
    if len(c) == 0:
        raise BenchError("EIO", "telemetry holds no snapshot")
    c_t, h_t = pd.DatetimeIndex(c["t"]).asi8, pd.DatetimeIndex(h["t"]).asi8
    c_server, c_worker = c["server"].to_numpy(), c["worker"].to_numpy()
    c_name = c["metric"].astype(str).to_numpy() + "/" + c["op"].astype(str).to_numpy()
    c_value = c["value"].to_numpy()
    h_server, h_worker = h["server"].to_numpy(), h["worker"].to_numpy()
    h_metric, h_op = h["metric"].astype(str).to_numpy(), h["op"].astype(str).to_numpy()
    start_ns, end_ns = int(start * 1e9), int(end * 1e9)
    names = {
        "bytes": f"bytes/{op}",
        "ops": f"ops/{op}",
        "errors": f"errors/{op}",
        "sum": f"total_ns.sum/{op}",
        "rejected_busy": "rejected_busy/",
        "pool_waits": "pool_waits/",
    }
    totals = dict.fromkeys(names, 0)
    rate = 0.0
    spans: list[float] = []
    buckets: dict[str, dict[int, list[int]]] = {k: {} for k in HISTOGRAMS}
    for server, worker in sorted(set(zip(c_server.tolist(), c_worker.tolist(), strict=True))):
        mine = (c_server == server) & (c_worker == worker)
        times = np.unique(c_t[mine])
        if enclose:
            before, after = times[times <= start_ns], times[times >= end_ns]
            t_a = int(before[-1]) if len(before) else None
            t_b = int(after[0]) if len(after) else None
        else:
            inside = times[(times >= start_ns) & (times <= end_ns)]
            t_a = int(inside[0]) if len(inside) >= 2 else None
            t_b = int(inside[-1]) if len(inside) >= 2 else None
        if t_b is None or (t_a is None and not enclose):
            raise BenchError(
                "EIO",
                f"telemetry of server {server} worker {worker} has no snapshots around the "
                f"{end - start:.2f} s measurement window",
            )
        at_b = mine & (c_t == t_b)
        at_a = mine & (c_t == t_a) if t_a is not None else np.zeros_like(mine)
        moved = 0
        for key, name in names.items():
            diff = int(c_value[at_b & (c_name == name)].sum())
            diff -= int(c_value[at_a & (c_name == name)].sum())
            totals[key] += diff
            moved = diff if key == "bytes" else moved
        span = (t_b - (t_a if t_a is not None else int(times[0]))) / 1e9
        spans.append(span)
        rate += moved / span if span > 0 else 0.0
        h_mine = (h_server == server) & (h_worker == worker) & (h_op == op)
        for key, metric in HISTOGRAMS.items():
            of_metric = h_mine & (h_metric == metric)
            for sign, t in ((1, t_b), (-1, t_a)):
                if t is None:
                    continue
                part = h[of_metric & (h_t == t)]
                for bucket, lo, hi, count in zip(
                    part["bucket"], part["bucket_lo"], part["bucket_hi"], part["count"], strict=True
                ):
                    entry = buckets[key].setdefault(int(bucket), [int(lo), int(hi), 0])
                    entry[2] += sign * int(count)
    found = {
        key: [Bucket(lo, hi, n) for lo, hi, n in b.values() if n > 0] for key, b in buckets.items()
    }
    if not found["total"] or totals["ops"] <= 0:
        raise BenchError("EIO", f"the servers recorded no {op} operations in the window")

    def q(key: str, quantile: float) -> float:
        return _quantile_us(found[key], quantile) if found[key] else 0.0

    return OpWindow(
        seconds=min(spans),
        bytes=totals["bytes"],
        ops=totals["ops"],
        mib_s=rate / MIB,
        p50_us=q("total", 0.5),
        p99_us=q("total", 0.99),
        mean_us=totals["sum"] / totals["ops"] / 1000 if totals["sum"] > 0 else 0.0,
        device_p50_us=q("device", 0.5),
        queue_wait_p50_us=q("queue_wait", 0.5),
        errors=totals["errors"],
        rejected_busy=totals["rejected_busy"],
        pool_waits=totals["pool_waits"],
    )

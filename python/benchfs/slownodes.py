"""The judgment of a run: which nodes slowed it, since when, and their share of its delay.

One method, used by both `benchfs-analyze` (the `slow_nodes` table and insight BFS-003) and
`benchfs-diagnose judge` (which adds the device, the kind and the exclusion list), under the
`[diagnose]` thresholds (docs/diagnose.md, "Judging a run"):

- Latency per node and op (read, write): the servers' service time, their `total_ns`
  histograms (arrival to reply ready) less `queue_wait_ns` (arrival to the storage operation's
  start), sum / count, over the run and per telemetry interval, all servers of a node summed.
  The wait in a server's queue is the load its clients put on it, not its slowness: a node
  whose clients keep more requests in flight (writes behind, deeper windows) queues them
  longer on the same device, and is not judged slow for that. A node is judged on an op only
  with at least `min_ops` of them.
- Outliers: the peer rule (`benchfs.peers.outliers`) on the nodes' mean op time.
- Onset: the one change point of the node's per-interval mean (log scale, least squares); the
  latency rose there when the level after is `rise_ratio` times the level before, otherwise
  the node was slow from the start.
- Agreement: one high mean may be one bad second. An outlier is slow when it was also slower
  than the other nodes (by `min_worse`, against their median in the same interval) in at
  least `persist_share` of its intervals since the onset, or when it is overwhelming
  (`overwhelming_ratio` times the reference), and it cost the run at least `min_delay_s` of
  server time (below). Otherwise it is reported, not judged slow.
- Delay: a node's excess time = ops x (its mean - the median of the nodes' means), in seconds;
  its share is its part of all nodes' excess.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from benchfs import telemetry
from benchfs.peers import MetricSpec, Thresholds, outliers

__all__ = ["COLUMNS", "OPS", "change_point", "judge_nodes", "node_series", "slow_node_names"]

OPS = ("read", "write")

COLUMNS = [
    "node",
    "op",
    "ops",
    "mean_ms",
    "reference_ms",
    "worse",
    "delay_s",
    "delay_share",
    "outlier",
    "slow",
    "grounds",
    "evidence",
    "onset_s",
    "onset_utc",
    "before_ms",
    "after_ms",
    "persist_pct",
    "how",
]


def node_series(tel: telemetry.Telemetry, op: str) -> pd.DataFrame:
    """Per node and telemetry interval: t (s since the first snapshot), ops, sum_ns (service
    time: total less queue wait), mean_ms.
    `attrs["t0_ns"]` is the first snapshot's wall-clock time."""
    r = tel.rates()
    metrics = ["total_ns.sum", "total_ns.count", "queue_wait_ns.sum"]
    r = r[(r["op"] == op) & r["metric"].isin(metrics)]
    if r.empty:
        return pd.DataFrame(columns=["node", "t", "ops", "sum_ns", "mean_ms"])
    t0 = pd.DatetimeIndex(r["t"]).asi8.min()
    dt = r["dt"].dropna()
    width = max(float(dt.median()) if len(dt) else 1.0, 0.1)
    r = r.assign(
        bin=((pd.DatetimeIndex(r["t"]).asi8 - t0) / 1e9 / width).round().astype(np.int64),
        metric=r["metric"].astype(str),
        node=r["node"].astype(str),
    )
    wide = r.pivot_table(
        index=["node", "bin"], columns="metric", values="delta", aggfunc="sum", fill_value=0
    ).reset_index()
    wide = wide.rename(columns={"total_ns.count": "ops", "total_ns.sum": "sum_ns"})
    if "queue_wait_ns.sum" in wide:  # service time: the queue's wait is not the server's
        wide["sum_ns"] = (wide["sum_ns"] - wide["queue_wait_ns.sum"]).clip(lower=0)
    wide.attrs["t0_ns"] = int(t0)
    wide["t"] = wide["bin"] * width
    with np.errstate(divide="ignore", invalid="ignore"):
        wide["mean_ms"] = np.where(wide["ops"] > 0, wide["sum_ns"] / wide["ops"] / 1e6, np.nan)
    return wide[["node", "t", "ops", "sum_ns", "mean_ms"]].sort_values(["node", "t"])


def change_point(t: Sequence[float], y: Sequence[float]) -> tuple[float, float, float] | None:
    """The single change in level of `y` (positive values) over `t`: (onset t, level before,
    level after), by least squares on log y; None with fewer than 4 points."""
    pts = [
        (a, b) for a, b in zip(t, y, strict=True) if b is not None and b > 0 and math.isfinite(b)
    ]
    if len(pts) < 4:
        return None
    ts = [a for a, _ in pts]
    ly = np.log([b for _, b in pts])
    best, best_k = math.inf, 0
    for k in range(1, len(ly)):
        left, right = ly[:k], ly[k:]
        cost = float(((left - left.mean()) ** 2).sum() + ((right - right.mean()) ** 2).sum())
        if cost < best:
            best, best_k = cost, k
    return ts[best_k], float(np.exp(ly[:best_k].mean())), float(np.exp(ly[best_k:].mean()))


def _persistence(series: pd.DataFrame, node: str, since: float, th: Thresholds) -> float | None:
    """The share of `node`'s intervals from `since` on in which its mean op time was at least
    min_worse above the median of the other nodes' means in the same interval (None: no
    interval to compare)."""
    busy = series[series["ops"] > 0]
    mine = busy[(busy["node"] == node) & (busy["t"] >= since)]
    others = busy[busy["node"] != node].groupby("t")["mean_ms"].median()
    compared = [(m, others[t]) for t, m in zip(mine["t"], mine["mean_ms"], strict=True)
                if t in others.index]  # fmt: skip
    if not compared:
        return None
    return sum(m >= (1 + th.min_worse) * ref for m, ref in compared) / len(compared)


def _judge_op(series: pd.DataFrame, op: str, th: Thresholds) -> list[dict[str, Any]]:
    totals = series.groupby("node").agg(ops=("ops", "sum"), sum_ns=("sum_ns", "sum"))
    totals = totals[totals["ops"] > 0]
    if totals.empty:
        return []
    means = (totals["sum_ns"] / totals["ops"] / 1e6).to_dict()
    judged = {n: m for n, m in means.items() if totals.loc[n, "ops"] >= th.min_ops}
    baseline = statistics.median(judged.values() if judged else means.values())
    excess = {n: max(0.0, means[n] - baseline) * float(totals.loc[n, "ops"]) / 1e3 for n in means}
    total_excess = sum(excess.values())
    spec = MetricSpec(f"{op}_mean_ms", f"server {op} service time", "ms", True)
    found = {o.key: o for o in outliers(judged, spec, th)}
    rows = []
    for n, mean in sorted(means.items()):
        row: dict[str, Any] = {
            "node": n,
            "op": op,
            "ops": int(totals.loc[n, "ops"]),
            "mean_ms": mean,
            "reference_ms": baseline,
            "worse": mean / baseline if baseline > 0 else math.nan,
            "delay_s": excess[n],
            "delay_share": excess[n] / total_excess if total_excess > 0 else 0.0,
            "outlier": n in found,
            "slow": False,
            "grounds": None,
            "evidence": None,
            "onset_s": math.nan,
            "onset_utc": None,
            "before_ms": math.nan,
            "after_ms": math.nan,
            "persist_pct": math.nan,
            "how": None,
        }
        if n not in judged:
            row["how"] = f"not judged: {row['ops']} {op}s (< min_ops {th.min_ops})"
        o = found.get(n)
        if o is not None:
            row["worse"], row["reference_ms"] = o.worse, o.reference
            row["evidence"] = o.evidence()
            mine = series[series["node"] == n]
            cp = change_point(mine["t"].tolist(), mine["mean_ms"].tolist())
            since = 0.0
            row["how"] = "slow from the start"
            if cp is not None and cp[2] >= th.rise_ratio * cp[1]:
                since = cp[0]
                at = pd.Timestamp(series.attrs["t0_ns"] + int(since * 1e9), tz="UTC")
                row.update(
                    onset_s=since,
                    onset_utc=at.isoformat(timespec="seconds"),
                    before_ms=cp[1],
                    after_ms=cp[2],
                    how=f"rose at t={since:.1f} s ({at.isoformat(timespec='seconds')}) from "
                    f"{cp[1]:.3g} to {cp[2]:.3g} ms",
                )
            persist = _persistence(series, n, since, th)
            row["persist_pct"] = math.nan if persist is None else 100.0 * persist
            if o.worse >= th.overwhelming_ratio:
                row["grounds"] = f"overwhelming ({o.worse:.1f}x >= {th.overwhelming_ratio:g}x)"
            elif persist is not None and persist >= th.persist_share:
                row["grounds"] = (
                    f"slower than the others in {persist:.0%} of its intervals since "
                    + ("the start" if since == 0.0 else "the onset")
                )
            else:
                row["how"] += (
                    "; not judged slow: slower than the others in only "
                    f"{0.0 if persist is None else persist:.0%} of its intervals "
                    f"(< persist_share {th.persist_share:g}) and not overwhelming"
                )
            if row["grounds"] is not None and excess[n] < th.min_delay_s:
                row["how"] += (
                    f"; not judged slow: it cost the run {excess[n] * 1e3:.3g} ms of server "
                    f"time (< min_delay_s {th.min_delay_s:g} s)"
                )
                row["grounds"] = None
            row["slow"] = row["grounds"] is not None
        rows.append(row)
    return rows


def judge_nodes(tel: telemetry.Telemetry, th: Thresholds) -> pd.DataFrame:
    """One row per node and op (`COLUMNS`), the slow ones first; `attrs["t0_ns"]` is the wall
    clock of t = 0 (None without server op telemetry)."""
    rows: list[dict[str, Any]] = []
    t0: int | None = None
    for op in OPS:
        series = node_series(tel, op)
        if series.empty or series["ops"].sum() == 0:
            continue
        t0 = series.attrs["t0_ns"] if t0 is None else min(t0, series.attrs["t0_ns"])
        rows += _judge_op(series, op, th)
    out = pd.DataFrame(rows, columns=COLUMNS)
    if not out.empty:
        out = out.sort_values(
            ["slow", "outlier", "delay_share"], ascending=False, ignore_index=True
        )
    out.attrs["t0_ns"] = t0
    return out


def slow_node_names(table: pd.DataFrame) -> list[str]:
    """The nodes judged slow on any op, most delay first."""
    slow = table[table["slow"]]
    return list(dict.fromkeys(slow.sort_values("delay_share", ascending=False)["node"]))

"""In-run judgment: from a run's server telemetry and iostat captures, which nodes were slow,
since when, on which device, what share of the run's delay they caused, and whether the
pre-run screen had flagged them (a slow node may pass a screen and slow down later).

- Latency per node and op: the servers' `total_ns` histograms (sum / count), overall and per
  telemetry interval (all workers of a node's servers summed).
- Slow nodes: the screen's outlier rule (`judge.outliers`) on each node's mean op time.
- Onset: the one change point of the node's per-interval mean (log scale, least squares);
  the latency "rose" there when the level after is `rise_ratio` times the level before,
  otherwise it was slow from the start.
- Share of delay: node i's excess time = ops_i x (mean_i - median over nodes of mean), the
  share is its part of the summed excess of all nodes.
- Device: the node's iostat capture (`RunDir.iostat_capture`): the device with the highest
  request-weighted r_await, and its ratio to the node's other devices.
"""

from __future__ import annotations

import csv
import io
import math
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from benchfs import telemetry
from benchfs.diagnose import history
from benchfs.diagnose.judge import (
    KIND_ABOVE,
    KIND_DEVICE,
    KIND_UNCLEAR,
    MetricSpec,
    Thresholds,
    exclusion_cap,
)
from benchfs.diagnose.judge import outliers as find_outliers
from benchfs.errors import DiagnoseError, ParseError
from benchfs.nodes import Exclusion, load_nodes, write_exclusions
from benchfs.probes import iostat
from benchfs.results import RunDir, read_json, write_json_atomic, write_text_atomic

__all__ = ["change_point", "judge_run", "node_series"]

OPS = ("read", "write")


def node_series(tel: telemetry.Telemetry, op: str) -> pd.DataFrame:
    """Per node and telemetry interval: t (s since the first snapshot), ops, sum_ns, mean_ms."""
    r = tel.rates()
    r = r[(r["op"] == op) & r["metric"].isin(["total_ns.sum", "total_ns.count"])]
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
    wide.attrs["t0_ns"] = int(t0)  # the first snapshot's wall-clock time
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


def _devices(run: RunDir, node: str) -> tuple[dict[str, Any] | None, str | None]:
    path = run.iostat_capture(node)
    if not path.exists():
        return None, None
    try:
        samples = iostat.read_iostat(path, partial=True)
    except ParseError as e:
        return None, str(e)
    stats = {d: s for d, s in iostat.summarize(samples).items() if s.r_s > 0 or s.w_s > 0}
    if not stats:
        return None, f"{path}: no device activity"
    worst = max(stats.values(), key=lambda s: s.r_await)
    others = [s.r_await for s in stats.values() if s.device != worst.device and s.r_s > 0]
    return {
        "device": worst.device,
        "r_await_ms": worst.r_await,
        "aqu_sz": worst.aqu_sz,
        "util_pct": worst.util,
        "twin_ratio": worst.r_await / max(min(others), 1e-3) if others else None,
        "devices": {d: s.to_json() for d, s in stats.items()},
    }, None


def _screen_flags(run: RunDir, screen: Path | None) -> dict[str, str] | None:
    path = screen or (run.prerun_screen if run.prerun_screen.exists() else None)
    if path is None:
        return None
    if path.is_dir():
        path = path / "screen.json"
    doc = read_json(path)
    out = {}
    for n in doc.get("nodes", []):
        status = n.get("verdict", {}).get("status", "ok")
        out[n.get("name") or n.get("host")] = status
        out.setdefault(n.get("host"), status)
    return out


def judge_run(run_dir: str | Path, th: Thresholds, screen: Path | None = None) -> dict[str, Any]:
    """Judge one results directory; writes `diagnose/judge.json` and `judge.csv` there."""
    run = RunDir(Path(run_dir))
    try:
        tel = telemetry.load(run.path)
    except FileNotFoundError as e:
        raise DiagnoseError("ENOENT", f"{run.path}: no telemetry to judge ({e})") from e
    except ValueError as e:
        raise DiagnoseError("EIO", str(e)) from e
    screened = _screen_flags(run, screen)
    nodes: dict[str, dict[str, Any]] = {}
    findings: list[dict[str, Any]] = []
    for op in OPS:
        series = node_series(tel, op)
        if series.empty or series["ops"].sum() == 0:
            continue
        totals = series.groupby("node").agg(ops=("ops", "sum"), sum_ns=("sum_ns", "sum"))
        totals = totals[totals["ops"] > 0]
        means = (totals["sum_ns"] / totals["ops"] / 1e6).to_dict()
        baseline = statistics.median(means.values())
        excess = {n: max(0.0, means[n] - baseline) * totals.loc[n, "ops"] for n in means}
        total_excess = sum(excess.values())
        for n, mean in means.items():
            entry = nodes.setdefault(n, {"node": n, "flags": []})
            entry[f"{op}_mean_ms"] = mean
            entry[f"{op}_ops"] = int(totals.loc[n, "ops"])
            entry[f"{op}_delay_share"] = excess[n] / total_excess if total_excess > 0 else 0.0
        spec = MetricSpec(f"{op}_mean_ms", f"server {op} time", "ms", True)
        for o in find_outliers(means, spec, th):
            mine = series[series["node"] == o.key]
            cp = change_point(mine["t"].tolist(), mine["mean_ms"].tolist())
            onset: float | None = None
            how = "slow from the start"
            onset_utc: str | None = None
            if cp is not None and cp[2] >= th.rise_ratio * cp[1]:
                onset = cp[0]
                at = pd.Timestamp(series.attrs["t0_ns"] + int(onset * 1e9), tz="UTC")
                onset_utc = at.isoformat(timespec="seconds")
                how = f"rose at t={cp[0]:.0f} s ({onset_utc}) from {cp[1]:.3g} to {cp[2]:.3g} ms"
            finding = {
                "node": o.key,
                "op": op,
                "evidence": o.evidence(),
                "onset_s": onset,
                "onset_utc": onset_utc,
                "how": how,
                "delay_share": nodes[o.key][f"{op}_delay_share"],
            }
            findings.append(finding)
            nodes[o.key]["flags"].append(finding)
    med_await = []
    for n, entry in nodes.items():
        dev, problem = _devices(run, n)
        entry["device"] = dev
        if problem:
            entry["iostat_problem"] = problem
        if dev:
            med_await.append(dev["r_await_ms"])
    dev_median = statistics.median(med_await) if med_await else None
    for entry in nodes.values():
        dev = entry["device"]
        if not entry["flags"]:
            entry["kind"] = None
        elif dev is None:
            entry["kind"] = KIND_UNCLEAR
        else:
            app = max(entry.get(f"{f['op']}_mean_ms", 0.0) for f in entry["flags"])
            device_slow = dev["r_await_ms"] >= th.r_await_ms or (
                dev_median is not None
                and dev["r_await_ms"] >= th.r_await_floor_ms
                and dev["r_await_ms"] >= (1 + th.min_worse) * max(dev_median, 1e-3) * 2
            )
            if device_slow or (dev["twin_ratio"] or 0) >= th.member_ratio:
                entry["kind"] = KIND_DEVICE
            elif app >= th.above_device_ratio * max(dev["r_await_ms"], 1e-3):
                entry["kind"] = KIND_ABOVE
            else:
                entry["kind"] = KIND_UNCLEAR
        if screened is None:
            entry["screen"] = "not screened"
        else:
            entry["screen"] = screened.get(entry["node"], "not in the screen")
    flagged = sorted({f["node"] for f in findings})
    shares = {op: sum(nodes[n].get(f"{op}_delay_share", 0.0) for n in flagged) for op in OPS}
    doc = {
        "run": str(run.path),
        "nodes": sorted(nodes.values(), key=lambda e: e["node"]),
        "flagged": flagged,
        "flagged_delay_share": shares,
        "missed_by_screen": [
            n for n in flagged if screened is not None and screened.get(n, "ok") == "ok"
        ],
        "thresholds": th.to_dict(),
    }
    run.diagnose_dir.mkdir(exist_ok=True)
    write_json_atomic(run.judge_json, doc)
    write_text_atomic(run.judge_csv, judge_csv(doc))
    hosts = _hosts(run)
    excluded = run_exclusions(doc, th, hosts)
    write_exclusions(run.diagnose_dir, excluded)
    gone = {e.host for e in excluded}

    def entry(e: Mapping[str, Any]) -> dict[str, Any]:
        host = hosts.get(e["node"], e["node"])
        status = "excluded" if host in gone else "flagged" if e["flags"] else "ok"
        share = max(e.get(f"{op}_delay_share", 0.0) for op in OPS)
        return {
            "host": host,
            "name": e["node"],
            "status": status,
            "kind": e.get("kind"),
            "severity": round(share, 3) if e["flags"] else None,
        }

    history.append(run.path.parent, "judge", str(run.path), [entry(e) for e in doc["nodes"]])
    return doc


def _hosts(run: RunDir) -> dict[str, str]:
    """Node name to host, from the run's nodes file (none: names stand for hosts)."""
    return {n.name: n.host for n in load_nodes(run.nodes_path)} if run.nodes_path.exists() else {}


def run_exclusions(
    doc: Mapping[str, Any], th: Thresholds, hosts: Mapping[str, str]
) -> list[Exclusion]:
    """The flagged nodes as the screen's exclusions (excluded.txt / excluded.json, by host),
    most delay first, at most the screen's cap; each reason says what was slow, since when
    (wall clock) and its share of the run's excess delay."""
    entries = {e["node"]: e for e in doc["nodes"]}

    def share(n: str) -> float:
        return max(entries[n].get(f"{op}_delay_share", 0.0) for op in OPS)

    chosen = sorted(doc["flagged"], key=share, reverse=True)[: exclusion_cap(len(entries), th)]
    out = []
    for n in chosen:
        e = entries[n]
        reasons = [
            f"{e.get('kind') or KIND_UNCLEAR}: {f['op']}: {f['evidence']}; {f['how']}; "
            f"{f['delay_share']:.0%} of the run's excess {f['op']} delay"
            for f in e["flags"]
        ]
        out.append(Exclusion(hosts.get(n, n), tuple(reasons)))
    return out


def judge_csv(doc: Mapping[str, Any]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    cols = ["node", "kind", "screen", "read_mean_ms", "read_delay_share", "write_mean_ms"]
    cols += ["write_delay_share", "device", "r_await_ms", "onset_s", "evidence"]
    w.writerow(cols)
    for e in doc["nodes"]:
        dev = e.get("device") or {}
        onset = next((f["onset_s"] for f in e["flags"] if f["onset_s"] is not None), None)
        w.writerow(
            [
                e["node"],
                e.get("kind") or "",
                e.get("screen", ""),
                *(
                    "" if e.get(k) is None else f"{e[k]:.6g}"
                    for k in ("read_mean_ms", "read_delay_share", "write_mean_ms")
                ),
                "" if e.get("write_delay_share") is None else f"{e['write_delay_share']:.6g}",
                dev.get("device", ""),
                "" if dev.get("r_await_ms") is None else f"{dev['r_await_ms']:.6g}",
                "" if onset is None else f"{onset:g}",
                " | ".join(f"{f['op']}: {f['evidence']}; {f['how']}" for f in e["flags"]),
            ]
        )
    return buf.getvalue()

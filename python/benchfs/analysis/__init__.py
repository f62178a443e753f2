"""Telemetry to answers: the standard analyses of a results directory, as a library.

    >>> from benchfs import analysis
    >>> a = analysis.analyze("results/20250102T030405Z-local-3fa9c1")
    >>> a.tables.per_node              # one DataFrame per analysis (docs/analysis.md)
    >>> [i.id for i in a.insights if i.fired]
    >>> a.write_csv("tables/")         # every table as CSV

`analyze` loads the run (`load_run`), computes the standard tables (`compute_tables`) and
evaluates the coded insights with the `[insights]` thresholds the run was made with (its
config.toml: `run_thresholds`; or explicit ones, e.g. `resolve_thresholds`); which nodes
slowed the run is judged under its `[diagnose]` thresholds, as benchfs-diagnose judges it.
Nothing here raises because a run lacks an optional part (client telemetry, traces, iostat):
the tables are then empty and `notes` says why.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from benchfs.analysis import kernel
from benchfs.analysis.darshanjoin import DarshanAnalysis, analyze_darshan, find_logs
from benchfs.analysis.darshanlog import read_log
from benchfs.analysis.insights import CATALOG, Insight, Tables, evaluate
from benchfs.analysis.run import (
    NO_CLIENT_TELEMETRY,
    NO_IOSTAT,
    NO_TRACE,
    LoadedRun,
    latest_run,
    load_run,
    previous_run,
)
from benchfs.analysis.tables import (
    DEPTH_RANGES,
    OP_TIME_RANGES,
    bandwidth,
    bimodal,
    io_depth,
    iostat_devices,
    op_time_distribution,
    op_time_stages,
    per_node,
    placement,
    placement_summary,
    rpc_by_target,
    rpc_timeseries,
    slow_nodes,
    timeseries,
)
from benchfs.analysis.thresholds import Thresholds, resolve_thresholds, run_thresholds
from benchfs.errors import AnalyzeError
from benchfs.results import CSV_FLOAT_FORMAT

__all__ = [
    "CATALOG",
    "DEPTH_RANGES",
    "NO_CLIENT_TELEMETRY",
    "NO_IOSTAT",
    "NO_TRACE",
    "OP_TIME_RANGES",
    "Analysis",
    "DarshanAnalysis",
    "Insight",
    "LoadedRun",
    "Tables",
    "Thresholds",
    "analyze",
    "bandwidth",
    "bimodal",
    "compute_tables",
    "evaluate",
    "io_depth",
    "iostat_devices",
    "latest_run",
    "load_run",
    "op_time_distribution",
    "op_time_stages",
    "per_node",
    "placement",
    "placement_summary",
    "previous_run",
    "resolve_thresholds",
    "rpc_by_target",
    "rpc_timeseries",
    "run_thresholds",
    "slow_nodes",
    "summary",
    "timeseries",
]


INSIGHT_COLUMNS = [
    "id",
    "title",
    "severity",
    "fired",
    "evaluated",
    "evidence",
    "reason",
    "recommendation",
]


def compute_tables(
    run: LoadedRun,
    thresholds: Thresholds,
    interval_s: float | None = None,
    judgment: Thresholds | None = None,
) -> Tables:
    """Every standard table of `run` (what the report, the CSV export and the insights use).
    `judgment` is the `[diagnose]` section (default: the run's own)."""
    if judgment is None:
        judgment = run_thresholds(run.path, name="diagnose")
    ts = timeseries(run, thresholds.slow_op_ms, interval_s)
    place = placement(run)
    return Tables(
        io_depth=io_depth(run),
        op_time=op_time_distribution(run, thresholds.bimodal_mode_share, "total_ns"),
        device_time=op_time_distribution(run, thresholds.bimodal_mode_share, "device_ns"),
        per_node=per_node(run, thresholds.slow_op_ms),
        timeseries=ts,
        bandwidth=bandwidth(run, interval_s),
        slow_nodes=slow_nodes(run, judgment),
        placement=place,
        placement_summary=placement_summary(place),
        rpc_by_target=rpc_by_target(run),
        rpc_timeseries=rpc_timeseries(run, interval_s),
        iostat_devices=iostat_devices(run),
        op_stages=op_time_stages(run.telemetry),
        block_latency=kernel.block_latency(run.kernel, judgment),
        block_heatmap=kernel.block_heatmap(run.kernel),
        sched_time=kernel.sched_time(run.kernel),
        top_frames=kernel.top_frames(run.kernel, run.manifest),
    )


def _num(v: Any) -> Any:
    """A JSON-friendly number (NaN and infinities become None)."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if hasattr(v, "item"):
        return _num(v.item())
    return v


def summary(run: LoadedRun, tables: Tables) -> dict[str, Any]:
    """The run at a glance: what ran, how it went, and the headline figures."""
    m = run.manifest or {}
    w = m.get("workload") or {}
    start, end = run.window()
    out: dict[str, Any] = {
        "run": run.name,
        "path": str(run.path),
        "mode": m.get("mode"),
        "outcome": (m.get("outcome") or {}).get("status"),
        "outcome_code": (m.get("outcome") or {}).get("code"),
        "started_at": m.get("started") or m.get("started_at"),
        "duration_s": (end - start).total_seconds()
        if start is not None and end is not None
        else None,
        "servers": len(run.servers()),
        "clients": w.get("ranks"),
        # Several iterations: the mean, its spread and their count (docs/workloads.md).
        "write_mib_s": w.get("write_mib_s"),
        "write_mib_s_std": ((w.get("spread") or {}).get("write_mib_s") or {}).get("std"),
        "read_mib_s": w.get("read_mib_s"),
        "read_mib_s_std": ((w.get("spread") or {}).get("read_mib_s") or {}).get("std"),
        "iterations": ((w.get("spread") or {}).get("write_mib_s") or {}).get("n"),
        "verified": w.get("verified"),
        "client_telemetry": run.has_clients,
        "trace_records": 0 if run.trace is None else len(run.trace),
        "iostat": run.iostat is not None,
    }
    d = tables.io_depth
    if not d.empty:
        row = d[d["node"] == "all"].iloc[0]
        out["mean_depth"] = float(row["mean"])
        out["share_depth1"] = float(row["share_depth1"])
    for row in tables.op_time.itertuples():
        out[f"{row.op}_ops"] = int(row.ops)
        out[f"{row.op}_p50_ms"] = float(row.p50_ms)
        out[f"{row.op}_p99_ms"] = float(row.p99_ms)
        out[f"{row.op}_mean_ms"] = float(row.mean_ms)
    s = tables.placement_summary
    out["placement_max_over_mean"] = s.get("write_bytes_max_over_mean")
    if not tables.rpc_by_target.empty:
        r = tables.rpc_by_target
        req = int(r["requests"].sum())
        out["retry_rate"] = int(r["retries"].sum()) / req if req else None
    return {k: _num(v) for k, v in out.items()}


@dataclass
class Analysis:
    """A run, its standard tables and the insights' verdicts."""

    run: LoadedRun
    thresholds: Thresholds
    tables: Tables
    insights: list[Insight]
    judgment: Thresholds
    """The `[diagnose]` section the slow_nodes table was judged under."""
    darshan: DarshanAnalysis | None = None
    """The application's own view, joined with this run: its Darshan logs (the run's
    `darshan/`, or those given to `analyze`)."""

    @property
    def notes(self) -> list[str]:
        return self.run.notes

    def flame_graphs(self) -> list[kernel.FlameGraph]:
        """A flame graph per BenchFS server the kernel trace profiled (drawn once)."""
        if "flame_graphs" not in self.run.cache:
            self.run.cache["flame_graphs"] = kernel.flame_graphs(self.run.kernel, self.run.manifest)
        graphs: list[kernel.FlameGraph] = self.run.cache["flame_graphs"]
        return graphs

    def write_flame_graphs(self, directory: str | os.PathLike[str]) -> list[Path]:
        """Every flame graph as `<directory>/<host>-server-<id>.svg`; returns the paths."""
        d = Path(directory)
        paths = []
        for g in self.flame_graphs():
            d.mkdir(parents=True, exist_ok=True)
            path = d / g.name
            path.write_text(g.svg)
            paths.append(path)
        return paths

    @property
    def fired(self) -> list[Insight]:
        return [i for i in self.insights if i.fired]

    def summary(self) -> dict[str, Any]:
        return summary(self.run, self.tables)

    def insights_table(self, ids: Iterable[str] | None = None) -> pd.DataFrame:
        """The insights (those of `ids`, or all) as one table: id, title, severity, fired,
        evaluated, evidence (one string), reason (why not evaluated), recommendation; the
        fired first. What insights.csv holds, and what a notebook shows."""
        wanted = None if ids is None else set(ids)
        rows = [
            {
                "id": i.id,
                "title": i.title,
                "severity": i.severity,
                "fired": i.fired,
                "evaluated": i.evaluated,
                "evidence": " | ".join(i.evidence),
                "reason": i.reason,
                "recommendation": i.recommendation,
            }
            for i in self.insights
            if wanted is None or i.id in wanted
        ]
        frame = pd.DataFrame(rows, columns=INSIGHT_COLUMNS)
        return frame.sort_values(["fired", "id"], ascending=[False, True], ignore_index=True)

    def write_csv(self, directory: str | os.PathLike[str]) -> list[Path]:
        """Every table as `<directory>/<name>.csv` (created if needed); returns the paths."""
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        paths = []
        for name, frame in self.tables.frames().items():
            path = d / f"{name}.csv"
            frame.to_csv(path, index=False, float_format=CSV_FLOAT_FORMAT)
            paths.append(path)
        path = d / "insights.csv"
        self.insights_table().sort_values("id").to_csv(
            path, index=False, float_format=CSV_FLOAT_FORMAT
        )
        paths.append(path)
        if self.darshan is not None:
            paths.extend(self.darshan.write_csv(d))
        return paths


def analyze(
    run: LoadedRun | str | os.PathLike[str],
    thresholds: Thresholds | None = None,
    interval_s: float | None = None,
    judgment: Thresholds | None = None,
    darshan: Iterable[str | os.PathLike[str]] | None = None,
) -> Analysis:
    """Load (if given a path), tabulate and judge one run.

    `thresholds` defaults to the `[insights]` section the run was made with
    (`run_thresholds`), `judgment` to its `[diagnose]` section; `interval_s` is the
    time-series step (default: the run's telemetry.interval_ms). `darshan` names Darshan logs
    (or directories of them) to join with the run; by default the run's own `darshan/`,
    whose unreadable logs become notes (given ones raise AnalyzeError).
    """
    r = run if isinstance(run, LoadedRun) else load_run(run)
    th = thresholds if thresholds is not None else run_thresholds(r.path)
    jt = judgment if judgment is not None else run_thresholds(r.path, name="diagnose")
    t = compute_tables(r, th, interval_s, jt)
    a = Analysis(r, th, t, evaluate(r, t, th), jt)
    if darshan is not None:
        a.darshan = analyze_darshan(find_logs(darshan), th, r)
    elif (r.path / "darshan").is_dir():
        logs = []
        for log in find_logs([r.path / "darshan"]):
            try:
                logs.append(read_log(log))
            except AnalyzeError as e:
                r.notes.append(f"Darshan log left out: {e.message}")
        if logs:
            a.darshan = analyze_darshan(logs, th, r)
    return a

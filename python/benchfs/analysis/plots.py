"""The report's figures (matplotlib, no pyplot state): one function per table, None if empty.

Each returns a `matplotlib.figure.Figure`; `to_data_uri` turns one into a base64 PNG for the
self-contained HTML report, and notebooks display them as they are.
"""

from __future__ import annotations

import base64
import io
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from benchfs.analysis.insights import Tables
from benchfs.analysis.run import LoadedRun
from benchfs.analysis.tables import DEPTH_RANGES, OP_TIME_RANGES

__all__ = [
    "ReportFigure",
    "bandwidth_figure",
    "comparison_figure",
    "io_depth_figure",
    "iostat_figure",
    "op_time_figure",
    "per_node_figure",
    "placement_figure",
    "rpc_figure",
    "timeseries_figure",
    "to_data_uri",
]

WIDTH = 8.0


DPI = 150
"""Images that read on a laptop's screen (and stay sharp on a high-density one)."""


class ReportFigure(Figure):
    """A figure that shows itself in Jupyter as a PNG (no pyplot, no backend state), laid out
    so that titles, labels and ticks of stacked axes never overlap."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("layout", "constrained")
        super().__init__(*args, **kwargs)

    def _repr_png_(self) -> bytes:
        buf = io.BytesIO()
        self.savefig(buf, format="png", dpi=DPI, bbox_inches="tight")
        return buf.getvalue()


def to_data_uri(fig: Figure, dpi: int = DPI) -> str:
    """The figure as a `data:image/png;base64,...` URI."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _bars(ax: object, frame: pd.DataFrame, labels: list[str], key: str) -> None:
    """Grouped bars: one group per label, one bar per row of `frame` (named by `key`)."""
    x = np.arange(len(labels))
    n = max(len(frame), 1)
    width = 0.8 / n
    for k, (_, row) in enumerate(frame.iterrows()):
        ax.bar(  # type: ignore[attr-defined]
            x + (k - (n - 1) / 2) * width,
            [100 * float(row[c]) for c in labels],
            width,
            label=str(row[key]),
        )
    ax.set_xticks(x, labels)  # type: ignore[attr-defined]
    ax.set_ylabel("% of operations")  # type: ignore[attr-defined]
    ax.legend(fontsize=8)  # type: ignore[attr-defined]


def io_depth_figure(tables: Tables) -> Figure | None:
    d = tables.io_depth
    if d.empty:
        return None
    fig = ReportFigure(figsize=(WIDTH, 3.2))
    ax = fig.add_subplot()
    _bars(ax, d, [label for label, _, _ in DEPTH_RANGES], "node")
    ax.set_ylabel("% of data submissions")
    ax.set_xlabel("device depth at submission (inflight_at_submit)")
    ax.set_title("io_depth distribution")
    return fig


def op_time_figure(tables: Tables, device: bool = False) -> Figure | None:
    d = tables.device_time if device else tables.op_time
    if d.empty:
        return None
    fig = ReportFigure(figsize=(WIDTH, 3.2))
    ax = fig.add_subplot()
    _bars(ax, d, [label for label, _, _ in OP_TIME_RANGES], "op")
    what = "device time" if device else "server op time (arrival to reply)"
    ax.set_title(f"{what} by range")
    return fig


def per_node_figure(tables: Tables) -> Figure | None:
    """Per node, p50, mean and p99 op time side by side on a linear axis (a 4 ms mean stays
    visible beside a 30 ms p99), with the share of slow operations on its own axis."""
    p = tables.per_node
    if p.empty:
        return None
    p = p.sort_values("node")
    fig = ReportFigure(figsize=(WIDTH, 3.6))
    ax = fig.add_subplot()
    x = np.arange(len(p))
    for k, (col, label, color) in enumerate(
        (("p50_ms", "p50", "#9ecae1"), ("mean_ms", "mean", "#3182bd"), ("p99_ms", "p99", "#08306b"))
    ):
        ax.bar(x + (k - 1) * 0.27, p[col], 0.27, label=label, color=color)
    ax.set_ylim(bottom=0)
    many = len(p) > 8
    ax.set_xticks(x, list(p["node"]), rotation=45 if many else 0, ha="right" if many else "center")
    ax.set_ylabel("op time (ms)")
    ax.set_title("per node: p50, mean and p99 op time")
    ax2 = ax.twinx()
    ax2.plot(x, p["slow_pct"], "o", color="crimson", label="slow %")
    ax2.set_ylabel("slow ops %")
    ax2.set_ylim(0, max(100.0, float(p["slow_pct"].max()) * 1.1))
    ax.legend(loc="upper left", fontsize=8)
    ax2.legend(loc="upper right", fontsize=8)
    return fig


def timeseries_figure(tables: Tables) -> Figure | None:
    ts = tables.timeseries
    if ts.empty:
        return None
    fig = ReportFigure(figsize=(WIDTH, 4.6))
    ax, ax2 = fig.subplots(2, 1, sharex=True)
    for node, g in ts.groupby("node"):
        ax.plot(g["t_s"], g["mean_ms"], marker=".", label=str(node))
        ax2.plot(g["t_s"], g["slow_pct"], marker=".", label=str(node))
    ax.set_yscale("log")
    ax.set_ylabel("mean op time (ms)")
    ax.set_title("per node over time")
    ax2.set_ylabel("slow ops %")
    ax2.set_xlabel("seconds since the run started")
    if ts["node"].nunique() <= 16:
        ax.legend(fontsize=7, ncol=4)
    return fig


def placement_figure(tables: Tables) -> Figure | None:
    p = tables.placement
    if p.empty:
        return None
    fig = ReportFigure(figsize=(WIDTH, 3.2))
    ax = fig.add_subplot()
    x = np.arange(len(p))
    ax.bar(x - 0.2, p["write_bytes"] / 2**20, 0.4, label="written")
    ax.bar(x + 0.2, p["read_bytes"] / 2**20, 0.4, label="read")
    mean = float(p["write_bytes"].mean()) / 2**20
    ax.axhline(mean, color="gray", linestyle="--", linewidth=1, label="mean written")
    ax.set_xticks(x, [str(s) for s in p["server"]])
    ax.set_xlabel("server")
    ax.set_ylabel("MiB")
    ax.set_title("placement: bytes per server")
    ax.legend(fontsize=8)
    return fig


def rpc_figure(tables: Tables) -> Figure | None:
    r, ts = tables.rpc_by_target, tables.rpc_timeseries
    if r.empty:
        return None
    fig = ReportFigure(figsize=(WIDTH, 4.6))
    ax, ax2 = fig.subplots(2, 1)
    x = np.arange(len(r))
    ax.bar(x - 0.2, r["mean_ms"], 0.4, label="mean")
    ax.bar(x + 0.2, r["p99_ms"], 0.4, label="p99")
    ax.set_xticks(x, [str(t) for t in r["target"]])
    ax.set_xlabel("target server")
    ax.set_ylabel("RPC time (ms)")
    ax.set_title("client RPC time and retries by target")
    ax.legend(fontsize=8)
    for target, g in ts.groupby("target"):
        ax2.plot(g["t_s"], g["mean_ms"], marker=".", label=f"server {target}")
    ax2.set_ylabel("mean RPC time (ms)")
    ax2.set_xlabel("seconds since the run started")
    return fig


def iostat_figure(run: LoadedRun) -> Figure | None:
    io = run.iostat
    if io is None or io.empty:
        return None
    active = io.groupby(["node", "device"])[["r_s", "w_s"]].transform("sum").sum(axis=1) > 0
    io = io[active]
    if io.empty:
        return None
    t0 = io["t"].min()
    fig = ReportFigure(figsize=(WIDTH, 3.4))
    ax = fig.add_subplot()
    for (node, device), g in io.groupby(["node", "device"]):
        await_ms = g[["r_await", "w_await"]].max(axis=1)
        ax.plot((g["t"] - t0).dt.total_seconds(), await_ms, marker=".", label=f"{node}:{device}")
    ax.set_ylabel("await (ms, max of r/w)")
    ax.set_xlabel("seconds since the first sample")
    ax.set_title("iostat: device await during the run")
    ax.legend(fontsize=7, ncol=3)
    return fig


def comparison_figure(comparison: pd.DataFrame) -> Figure | None:
    """This run against the baseline: per headline figure, this / baseline as a bar from 1,
    labelled as a signed percentage or an x factor, green when better, red when worse."""
    c = comparison[comparison["change"].notna()]
    if c.empty:
        return None
    fig = ReportFigure(figsize=(WIDTH, 0.45 * len(c) + 1.0))
    ax = fig.add_subplot()
    y = np.arange(len(c))[::-1]
    ratio = (c["change"].astype(float) + 1.0).to_numpy()
    colors = ["#2e7d32" if b else "#c62828" if b is False else "#777" for b in c["better"]]
    ax.barh(y, ratio - 1.0, left=1.0, color=colors)
    ax.axvline(1.0, color="#333", linewidth=1)
    for yi, r, label in zip(y, ratio, c["change_label"], strict=True):
        ax.text(r, yi, f" {label} ", va="center", ha="left" if r >= 1 else "right", fontsize=8)
    ax.set_yticks(y, list(c["metric"]))
    ax.set_xscale("log", base=2)
    lo, hi = float(min(ratio.min(), 1.0)), float(max(ratio.max(), 1.0))
    ax.set_xlim(lo / 1.6, hi * 1.6)
    ticks = [t for t in (0.125, 0.25, 0.5, 0.75, 1, 1.5, 2, 4, 8) if lo / 1.6 <= t <= hi * 1.6]
    ax.set_xticks(ticks, [f"{t:g}x" for t in ticks])
    ax.minorticks_off()
    ax.set_xlabel("this run / baseline (log scale; 1 = the same)")
    ax.set_title("change against the baseline (green: better, red: worse)")
    return fig


def bandwidth_figure(tables: Tables) -> Figure | None:
    """Write and read bandwidth over time: one line per node and the total (thick)."""
    b = tables.bandwidth
    if b.empty:
        return None
    fig = ReportFigure(figsize=(WIDTH, 4.6))
    axs = fig.subplots(2, 1, sharex=True)
    nodes = [n for n in b["node"].unique() if n != "all"]
    for ax, op in zip(axs, ("write", "read"), strict=True):
        for node in nodes:
            g = b[b["node"] == node]
            ax.plot(g["t_s"], g[f"{op}_mib_s"], marker=".", linewidth=1, label=str(node))
        total = b[b["node"] == "all"]
        ax.plot(total["t_s"], total[f"{op}_mib_s"], color="black", linewidth=2.2, label="total")
        ax.set_ylabel(f"{op} MiB/s")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    if len(nodes) <= 16:
        axs[0].legend(fontsize=7, ncol=min(len(nodes) + 1, 6))
    axs[0].set_title("bandwidth over time, per node and in total (servers' byte counters)")
    axs[1].set_xlabel("seconds since the run started")
    return fig

"""The report's figures (matplotlib, no pyplot state): one function per table, None if empty.

Each returns a `matplotlib.figure.Figure`; `to_data_uri` turns one into a base64 PNG for the
self-contained HTML report, and notebooks display them as they are.
"""

from __future__ import annotations

import base64
import io
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from benchfs.analysis.insights import Tables
from benchfs.analysis.run import LoadedRun
from benchfs.analysis.tables import DEPTH_RANGES, OP_TIME_RANGES

__all__ = [
    "ReportFigure",
    "bandwidth_figure",
    "block_heatmap_figure",
    "block_latency_figure",
    "comparison_figure",
    "darshan_timeline_figure",
    "io_depth_figure",
    "iostat_figure",
    "op_time_figure",
    "per_node_figure",
    "placement_figure",
    "rpc_figure",
    "sched_figure",
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
    """The figure as a `data:image/png;base64,...` URI. Its constrained layout already fits
    it; `bbox_inches="tight"` would draw it a second time (a fifth of a report's time)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
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


def _devices_with_io(tables: Tables, op: str) -> list[tuple[str, str]]:
    b = tables.block_latency
    if b.empty:
        return []
    chosen = b[(b["op"] == op) & (b["ios"] > 0)].sort_values(["host", "device"])
    return [(str(r.host), str(r.device)) for r in chosen.itertuples()]


def block_latency_figure(tables: Tables, op: str = "read") -> Figure | None:
    """The kernel's block latency histogram of each device over the run (share of its I/Os
    per log2 bucket): a device whose second mode its peers lack stands out at once."""
    h = tables.block_heatmap
    devices = _devices_with_io(tables, op)
    if h.empty or not devices:
        return None
    h = h[h["op"] == op]
    fig = ReportFigure(figsize=(WIDTH, 3.4))
    ax = fig.add_subplot()
    odd = set()
    b = tables.block_latency
    for r in b[(b["op"] == op) & b["odd"]].itertuples():
        odd.add((str(r.host), str(r.device)))
    for host, device in devices:
        g = h[(h["host"] == host) & (h["device"] == device)]
        per = g.groupby("bucket_lo_us")["count"].sum().sort_index()
        if per.sum() == 0:
            continue
        x = np.maximum(per.index.to_numpy(dtype=float), 1.0)
        label = f"{host}:{device}" + (" (odd mode)" if (host, device) in odd else "")
        ax.step(
            x,
            per.to_numpy() / per.sum(),
            where="post",
            label=label,
            linewidth=2.2 if (host, device) in odd else 1.0,
        )
    ax.set_xscale("log")
    ax.set_xlabel("latency, issue to complete (us, log2 buckets)")
    ax.set_ylabel(f"share of the device's {op}s")
    ax.set_title(f"Kernel block latency per device ({op}s)")
    ax.legend(fontsize=7, ncol=3)
    return fig


def block_heatmap_figure(tables: Tables, op: str | None = None, most: int = 8) -> Figure | None:
    """Latency over time per device (I/Os per log2 bucket per second; of one direction, or
    reads and writes together), up to `most` devices, the odd ones first."""
    h = tables.block_heatmap
    if h.empty:
        return None
    if op is not None:
        h = h[h["op"] == op]
    b = tables.block_latency
    odd = {(str(r.host), str(r.device)) for r in b[b["odd"]].itertuples()} if not b.empty else set()
    devices = sorted(
        {(str(x.host), str(x.device)) for x in h[h["count"] > 0].itertuples()},
        key=lambda d: (d not in odd, d),
    )[:most]
    if not devices:
        return None
    t0 = h["t"].min()
    fig = ReportFigure(figsize=(WIDTH, 1.0 + 1.6 * len(devices)))
    axes = fig.subplots(len(devices), 1, sharex=True, squeeze=False)[:, 0]
    for ax, (host, device) in zip(axes, devices, strict=True):
        g = h[(h["host"] == host) & (h["device"] == device)]
        grid = g.pivot_table(
            index="bucket_lo_us", columns="t", values="count", aggfunc="sum", fill_value=0
        ).sort_index()
        seconds = (grid.columns - t0).total_seconds().to_numpy()
        lo = np.maximum(grid.index.to_numpy(dtype=float), 1.0)
        x_edges = np.append(seconds - 1.0, seconds[-1])
        y_edges = np.append(lo, lo[-1] * 2)
        mesh = ax.pcolormesh(x_edges, y_edges, np.log10(1 + grid.to_numpy()), cmap="viridis")
        ax.set_yscale("log")
        ax.set_ylabel("us")
        what = f"{op}s" if op else "reads and writes"
        ax.set_title(
            f"{host}:{device}, {what}" + (" (odd mode)" if (host, device) in odd else ""),
            fontsize=9,
        )
        fig.colorbar(mesh, ax=ax, label="log10(1 + I/Os)")
    axes[-1].set_xlabel("seconds since the first interval")
    return fig


def sched_figure(tables: Tables) -> Figure | None:
    """Seconds per program by reason: on CPU, runnable (waiting for a core), sleeping, waiting
    for I/O."""
    s = tables.sched_time
    if s.empty:
        return None
    shown = s.assign(label=s["host"] + ":" + s["comm"]).head(16)
    reasons = ["on CPU", "runnable", "waiting for I/O", "sleeping"]
    fig = ReportFigure(figsize=(WIDTH, 0.8 + 0.32 * len(shown)))
    ax = fig.add_subplot()
    left = np.zeros(len(shown))
    for reason in reasons:
        values = shown[reason].to_numpy(dtype=float)
        ax.barh(shown["label"], values, left=left, label=reason)
        left += values
    ax.invert_yaxis()
    ax.set_xlabel("seconds (summed over threads)")
    ax.set_title("Time on and off CPU per program, by reason")
    ax.legend(fontsize=7, ncol=4)
    return fig


def darshan_timeline_figure(da: Any, most_ranks: int = 64) -> Figure | None:
    """The application's operations (Darshan's DXT trace: one row per log and rank, a bar from
    each call's start to its end, slow ones red), above the requests each server held (from
    the servers' trace), on one clock: seconds since the application started."""
    from benchfs.analysis.darshanjoin import server_depth

    ops = da.ops
    if ops.empty:
        return None
    trace = da.run.trace if da.run is not None else None
    depth = server_depth(trace, da.start_ns) if trace is not None else None
    panels = 2 if depth is not None and not depth.empty else 1
    fig = ReportFigure(figsize=(WIDTH, 2.4 + 2.2 * panels))
    axes = fig.subplots(panels, 1, sharex=True, squeeze=False)[:, 0]
    ax = axes[0]
    who = ops[["log", "rank"]].drop_duplicates().sort_values(["log", "rank"]).head(most_ranks)
    row = {(int(r.log), int(r.rank)): n for n, r in enumerate(who.itertuples())}
    colours = {"write": "#2980b9", "read": "#27ae60", "flush": "#7f8c8d"}
    slow_colour = "#c0392b"
    for kind, g in ops.groupby("op"):
        y = [row.get((int(a), int(b))) for a, b in zip(g["log"], g["rank"], strict=True)]
        keep = [v is not None for v in y]
        g = g[keep]
        ys = np.array([v for v in y if v is not None], dtype=float)
        colour = np.where(g["slow"].to_numpy(), slow_colour, colours.get(str(kind), "#999"))
        # A white edge keeps back-to-back calls apart.
        ax.barh(
            ys,
            g["dur_ms"].to_numpy() / 1e3,
            left=g["t_s"].to_numpy(),
            height=0.6,
            color=list(colour),
            edgecolor="white",
            linewidth=0.4,
        )
    shown = [k for k in colours if k in set(ops["op"])]
    handles = [Patch(color=colours[k], label=k) for k in shown]
    handles.append(Patch(color=slow_colour, label="slow"))
    programs = [Path(log.exe.split(" ", 1)[0]).name for log in da.logs]
    ax.set_yticks(range(len(row)), [f"{programs[a]} {b}" for a, b in row], fontsize=7)
    ax.invert_yaxis()
    ax.set_title("the application's reads, writes and flushes (Darshan; slow ones red)")
    ax.legend(handles=handles, fontsize=7, loc="upper right")
    if panels == 2:
        ax2 = axes[1]
        for server, g in depth.groupby("server"):
            ax2.step(g["t_s"], g["depth"], where="post", label=f"server {server}")
        ax2.set_ylabel("requests held")
        ax2.set_title("requests each server held (arrived, not yet answered)")
        ax2.legend(fontsize=7, ncol=4)
    end = float((ops["t_s"] + ops["dur_ms"] / 1e3).max())
    margin = 0.03 * max(end, 1e-3)
    axes[-1].set_xlim(min(0.0, float(ops["t_s"].min())) - margin, end + margin)
    axes[-1].set_xlabel("seconds since the application started")
    return fig

"""Reports of an analysis: terminal (rich), one self-contained HTML file, JSON, comparison.

The HTML report embeds its figures as base64 PNGs and its style inline: one file, no network.
"""

from __future__ import annotations

import base64
import html
import json
import math
from typing import Any

import pandas as pd
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from benchfs import __version__
from benchfs.analysis import Analysis, _num
from benchfs.analysis import plots as P
from benchfs.analysis.darshanjoin import DarshanAnalysis
from benchfs.analysis.darshanreport import darshan_html, darshan_json, print_darshan
from benchfs.analysis.htmlparts import insights_html
from benchfs.analysis.tables import STAGES
from benchfs.units import shown_value

__all__ = [
    "SECTIONS",
    "FlameGraphs",
    "compare",
    "config_diff",
    "print_terminal",
    "render_darshan_html",
    "render_html",
    "to_json",
]

SECTIONS = (
    ("summary", "Summary"),
    ("insights", "Insights"),
    ("io-depth", "Device queue depth (io_depth)"),
    ("op-time", "Op-time distribution"),
    ("per-node", "Per node"),
    ("timeseries", "Per node over time"),
    ("placement", "Placement"),
    ("rpc", "RPC latency and retries by target"),
    ("iostat", "iostat during the run"),
    ("kernel", "The kernel's view: block latency, CPU time, profiles"),
    ("darshan", "The application's view (Darshan)"),
    ("comparison", "Comparison with the baseline"),
    ("config", "Effective configuration"),
    ("notes", "Notes"),
)
"""The HTML report's sections: (element id, title); comparison only with a baseline."""


def _flatten(config: dict[str, Any]) -> dict[str, Any]:
    return {
        f"{section}.{key}": value
        for section, table in config.items()
        if isinstance(table, dict)
        for key, value in table.items()
    }


RUN_PLACES = frozenset(
    {"cluster.registry_dir", "telemetry.dir", "run.results_root", "run.scratch_dir"}
)
"""Keys that name where a run wrote: they differ between any two runs and say nothing."""


def config_diff(a: Analysis, baseline: Analysis) -> pd.DataFrame:
    """Keys whose effective values differ between the two runs (config.toml of each), sizes
    with units, without the keys that only say where each run wrote (`RUN_PLACES`)."""
    mine, theirs = _flatten(a.run.config), _flatten(baseline.run.config)
    rows = [
        {"key": k, "this": shown_value(k, mine.get(k)), "baseline": shown_value(k, theirs.get(k))}
        for k in sorted(set(mine) | set(theirs))
        if mine.get(k) != theirs.get(k) and k not in RUN_PLACES
    ]
    return pd.DataFrame(rows, columns=["key", "this", "baseline"])


COMPARED = (
    ("write_mib_s", "write MiB/s", True),
    ("read_mib_s", "read MiB/s", True),
    ("write_p50_ms", "write op p50 (ms)", False),
    ("write_p99_ms", "write op p99 (ms)", False),
    ("read_p50_ms", "read op p50 (ms)", False),
    ("read_p99_ms", "read op p99 (ms)", False),
    ("all_mean_ms", "op mean (ms)", False),
    ("mean_depth", "mean device depth", True),
    ("share_depth1", "share of depth-1 submits", False),
    ("placement_max_over_mean", "placement max/mean", False),
    ("retry_rate", "retry rate", False),
)


def change_label(ratio: float | None) -> str:
    """this / baseline in words: a signed percentage up to +-100%, an `x` factor beyond."""
    if ratio is None or not math.isfinite(ratio) or ratio <= 0:
        return "-"
    if ratio >= 2.0:
        return f"{ratio:.2f}x"
    if ratio <= 0.5:
        return f"{ratio:.2f}x ({(ratio - 1) * 100:+.0f}%)"
    return f"{(ratio - 1) * 100:+.1f}%"


def compare(a: Analysis, baseline: Analysis) -> pd.DataFrame:
    """Headline figures side by side: metric, this, baseline, change (this / baseline - 1),
    change_label (the same as a signed percentage or an x factor), better (whether the change
    is for the better, None when there is none)."""
    s, b = a.summary(), baseline.summary()
    rows = []
    for key, label, higher_is_better in COMPARED:
        x, y = s.get(key), b.get(key)
        numbers = isinstance(x, int | float) and isinstance(y, int | float) and y
        change = x / y - 1 if numbers else None
        rows.append(
            {
                "metric": label,
                "this": x,
                "baseline": y,
                "change": change,
                "change_label": change_label(None if change is None else change + 1),
                "better": None if not change else (change > 0) == higher_is_better,
            }
        )
    fired = {i.id for i in a.fired}
    fired_b = {i.id for i in baseline.fired}
    rows.append(
        {
            "metric": "insights fired",
            "this": " ".join(sorted(fired)) or "-",
            "baseline": " ".join(sorted(fired_b)) or "-",
            "change": None,
            "change_label": "-",
            "better": None,
        }
    )
    return pd.DataFrame(
        rows, columns=["metric", "this", "baseline", "change", "change_label", "better"]
    )


def _records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    return [{k: _num(v) for k, v in row.items()} for row in frame.to_dict(orient="records")]


REPORT_SCHEMA_VERSION = 1
"""Version of report.json's layout (benchfs/schemas/report.schema.json)."""


def to_json(a: Analysis, baseline: Analysis | None = None) -> dict[str, Any]:
    """The whole analysis as one JSON-ready object."""
    out: dict[str, Any] = {
        "schema_version": REPORT_SCHEMA_VERSION,
        "benchfs_version": __version__,
        "summary": a.summary(),
        "insights": [i.to_dict() for i in a.insights],
        "tables": {name: _records(f) for name, f in a.tables.frames().items()},
        "placement_summary": {k: _num(v) for k, v in a.tables.placement_summary.items()},
        "thresholds": a.thresholds.to_dict(),
        "judgment_thresholds": a.judgment.to_dict(),
        "notes": list(a.notes),
    }
    if a.darshan is not None:
        out["darshan"] = darshan_json(a.darshan)
    if baseline is not None:
        out["baseline"] = {
            "summary": baseline.summary(),
            "comparison": _records(compare(a, baseline)),
            "config_diff": _records(config_diff(a, baseline)),
            "insights_fired": [i.id for i in baseline.fired],
        }
    return json.loads(json.dumps(out, default=_json_default))


def _json_default(o: Any) -> Any:
    if hasattr(o, "item"):
        return _num(o.item())
    if isinstance(o, pd.Timestamp):
        return o.isoformat()
    return str(o)


# ---------------------------------------------------------------------------------------------
# Terminal


def _fmt(v: Any, digits: int = 2) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        if not math.isfinite(v):
            return "-"
        return f"{v:,.{digits}f}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def _spread(s: dict[str, Any], op: str) -> str:
    std = s.get(f"{op}_mib_s_std")
    return "" if std is None else f" ± {_fmt(std, 1)}"


def _rich_table(title: str, frame: pd.DataFrame, columns: list[str], digits: int = 2) -> Table:
    t = Table(
        title=title, title_justify="left", box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False
    )
    for c in columns:
        text = frame[c].dtype == object
        t.add_column(c, justify="left" if text else "right", no_wrap=not text, overflow="fold")
    for row in frame[columns].itertuples(index=False):
        t.add_row(*(escape(_fmt(_num(v), digits)) for v in row))
    return t


def print_terminal(console: Console, a: Analysis, baseline: Analysis | None = None) -> None:
    """The summary, the insights and the key tables, for people."""
    s = a.summary()
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column()
    lines = [
        ("run", f"{s['run']} ({s.get('mode') or '?'}, outcome {s.get('outcome') or '?'})"),
        ("cluster", f"{s['servers']} servers, {s.get('clients') or '?'} clients"),
        (
            "bandwidth",
            f"write {_fmt(s.get('write_mib_s'), 1)}{_spread(s, 'write')} MiB/s, "
            f"read {_fmt(s.get('read_mib_s'), 1)}{_spread(s, 'read')} MiB/s"
            + (f" (mean of {s['iterations']} iterations)" if s.get("iterations") else ""),
        ),
        (
            "op time",
            f"read p50 {_fmt(s.get('read_p50_ms'))} / p99 {_fmt(s.get('read_p99_ms'))} ms, "
            f"write p50 {_fmt(s.get('write_p50_ms'))} / p99 {_fmt(s.get('write_p99_ms'))} ms",
        ),
        (
            "io_depth",
            f"mean {_fmt(s.get('mean_depth'))}, depth-1 submits "
            f"{_fmt(100 * s['share_depth1'] if s.get('share_depth1') is not None else None, 1)}%",
        ),
        (
            "sources",
            f"client telemetry {_fmt(s['client_telemetry'])}, trace records "
            f"{s['trace_records']:,}, iostat {_fmt(s['iostat'])}",
        ),
    ]
    for label, text in lines:
        grid.add_row(label, escape(text))
    console.print(grid)
    console.print()
    fired = a.fired
    console.print(f"[bold]insights[/]: {len(fired)} fired of {len(a.insights)}")
    for i in fired:
        style = {"high": "red", "medium": "yellow"}.get(i.severity, "cyan")
        console.print(f"  [{style}]{i.id}[/] {escape(i.title)}", highlight=False)
        for e in i.evidence:
            console.print(f"      {escape(e)}", highlight=False, soft_wrap=True)
        console.print(f"      [dim]{escape(i.recommendation)}[/]", highlight=False, soft_wrap=True)
    skipped = [i for i in a.insights if not i.evaluated]
    for i in skipped:
        console.print(f"  [dim]{i.id} not evaluated: {escape(i.reason)}[/]", highlight=False)
    console.print()
    t = a.tables
    if not t.per_node.empty:
        cols = ["node", "ops", "slow_ops", "slow_pct", "mean_ms", "p50_ms", "p99_ms"]
        cols += ["read_write_ratio"]
        console.print(_rich_table("per node", t.per_node, cols))
    standing_out = t.slow_nodes[t.slow_nodes["outlier"]] if not t.slow_nodes.empty else None
    if standing_out is not None and not standing_out.empty:
        cols = ["node", "op", "ops", "mean_ms", "worse", "delay_share", "slow", "persist_pct"]
        cols += ["onset_utc"]
        console.print(_rich_table("nodes that stood out (slow_nodes)", standing_out, cols))
    if not t.io_depth.empty:
        cols = ["node", "submits", "mean", "share_depth1", "max", "1", "2-4", "5-8", "9-16"]
        cols += ["17-32", ">128", "mean_batch"]
        console.print(_rich_table("io_depth (shares)", t.io_depth, cols))
    if not t.op_time.empty:
        cols = ["op", "ops", "0-100us", "100-500us", "0.5-1ms", "1-5ms", "5-10ms", "10-50ms"]
        cols += ["50-100ms", ">100ms", "bimodal"]
        console.print(_rich_table("op-time distribution (shares)", t.op_time, cols))
    if not t.placement.empty:
        cols = ["server", "node", "write_bytes", "write_ops", "read_bytes", "bytes_share"]
        console.print(_rich_table("placement", t.placement, cols))
    if not t.rpc_by_target.empty:
        cols = ["target", "requests", "retries", "retry_pct", "timeouts", "mean_ms", "p99_ms"]
        console.print(_rich_table("RPC by target", t.rpc_by_target, cols))
    if not t.op_stages.empty:
        cols = ["op", "call_p50_ms", *STAGES, "unattributed_ms", "attributed_share"]
        console.print(_rich_table("p50 call in stages (ms)", t.op_stages, cols))
    if not t.block_latency.empty:
        cols = ["host", "device", "op", "ios", "mean_us", "p50_us", "p99_us", "mode_share"]
        cols += ["peer_share", "odd"]
        console.print(_rich_table("kernel block latency per device", t.block_latency, cols))
    if not t.sched_time.empty:
        cols = ["host", "comm", "on CPU", "runnable", "waiting for I/O", "sleeping", "cpus"]
        console.print(_rich_table("time on and off CPU (s)", t.sched_time.head(10), cols))
    if not t.top_frames.empty:
        top = t.top_frames.groupby(["host", "pid"]).head(5)
        cols = ["host", "server", "function", "self", "self_share", "total_share"]
        console.print(_rich_table("servers' top frames on CPU (perf)", top, cols))
    if baseline is not None:
        console.print(
            _rich_table(
                f"vs baseline {baseline.run.name}",
                compare(a, baseline),
                ["metric", "this", "baseline", "change_label"],
            )
        )
        diff = config_diff(a, baseline)
        if not diff.empty:
            console.print(_rich_table("config differences", diff, ["key", "this", "baseline"]))
    if a.darshan is not None:
        print_darshan(console, a.darshan)
    for n in a.notes:
        console.print(f"[dim]note: {escape(n)}[/]", highlight=False, soft_wrap=True)


# ---------------------------------------------------------------------------------------------
# HTML

CSS = """
body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;margin:2em auto;max-width:1400px;
color:#222;padding:0 1em}
.wide{overflow-x:auto;max-width:100%}td,th{white-space:nowrap}
h1{font-size:1.6em}h2{border-bottom:2px solid #ddd;padding-bottom:.2em;margin-top:1.8em}
table{border-collapse:collapse;font-size:.85em;margin:.6em 0}
th,td{border:1px solid #ccc;padding:.25em .5em;text-align:right}
th{background:#f2f2f2}td:first-child,th:first-child{text-align:left}
.insight{border-left:6px solid #999;padding:.4em .8em;margin:.8em 0;background:#fafafa}
.high{border-color:#c0392b}.medium{border-color:#e67e22}.low{border-color:#2980b9}
.silent{color:#777;font-size:.9em}.note{color:#555;font-size:.9em}
img{max-width:100%;display:block;margin:.5em 0}nav a{margin-right:1em}
.kv td{text-align:left}
"""


def _table_html(frame: pd.DataFrame, name: str) -> str:
    if frame.empty:
        return f'<p class="note">No data for this table ({html.escape(name)}).</p>'
    shown = frame.copy()
    for c in shown.columns:
        if shown[c].dtype.kind == "f":
            shown[c] = shown[c].map(
                lambda v: (
                    "-" if not math.isfinite(v) else f"{v:,.3g}" if abs(v) < 1000 else f"{v:,.0f}"
                )
            )
    table = shown.to_html(index=False, border=0, classes=f"table-{name}", escape=True)
    return f'<div class="wide">{table}</div>'


def _img(fig: Any, alt: str) -> str:
    if fig is None:
        return ""
    return f'<img alt="{html.escape(alt)}" src="{P.to_data_uri(fig)}">'


class FlameGraphs:
    """Flame graphs side by side (one column per run), shown as HTML in Jupyter."""

    def __init__(self, *analyses: Analysis) -> None:
        self.columns = [(a.run.name, a.flame_graphs()) for a in analyses]

    def _repr_html_(self) -> str:
        cells = []
        for name, graphs in self.columns:
            body = "".join(_svg_img(g.svg, g.title) for g in graphs) or (
                '<p class="note">No server was profiled.</p>'
            )
            cells.append(f'<td style="vertical-align:top"><b>{html.escape(name)}</b>{body}</td>')
        return f'<table style="width:100%;table-layout:fixed"><tr>{"".join(cells)}</tr></table>'


def _svg_img(svg: str, alt: str) -> str:
    data = base64.b64encode(svg.encode()).decode("ascii")
    return f'<img class="flame" alt="{html.escape(alt)}" src="data:image/svg+xml;base64,{data}">'


def _kernel_html(a: Analysis) -> str:
    """Block latency per device (histograms, heat map), time on and off CPU per program, a
    flame graph and the top frames per server; or the one line saying why there is none."""
    t = a.tables
    if not a.run.kernel:
        why = next((n for n in a.notes if "unavailable" in n or "kernel trace" in n), "")
        return f'<p class="note">{html.escape(why or "No kernel trace in this run.")}</p>'
    out = [
        "<h3>Block I/O latency per device</h3>",
        _img(P.block_latency_figure(t, "read"), "block read latency per device"),
        _img(P.block_latency_figure(t, "write"), "block write latency per device"),
        _table_html(t.block_latency, "block_latency"),
        "<h3>Latency over time</h3>",
        _img(P.block_heatmap_figure(t), "block latency heat map"),
        "<h3>Time on and off CPU</h3>",
        _img(P.sched_figure(t), "time on and off CPU"),
        _table_html(t.sched_time, "sched_time"),
        "<h3>CPU profiles of the servers</h3>",
    ]
    graphs = a.flame_graphs()
    if not graphs:
        out.append('<p class="note">No server was profiled (perf).</p>')
    for g in graphs:
        out.append(f"<h4>{html.escape(g.title)}</h4>" + _svg_img(g.svg, g.title))
    out.append(_table_html(t.top_frames, "top_frames"))
    notes = [n for n in a.notes if "unavailable" in n or "failed" in n]
    if notes:
        out.append("<ul>" + "".join(f"<li>{html.escape(n)}</li>" for n in notes) + "</ul>")
    return "".join(out)


def render_html(a: Analysis, baseline: Analysis | None = None) -> str:
    """One self-contained HTML page: every section of SECTIONS, figures embedded."""
    s = a.summary()
    t = a.tables
    parts: dict[str, str] = {}
    rows = "".join(
        f"<tr><th>{html.escape(k)}</th><td>{html.escape(_fmt(v))}</td></tr>" for k, v in s.items()
    )
    parts["summary"] = f'<table class="kv">{rows}</table>'
    parts["insights"] = insights_html(a.insights)
    parts["io-depth"] = _img(P.io_depth_figure(t), "io_depth distribution") + _table_html(
        t.io_depth, "io_depth"
    )
    parts["op-time"] = (
        _img(P.op_time_figure(t), "op-time distribution")
        + _table_html(t.op_time, "op_time_distribution")
        + "<h3>Device time</h3>"
        + _img(P.op_time_figure(t, device=True), "device-time distribution")
        + _table_html(t.device_time, "device_time_distribution")
    )
    parts["per-node"] = _img(P.per_node_figure(t), "per-node op time") + _table_html(
        t.per_node, "per_node"
    )
    parts["timeseries"] = (
        _img(P.bandwidth_figure(t), "bandwidth over time")
        + _img(P.timeseries_figure(t), "per-node time series")
        + "<h3>Which nodes slowed the run</h3>"
        + _table_html(t.slow_nodes, "slow_nodes")
    )
    ps = "".join(
        f"<tr><th>{html.escape(k)}</th><td>{html.escape(_fmt(_num(v)))}</td></tr>"
        for k, v in t.placement_summary.items()
    )
    parts["placement"] = (
        _img(P.placement_figure(t), "placement")
        + _table_html(t.placement, "placement")
        + f'<table class="kv">{ps}</table>'
    )
    parts["rpc"] = (
        _img(P.rpc_figure(t), "RPC by target")
        + _table_html(t.rpc_by_target, "rpc_by_target")
        + _table_html(t.op_stages, "op_time_stages")
        if not t.rpc_by_target.empty
        else f'<p class="note">{html.escape("No client telemetry in this run.")}</p>'
    )
    parts["iostat"] = (
        _img(P.iostat_figure(a.run), "iostat") + _table_html(t.iostat_devices, "iostat_devices")
        if a.run.iostat is not None
        else '<p class="note">No iostat captures in this run.</p>'
    )
    parts["kernel"] = _kernel_html(a)
    parts["darshan"] = (
        darshan_html(a.darshan)
        if a.darshan is not None
        else '<p class="note">No Darshan log in this run (benchfs-run launch --darshan traces a '
        "program; benchfs-analyze --darshan LOG joins a log made elsewhere).</p>"
    )
    if baseline is not None:
        parts["comparison"] = (
            f"<p>Baseline: {html.escape(str(baseline.run.path))}</p>"
            + _img(P.comparison_figure(compare(a, baseline)), "change against the baseline")
            + _table_html(compare(a, baseline), "comparison")
            + "<h3>Configuration differences</h3>"
            + _table_html(config_diff(a, baseline), "config_diff")
        )
    parts["config"] = (
        f"<pre>{html.escape(a.run.config_text)}</pre>"
        if a.run.config_text
        else '<p class="note">No config.toml in this run.</p>'
    )
    parts["notes"] = "<ul>" + "".join(f"<li>{html.escape(n)}</li>" for n in a.notes) + "</ul>"
    sections = [(k, title) for k, title in SECTIONS if k in parts]
    nav = "".join(f'<a href="#{k}">{html.escape(title)}</a>' for k, title in sections)
    body = "".join(
        f'<section id="{k}"><h2>{html.escape(title)}</h2>{parts[k]}</section>'
        for k, title in sections
    )
    title = f"BenchFS analysis: {a.run.name}"
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{html.escape(title)}</title><style>{CSS}</style></head><body>"
        f"<h1>{html.escape(title)}</h1><nav>{nav}</nav>{body}"
        f"<p class='note'>benchfs {html.escape(__version__)}</p></body></html>\n"
    )


def render_darshan_html(da: DarshanAnalysis) -> str:
    """A page of its own for Darshan logs analysed without a run (`benchfs-analyze
    --darshan LOG`)."""
    title = f"BenchFS analysis: {da.summary()['exe'].strip()[:80]}"
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{html.escape(title)}</title><style>{CSS}</style></head><body>"
        f"<h1>{html.escape(title)}</h1><section id='darshan'><h2>The application's view "
        f"(Darshan)</h2>{darshan_html(da)}</section>"
        f"<p class='note'>benchfs {html.escape(__version__)}</p></body></html>\n"
    )

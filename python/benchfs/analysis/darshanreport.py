"""The application's view (a `DarshanAnalysis`) in each report: JSON, terminal, the HTML
section (`report.render_darshan_html` makes it a page of its own when no run is given)."""

from __future__ import annotations

import html
import json
import math
from typing import Any

import pandas as pd
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from benchfs.analysis import plots as P
from benchfs.analysis.darshanjoin import DarshanAnalysis
from benchfs.analysis.htmlparts import insights_html

__all__ = ["TABLE_TITLES", "darshan_html", "darshan_json", "print_darshan"]

TABLE_TITLES = {
    "phases": "The application's phases",
    "slow_ops": "Slow application operations and the servers that held them",
    "by_server": "The application's operations by server",
    "alignment": "How well the two clocks agree (per log and rank)",
    "write_behind": "Write requests by when they reached the server",
}
"""Each table of a DarshanAnalysis, by its name, as the reports title it."""


def _num(v: Any) -> Any:
    if hasattr(v, "item"):
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def _records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    return [{k: _num(v) for k, v in row.items()} for row in frame.to_dict(orient="records")]


def darshan_json(da: DarshanAnalysis) -> dict[str, Any]:
    """The application's view as one JSON-ready object (report.json's `darshan`)."""
    out = {
        "summary": {k: _num(v) for k, v in da.summary().items()},
        "insights": [i.to_dict() for i in da.insights],
        "tables": {name: _records(f) for name, f in da.tables.items()},
        "notes": list(da.notes),
    }
    return json.loads(json.dumps(out, default=str))


def _fmt(v: Any) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "-"
    if isinstance(v, float):
        return f"{v:,.3g}" if abs(v) < 1000 else f"{v:,.0f}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


TERMINAL_COLUMNS = {
    "phases": [
        "phase",
        "kind",
        "start_s",
        "end_s",
        "ranks",
        "ops",
        "median_bytes",
        "sequential_share",
        "opens",
        "server_service_p50_ms",
    ],
    "slow_ops": [
        "rank",
        "op",
        "offset",
        "length",
        "t_s",
        "dur_ms",
        "held_by",
        "waited_ms",
        "server_queue_ms",
        "server_service_ms",
    ],
    "by_server": [
        "server",
        "node",
        "app_ops",
        "slow_held",
        "queue_p50_ms",
        "service_p50_ms",
        "service_p99_ms",
    ],
    "alignment": ["log", "rank", "requests", "offset_lo_ms", "offset_hi_ms", "agree"],
}


def print_darshan(console: Console, da: DarshanAnalysis) -> None:
    """The application's view for people: what ran, its insights, the key tables."""
    s = da.summary()
    logs = f"{len(s['logs'])} Darshan log" + ("s" if len(s["logs"]) != 1 else "")
    console.print(
        f"[bold]application[/] {escape(s['exe'].strip()[:100])} ({s['nprocs']} processes, "
        f"{logs}, {s['run_time_s']:.2f} s): {s['writes']:,} writes, "
        f"{s['reads']:,} reads, {s['slow_ops']:,} slow"
        + (f"; {s['matched_requests']:,} server requests joined" if s["joined"] else ""),
        highlight=False,
    )
    for i in da.insights:
        if i.fired:
            codes = f" [Drishti {', '.join(i.drishti)}]" if i.drishti else ""
            console.print(f"[red]{i.id}[/] {escape(i.title)}{escape(codes)}", highlight=False)
            for e in i.evidence:
                console.print(f"    {escape(e)}", highlight=False, soft_wrap=True)
    quiet = [i.id for i in da.insights if not i.fired]
    if quiet:
        console.print(f"[dim]silent or not evaluated: {', '.join(quiet)}[/]", highlight=False)
    for name, cols in TERMINAL_COLUMNS.items():
        frame = da.tables.get(name)
        if frame is None or frame.empty:
            continue
        t = Table(title=TABLE_TITLES[name], box=box.SIMPLE_HEAD, title_justify="left")
        shown = [c for c in cols if c in frame.columns]
        for c in shown:
            t.add_column(c, justify="right")
        for row in frame.head(10)[shown].itertuples(index=False):
            t.add_row(*(_fmt(_num(v)) for v in row))
        console.print(t)
    for n in da.notes:
        console.print(f"[dim]note: {escape(n)}[/]", highlight=False, soft_wrap=True)


def _table_html(frame: pd.DataFrame | None, name: str) -> str:
    if frame is None or frame.empty:
        return f'<p class="note">No data for this table ({html.escape(name)}).</p>'
    shown = frame.map(lambda v: _fmt(_num(v)))
    return f'<div class="wide">{shown.to_html(index=False, border=0, escape=True)}</div>'


def darshan_html(da: DarshanAnalysis) -> str:
    """The report's section on the application: what ran, the insights, the timeline above
    the servers, the tables."""
    s = da.summary()
    rows = "".join(
        f"<tr><th>{html.escape(k)}</th><td>{html.escape(_fmt(_num(v)))}</td></tr>"
        for k, v in s.items()
        if k != "logs"
    )
    logs = "".join(f"<li>{html.escape(str(p))}</li>" for p in s["logs"])
    fig = P.darshan_timeline_figure(da)
    img = (
        f'<img alt="the application\'s operations above the servers" src="{P.to_data_uri(fig)}">'
        if fig is not None
        else ""
    )
    tables = "".join(
        f"<h3>{html.escape(title)}</h3>{_table_html(da.tables.get(name), name)}"
        for name, title in TABLE_TITLES.items()
        if name in da.tables
    )
    notes = "".join(f"<li>{html.escape(n)}</li>" for n in da.notes)
    return (
        f'<table class="kv">{rows}</table><ul class="note">{logs}</ul>'
        f"<h3>Insights</h3>{insights_html(da.insights)}"
        f"<h3>Timeline</h3>{img}{tables}" + (f'<ul class="note">{notes}</ul>' if notes else "")
    )

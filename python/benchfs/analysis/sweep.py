"""A sweep directory's report: each figure (bandwidths, metadata rates) against each swept
axis, the mean of a point's repetitions with its standard deviation as error bars, and the
table of points; for the terminal, JSON and one self-contained HTML page.

It reads what `benchfs-run sweep` wrote (`index.json`, schema sweep-index, docs/submit.md),
never the sweep's code: the analysis reads results directories only.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
from matplotlib.figure import Figure
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from benchfs import schemas
from benchfs.analysis.plots import WIDTH, ReportFigure, to_data_uri
from benchfs.results import read_json
from benchfs.units import shown_value

__all__ = [
    "Sweep",
    "is_sweep",
    "load_sweep",
    "print_sweep",
    "render_sweep_html",
    "sweep_figures",
    "sweep_json",
]

INDEX_JSON = "index.json"
FIGURE_LABELS = {"write_mib_s": "write MiB/s", "read_mib_s": "read MiB/s"}


def is_sweep(path: Path) -> bool:
    """Whether `path` is a sweep directory (it holds a sweep's index.json)."""
    return (path / INDEX_JSON).is_file()


@dataclass
class Sweep:
    """A sweep's index: its axes, every run, and every point aggregated."""

    path: Path
    name: str
    axes: list[str]
    rows: list[dict[str, Any]]
    points: list[dict[str, Any]]

    @property
    def varied(self) -> list[str]:
        """The axes that take more than one value."""
        return [a for a in self.axes if len({_key(p["values"].get(a)) for p in self.points}) > 1]

    @property
    def figures(self) -> list[str]:
        names = {f for p in self.points for f in p["figures"]}
        first = [f for f in FIGURE_LABELS if f in names]
        return first + sorted(names - set(first))

    def table(self) -> pd.DataFrame:
        """One row per point: the axes' values, runs, ok, and per figure mean and std."""
        rows = []
        for p in self.points:
            row: dict[str, Any] = {"point": p["point"], **p["values"]}
            row.update(runs=p["runs"], ok=p["ok"])
            for f in self.figures:
                stats = p["figures"].get(f) or {}
                row[f"{f}_mean"] = stats.get("mean")
                row[f"{f}_std"] = stats.get("std")
            rows.append(row)
        return pd.DataFrame(rows)


def _key(value: Any) -> str:
    return repr(value)


def load_sweep(path: Path) -> Sweep:
    """The sweep in `path`; ValueError names the file when its index is not one."""
    file = path / INDEX_JSON
    doc = read_json(file)
    if doc.get("schema_version") != 3:
        raise ValueError(
            f"{file}: a sweep index of version {doc.get('schema_version')!r}; this version reads "
            "version 3 (run the sweep again)"
        )
    schemas.check(doc, schemas.SWEEP_INDEX, file)
    return Sweep(path, doc["name"], doc["axes"], doc["rows"], doc["points"])


def show(axis: str, value: Any) -> str:
    """An axis value as people read it (sizes of size keys with units)."""
    return "-" if value is None else str(shown_value(axis, value))


def sweep_figures(s: Sweep) -> list[tuple[str, Figure]]:
    """Per varied axis, one figure: each figure (bandwidth, rate) against the axis, a line per
    combination of the other varied axes, mean with +-1 standard deviation as error bars."""
    out = []
    for axis in s.varied:
        others = [a for a in s.varied if a != axis]
        # Numbers in increasing order; anything else in the parameter file's order.
        xs = list({_key(p["values"].get(axis)): p["values"].get(axis) for p in s.points}.values())
        numeric = all(isinstance(x, int | float) and not isinstance(x, bool) for x in xs)
        if numeric:
            xs.sort()
        figs = s.figures or []
        if not figs:
            continue
        fig = ReportFigure(figsize=(WIDTH, 2.8 * len(figs)))
        axs = fig.subplots(len(figs), 1, squeeze=False)[:, 0]
        for ax, name in zip(axs, figs, strict=True):
            series: dict[str, list[tuple[Any, float, float]]] = {}
            for p in s.points:
                stats = p["figures"].get(name)
                if not stats:
                    continue
                label = ", ".join(f"{a} {show(a, p['values'].get(a))}" for a in others) or name
                std = stats["std"] if stats["std"] is not None else 0.0
                series.setdefault(label, []).append((p["values"].get(axis), stats["mean"], std))
            for label, pts in series.items():
                pts.sort(key=lambda t: xs.index(t[0]))
                x = [v for v, _, _ in pts] if numeric else [xs.index(v) for v, _, _ in pts]
                ax.errorbar(x, [m for _, m, _ in pts], yerr=[e for _, _, e in pts], marker="o",
                            capsize=4, label=label)  # fmt: skip
            if numeric and min(xs) > 0 and max(xs) / min(xs) >= 8:
                ax.set_xscale("log", base=2)
            ax.set_xticks(xs if numeric else range(len(xs)), [show(axis, x) for x in xs])
            ax.minorticks_off()
            ax.set_ylabel(FIGURE_LABELS.get(name, name.replace("_ops_s", " ops/s")))
            ax.set_ylim(bottom=0)
            ax.grid(alpha=0.3)
            if len(series) > 1:
                ax.legend(fontsize=7)
        axs[-1].set_xlabel(axis)
        fig.suptitle(f"against {axis} (mean of the repetitions, +-1 standard deviation)")
        out.append((axis, fig))
    return out


def _cell(axis: str, value: Any) -> str:
    if isinstance(value, float):
        return (
            "-" if math.isnan(value) else f"{value:,.3g}" if abs(value) < 100 else f"{value:,.0f}"
        )
    return show(axis, value)


def print_sweep(console: Console, s: Sweep) -> None:
    """The sweep's points: axes, runs, and each figure as mean +- std."""
    failed = sum(1 for r in s.rows if r["outcome"] != "ok")
    console.print(
        f"[bold]sweep[/] {escape(s.name)}: {len(s.points)} points, {len(s.rows)} runs"
        + (f", [red]{failed} failed[/]" if failed else ""),
        highlight=False,
    )
    t = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    for col in ("point", *s.axes, "runs"):
        t.add_column(col, justify="right")
    for f in s.figures:
        t.add_column(FIGURE_LABELS.get(f, f), justify="right")
    for p in s.points:
        cells = [str(p["point"]), *(show(a, p["values"].get(a)) for a in s.axes)]
        cells.append(f"{p['ok']}/{p['runs']}")
        for f in s.figures:
            stats = p["figures"].get(f)
            if not stats:
                cells.append("-")
            elif stats["std"] is None:
                cells.append(_cell(f, stats["mean"]))
            else:
                cells.append(f"{_cell(f, stats['mean'])} ± {_cell(f, stats['std'])}")
        t.add_row(*(escape(c) for c in cells))
    console.print(t)


def render_sweep_html(s: Sweep) -> str:
    """One self-contained page: the plots against each varied axis, then the points' table."""
    parts = [f"<h1>Sweep {html.escape(s.name)}</h1>"]
    parts.append(
        f"<p>{len(s.points)} points, {len(s.rows)} runs; axes: "
        + ", ".join(f"<code>{html.escape(a)}</code>" for a in s.axes)
        + f"; directory <code>{html.escape(str(s.path))}</code></p>"
    )
    for axis, fig in sweep_figures(s):
        parts.append(f"<h2>Against {html.escape(axis)}</h2>")
        parts.append(f'<img alt="against {html.escape(axis)}" src="{to_data_uri(fig, 150)}">')
    frame = s.table()
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in frame.columns)
    body = "".join(
        "<tr>"
        + "".join(f"<td>{html.escape(_cell(str(c), v))}</td>" for c, v in zip(frame.columns, row,
                                                                             strict=True))
        + "</tr>"
        for row in frame.itertuples(index=False)
    )  # fmt: skip
    parts.append(f"<h2>Points</h2><div class=wide><table><tr>{head}</tr>{body}</table></div>")
    style = (
        "body{font-family:sans-serif;margin:1.5em;max-width:none}"
        "img{max-width:100%;height:auto}"
        ".wide{overflow-x:auto}table{border-collapse:collapse;font-size:13px}"
        "td,th{border:1px solid #ccc;padding:2px 6px;text-align:right;white-space:nowrap}"
    )
    return (
        f"<!doctype html><html><head><meta charset=utf-8><title>sweep {html.escape(s.name)}"
        f"</title><style>{style}</style></head><body>{''.join(parts)}</body></html>\n"
    )


def sweep_json(s: Sweep) -> dict[str, Any]:
    """The sweep's points as one JSON object (NaN as null)."""
    return {
        "sweep": s.name,
        "path": str(s.path),
        "axes": s.axes,
        "varied": s.varied,
        "points": s.points,
        "runs": len(s.rows),
        "failed": sum(1 for r in s.rows if r["outcome"] != "ok"),
    }

"""What every benchmark's terminal report shares: figures as text, a table of cases, labelled
lines and the targets with whether each was met."""

from __future__ import annotations

import math
from typing import Any

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table


def fmt(value: float | None, digits: int = 0) -> str:
    """A figure with `digits` decimals; "-" when there is none."""
    if value is None or not math.isfinite(value):
        return "-"
    return f"{value:.{digits}f}"


def duration(us: float | None) -> str:
    """Microseconds as µs, or as ms from 10 ms on."""
    if us is None or not math.isfinite(us):
        return "-"
    return f"{us:,.0f} µs" if us < 10_000 else f"{us / 1000:,.0f} ms"


def report_table(title: str, numeric_columns: list[str]) -> Table:
    """A results table: a case column, then right-aligned figures."""
    table = Table(
        title=title,
        title_justify="left",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        collapse_padding=True,
        pad_edge=False,
    )
    table.add_column("case", no_wrap=True)
    for col in numeric_columns:
        table.add_column(col, justify="right", no_wrap=True)
    return table


def print_lines_and_targets(
    console: Console, lines: list[tuple[str, str]], targets: list[dict[str, Any]]
) -> None:
    """Labelled summary lines, then each target with whether it was met (n/a: not measured)."""
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column()
    for label, text in lines:
        grid.add_row(label, escape(text))
    console.print(grid)
    for target in targets:
        met = target["met"]
        mark = "[dim]n/a[/]" if met is None else "[green]met[/]" if met else "[red]missed[/]"
        console.print(f"  target {escape(target['target'])}: {mark}", highlight=False)


def print_ratio_cases(
    console: Console,
    title: str,
    tools: tuple[str, str],
    other_key: str,
    cases: list[dict[str, Any]],
) -> None:
    """The cases' medians of the measured tool and its reference, and their ratio."""
    table = report_table(title, [*tools, "ratio"])
    for c in cases:
        table.add_row(c["name"], fmt(c["mib_s"]), fmt(c[other_key]), fmt(c["ratio"], 2))
    console.print(table)

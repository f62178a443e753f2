"""`benchfs-diagnose`: find the slow node before and during a run, name the device, exclude it.

    benchfs-diagnose screen --nodes nodes.toml [--quick] [--json]   probes and judgment
    benchfs-diagnose judge RESULTS_DIR [--json]                      in-run judgment
    benchfs-diagnose show SCREEN_DIR [--csv | --json]                a screen's table
    benchfs-diagnose trace [--seconds N] > host.jsonl                the kernel's view of a host

Method, thresholds and outputs: docs/diagnose.md.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from benchfs import __version__
from benchfs.cli.consoles import console
from benchfs.config import load_config, parse_config, resolve_config_text, section
from benchfs.diagnose.inrun import judge_run
from benchfs.diagnose.judge import Thresholds
from benchfs.diagnose.screen import (
    ScreenSettings,
    load_screen,
    run_screen,
    run_screen_mpi,
    screen_csv,
)
from benchfs.errors import EXIT_FAILED, EXIT_USAGE, DiagnoseError
from benchfs.nodes import Exclusion, NodesFileError, from_allocation, load_nodes, read_exclusions
from benchfs.results import RunDir, ScreenDir
from benchfs.stdio import keep_every_byte

SHOWN_METRICS = (
    ("fio_seqread_mib_s", "seq rd MiB/s", "{:.0f}"),
    ("fio_seqwrite_mib_s", "seq wr MiB/s", "{:.0f}"),
    ("fio_workload_mib_s", "files MiB/s", "{:.0f}"),
    ("fio_workload_p50_ms", "files p50 ms", "{:.3g}"),
    ("fio_rand4k_p50_us", "4k p50 us", "{:.0f}"),
    ("dev_worst", "device", "{}"),
    ("dev_r_await_ms", "r_await ms", "{:.3g}"),
    ("dev_util_pct", "%util", "{:.0f}"),
    ("dev_member_ratio", "twins", "{:.1f}x"),
)


def _fail(err: Console, code: str, message: str, exit_code: int = EXIT_FAILED) -> None:
    err.print(
        f"[red]benchfs-diagnose: error {code}:[/] {escape(message)}",
        highlight=False,
        soft_wrap=True,
    )
    sys.exit(exit_code)


def _config(config_path: str | None, sets: Sequence[str]) -> tuple[str, Thresholds]:
    """The effective configuration (resolved once) and its `[diagnose]` section."""
    text = resolve_config_text(config_path, sets)
    return text, section(parse_config(text), "diagnose")


def _run_config(results_dir: str, config_path: str | None, sets: Sequence[str]) -> Thresholds:
    """The `[diagnose]` section a run was made with (its config.toml, without the environment),
    unless `--config` names another file."""
    if config_path is not None:
        return _config(config_path, sets)[1]
    recorded = RunDir(Path(results_dir)).config_path
    path = recorded if recorded.is_file() else None
    return section(load_config(path, sets, environment=False), "diagnose")


def screen_table(doc: dict[str, Any]) -> Table:
    """The screen as a table: one row per node, the main metrics, verdict, kind, evidence."""
    table = Table(title="benchfs-diagnose screen", title_justify="left")
    table.add_column("node")
    for _, label, _ in SHOWN_METRICS:
        table.add_column(label, justify="right")
    table.add_column("verdict")
    table.add_column("kind")
    table.add_column("evidence", overflow="fold")
    for n in doc["nodes"]:
        cells = []
        for key, _, fmt in SHOWN_METRICS:
            value = n["metrics"].get(key)
            cells.append("-" if value is None else fmt.format(value))
        v = n["verdict"]
        colour = {"ok": "green", "flagged": "yellow", "excluded": "red"}.get(v["status"], "")
        table.add_row(
            n["name"],
            *cells,
            f"[{colour}]{v['status']}[/]",
            v["kind"] or "",
            escape("\n".join(v["reasons"])),
        )
    return table


def pairs_table(doc: dict[str, Any]) -> Table | None:
    pairs = doc.get("pairs") or []
    if not pairs:
        return None
    table = Table(title="network pairs", title_justify="left")
    for col in ("pair", "write MiB/s", "read MiB/s", "rtt p50 us", "flags"):
        table.add_column(col)
    for p in pairs:

        def f(x: float | None, fmt: str = "{:.0f}") -> str:
            return "-" if x is None else fmt.format(x)

        table.add_row(
            p["pair"],
            f(p["write_mib_s"]),
            f(p["read_mib_s"]),
            f(p["rtt_p50_us"], "{:.1f}"),
            escape(p["error"] or "; ".join(p.get("flags", []))),
        )
    return table


def print_screen(console: Console, doc: dict[str, Any], path: Path | None) -> None:
    console.print(screen_table(doc))
    pairs = pairs_table(doc)
    if pairs is not None:
        console.print(pairs)
    excluded = doc.get("excluded") or []
    console.print(
        f"[bold]excluded[/] {len(excluded)}: {', '.join(e['host'] for e in excluded) or 'none'}"
    )
    tracing = doc.get("tracing")
    if tracing:
        console.print(f"[bold]tracing[/]  {escape(tracing)}", soft_wrap=True, highlight=False)
    if path is not None:
        console.print(f"[bold]screen[/]   {escape(str(path))}", soft_wrap=True, highlight=False)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="benchfs-diagnose")
def main() -> None:
    """Screen nodes before a run, judge them during it, and exclude the slow ones."""
    keep_every_byte()  # its ranks' reports pass through mpiexec (benchfs.stdio)


def _config_options(f: Any) -> Any:
    f = click.option(
        "--set",
        "sets",
        multiple=True,
        metavar="SECTION.KEY=VALUE",
        help="Override one configuration key, e.g. diagnose.r_await_ms=10 (repeatable).",
    )(f)
    return click.option(
        "--config",
        "config_path",
        type=click.Path(dir_okay=False),
        help="Configuration file, read with the BENCHFS_* variables [screen: $BENCHFS_CONFIG; "
        "judge: the run's own config.toml, without the variables].",
    )(f)


def _results_root(help: str) -> Any:
    return click.option(
        "--results-root",
        type=click.Path(file_okay=False),
        default="results",
        show_default=True,
        help=help,
    )


@main.command()
@click.option(
    "--nodes",
    "nodes_path",
    type=click.Path(dir_okay=False),
    help="Nodes file (docs/nodes.md); default: the Slurm or PBS allocation.",
)
@click.option("--scratch", help="Scratch directory of every node, with an allocation.")
@click.option("--quick", is_flag=True, help="Short probes (diagnose.quick_seconds), small files.")
@click.option(
    "--seconds",
    type=click.FloatRange(min=1),
    help="Seconds of the workload-shaped probe (others run a quarter of it).",
)
@click.option("--no-network", is_flag=True, help="Skip the network probe.")
@click.option(
    "--mpi",
    is_flag=True,
    help="Run under mpiexec, one rank per node (no network probe in this mode).",
)
@_results_root("Where the screen directory is created.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of tables.")
@_config_options
def screen(
    nodes_path: str | None,
    scratch: str | None,
    quick: bool,
    seconds: float | None,
    no_network: bool,
    mpi: bool,
    results_root: str,
    as_json: bool,
    config_path: str | None,
    sets: tuple[str, ...],
) -> None:
    """Probe every node at once, judge them, write screen.csv, excluded.txt, excluded.json."""
    out, err = console(), console(stderr=True)
    try:
        text, th = _config(config_path, sets)
        if nodes_path:
            nodes = load_nodes(nodes_path)
        elif scratch:
            nodes = from_allocation(scratch)
        else:
            raise NodesFileError("give --nodes FILE, or --scratch DIR inside an allocation")
        settings = ScreenSettings.from_thresholds(th, quick, not no_network, seconds)
        if mpi:
            done = run_screen_mpi(nodes, text, th, settings, results_root)
            if done is None:
                return
            screen_dir, result = done
        else:

            def progress(message: str) -> None:
                if not as_json:
                    err.print(f"[dim]benchfs-diagnose:[/] {escape(message)}", highlight=False)

            screen_dir, result = run_screen(nodes, text, th, settings, results_root, progress)
    except (NodesFileError, ValueError) as e:
        _fail(err, "EINVAL", str(e), EXIT_USAGE)
        return
    except FileNotFoundError as e:
        _fail(err, "ENOENT", str(e), EXIT_USAGE)
        return
    except DiagnoseError as e:
        _fail(err, e.code, e.message)
        return
    doc = result.to_json()
    if as_json:
        click.echo(json.dumps({**doc, "screen_dir": str(screen_dir.path)}))
    else:
        print_screen(out, doc, screen_dir.path)


@main.command()
@click.argument("results_dir", type=click.Path(file_okay=False, exists=True))
@click.option(
    "--screen",
    "screen_path",
    type=click.Path(exists=True),
    help="The pre-run screen (default: <results>/diagnose/screen.json if present).",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of a table.")
@_config_options
def judge(
    results_dir: str,
    screen_path: str | None,
    as_json: bool,
    config_path: str | None,
    sets: tuple[str, ...],
) -> None:
    """Judge a run from its telemetry and iostat captures (writes diagnose/judge.json)."""
    out, err = console(), console(stderr=True)
    try:
        th = _run_config(results_dir, config_path, sets)
        doc = judge_run(results_dir, th, Path(screen_path) if screen_path else None)
    except (ValueError, FileNotFoundError) as e:
        _fail(err, "EINVAL", str(e), EXIT_USAGE)
        return
    except DiagnoseError as e:
        _fail(err, e.code, e.message)
        return
    if as_json:
        click.echo(json.dumps(doc))
        return
    table = Table(title="benchfs-diagnose judge", title_justify="left")
    for col in ("node", "read ms", "read delay", "write ms", "device", "r_await ms", "kind"):
        table.add_column(col)
    table.add_column("screen")
    table.add_column("evidence", overflow="fold")
    for e in doc["nodes"]:
        dev = e.get("device") or {}

        def f(x: float | None, fmt: str) -> str:
            return "-" if x is None else fmt.format(x)

        # A delay share means something only for a node that stands out.
        table.add_row(
            e["node"],
            f(e.get("read_mean_ms"), "{:.3g}"),
            f(e.get("read_delay_share") if e["flags"] else None, "{:.0%}"),
            f(e.get("write_mean_ms"), "{:.3g}"),
            dev.get("device", "-"),
            f(dev.get("r_await_ms"), "{:.3g}"),
            e.get("kind") or "",
            e.get("screen", ""),
            escape(
                "\n".join(
                    f"{x['op']}: {x['evidence']}; {x['how']}"
                    + (f"; slow: {x['grounds']}" if x["slow"] else "")
                    for x in e["flags"]
                )
            ),
        )
    out.print(table)
    if not doc["slow"]:
        out.print(
            "no node slowed this run"
            + (
                f" (stood out but not judged slow: {', '.join(doc['flagged'])})"
                if doc["flagged"]
                else ""
            )
        )
        return
    shares = doc["slow_delay_share"]
    out.print(
        f"slow: {', '.join(doc['slow'])}, causing {shares.get('read', 0):.0%} of the read "
        f"delay and {shares.get('write', 0):.0%} of the write delay; missed by the screen: "
        f"{', '.join(doc['missed_by_screen']) or 'none'}"
    )


@main.command()
@click.argument("screen_dir", type=click.Path(exists=True))
@click.option("--csv", "as_csv", is_flag=True, help="Print screen.csv.")
@click.option("--json", "as_json", is_flag=True, help="Print screen.json.")
def show(screen_dir: str, as_csv: bool, as_json: bool) -> None:
    """Show a screen's table (its directory or screen.json)."""
    err = console(stderr=True)
    try:
        doc = load_screen(screen_dir)
    except (ValueError, FileNotFoundError) as e:
        _fail(err, "EINVAL", str(e), EXIT_USAGE)
        return
    if as_csv:
        click.echo(screen_csv(doc), nl=False)
    elif as_json:
        click.echo(json.dumps(doc))
    else:
        path = Path(screen_dir)
        print_screen(console(), doc, ScreenDir(path).path if path.is_dir() else path)


@main.command()
@_results_root("The results root whose diagnose-history.jsonl to read.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of a table.")
def history(results_root: str, as_json: bool) -> None:
    """Per node, how often and how badly screens and in-run judgments flagged it."""
    from benchfs.diagnose import history as hist

    err = console(stderr=True)
    try:
        entries, notes = hist.read_history(results_root)
    except FileNotFoundError as e:
        _fail(err, "ENOENT", str(e), EXIT_USAGE)
        return
    for note in notes:
        err.print(f"[yellow]benchfs-diagnose:[/] {escape(note)}", highlight=False)
    rows = hist.summarize(entries)
    if as_json:
        click.echo(json.dumps({"entries": len(entries), "nodes": [r.to_json() for r in rows]}))
        return
    table = Table(
        title=f"benchfs-diagnose history: {len(entries)} screens and judgments",
        title_justify="left",
    )
    for col in ("host", "seen", "flagged", "excluded", "worst", "kinds", "last flagged"):
        table.add_column(col, no_wrap=col != "kinds")
    table.add_column("recent (. ok, f flagged, X excluded)", no_wrap=True)
    for r in rows:
        table.add_row(
            r.host,
            str(r.seen),
            str(r.flagged),
            str(r.excluded),
            "-" if r.worst is None else f"{r.worst:.3g}",
            ", ".join(f"{k} x{n}" for k, n in r.kinds.items()) or "-",
            r.last_flagged or "-",
            r.recent,
        )
    console().print(table)


@main.command()
@click.option(
    "--work",
    type=click.Path(file_okay=False, path_type=Path),
    help="Directory for the tracers' files while they run [a temporary directory].",
)
@click.option(
    "--seconds",
    type=click.FloatRange(min=0, min_open=True),
    help="Stop after this long [at SIGINT or SIGTERM].",
)
@click.option("--no-profile", is_flag=True, help="No perf CPU profile (block and scheduler only).")
def trace(work: Path | None, seconds: float | None, no_profile: bool) -> None:
    """Trace this host until stopped: block I/O latency per device per second, time on and off
    CPU per program by reason, CPU stacks per process; print them as JSON lines
    (benchfs-analyze reads them from a run's kernel/ directory; docs/diagnose.md)."""
    import signal
    import tempfile
    import threading

    from benchfs.probes.kerneltrace import HostTrace

    err = console(stderr=True)
    stop = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)
    with tempfile.TemporaryDirectory(prefix="benchfs-trace-", dir=work) as tmp:
        tracer = HostTrace(Path(tmp), profile=not no_profile)
        if sys.stderr.isatty():
            for note in tracer.notes:
                err.print(f"[dim]benchfs-diagnose:[/] {escape(note)}", highlight=False)
        tracer.announce(sys.stdout)
        try:
            stop.wait(seconds)
        finally:
            tracer.stop()
            tracer.write(sys.stdout)


@main.command()
@click.argument("exclusions", type=click.Path(exists=True))
@click.option("--run", "run_it", is_flag=True, help="Run the commands (as a Slurm admin).")
def drain(exclusions: str, run_it: bool) -> None:
    """Slurm commands that drain the excluded nodes of a screen or judgment (EXCLUSIONS: its
    directory, excluded.json or excluded.txt), with the evidence as the reason; printed, or
    run with --run."""
    err = console(stderr=True)
    try:
        excluded = read_exclusions(exclusions)
    except (NodesFileError, ValueError, FileNotFoundError) as e:
        _fail(err, "EINVAL", str(e), EXIT_USAGE)
        return
    failed = 0
    for argv in drain_commands(excluded):
        click.echo(shlex.join(argv))
        if run_it:
            try:
                done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
            except (OSError, subprocess.TimeoutExpired) as e:
                err.print(f"[red]benchfs-diagnose:[/] {escape(str(e))}", highlight=False)
                failed += 1
                continue
            if done.returncode != 0:
                failed += 1
                err.print(
                    f"[red]benchfs-diagnose:[/] exit {done.returncode}: "
                    f"{escape((done.stderr or done.stdout).strip())}",
                    highlight=False,
                )
    if failed:
        sys.exit(EXIT_FAILED)


DRAIN_REASON_CHARS = 200
"""Slurm keeps a node's reason short; the first reason, cut to this, with a prefix."""


def drain_commands(excluded: Sequence[Exclusion]) -> list[list[str]]:
    """`scontrol update nodename=HOST state=drain reason="benchfs: ..."` per excluded host."""
    out = []
    for e in excluded:
        why = e.reasons[0] if e.reasons else "excluded by benchfs-diagnose"
        reason = f"benchfs: {why}"
        if len(reason) > DRAIN_REASON_CHARS:
            reason = reason[: DRAIN_REASON_CHARS - 3] + "..."
        out.append(["scontrol", "update", f"nodename={e.host}", "state=drain", f"reason={reason}"])
    return out


if __name__ == "__main__":
    main()

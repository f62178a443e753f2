"""`benchfs-analyze RESULTS_DIR`: the standard analyses, coded insights and reports of one run.

Prints a terminal summary (rich); `--html` writes one self-contained report, `--json` prints
one JSON object instead of the summary, `--csv` writes every table, `--baseline` compares with
another run (figures and effective configs), `--chrome-trace` exports per-operation traces for
Perfetto, `--save` puts report.html, report.json and tables/ into RESULTS_DIR/analysis/.
See docs/analysis.md.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

import click
from rich.markup import escape

from benchfs import __version__
from benchfs.analysis import Analysis, analyze, load_run
from benchfs.analysis.chrome import DEFAULT_LIMIT, write_chrome_trace
from benchfs.analysis.darshanjoin import analyze_darshan, find_logs
from benchfs.analysis.darshanreport import darshan_json, print_darshan
from benchfs.analysis.report import print_terminal, render_darshan_html, render_html, to_json
from benchfs.analysis.sweep import (
    is_sweep,
    load_sweep,
    print_sweep,
    render_sweep_html,
    sweep_json,
)
from benchfs.analysis.thresholds import Thresholds, resolve_thresholds, run_thresholds
from benchfs.cli.consoles import console
from benchfs.errors import EXIT_FAILED, AnalyzeError
from benchfs.results import RunDir, write_json_atomic, write_text_atomic


def _thresholds(
    run: Path, config: Path | None, overrides: tuple[str, ...], name: str = "insights"
) -> Thresholds:
    """The run's own thresholds (its config.toml), unless `--config` names another file."""
    try:
        if config is None:
            return run_thresholds(run, overrides, name)
        return resolve_thresholds(config, overrides, name)
    except FileNotFoundError as e:
        raise AnalyzeError("ENOENT", f"configuration: {e}") from e
    except ValueError as e:
        raise AnalyzeError("EINVAL", f"configuration: {e}") from e


def _analyze(
    path: Path,
    thresholds: Thresholds,
    interval: float | None,
    judgment: Thresholds,
    darshan: tuple[Path, ...] | None = None,
) -> Analysis:
    try:
        return analyze(load_run(path), thresholds, interval, judgment, darshan)
    except FileNotFoundError as e:
        raise AnalyzeError("ENOENT", str(e)) from e
    except ValueError as e:
        raise AnalyzeError("EIO", str(e)) from e


def _sweep_report(path: Path, html_path: Path | None, as_json: bool, save: bool) -> None:
    """A sweep directory: its points in the terminal or as JSON, the sweep report as HTML."""
    try:
        s = load_sweep(path)
    except (ValueError, FileNotFoundError) as e:
        raise AnalyzeError("EINVAL", str(e)) from e
    if html_path:
        _write(html_path, render_sweep_html(s))
    if save:
        _write(path / "report.html", render_sweep_html(s))
    if as_json:
        click.echo(json.dumps(sweep_json(s)))
    else:
        print_sweep(console(), s)
        for where in [p for p in (html_path, path / "report.html" if save else None) if p]:
            console(stderr=True).print(
                f"[dim]benchfs-analyze: sweep report in {escape(str(where))}[/]", highlight=False
            )


def _darshan_report(
    logs: tuple[Path, ...],
    config: Path | None,
    overrides: tuple[str, ...],
    html_path: Path | None,
    as_json: bool,
    csv_dir: Path | None,
) -> None:
    """Darshan logs made elsewhere, without a run: the application's insights and tables."""
    try:
        th = resolve_thresholds(config, overrides)
    except (FileNotFoundError, ValueError) as e:
        raise AnalyzeError("EINVAL", f"configuration: {e}") from e
    da = analyze_darshan(find_logs(logs), th)
    if html_path:
        _write(html_path, render_darshan_html(da))
    if csv_dir:
        _write_csv(da.write_csv, csv_dir)
    if as_json:
        click.echo(json.dumps({"darshan": darshan_json(da), "thresholds": th.to_dict()}))
    else:
        print_darshan(console(), da)


def _refuse_given(options: dict[str, object], why: str) -> None:
    """One line naming the options given (of `options`) that cannot go with the others:
    `why` with "{}" where their names go."""
    given = [name for name, value in options.items() if value]
    if given:
        raise AnalyzeError("EINVAL", why.format(", ".join(given)))


def _write_csv(write: Callable[[Path], object], directory: Path) -> None:
    try:
        write(directory)
    except OSError as e:
        raise AnalyzeError("EIO", f"{directory}: {e.strerror or e}") from e


def _write(path: Path, text: str) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(path, text)
    except OSError as e:
        raise AnalyzeError("EIO", f"{path}: {e.strerror or e}") from e


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="benchfs-analyze")
@click.argument(
    "results_dir", required=False, type=click.Path(exists=True, file_okay=False, path_type=Path)
)
@click.option(
    "--darshan",
    "darshan_logs",
    multiple=True,
    type=click.Path(exists=True, path_type=Path),
    help="A Darshan log (or a directory of them) of a program run on BenchFS: its insights, "
    "and with RESULTS_DIR its operations joined with that run's servers (repeatable; a run "
    "made with benchfs-run launch --darshan has its own).",
)
@click.option(
    "--html",
    "html_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write one self-contained HTML report (plots and tables) to FILE.",
)
@click.option(
    "--json", "as_json", is_flag=True, help="Print one JSON object instead of the summary."
)
@click.option(
    "--csv",
    "csv_dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Write every table as <name>.csv into DIR.",
)
@click.option(
    "--baseline",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="Another results directory to compare with (figures and effective configs).",
)
@click.option(
    "--chrome-trace",
    "chrome_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Export the per-operation trace as Chrome trace JSON (Perfetto) to FILE.",
)
@click.option(
    "--chrome-trace-limit",
    type=click.IntRange(min=1),
    default=DEFAULT_LIMIT,
    show_default=True,
    help="Operations exported at most (the earliest).",
)
@click.option(
    "--save",
    is_flag=True,
    help="Also write report.html, report.json and tables/ into RESULTS_DIR/analysis/.",
)
@click.option(
    "--interval",
    type=click.FloatRange(min=0, min_open=True),
    help="Seconds per time-series interval [the run's telemetry.interval_ms].",
)
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Configuration file for the [insights] thresholds, read with the BENCHFS_* variables "
    "[the run's own config.toml, without them].",
)
@click.option(
    "--set",
    "overrides",
    multiple=True,
    metavar="SECTION.KEY=VALUE",
    help="Override one threshold, e.g. insights.slow_op_ms=50 (repeatable).",
)
def main(
    results_dir: Path | None,
    darshan_logs: tuple[Path, ...],
    html_path: Path | None,
    as_json: bool,
    csv_dir: Path | None,
    baseline: Path | None,
    chrome_path: Path | None,
    chrome_trace_limit: int,
    save: bool,
    interval: float | None,
    config_path: Path | None,
    overrides: tuple[str, ...],
) -> None:
    """Analyze the results directory RESULTS_DIR, or a sweep's directory, or Darshan logs (see
    docs/analysis.md, docs/darshan.md)."""
    out, err = console(), console(stderr=True)
    try:
        if results_dir is None:
            if not darshan_logs:
                raise click.UsageError("give a RESULTS_DIR, or Darshan logs with --darshan")
            _refuse_given(
                {
                    "--baseline": baseline,
                    "--chrome-trace": chrome_path,
                    "--save": save,
                    "--interval": interval,
                },
                "{} needs a RESULTS_DIR",
            )
            _darshan_report(darshan_logs, config_path, overrides, html_path, as_json, csv_dir)
            return
        if is_sweep(results_dir):
            _refuse_given(
                {
                    "--csv": csv_dir,
                    "--baseline": baseline,
                    "--chrome-trace": chrome_path,
                    "--interval": interval,
                    "--config": config_path,
                    "--set": overrides,
                    "--darshan": darshan_logs,
                },
                f"{results_dir} is a sweep: {{}} is for one run",
            )
            _sweep_report(results_dir, html_path, as_json, save)
            return
        thresholds = _thresholds(results_dir, config_path, overrides)
        judgment = _thresholds(results_dir, config_path, overrides, "diagnose")
        a = _analyze(results_dir, thresholds, interval, judgment, darshan_logs or None)
        b = _analyze(baseline, thresholds, interval, judgment) if baseline else None
        report = to_json(a, b)
        if html_path:
            _write(html_path, render_html(a, b))
        if csv_dir:
            _write_csv(a.write_csv, csv_dir)
        if save:
            rd = RunDir(a.run.path)
            _write(rd.analysis_dir / "report.html", render_html(a, b))
            try:
                rd.analysis_dir.mkdir(exist_ok=True)
                write_json_atomic(rd.analysis_dir / "report.json", report)
                a.write_csv(rd.analysis_tables_dir)
                a.write_flame_graphs(rd.analysis_dir / "flamegraphs")
            except OSError as e:
                raise AnalyzeError("EIO", f"{rd.analysis_dir}: {e.strerror or e}") from e
        if as_json:
            click.echo(json.dumps(report))
        else:
            print_terminal(out, a, b)
        for what, path in (("HTML report", html_path), ("tables", csv_dir)):
            if path and not as_json:
                err.print(
                    f"[dim]benchfs-analyze: {what} in {escape(str(path))}[/]", highlight=False
                )
        if chrome_path:
            if a.run.trace is None:
                raise AnalyzeError(
                    "ENOENT",
                    f"no per-operation trace in {a.run.path} (telemetry.trace was off): "
                    "nothing to export",
                )
            info = write_chrome_trace(a.run.trace, chrome_path, chrome_trace_limit)
            note = " (truncated: raise --chrome-trace-limit)" if info["truncated"] else ""
            err.print(
                f"[dim]benchfs-analyze: {info['exported_ops']:,} of {info['trace_ops']:,} "
                f"operations in {escape(str(chrome_path))}{note}[/]",
                highlight=False,
            )
    except AnalyzeError as e:
        err.print(
            f"[red]benchfs-analyze: error {e.code}:[/] {escape(e.message)}",
            highlight=False,
            soft_wrap=True,
        )
        sys.exit(EXIT_FAILED)


if __name__ == "__main__":
    main()

"""`benchfs-bench`: benchmarks that put BenchFS's figures beside a reference.

`benchfs-bench storage` runs the chunk store alone against fio on the same directory (ten cases,
interleaved repeats, medians), then the whole path through one `benchfsd`: in-flight depth at
the device with 64 reads in flight, idle CPU, and telemetry overhead. See docs/bench.md.
"""

from __future__ import annotations

import contextlib
import json
import math
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import click
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from benchfs import __version__
from benchfs.bench.fio import find_fio
from benchfs.bench.storage import CHUNK_SIZE, Sizes, StorageBench, check_engine, check_size
from benchfs.bench.system import BenchError, free_bytes, oserror_code, tool_version
from benchfs.bench.wholepath import WholePathBench
from benchfs.cli.run import SizeType
from benchfs.cluster import find_benchfsd
from benchfs.config import load_config
from benchfs.units import format_size

MIB = 1 << 20
GIB = 1 << 30
EXIT_FAILED = 1
EXIT_INTERRUPTED = 130
DEFAULT_ROOT = "/var/tmp"
"""Scratch filesystem for the default --dir (disk-backed, unlike a tmpfs /tmp)."""
FULL = {"seq": GIB, "rand": 256 * MIB, "file": 256 * MIB, "duration": 15.0, "idle": 10.0}
QUICK = {"seq": 32 * MIB, "rand": 8 * MIB, "file": 32 * MIB, "duration": 2.0, "idle": 2.0}
MIN_SEQ, MIN_RAND, MIN_FILE = 16 * MIB, CHUNK_SIZE, 16 * MIB
HEADROOM = 256 * MIB
"""Free space kept beyond what the benchmark writes."""
WHOLE_PATH_CLIENTS = 4
WHOLE_PATH_SERVERS = 2
MIN_OVERHEAD_REPEATS_FULL = 3
MAX_DEPTH = 32
"""The deepest queue of the storage cases."""


def plan_sizes(
    sizes: Sizes, file_size: int, free: int, note: Callable[[str], None]
) -> tuple[Sizes, int]:
    """Scale the sizes down (halving) until they fit in `free` bytes; BenchError if they never do.

    Whole-path files count too: each of the two servers holds one per reader.
    """

    def need(s: Sizes, f: int) -> int:
        return s.disk_need() + WHOLE_PATH_SERVERS * WHOLE_PATH_CLIENTS * f + HEADROOM

    wanted = need(sizes, file_size)
    while need(sizes, file_size) > free:
        smaller = sizes.halved(MIN_SEQ)
        smaller = Sizes(smaller.seq, max(MIN_RAND, smaller.rand))
        smaller_file = max(MIN_FILE, file_size // 2 // MIB * MIB)
        if (smaller, smaller_file) == (sizes, file_size):
            raise BenchError(
                "ENOSPC",
                f"only {format_size(free)} free; even the smallest sizes need "
                f"{format_size(need(sizes, file_size))}",
            )
        sizes, file_size = smaller, smaller_file
    if need(sizes, file_size) < wanted:
        note(
            f"only {free / GIB:.1f} GiB free (the requested sizes need {wanted / GIB:.1f} GiB): "
            f"scaled down to {sizes.describe()} and {format_size(file_size)} per whole-path file"
        )
    return sizes, file_size


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM tears down like Ctrl-C: daemons and readers stopped, scratch removed."""

    def on_term(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt()

    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def default_root() -> Path:
    """Where the scratch directory goes without --dir: `run.scratch_dir` if set, else /var/tmp."""
    try:
        scratch = load_config()["run"]["scratch_dir"]
    except (ValueError, FileNotFoundError) as e:
        raise BenchError("EINVAL", f"configuration: {e}") from e
    return Path(scratch or DEFAULT_ROOT)


def _fmt(value: float | None, digits: int = 0) -> str:
    if value is None or not math.isfinite(value):
        return "-"
    return f"{value:.{digits}f}"


def print_report(console: Console, report: dict[str, Any]) -> None:
    """The table of cases and the whole-path lines, for people."""
    table = Table(
        title="benchfs-bench storage: medians (MiB/s, latency in µs)",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        collapse_padding=True,
        pad_edge=False,
    )
    table.add_column("case", no_wrap=True)
    for col in (
        "benchfs\nMiB/s",
        "fio\nMiB/s",
        "ratio",
        "benchfs\np50",
        "fio\np50",
        "benchfs\np99",
        "fio\np99",
    ):
        table.add_column(col, justify="right", no_wrap=True)
    for case in report["cases"]:
        ratio = case["ratio"]
        style = "" if ratio is None else ("green" if ratio >= 0.95 else "yellow")
        table.add_row(
            case["name"],
            _fmt(case["benchfs_mib_s"], 1),
            _fmt(case["fio_mib_s"], 1),
            f"[{style}]{_fmt(ratio, 2)}[/]" if style else _fmt(ratio, 2),
            _fmt(case["p50_us"]),
            _fmt(case["fio_p50_us"]),
            _fmt(case["p99_us"]),
            _fmt(case["fio_p99_us"]),
        )
    console.print(table)
    depth = report["depth"]
    lines = [
        (
            "depth",
            f"mean in-flight {depth['mean_inflight']:.1f}, depth-1 submits "
            f"{100 * depth['share_depth1']:.1f}%, op time p50 {_fmt(depth['p50_us'])} µs, "
            f"p99 {_fmt(depth['p99_us'])} µs",
        ),
        ("why", depth["explanation"]),
        (
            "idle CPU",
            f"{report['idle_cpu_pct']:.2f}% of one core over {report['idle_seconds']:g} s",
        ),
        (
            "telemetry",
            f"overhead {report['telemetry_overhead_pct']:+.1f}% server CPU per op "
            f"({report['telemetry_overhead']['cpu_us_per_op_on']:.1f} µs on vs "
            f"{report['telemetry_overhead']['cpu_us_per_op_off']:.1f} µs off)",
        ),
        (
            "settings",
            f"{report['io_mode']} I/O, {report['sizes']['seq_human']} per sequential case, "
            f"{report['sizes']['rand_human']} per random case, {report['repeats']} "
            f"repeat{'s' if report['repeats'] != 1 else ''}, "
            f"layout {report['layout']}"
            + ("" if report["page_cache_dropped"] else "; page cache NOT dropped (not root)"),
        ),
    ]
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column()
    for label, text in lines:
        grid.add_row(label, escape(text))
    console.print(grid)
    for target in report["targets"]:
        mark = "[green]met[/]" if target["met"] else "[red]missed[/]"
        console.print(f"  target {escape(target['target'])}: {mark}", highlight=False)


def targets(report: dict[str, Any]) -> list[dict[str, Any]]:
    """Issue 3's targets, checked against this report's medians."""
    found: list[dict[str, Any]] = []
    by_name = {c["name"]: c for c in report["cases"]}
    for name, case in by_name.items():
        if name.startswith("seq") and name.endswith("qd32") and case["ratio"] is not None:
            found.append(
                {
                    "target": f"{name} ratio >= 0.95",
                    "value": case["ratio"],
                    "met": case["ratio"] >= 0.95,
                }
            )
    rand = by_name.get("randread-4k-qd1")
    if rand is not None and rand["fio_p50_us"] > 0:
        value = rand["p50_us"] / rand["fio_p50_us"]
        found.append(
            {"target": "randread-4k-qd1 p50 <= 1.1 x fio's", "value": value, "met": value <= 1.1}
        )
    depth = report["depth"]["mean_inflight"]
    found.append(
        {"target": "whole-path mean in-flight depth >= 16", "value": depth, "met": depth >= 16}
    )
    idle = report["idle_cpu_pct"]
    found.append({"target": "idle server < 1% of one core", "value": idle, "met": idle < 1})
    over = report["telemetry_overhead_pct"]
    found.append({"target": "telemetry overhead < 2%", "value": over, "met": over < 2})
    return found


def run_storage(
    root: Path,
    sizes: Sizes,
    file_size: int,
    repeats: int,
    quick: bool,
    direct: bool,
    layout: str,
    duration_s: float,
    progress: Callable[[str], None],
    note: Callable[[str], None],
) -> dict[str, Any]:
    """The whole `storage` benchmark in a fresh directory under `root`, removed afterwards."""
    fio = find_fio()
    check_engine()
    try:
        benchfsd = find_benchfsd()
    except FileNotFoundError as e:
        raise BenchError("ENOENT", str(e)) from e
    try:
        root.mkdir(parents=True, exist_ok=True)
        sizes, file_size = plan_sizes(sizes, file_size, free_bytes(root), note)
        workdir = Path(tempfile.mkdtemp(prefix="benchfs-bench-", dir=root))
    except OSError as e:
        raise BenchError(oserror_code(e), f"scratch directory under {root}: {e}") from e
    started = time.monotonic()
    try:
        whole = WholePathBench(
            workdir / "whole-path",
            duration_s=duration_s,
            idle_s=QUICK["idle"] if quick else FULL["idle"],
            overhead_repeats=repeats if quick else max(MIN_OVERHEAD_REPEATS_FULL, repeats),
            file_size=file_size,
            clients=WHOLE_PATH_CLIENTS,
            progress=progress,
            benchfsd=benchfsd,
        )
        whole.check()
        progress(f"working in {workdir} ({'direct' if direct else 'buffered'} I/O)")
        storage = StorageBench(
            workdir / "storage", sizes, repeats, direct, layout, fio=fio, progress=progress
        )
        storage.workdir.mkdir()
        cases = [c.summary() for c in storage.run()]
        whole.workdir.mkdir()
        whole_report = whole.run()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    report: dict[str, Any] = {
        "cases": cases,
        **whole_report,
        "io_mode": "direct" if direct else "buffered",
        "direct_write": direct,
        "direct_read": direct,
        "page_cache_dropped": storage.cache_dropped,
        "sizes": {
            "seq": sizes.seq,
            "rand": sizes.rand,
            "seq_human": format_size(sizes.seq),
            "rand_human": format_size(sizes.rand),
        },
        "chunk_size": CHUNK_SIZE,
        "layout": layout,
        "repeats": repeats,
        "quick": quick,
        "dir": str(root),
        "fio_version": storage.fio_version or tool_version([fio, "--version"]),
        "benchfs_version": __version__,
        "elapsed_s": round(time.monotonic() - started, 3),
    }
    report["targets"] = targets(report)
    return report


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="benchfs-bench")
def main() -> None:
    """Benchmarks that show BenchFS's figures beside a reference (see docs/bench.md)."""


@main.command()
@click.option(
    "--dir",
    "root",
    type=click.Path(file_okay=False, path_type=Path),
    help="Directory on the device to measure; a fresh subdirectory is used and removed "
    f"[run.scratch_dir, else {DEFAULT_ROOT}].",
)
@click.option(
    "--repeats",
    type=click.IntRange(min=1),
    help="Interleaved repeats of every case; medians are reported [3; --quick: 1].",
)
@click.option("--quick", is_flag=True, help="Small sizes, short loads, 1 repeat (for tests).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of tables.")
@click.option(
    "--direct/--buffered",
    default=True,
    show_default=True,
    help="O_DIRECT for both directions, for both tools (buffered measures the page cache).",
)
@click.option(
    "--size",
    type=SizeType(),
    help="Bytes each sequential case moves, a multiple of 4 MiB [1 GiB; --quick: 32 MiB].",
)
@click.option(
    "--rand-size",
    type=SizeType(),
    help="Bytes each random-read case reads (over a dataset of that size) [256 MiB; quick: 8 MiB].",
)
@click.option(
    "--layout",
    type=click.Choice(["chunkfile", "packed"]),
    default="chunkfile",
    show_default=True,
    help="On-disk layout of the engine in the storage cases.",
)
@click.option(
    "--duration",
    type=click.FloatRange(min=0, min_open=True),
    help="Seconds of each whole-path load [15; --quick: 2].",
)
def storage(
    root: Path | None,
    repeats: int | None,
    quick: bool,
    as_json: bool,
    direct: bool,
    size: int | None,
    rand_size: int | None,
    layout: str,
    duration: float | None,
) -> None:
    """The chunk store alone vs fio, then depth, idle CPU and telemetry overhead via benchfsd."""
    out, err = Console(), Console(stderr=True)
    notes: list[str] = []

    def progress(message: str) -> None:
        if not as_json:
            err.print(f"[dim]benchfs-bench:[/] {escape(message)}", highlight=False, soft_wrap=True)

    def note(message: str) -> None:
        notes.append(message)
        err.print(f"[yellow]benchfs-bench:[/] {escape(message)}", highlight=False, soft_wrap=True)

    defaults = QUICK if quick else FULL
    try:
        if root is None:
            root = default_root()
        sizes = Sizes(size or defaults["seq"], rand_size or defaults["rand"])
        check_size(sizes.seq, "--size")
        check_size(sizes.rand, "--rand-size")
        if not quick and sizes.seq < MAX_DEPTH * CHUNK_SIZE:
            note(
                f"--size {format_size(sizes.seq)} holds fewer than {MAX_DEPTH} blocks of 4 MiB: "
                f"the 4m-qd{MAX_DEPTH} cases cannot reach depth {MAX_DEPTH}"
            )
        with sigterm_as_interrupt():
            report = run_storage(
                root,
                sizes,
                int(defaults["file"]),
                repeats or (1 if quick else 3),
                quick,
                direct,
                layout,
                duration or float(defaults["duration"]),
                progress,
                note,
            )
    except BenchError as e:
        err.print(
            f"[red]benchfs-bench: error {e.code}:[/] {escape(e.message)}",
            highlight=False,
            soft_wrap=True,
        )
        sys.exit(EXIT_FAILED)
    except KeyboardInterrupt:
        err.print("[red]benchfs-bench: interrupted[/]")
        sys.exit(EXIT_INTERRUPTED)
    report["notes"] = notes
    if as_json:
        click.echo(json.dumps(report))
    else:
        print_report(out, report)


if __name__ == "__main__":
    main()

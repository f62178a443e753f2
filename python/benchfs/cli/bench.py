"""`benchfs-bench`: benchmarks that put BenchFS's figures beside a reference.

`benchfs-bench storage` runs the chunk store alone against fio on the same directory (ten cases,
interleaved repeats, medians), then the whole path through one `benchfsd`: in-flight depth at
the device with 64 reads in flight, idle CPU, and telemetry overhead.

`benchfs-bench rpc` measures the network layer on tmpfs: bandwidth and round trips of one client
and one server beside `ucx_perftest`, over TCP and shared memory, then an overload shaped like
seed 002 against the peak of well-behaved windows. See docs/bench.md.
"""

from __future__ import annotations

import contextlib
import dataclasses
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
from benchfs.bench.rpc import CASE_NAMES, LOAD_INFLIGHT, RpcBench, Settings, filesystem_type
from benchfs.bench.storage import CHUNK_SIZE, Sizes, StorageBench, check_engine, check_size
from benchfs.bench.wholepath import WholePathBench
from benchfs.cli.consoles import console
from benchfs.cli.run import SizeType
from benchfs.cluster import find_benchfsd
from benchfs.config import load_config
from benchfs.errors import EXIT_INTERRUPTED, BenchError, BenchfsError, errno_name
from benchfs.probes.fio import find_fio
from benchfs.probes.system import free_bytes, tool_version
from benchfs.ucx import find_tool
from benchfs.units import GIB, MIB, format_size

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


class _Reporter:
    """Progress (hidden with --json) and notes (always shown, and kept for the report)."""

    def __init__(self, err: Console, quiet: bool) -> None:
        self.err, self.quiet = err, quiet
        self.notes: list[str] = []

    def progress(self, message: str) -> None:
        if not self.quiet:
            self.err.print(
                f"[dim]benchfs-bench:[/] {escape(message)}", highlight=False, soft_wrap=True
            )

    def note(self, message: str) -> None:
        self.notes.append(message)
        self.err.print(
            f"[yellow]benchfs-bench:[/] {escape(message)}", highlight=False, soft_wrap=True
        )


@contextlib.contextmanager
def _failures_exit(err: Console) -> Iterator[None]:
    """A tool's error (BenchfsError) or Ctrl-C ends the command with its message and exit
    status."""
    try:
        yield
    except BenchfsError as e:
        err.print(
            f"[red]benchfs-bench: error {e.code}:[/] {escape(e.message)}",
            highlight=False,
            soft_wrap=True,
        )
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        err.print("[red]benchfs-bench: interrupted[/]")
        sys.exit(EXIT_INTERRUPTED)


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


def _report_table(title: str, numeric_columns: list[str]) -> Table:
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


def _print_lines_and_targets(
    console: Console, lines: list[tuple[str, str]], targets: list[dict[str, Any]]
) -> None:
    """Labelled summary lines, then each target with whether it was met."""
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column()
    for label, text in lines:
        grid.add_row(label, escape(text))
    console.print(grid)
    for target in targets:
        mark = "[green]met[/]" if target["met"] else "[red]missed[/]"
        console.print(f"  target {escape(target['target'])}: {mark}", highlight=False)


def print_report(console: Console, report: dict[str, Any]) -> None:
    """The table of cases and the whole-path lines, for people."""
    table = _report_table(
        "benchfs-bench storage: medians (MiB/s, latency in µs)",
        [
            "benchfs\nMiB/s",
            "fio\nMiB/s",
            "ratio",
            "benchfs\np50",
            "fio\np50",
            "benchfs\np99",
            "fio\np99",
        ],
    )
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
    _print_lines_and_targets(console, lines, report["targets"])


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
        raise BenchError(errno_name(e), f"scratch directory under {root}: {e}") from e
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
    out, err = console(), console(stderr=True)
    report_to = _Reporter(err, quiet=as_json)
    progress, note, notes = report_to.progress, report_to.note, report_to.notes

    defaults = QUICK if quick else FULL
    with _failures_exit(err):
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
    report["notes"] = notes
    if as_json:
        click.echo(json.dumps(report))
    else:
        print_report(out, report)


RPC_DEFAULT_ROOT = "/dev/shm"
TMPFS_DIR_OPTION = click.option(
    "--dir",
    "root",
    type=click.Path(file_okay=False, path_type=Path),
    default=RPC_DEFAULT_ROOT,
    show_default=True,
    help="tmpfs directory for the servers' data; a fresh subdirectory is used and removed.",
)
RPC_RATIO_TARGET = 0.8
RPC_RTT_TARGET_US = {"shm": 25.0, "tcp": 60.0}
RPC_PEAK_SHARE_TARGET = 0.9
FULL_LOAD_CLIENTS = Settings.full().load_clients


def rpc_targets(report: dict[str, Any]) -> list[dict[str, Any]]:
    """Issue 4's targets, checked against this report's medians."""
    found: list[dict[str, Any]] = []
    for case in report["cases"]:
        name, transport = case["name"], case["transport"]
        if name in ("write-4m", "read-4m") and case["ratio"] is not None:
            found.append(
                {
                    "target": f"{name} over {transport}: ratio >= {RPC_RATIO_TARGET}",
                    "value": case["ratio"],
                    "met": case["ratio"] >= RPC_RATIO_TARGET,
                }
            )
        if name in ("rtt-write-4k", "rtt-read-4k") and case["p50_us"] is not None:
            limit = RPC_RTT_TARGET_US[transport]
            found.append(
                {
                    "target": f"{name} over {transport}: p50 <= {limit:g} µs",
                    "value": case["p50_us"],
                    "met": case["p50_us"] <= limit,
                }
            )
    over = report["overload"]
    found.append(
        {
            "target": "overload: zero timeouts",
            "value": over["timeouts"],
            "met": over["timeouts"] == 0,
        }
    )
    found.append(
        {"target": "overload: zero retries", "value": over["retries"], "met": over["retries"] == 0}
    )
    share = over["ratio_to_peak"]
    found.append(
        {
            "target": f"overload: throughput >= {RPC_PEAK_SHARE_TARGET} x peak",
            "value": share,
            "met": share is not None and share >= RPC_PEAK_SHARE_TARGET,
        }
    )
    return found


def _duration(us: float | None) -> str:
    """Microseconds as µs, or as ms from 10 ms on."""
    if us is None or not math.isfinite(us):
        return "-"
    return f"{us:,.0f} µs" if us < 10_000 else f"{us / 1000:,.0f} ms"


def print_rpc_report(console: Console, report: dict[str, Any]) -> None:
    """The table of cases, the overload lines and the rendezvous study, for people."""
    table = _report_table(
        "benchfs-bench rpc: medians (bandwidth in MiB/s, round trips in µs)",
        [
            "benchfs\nMiB/s",
            "perftest\nMiB/s",
            "ratio",
            "benchfs\np50",
            "benchfs\np99",
            "perftest\np50",
            "perftest\np99",
            "perftest\nsleep p50",
            "server\np50",
        ],
    )
    for case in report["cases"]:
        value = case["ratio"]
        style = "" if value is None else ("green" if value >= RPC_RATIO_TARGET else "yellow")
        table.add_row(
            f"{case['transport']} {case['name']}",
            _fmt(case["mib_s"], 0),
            _fmt(case["perftest_mib_s"], 0),
            f"[{style}]{_fmt(value, 2)}[/]" if style else _fmt(value, 2),
            _fmt(case["p50_us"], 1),
            _fmt(case["p99_us"], 1),
            _fmt(case["perftest_us"], 1),
            _fmt(case.get("perftest_p99_us"), 1),
            _fmt(case.get("perftest_sleep_us"), 1),
            _fmt(case.get("server_p50_us"), 1),
        )
    console.print(table)
    over = report["overload"]
    peaks = ", ".join(f"w{w} {_fmt(v, 0)}" for w, v in over["peak_by_window"].items())
    lines = [
        (
            "overload",
            f"{over['clients']} clients x {over['inflight_per_client']} in flight, "
            f"{over['servers']} servers x {over['buffer_count']} buffers, "
            f"{format_size(over['transfer_size'])} transfers over "
            f"{format_size(over['chunk_size'])} chunks ({over['op']}, {over['transport']}, "
            f"{over['duration_s']:g} s): {_fmt(over['mib_s'], 0)} MiB/s = "
            f"{_fmt(over['ratio_to_peak'], 2)} x peak",
        ),
        (
            "peak",
            f"{_fmt(over['peak_mib_s'], 0)} MiB/s (window {over['peak_window']}, "
            f"{over['peak_buffer_count']} buffers; by window: {peaks})",
        ),
        (
            "chunk ops",
            f"p50 {_duration(over['p50_us'])}, p99 {_duration(over['p99_us'])} at the servers "
            f"(arrival to reply ready); slowest client's call p99 "
            f"{_duration(over['call_p99_us'])}",
        ),
        (
            "faults",
            f"timeouts {over['timeouts']}, retries {over['retries']}, failures "
            f"{over['failures']}, failed calls {over['failed_calls']}, refused busy "
            f"{over['rejected_busy']}, buffer waits {over['pool_waits']}",
        ),
    ]
    study = report.get("rndv_threshold_study")
    if study:
        lines.append(
            (
                "rndv study",
                "; ".join(
                    f"{row['label']}: write-4m {_fmt(row['write-4m_mib_s'], 0)}, read-4m "
                    f"{_fmt(row['read-4m_mib_s'], 0)} MiB/s"
                    for row in study["rows"]
                )
                + " (tcp)",
            )
        )
    lines.append(
        (
            "settings",
            f"data on {report['data_dir']} ({report['data_fs']}, {report['io_mode']} I/O), "
            f"{report['repeats']} repeat{'s' if report['repeats'] != 1 else ''}, "
            f"UCX {report['versions']['ucx'] or '?'}",
        )
    )
    _print_lines_and_targets(console, lines, report["targets"])
    for text in report["notes"]:
        console.print(f"  note: {escape(text)}", highlight=False, soft_wrap=True)


def method_notes(settings: Settings, quick: bool) -> list[str]:
    """What the output's figures are, said where they are read."""
    notes = [
        "rtt-null is Client.stat on a 1-server cluster (BenchFS has no null op): one "
        "round trip to the metadata owner, no payload and no disk",
        "perftest RTT = 2 x ucx_perftest's ucp_am_lat latency, which is one-way (half the "
        "ping-pong round trip); ucx_perftest busy-polls, BenchFS sleeps in the kernel when idle",
        "overload p50/p99_us are chunk write times at the servers (request arrival to reply "
        "ready, from telemetry) over the load minus its first "
        f"{settings.load_ramp_s:g} s; each client call moves 128 MiB (64 transfers of 2 MiB)",
    ]
    if settings.load_clients != FULL_LOAD_CLIENTS:
        why = " (--quick: 16 processes are heavy on a small host)" if quick else ""
        notes.append(
            f"overload and peak ran with {settings.load_clients} client processes, "
            f"not {FULL_LOAD_CLIENTS}{why}"
        )
    if not settings.rndv_study:
        notes.append("no rendezvous threshold study (--quick or --no-rndv-study)")
    return notes


def ucx_version() -> str | None:
    try:
        line = tool_version([find_tool("ucx_info"), "-v"])
    except FileNotFoundError:
        return None
    return line.lstrip("# ").removeprefix("Version ").strip() if line else None


@main.command()
@TMPFS_DIR_OPTION
@click.option(
    "--repeats",
    type=click.IntRange(min=1),
    help="Interleaved repeats of every case and load; medians are reported [3; --quick: 1].",
)
@click.option("--quick", is_flag=True, help="Short runs, 1 repeat, 4 load clients (for tests).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of tables.")
@click.option(
    "--duration",
    type=click.FloatRange(min=1, min_open=False),
    help="Seconds of each overload and peak load [10; --quick: 2].",
)
@click.option(
    "--clients",
    type=click.IntRange(min=1, max=64),
    help="Client processes of the overload and peak loads [16; --quick: 4].",
)
@click.option(
    "--rndv-study/--no-rndv-study",
    default=None,
    help="Measure write-4m and read-4m at three rendezvous thresholds [on; --quick: off].",
)
def rpc(
    root: Path,
    repeats: int | None,
    quick: bool,
    as_json: bool,
    duration: float | None,
    clients: int | None,
    rndv_study: bool | None,
) -> None:
    """The network layer vs ucx_perftest (tcp, shm), then overload vs peak, on tmpfs."""
    out, err = console(), console(stderr=True)
    report_to = _Reporter(err, quiet=as_json)
    progress, note, notes = report_to.progress, report_to.note, report_to.notes

    base = Settings.quick() if quick else Settings.full()
    settings = dataclasses.replace(
        base,
        repeats=repeats or base.repeats,
        load_seconds=duration or base.load_seconds,
        load_clients=clients or base.load_clients,
        rndv_study=base.rndv_study if rndv_study is None else rndv_study,
    )
    started = time.monotonic()
    with _failures_exit(err):
        try:
            benchfsd = find_benchfsd()
        except FileNotFoundError as e:
            raise BenchError("ENOENT", str(e)) from e
        bench = RpcBench(root, settings, benchfsd, progress=progress, note=note)
        with sigterm_as_interrupt():
            results = bench.run()
    report: dict[str, Any] = {
        **results,
        "data_dir": str(bench.workdir),
        "io_mode": "buffered",
        "data_fs": filesystem_type(root),
        "direct_write": False,
        "direct_read": False,
        "case_names": list(CASE_NAMES),
        "overload_inflight": LOAD_INFLIGHT,
        "repeats": settings.repeats,
        "quick": quick,
        "settings": dataclasses.asdict(settings),
        "versions": {
            "benchfs": __version__,
            "ucx": ucx_version(),
            "ucx_perftest": bench.perftest,
        },
        "elapsed_s": round(time.monotonic() - started, 3),
    }
    report["targets"] = rpc_targets(report)
    report["notes"] = method_notes(settings, quick) + notes
    if as_json:
        click.echo(json.dumps(report))
    else:
        print_rpc_report(out, report)


def _targets_placement(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The issue's balance targets for the default scheme, checked row by row."""
    out = []
    for r in rows:
        if not r["default"] or r["max_over_mean"] is None:
            continue
        if r["servers"] == 16:
            overall = {"fpp-2chunks": 1.10, "mdtest-100k": 1.05}.get(r["workload"], 1.02)
            step = None if r["workload"] == "mdtest-100k" else 1.10
        else:
            overall, step = 1.25, 1.25
        met = r["max_over_mean"] <= overall and (step is None or r["step_max_over_mean"] <= step)
        out.append(
            {
                "workload": r["workload"],
                "names": r["names"],
                "servers": r["servers"],
                "target_overall": overall,
                "target_step": step,
                "met": met,
            }
        )
    return out


@main.command()
@click.option("--quick", is_flag=True, help="16 and 64 servers, 8 sampled steps (for tests).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of a table.")
@click.option(
    "--servers",
    "scales",
    type=click.IntRange(min=1),
    multiple=True,
    help="Cluster sizes to study (repeatable) [16 64 256 1024 4096].",
)
@click.option(
    "--max-steps",
    type=click.IntRange(min=1),
    default=32,
    show_default=True,
    help="Synchronised steps sampled per workload (evenly spaced; all when fewer).",
)
def placement(quick: bool, as_json: bool, scales: tuple[int, ...], max_steps: int) -> None:
    """Chunk balance of every placement scheme on recorded file sets (the servers' code)."""
    from benchfs import placement as study

    err = console(stderr=True)
    report_to = _Reporter(err, quiet=as_json)
    scales = scales or ((16, 64) if quick else study.SCALES)
    steps = 8 if quick else max_steps
    started = time.monotonic()
    rows = [
        r.as_dict()
        for r in study.rows(
            scales,
            max_steps=steps,
            on_row=lambda r: report_to.progress(
                f"{r.servers} servers {r.workload} {r.names} {r.scheme}"
            ),
        )
    ]
    report = {
        "rows": rows,
        "targets": _targets_placement(rows),
        "max_steps": steps,
        "elapsed_s": round(time.monotonic() - started, 3),
    }
    if as_json:
        click.echo(json.dumps(report))
        return
    table = _report_table(
        "benchfs-bench placement: chunks per server, max/mean (overall, worst step), CV",
        ["servers", "names", "scheme", "max/mean", "step max/mean", "cv", "moved"],
    )
    for r in rows:
        table.add_row(
            r["workload"],
            str(r["servers"]),
            r["names"],
            r["scheme"] + (" *" if r["default"] else ""),
            _fmt(r["max_over_mean"], 3),
            _fmt(r["step_max_over_mean"], 3),
            _fmt(r["cv"], 3),
            _fmt(r["moved_fraction"], 3) if r["skipped"] is None else "skipped",
        )
    console().print(table)


@main.command()
@TMPFS_DIR_OPTION
@click.option("--quick", is_flag=True, help="2 servers, 2 clients, 400 files (for tests).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of a table.")
@click.option("--files", type=click.IntRange(min=1), help="Files in total [10000; --quick: 400].")
def meta(root: Path, quick: bool, as_json: bool, files: int | None) -> None:
    """Create, stat and unlink throughput from 4 clients on 4 local servers."""
    from benchfs.bench.meta import MetaSettings, run_meta

    err = console(stderr=True)
    settings = MetaSettings.quick() if quick else MetaSettings()
    if files:
        settings = dataclasses.replace(settings, files=files)
    with _failures_exit(err):
        try:
            benchfsd = find_benchfsd()
        except FileNotFoundError as e:
            raise BenchError("ENOENT", str(e)) from e
        with tempfile.TemporaryDirectory(prefix="benchfs-meta-", dir=root) as work:
            with sigterm_as_interrupt():
                report = run_meta(Path(work), settings, benchfsd)
    report["quick"] = quick
    if as_json:
        click.echo(json.dumps(report))
        return
    table = _report_table(
        f"benchfs-bench meta: {report['files']} files, {report['clients']} clients, "
        f"{report['servers']} servers",
        ["ops", "seconds", "ops/s"],
    )
    for c in report["cases"]:
        table.add_row(c["name"], str(c["ops"]), _fmt(c["seconds"], 2), _fmt(c["ops_s"], 0))
    console().print(table)


def _run_in_scratch(
    err: Console,
    base: Path,
    prefix: str,
    quiet: bool,
    run: Callable[[Path, str, Callable[[str], None]], dict[str, Any]],
) -> dict[str, Any]:
    """`run(work_dir, benchfsd, progress)` in a fresh directory under `base`, removed
    afterwards; a failure, Ctrl-C or SIGTERM ends the command with its message. Records the
    file system type of `base` as `data_fs`."""
    with _failures_exit(err):
        try:
            benchfsd = find_benchfsd()
        except FileNotFoundError as e:
            raise BenchError("ENOENT", str(e)) from e
        fs = filesystem_type(base)

        def progress(message: str) -> None:
            if not quiet:
                err.print(f"[dim]{escape(message)}[/]")

        with tempfile.TemporaryDirectory(prefix=prefix, dir=base) as work:
            with sigterm_as_interrupt():
                report = run(Path(work), benchfsd, progress)
    report["data_fs"] = fs
    return report


def _print_ratio_cases(
    console: Console,
    title: str,
    tools: tuple[str, str],
    other_key: str,
    cases: list[dict[str, Any]],
) -> None:
    """The cases' medians of the measured tool and its reference, and their ratio."""
    table = _report_table(title, [*tools, "ratio"])
    for c in cases:
        table.add_row(c["name"], _fmt(c["mib_s"]), _fmt(c[other_key]), _fmt(c["ratio"], 2))
    console.print(table)


@main.command()
@TMPFS_DIR_OPTION
@click.option(
    "--quick", is_flag=True, help="1 repeat, 16 MiB per fio job, 32 MiB readinto (for tests)."
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of a table.")
@click.option("--repeats", type=click.IntRange(min=1), help="Interleaved repeats [3; --quick: 1].")
@click.option(
    "--mount-threads",
    type=click.IntRange(min=1),
    help="benchfs-mount worker threads [its default].",
)
def access(
    root: Path, quick: bool, as_json: bool, repeats: int | None, mount_threads: int | None
) -> None:
    """The FUSE mount (fio --direct=1) and the Python API against the native client."""
    from benchfs.bench.access import AccessSettings, run_access

    settings = AccessSettings.quick() if quick else AccessSettings()
    if repeats:
        settings = dataclasses.replace(settings, repeats=repeats)
    settings = dataclasses.replace(settings, mount_threads=mount_threads)
    report = _run_in_scratch(
        console(stderr=True),
        root,
        "benchfs-access-",
        as_json,
        lambda work, benchfsd, progress: run_access(work, settings, benchfsd, progress),
    )
    report["quick"] = quick
    if as_json:
        click.echo(json.dumps(report))
        return
    _print_ratio_cases(
        console(),
        f"benchfs-bench access: medians of {report['repeats']} (MiB/s)",
        ("layer", "native"),
        "native_mib_s",
        report["cases"],
    )
    fs = report["data_fs"]
    lines = [
        ("servers' data", f"{report['data_dir']} ({fs})"),
        (
            "fio",
            f"{report['fio_jobs']} jobs x {format_size(report['fio_file_size'])}, bs 1M, direct",
        ),
        ("readinto", f"{format_size(report['py_file_size'])} in 4 MiB calls"),
    ]
    _print_lines_and_targets(console, lines, report["targets"])


@main.command()
@click.option(
    "--dir",
    "root",
    type=click.Path(file_okay=False, path_type=Path),
    help="Directory on the disk for the servers' data and fio's files (a fresh subdirectory, "
    f"removed afterwards) [run.scratch_dir, else {DEFAULT_ROOT}].",
)
@click.option("--quick", is_flag=True, help="1 repeat, 8 MiB per rank (for tests).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of a table.")
@click.option("--repeats", type=click.IntRange(min=1), help="Interleaved repeats [3; --quick: 1].")
def e2e(root: Path | None, quick: bool, as_json: bool, repeats: int | None) -> None:
    """The built-in IOR workload (2 ranks, file per process) against fio on the same disk."""
    from benchfs.bench.e2e import E2ESettings, run_e2e

    settings = E2ESettings.quick() if quick else E2ESettings()
    if repeats:
        settings = dataclasses.replace(settings, repeats=repeats)
    err = console(stderr=True)
    with _failures_exit(err):
        base = root if root is not None else default_root()
    report = _run_in_scratch(
        err,
        base,
        "benchfs-e2e-",
        as_json,
        lambda work, benchfsd, progress: run_e2e(work, settings, benchfsd, progress),
    )
    report["quick"] = quick
    if as_json:
        click.echo(json.dumps(report))
        return
    _print_ratio_cases(
        console(),
        f"benchfs-bench e2e: medians of {report['repeats']} (MiB/s)",
        ("benchfs", "fio"),
        "fio_mib_s",
        report["cases"],
    )
    fs = report["data_fs"]
    io = f"direct_write={report['direct_write']}, direct_read={report['direct_read']}"
    lines = [
        ("data", f"{report['data_dir']} ({fs}), {io}"),
        (
            "shape",
            f"{report['servers']} servers, {report['ranks']} ranks x "
            f"{format_size(report['block_size'])}, file per process; fio {report['ranks']} jobs",
        ),
    ]
    if not report["cache_dropped"]:
        lines.append(("note", "page cache not dropped (not root): reads may hit the cache"))
    _print_lines_and_targets(console, lines, report["targets"])


ANALYSIS_RECORDS = {"full": 10_000_000, "quick": 200_000}
ANALYSIS_TABLES_TARGET_S = 10.0


def analysis_targets(report: dict[str, Any]) -> list[dict[str, Any]]:
    """Issue 9's targets, checked against this report (the load target is for 10 M records)."""
    found: list[dict[str, Any]] = []
    total = report["load_s"] + report["tables_s"]
    if report["records"] >= ANALYSIS_RECORDS["full"]:
        found.append(
            {
                "target": f"{report['records']:,} op records loaded and all tables in <= 10 s",
                "value": total,
                "met": total <= ANALYSIS_TABLES_TARGET_S,
            }
        )
    for key, limit, what in (
        ("overhead_snapshots_pct", 2.0, "snapshots"),
        ("overhead_trace_pct", 5.0, "per-operation tracing"),
    ):
        value = report[key]
        found.append(
            {
                "target": f"telemetry overhead with {what} < {limit:g}%",
                "value": value,
                "met": None if value is None else value < limit,
            }
        )
    return found


@main.command(name="analysis")
@click.option("--records", type=click.IntRange(min=1000), help="Trace records [10M; quick: 200k].")
@click.option("--servers", type=click.IntRange(min=2, max=4096), default=16, show_default=True)
@click.option("--quick", is_flag=True, help="200k records, a short overhead run (for tests).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of lines.")
@click.option(
    "--overhead/--no-overhead",
    default=True,
    show_default=True,
    help="Measure the telemetry overhead on the storage path (off, snapshots, traces).",
)
@click.option("--repeats", type=click.IntRange(min=1), help="Overhead rounds [60; --quick: 3].")
@click.option(
    "--dir",
    "root",
    type=click.Path(file_okay=False, path_type=Path),
    help=f"Scratch directory (removed afterwards) [run.scratch_dir, else {DEFAULT_ROOT}].",
)
def analysis(
    records: int | None,
    servers: int,
    quick: bool,
    as_json: bool,
    overhead: bool,
    repeats: int | None,
    root: Path | None,
) -> None:
    """Load N op records and compute every analysis table; telemetry overhead per op."""
    from benchfs.analysis.thresholds import resolve_thresholds
    from benchfs.bench.analysis import AnalysisBench

    out, err = console(), console(stderr=True)
    report_to = _Reporter(err, quiet=as_json)
    started = time.monotonic()
    with _failures_exit(err):
        if root is None:
            root = default_root()
        try:
            thresholds = resolve_thresholds()
        except ValueError as e:
            raise BenchError("EINVAL", f"configuration: {e}") from e
        try:
            root.mkdir(parents=True, exist_ok=True)
            workdir = Path(tempfile.mkdtemp(prefix="benchfs-bench-analysis-", dir=root))
        except OSError as e:
            raise BenchError(errno_name(e), f"scratch directory under {root}: {e}") from e
        try:
            bench = AnalysisBench(
                workdir=workdir,
                records=records or ANALYSIS_RECORDS["quick" if quick else "full"],
                servers=servers,
                thresholds=thresholds,
                overhead=overhead,
                repeats=repeats or (3 if quick else 60),
                overhead_ops=10_000 if quick else 50_000,
                progress=report_to.progress,
            )
            with sigterm_as_interrupt():
                report = bench.run()
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
    report["quick"] = quick
    report["servers"] = servers
    report["elapsed_s"] = round(time.monotonic() - started, 3)
    report["targets"] = analysis_targets(report)
    report["notes"] = report_to.notes
    if as_json:
        click.echo(json.dumps(report))
        return
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column()
    snap, trace = report["overhead_snapshots_pct"], report["overhead_trace_pct"]
    rows = [
        ("records", f"{report['records']:,} over {servers} servers"),
        ("load", f"{report['load_s']:.2f} s ({report['telemetry_bytes'] / MIB:,.0f} MiB)"),
        ("tables", f"{report['tables_s']:.2f} s (every standard table and insight)"),
        ("snapshots", "not measured" if snap is None else f"overhead {snap:+.2f}% CPU per op"),
        ("tracing", "not measured" if trace is None else f"overhead {trace:+.2f}% CPU per op"),
    ]
    for label, text in rows:
        grid.add_row(label, escape(text))
    out.print(grid)
    for target in report["targets"]:
        met = target["met"]
        mark = "[dim]n/a[/]" if met is None else "[green]met[/]" if met else "[red]missed[/]"
        out.print(f"  target {escape(target['target'])}: {mark}", highlight=False)


if __name__ == "__main__":
    main()

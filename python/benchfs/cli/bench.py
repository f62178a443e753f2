"""`benchfs-bench`: benchmarks that put BenchFS's figures beside a reference.

Each command's options become a call of its module in `benchfs.bench` (which owns the sizes,
the run, the targets and the terminal report); this module only parses options, reports
progress and errors, and prints the report or its JSON. See docs/bench.md.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import signal
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import click
from rich.console import Console
from rich.markup import escape

from benchfs import __version__
from benchfs.cli.consoles import console
from benchfs.cli.options import SizeType
from benchfs.cluster import find_benchfsd
from benchfs.config import load_config, resolve_config_text
from benchfs.errors import EXIT_INTERRUPTED, BenchError, BenchfsError, errno_name
from benchfs.probes.system import filesystem_type

DEFAULT_ROOT = "/var/tmp"
"""Scratch filesystem for the default --dir (disk-backed, unlike a tmpfs /tmp)."""
TMPFS_ROOT = "/dev/shm"
JSON_OPTION = click.option(
    "--json", "as_json", is_flag=True, help="Print one JSON object instead of tables."
)
TMPFS_DIR_OPTION = click.option(
    "--dir",
    "root",
    type=click.Path(file_okay=False, path_type=Path),
    default=TMPFS_ROOT,
    show_default=True,
    help="tmpfs directory for the servers' data; a fresh subdirectory is used and removed.",
)


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
    """A tool's error (BenchfsError), Ctrl-C or SIGTERM ends the command with its message and
    exit status, after the benchmark has torn down what it started."""

    def on_term(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt()

    previous = signal.signal(signal.SIGTERM, on_term)
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
    finally:
        signal.signal(signal.SIGTERM, previous)


def _benchfsd() -> str:
    try:
        return find_benchfsd()
    except FileNotFoundError as e:
        raise BenchError("ENOENT", str(e)) from e


def default_root() -> Path:
    """Where the scratch directory goes without --dir: `run.scratch_dir` if set, else /var/tmp."""
    try:
        scratch = load_config()["run"]["scratch_dir"]
    except (ValueError, FileNotFoundError) as e:
        raise BenchError("EINVAL", f"configuration: {e}") from e
    return Path(scratch or DEFAULT_ROOT)


def _in_scratch(
    base: Path, prefix: str, run: Callable[[Path, str], dict[str, Any]]
) -> dict[str, Any]:
    """`run(work_dir, benchfsd)` in a fresh directory under `base`, removed afterwards;
    records the file system type of `base` as `data_fs`."""
    benchfsd = _benchfsd()
    try:
        base.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise BenchError(errno_name(e), f"--dir {base}: {e.strerror}") from e
    with tempfile.TemporaryDirectory(prefix=prefix, dir=base) as work:
        report = run(Path(work), benchfsd)
    report["data_fs"] = filesystem_type(base)
    return report


def _emit(
    report: dict[str, Any], as_json: bool, render: Callable[[Console, dict[str, Any]], None]
) -> None:
    if as_json:
        click.echo(json.dumps(report))
    else:
        render(console(), report)


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
@JSON_OPTION
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
    from benchfs.bench import storage as bench
    from benchfs.bench.chunkstore import CHUNK_SIZE, CaseSizes, check_size
    from benchfs.units import format_size

    err = console(stderr=True)
    report_to = _Reporter(err, quiet=as_json)
    defaults = bench.QUICK if quick else bench.FULL
    with _failures_exit(err):
        if root is None:
            root = default_root()
        sizes = CaseSizes(int(size or defaults["seq"]), int(rand_size or defaults["rand"]))
        check_size(sizes.seq, "--size")
        check_size(sizes.rand, "--rand-size")
        depth = bench.MAX_DEPTH
        if not quick and sizes.seq < depth * CHUNK_SIZE:
            report_to.note(
                f"--size {format_size(sizes.seq)} holds fewer than {depth} blocks of 4 MiB: "
                f"the 4m-qd{depth} cases cannot reach depth {depth}"
            )
        report = bench.run_storage(
            root,
            sizes,
            int(defaults["file"]),
            repeats or (1 if quick else 3),
            quick,
            direct,
            layout,
            duration or float(defaults["duration"]),
            report_to.progress,
            report_to.note,
        )
    report["notes"] = report_to.notes
    _emit(report, as_json, bench.render)


@main.command()
@TMPFS_DIR_OPTION
@click.option(
    "--repeats",
    type=click.IntRange(min=1),
    help="Interleaved repeats of every case and load; medians and ranges are reported "
    "[5; --quick: 1].",
)
@click.option("--quick", is_flag=True, help="Short runs, 1 repeat, 4 load clients (for tests).")
@JSON_OPTION
@click.option(
    "--duration",
    type=click.FloatRange(min=1, min_open=False),
    help="Seconds of each overload and peak load [10; --quick: 2].",
)
@click.option(
    "--clients",
    type=click.IntRange(min=1, max=64),
    help="Client processes of the overload and peak loads [64; --quick: 4].",
)
@click.option(
    "--rndv-study/--no-rndv-study",
    default=None,
    help="Measure write-4m and read-4m at three rendezvous thresholds [on; --quick: off].",
)
@click.option(
    "--netns",
    is_flag=True,
    help="Between nodes in network namespaces (root): the cases over TCP, server and client "
    "(and ucx_perftest's two sides) on different nodes, then 1, 2 and 4 servers with clients "
    "on other nodes; no overload.",
)
def rpc(
    root: Path,
    repeats: int | None,
    quick: bool,
    as_json: bool,
    duration: float | None,
    clients: int | None,
    rndv_study: bool | None,
    netns: bool,
) -> None:
    """The network layer vs ucx_perftest (tcp, shm), then overload vs peak, on tmpfs."""
    from benchfs.bench import rpc as bench

    err = console(stderr=True)
    report_to = _Reporter(err, quiet=as_json)
    base = bench.RpcSettings.quick() if quick else bench.RpcSettings.full()
    settings = dataclasses.replace(
        base,
        repeats=repeats or base.repeats,
        load_seconds=duration or base.load_seconds,
        load_clients=clients or base.load_clients,
        rndv_study=(base.rndv_study if rndv_study is None else rndv_study) and not netns,
        netns=netns,
    )
    with _failures_exit(err):
        report = bench.run_rpc(
            root, settings, _benchfsd(), quick, report_to.progress, report_to.note
        )
    report["notes"] += report_to.notes
    _emit(report, as_json, bench.render)


@main.command()
@click.option("--quick", is_flag=True, help="16 and 64 servers, 8 sampled steps (for tests).")
@JSON_OPTION
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
    from benchfs.bench import placement as bench

    err = console(stderr=True)
    report_to = _Reporter(err, quiet=as_json)
    with _failures_exit(err):
        report = bench.run_placement(
            scales or (bench.QUICK_SCALES if quick else bench.SCALES),
            bench.QUICK_STEPS if quick else max_steps,
            report_to.progress,
        )
    _emit(report, as_json, bench.render)


@main.command(name="find")
@click.option(
    "--dir",
    "root",
    type=click.Path(file_okay=False, path_type=Path),
    help="Directory for the servers' data [run.scratch_dir, else /var/tmp].",
)
@click.option(
    "--quick", is_flag=True, help="2 servers, 2 clients, 2000 files, 1 repeat (for tests)."
)
@JSON_OPTION
@click.option("--files", type=click.IntRange(min=1), help="Files [100000; --quick: 2000].")
@click.option("--repeats", type=click.IntRange(min=1), help="Interleaved repeats [3; --quick: 1].")
def find_case(
    root: Path | None, quick: bool, as_json: bool, files: int | None, repeats: int | None
) -> None:
    """A find run on the servers against pfind's method (readdir plus a stat per entry from
    4 clients) over 100,000 files on 4 local servers."""
    from benchfs.bench import find as bench

    settings = bench.FindSettings.quick() if quick else bench.FindSettings()
    if files:
        settings = dataclasses.replace(settings, files=max(files, settings.dirs))
    if repeats:
        settings = dataclasses.replace(settings, repeats=repeats)
    with _failures_exit(console(stderr=True)):
        report = _in_scratch(
            root or default_root(),
            "benchfs-find-",
            lambda work, benchfsd: bench.run_find(work, settings, benchfsd),
        )
    report["quick"] = quick
    _emit(report, as_json, bench.render)


@main.command()
@click.option(
    "--dir",
    "root",
    type=click.Path(file_okay=False, path_type=Path),
    help="Directory for the servers' data and metadata stores [run.scratch_dir, else /var/tmp].",
)
@click.option(
    "--quick", is_flag=True, help="2 servers, 2 clients, 400 files, 1 repeat (for tests)."
)
@JSON_OPTION
@click.option("--files", type=click.IntRange(min=1), help="Files in total [10000; --quick: 400].")
@click.option(
    "--modes",
    default="memory,none,fsync,close,none-x2,none-chunkfile,none-packed",
    show_default=True,
    help="storage.durability modes to run, comma-separated (none-x2: none with two copies of "
    "the metadata, layout.replicas=2; none-chunkfile and none-packed: none with no file kept "
    "with its name, layout.inline_max=0, in chunk files or packed slots).",
)
@click.option("--repeats", type=click.IntRange(min=1), help="Interleaved repeats [3; --quick: 1].")
def meta(
    root: Path | None,
    quick: bool,
    as_json: bool,
    files: int | None,
    modes: str,
    repeats: int | None,
) -> None:
    """Create, stat and unlink throughput from 4 clients on 4 local servers, per durability
    mode, with two copies of the metadata, and of small files kept with their names, in chunk
    files and in packed slots."""
    from benchfs.bench import meta as bench

    settings = bench.MetaSettings.quick() if quick else bench.MetaSettings()
    chosen = tuple(m.strip() for m in modes.split(",") if m.strip())
    if not chosen or any(m not in bench.MODES for m in chosen):
        raise click.BadParameter(
            f"{modes!r}: choose from {', '.join(bench.MODES)}", param_hint="--modes"
        )
    settings = dataclasses.replace(settings, modes=chosen)
    if files:
        settings = dataclasses.replace(settings, files=files)
    if repeats:
        settings = dataclasses.replace(settings, repeats=repeats)
    with _failures_exit(console(stderr=True)):
        report = _in_scratch(
            root or default_root(),
            "benchfs-meta-",
            lambda work, benchfsd: bench.run_meta(work, settings, benchfsd),
        )
    report["quick"] = quick
    _emit(report, as_json, bench.render)


@main.command()
@TMPFS_DIR_OPTION
@click.option(
    "--quick", is_flag=True, help="1 repeat, 16 MiB per fio job, 32 MiB readinto (for tests)."
)
@JSON_OPTION
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
    from benchfs.bench import access as bench

    settings = bench.AccessSettings.quick() if quick else bench.AccessSettings()
    if repeats:
        settings = dataclasses.replace(settings, repeats=repeats)
    settings = dataclasses.replace(settings, mount_threads=mount_threads)
    err = console(stderr=True)
    report_to = _Reporter(err, quiet=as_json)
    with _failures_exit(err):
        report = _in_scratch(
            root,
            "benchfs-access-",
            lambda work, benchfsd: bench.run_access(work, settings, benchfsd, report_to.progress),
        )
    report["quick"] = quick
    _emit(report, as_json, bench.render)


@main.command()
@click.option(
    "--dir",
    "root",
    type=click.Path(file_okay=False, path_type=Path),
    help="Directory on the disk for the servers' data and fio's files (a fresh subdirectory, "
    f"removed afterwards) [run.scratch_dir, else {DEFAULT_ROOT}].",
)
@click.option("--quick", is_flag=True, help="1 repeat, 8 MiB per rank (for tests).")
@JSON_OPTION
@click.option("--repeats", type=click.IntRange(min=1), help="Interleaved repeats [3; --quick: 1].")
@click.option(
    "--netns",
    is_flag=True,
    help="Servers and ranks on different nodes, each its own network namespace (root).",
)
@click.option(
    "--block-size",
    type=SizeType(),
    help="Bytes per rank and per fio job [64MiB; --quick: 8MiB]; a multiple of 4 MiB.",
)
def e2e(
    root: Path | None,
    quick: bool,
    as_json: bool,
    repeats: int | None,
    netns: bool,
    block_size: int | None,
) -> None:
    """The built-in IOR workload (2 ranks, file per process) against fio on the same disk."""
    from benchfs.bench import e2e as bench

    settings = bench.E2ESettings.quick() if quick else bench.E2ESettings()
    if repeats:
        settings = dataclasses.replace(settings, repeats=repeats)
    if block_size is not None:
        if block_size <= 0 or block_size % (4 * 1024 * 1024):
            raise click.BadParameter(
                "must be a positive multiple of 4 MiB", param_hint="--block-size"
            )
        settings = dataclasses.replace(settings, block_size=block_size)
    err = console(stderr=True)
    report_to = _Reporter(err, quiet=as_json)
    with _failures_exit(err):
        report = _in_scratch(
            root if root is not None else default_root(),
            "benchfs-e2e-",
            lambda work, benchfsd: bench.run_e2e(
                work, settings, benchfsd, report_to.progress, netns
            ),
        )
    report["quick"] = quick
    _emit(report, as_json, bench.render)


@main.command()
@click.option(
    "--dir",
    "root",
    type=click.Path(file_okay=False, path_type=Path),
    help="Disk directory for the source tree, the copies and the servers' data "
    "[run.scratch_dir, else /var/tmp].",
)
@click.option(
    "--quick", is_flag=True, help="4 files of 8 MiB, 200 small files, 1 repeat (for tests)."
)
@JSON_OPTION
@click.option("--repeats", type=click.IntRange(min=1), help="Interleaved repeats [5; --quick: 1].")
def staging(root: Path | None, quick: bool, as_json: bool, repeats: int | None) -> None:
    """`benchfs stage-in` and `stage-out` of 4 GiB in 64 MiB files vs `cp -r` (+ `sync`) on
    the same disk, and 100,000 files of 4 KiB staged in vs the create rate."""
    from benchfs.bench import staging as bench

    settings = bench.StagingSettings.quick() if quick else bench.StagingSettings()
    if repeats:
        settings = dataclasses.replace(settings, repeats=repeats)
    with _failures_exit(console(stderr=True)):
        report = _in_scratch(
            root or default_root(),
            "benchfs-staging-",
            lambda work, benchfsd: bench.run_staging(work, settings, benchfsd),
        )
    report["quick"] = quick
    _emit(report, as_json, bench.render)


def _int_list(value: str, name: str) -> list[int]:
    try:
        items = [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        items = []
    if not items or any(i < 1 for i in items):
        raise click.BadParameter(
            f"expected positive integers separated by commas, not {value!r}", param_hint=name
        )
    return items


@main.command()
@click.option("--nodes", "nodes", help="Node counts, comma-separated [2,4,8,16,32].")
@click.option(
    "--ranks-per-node", "ranks", help="Client ranks per node, comma-separated [8; and 32x16]."
)
@click.option(
    "--file-size", type=SizeType(), help="Bytes per rank [16MiB, 4MiB at 32x16; --quick: 2MiB]."
)
@click.option("--quick", is_flag=True, help="8 nodes x 8 ranks, 2 MiB per rank (for tests).")
@click.option(
    "--set",
    "sets",
    multiple=True,
    metavar="SECTION.KEY=VALUE",
    help="A configuration key for every run, e.g. cluster.connect_at_start=true (repeatable).",
)
@JSON_OPTION
@click.option(
    "--plot",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write a PNG of start-up, connection and bandwidth against ranks.",
)
@click.option(
    "--dir",
    "root",
    type=click.Path(file_okay=False, path_type=Path),
    help="Scratch directory for the nodes (removed afterwards) "
    f"[run.scratch_dir, else {DEFAULT_ROOT}].",
)
def scale(
    nodes: str | None,
    ranks: str | None,
    file_size: int | None,
    quick: bool,
    sets: tuple[str, ...],
    as_json: bool,
    plot: Path | None,
    root: Path | None,
) -> None:
    """Nodes apart (network namespaces) by the dozen, ranks by the hundred: connect, verify."""
    from benchfs.bench import scale as bench

    try:
        resolve_config_text(None, sets, environment=False)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--set") from None
    settings = bench.ScaleSettings.quick(sets) if quick else bench.ScaleSettings(overrides=sets)
    if nodes is not None or ranks is not None:
        counts = (
            _int_list(nodes, "--nodes") if nodes else sorted({p.nodes for p in settings.points})
        )
        per_node = _int_list(ranks, "--ranks-per-node") if ranks else [8]
        points = tuple(bench.Point(n, r) for r in per_node for n in counts)
        settings = dataclasses.replace(settings, points=points)
    if file_size is not None:
        points = tuple(dataclasses.replace(p, file_size=None) for p in settings.points)
        settings = dataclasses.replace(settings, file_size=file_size, points=points)
    err = console(stderr=True)
    report_to = _Reporter(err, quiet=as_json)
    with _failures_exit(err):
        bench.check_root()
        report = _in_scratch(
            root or default_root(),
            "benchfs-scale-",
            lambda work, _benchfsd: bench.run_scale(work, settings, report_to.progress),
        )
        if plot is not None:
            bench.plot(report, plot)
    report["quick"] = quick
    _emit(report, as_json, bench.render)


@main.command(name="analysis")
@click.option("--records", type=click.IntRange(min=1000), help="Trace records [10M; quick: 200k].")
@click.option("--servers", type=click.IntRange(min=2, max=4096), default=16, show_default=True)
@click.option("--quick", is_flag=True, help="200k records, a short overhead run (for tests).")
@JSON_OPTION
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
    from benchfs.bench import analysis as bench

    err = console(stderr=True)
    report_to = _Reporter(err, quiet=as_json)
    with _failures_exit(err):
        try:
            thresholds = resolve_thresholds()
        except ValueError as e:
            raise BenchError("EINVAL", f"configuration: {e}") from e
        report = bench.run_analysis(
            root if root is not None else default_root(),
            records or bench.RECORDS["quick" if quick else "full"],
            servers,
            thresholds,
            overhead,
            repeats or (3 if quick else 60),
            10_000 if quick else 50_000,
            report_to.progress,
        )
    report["quick"] = quick
    report["notes"] = report_to.notes
    _emit(report, as_json, bench.render)


@main.command(name="diagnose")
@click.option(
    "--dir",
    "root",
    type=click.Path(file_okay=False, path_type=Path),
    help=f"Directory for the simulated nodes' images and screens [{DEFAULT_ROOT}].",
)
@click.option("--quick", is_flag=True, help="3 nodes, 2 trials (one planted, one clean), no load.")
@JSON_OPTION
@click.option("--nodes", type=click.IntRange(min=3), help="Simulated nodes [4; --quick: 3].")
@click.option(
    "--trials",
    type=click.IntRange(min=0),
    help="Screens [20; --quick: 2; 0: the in-run trials only].",
)
@click.option("--seed", type=int, help="Seed of the trials' draws [random, and reported].")
@click.option(
    "--seconds",
    type=click.FloatRange(min=1),
    help="Workload probe seconds of each screen [diagnose.quick_seconds; --quick: 2].",
)
@click.option(
    "--inrun-trials",
    type=click.IntRange(min=0),
    help="In-run trials (a cluster on the nodes, slowed mid-run) [8; --quick: 0].",
)
@click.option("--no-load", is_flag=True, help="No stress-ng background load.")
@click.option(
    "--kinds",
    help="Kinds planted in the screen trials, comma-separated, in turn: device, throttle, "
    "bimodal [all three].",
)
@click.option(
    "--keep",
    type=click.Path(file_okay=False, path_type=Path),
    help="Copy every trial's screen and run directory into DIR, to read what was judged.",
)
def diagnose_case(
    root: Path | None,
    quick: bool,
    as_json: bool,
    nodes: int | None,
    trials: int | None,
    seed: int | None,
    seconds: float | None,
    inrun_trials: int | None,
    no_load: bool,
    kinds: str | None,
    keep: Path | None,
) -> None:
    """The screen's accuracy: trials on simulated nodes (loop devices; a delaying device, a
    blkio throttle or a bimodal device planted at random, a quarter of the trials clean) under
    stress-ng load."""
    from benchfs.bench import diagnose as bench

    settings = bench.DiagnoseSettings.quick() if quick else bench.DiagnoseSettings()
    changes: dict[str, Any] = {"seed": seed}
    if nodes:
        changes["nodes"] = nodes
    if trials is not None:
        changes["trials"] = trials
    if seconds:
        changes["seconds"] = seconds
    if no_load:
        changes["load"] = False
    if inrun_trials is not None:
        changes["inrun_trials"] = inrun_trials
    if kinds:
        chosen = tuple(k.strip() for k in kinds.split(",") if k.strip())
        unknown = [k for k in chosen if k not in bench.KINDS]
        if unknown or not chosen:
            raise click.BadParameter(
                f"{', '.join(unknown) or 'none given'} (choose among {', '.join(bench.KINDS)})",
                param_hint="--kinds",
            )
        changes["kinds"] = chosen
    settings = dataclasses.replace(settings, **changes)
    err = console(stderr=True)
    reporter = _Reporter(err, as_json)
    base = root or Path(DEFAULT_ROOT)
    with _failures_exit(err), tempfile.TemporaryDirectory(prefix="benchfs-diag-", dir=base) as work:
        try:
            report = bench.run_diagnose(Path(work), settings, reporter.progress)
        finally:
            if keep is not None:
                bench.keep_trials(Path(work), keep)
    report["quick"] = quick
    _emit(report, as_json, bench.render)


if __name__ == "__main__":
    main()

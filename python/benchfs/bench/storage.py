"""`benchfs-bench storage`: the chunk store alone against fio on the same directory
(`benchfs.bench.chunkstore`), then the whole path through `benchfsd`
(`benchfs.bench.wholepath`): in-flight depth at the device, idle CPU and telemetry overhead.

This module owns the command's sizes (scaled down to the free space), its targets and its
terminal report. Method and how to read the numbers: docs/bench.md.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console

from benchfs import __version__
from benchfs.bench.chunkstore import CHUNK_SIZE, CaseSizes, StorageBench, check_engine
from benchfs.bench.render import fmt, print_lines_and_targets, report_table
from benchfs.bench.wholepath import WholePathBench
from benchfs.cluster import find_benchfsd
from benchfs.errors import BenchError, errno_name
from benchfs.probes.fio import find_fio
from benchfs.probes.system import free_bytes, tool_version
from benchfs.units import GIB, MIB, format_size

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
    sizes: CaseSizes, file_size: int, free: int, note: Callable[[str], None]
) -> tuple[CaseSizes, int]:
    """Scale the sizes down (halving) until they fit in `free` bytes; BenchError if they never do.

    Whole-path files count too: each of the two servers holds one per reader.
    """

    def need(s: CaseSizes, f: int) -> int:
        return s.disk_need() + WHOLE_PATH_SERVERS * WHOLE_PATH_CLIENTS * f + HEADROOM

    wanted = need(sizes, file_size)
    while need(sizes, file_size) > free:
        smaller = sizes.halved(MIN_SEQ)
        smaller = CaseSizes(smaller.seq, max(MIN_RAND, smaller.rand))
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


def run_storage(
    root: Path,
    sizes: CaseSizes,
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


def targets(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The storage targets, checked against this report's medians."""
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


def render(console: Console, report: dict[str, Any]) -> None:
    """The table of cases and the whole-path lines, for people."""
    table = report_table(
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
            fmt(case["benchfs_mib_s"], 1),
            fmt(case["fio_mib_s"], 1),
            f"[{style}]{fmt(ratio, 2)}[/]" if style else fmt(ratio, 2),
            fmt(case["p50_us"]),
            fmt(case["fio_p50_us"]),
            fmt(case["p99_us"]),
            fmt(case["fio_p99_us"]),
        )
    console.print(table)
    depth = report["depth"]
    lines = [
        (
            "depth",
            f"mean in-flight {depth['mean_inflight']:.1f}, depth-1 submits "
            f"{100 * depth['share_depth1']:.1f}%, op time p50 {fmt(depth['p50_us'])} µs, "
            f"p99 {fmt(depth['p99_us'])} µs",
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
    print_lines_and_targets(console, lines, report["targets"])

"""`benchfs-bench staging`: `benchfs stage-in` of a tree of large files beside `cp -r` of the
same tree into a directory of the same file system, interleaved, medians.

The servers keep their data on the disk under the scratch directory (direct writes, as by
default), so both copies read the same source and write to the same device. `cp -r` returns
with its data in the page cache; `cp -r` + `sync` is timed too, as the durable comparison.
Stage-in includes what staging always does: an xxh3 checksum of every byte, the read-back
from BenchFS that verifies it, and the modes and times set on every file.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from benchfs import Client
from benchfs.bench.cluster import BenchCluster
from benchfs.bench.render import fmt, print_lines_and_targets, report_table
from benchfs.bench.stats import interleave, median, ratio
from benchfs.lifecycle.stage import BenchfsSide, LocalSide, stage
from benchfs.units import MIB

TOOLS = ("stage-in", "cp -r", "cp -r + sync")
TARGET = 0.8
"""Stage-in at least this fraction of `cp -r`'s bandwidth (the issue's target)."""


@dataclass(frozen=True)
class StagingSettings:
    files: int = 16
    file_size: int = 64 * MIB
    servers: int = 2
    threads: int = 4
    repeats: int = 3

    @classmethod
    def quick(cls) -> StagingSettings:
        return cls(files=4, file_size=8 * MIB, repeats=1)


def _make_source(src: Path, settings: StagingSettings) -> None:
    src.mkdir()
    block = os.urandom(MIB)
    for i in range(settings.files):
        with open(src / f"f{i:03d}", "wb") as f:
            for j in range(settings.file_size // MIB):
                f.write(block[j % 7 :] + block[: j % 7])  # distinct blocks, no compression luck


def _remove_tree(client: Client, path: str) -> None:
    for name, kind in client.readdir(path):
        child = f"{path}/{name}"
        if kind == "dir":
            _remove_tree(client, child)
        else:
            client.unlink(child)
    client.rmdir(path)


def run_staging(root: Path, settings: StagingSettings, benchfsd: str) -> dict[str, Any]:
    src = root / "src"
    _make_source(src, settings)
    total = settings.files * settings.file_size
    cluster = BenchCluster(
        root / "cluster", "staging", settings.servers, ["storage.direct_write=true"], benchfsd
    )
    cluster.start()
    seconds: dict[str, list[float]] = {tool: [] for tool in TOOLS}
    try:
        config = cluster.config_text()
        for step in interleave(["tree"], settings.repeats, TOOLS):
            if step.tool == "stage-in":
                side = BenchfsSide(f"/in-{step.repeat}", lambda: Client(cluster.registry, config))
                t0 = time.perf_counter()
                stage(
                    LocalSide(src), side, "in", root / f"stage-{step.repeat}.json", settings.threads
                )
                seconds[step.tool].append(time.perf_counter() - t0)
                side.close()
                with Client(cluster.registry, config) as c:
                    _remove_tree(c, f"/in-{step.repeat}")
            else:
                dest = root / f"cp-{step.repeat}"
                t0 = time.perf_counter()
                subprocess.run(["cp", "-r", str(src), str(dest)], check=True)
                if step.tool == "cp -r + sync":
                    subprocess.run(["sync", "-f", str(dest)], check=True)
                seconds[step.tool].append(time.perf_counter() - t0)
                shutil.rmtree(dest)
                subprocess.run(["sync", "-f", str(root)], check=True)  # the next case starts clean
    finally:
        cluster.stop()
    mib_s = {tool: total / MIB / median(s) for tool, s in seconds.items()}
    vs_cp = ratio(mib_s["stage-in"], mib_s["cp -r"])
    return {
        "files": settings.files,
        "file_size": settings.file_size,
        "servers": settings.servers,
        "threads": settings.threads,
        "repeats": settings.repeats,
        "seconds": seconds,
        "mib_s": mib_s,
        "ratio_vs_cp": vs_cp,
        "ratio_vs_cp_sync": ratio(mib_s["stage-in"], mib_s["cp -r + sync"]),
        "targets": [
            {
                "target": f"stage-in >= {TARGET}x cp -r",
                "met": None if vs_cp is None else vs_cp >= TARGET,
            }
        ],
        "data_dir": str(root),
    }


def render(console: Console, report: dict[str, Any]) -> None:
    table = report_table(
        f"benchfs-bench staging: {report['files']} files x {report['file_size'] // MIB} MiB, "
        f"{report['servers']} servers, {report['threads']} threads, median of "
        f"{report['repeats']}",
        ["MiB/s", "seconds"],
    )
    for tool in TOOLS:
        table.add_row(tool, fmt(report["mib_s"][tool], 1), fmt(median(report["seconds"][tool]), 2))
    console.print(table)
    print_lines_and_targets(
        console,
        [
            ("stage-in / cp -r", fmt(report["ratio_vs_cp"], 2) + "x"),
            ("stage-in / cp -r + sync", fmt(report["ratio_vs_cp_sync"], 2) + "x"),
        ],
        report["targets"],
    )

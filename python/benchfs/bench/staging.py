"""`benchfs-bench staging`: `benchfs stage-in` and `stage-out` beside `cp -r` and `cp -r` +
`sync` of the same tree on the same disk, interleaved, medians; and a tree of many small files
staged in beside the create rate of the same clients and servers.

The servers keep their data on the disk under the scratch directory (direct writes, as by
default), so every copy reads the same source and writes to the same device. `cp -r` returns
with its data in the page cache; `cp -r` + `sync` is the durable comparison, and the one the
targets use: stage-out fsyncs what it writes, and stage-in's copy is on the servers' device
(direct writes) and verified there. Both stagings include what staging always does: a checksum
of every byte read, the servers' checksums compared with it (into BenchFS, of the bytes as they
received them, its default; out of it, as they read them from their device for the copy), and
the modes and times set on every file. `stage-in stored` is `benchfs stage-in --verify stored`:
each server also reads every byte it wrote back from its device and hashes that, so the disk
moves every byte twice. Every tool runs in two forms, interleaved: warm (the source as the
previous step left it, mostly in the page cache) and cold (the page cache dropped before it, as
at a job's end, so `cp -r` and stage-out read their source from the device). The device's own
counts (/proc/diskstats) of bytes read and written during each copy show where the time goes.

Small files: `files` x 4 KiB staged in with the same threads, in each way BenchFS can keep
them: `inline` (the default: each file's bytes with its name, `layout.inline_max`), `chunkfile`
(`layout.inline_max=0`: a chunk file per file) and `packed` (`layout.inline_max=0` and
`storage.layout=packed` with 4 KiB slots, its best case: one slot per file) on clusters of the
same size, against the rate at which the same number of clients create empty files
(`open(O_CREAT | O_EXCL)` + `close`, as `benchfs-bench meta` measures it) on the default
cluster, and `cp -r` + `sync` of the tree.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from rich.console import Console

from benchfs import Client
from benchfs.bench.cluster import BenchCluster, on_threads
from benchfs.bench.render import fmt, print_lines_and_targets, report_table
from benchfs.bench.stats import interleave, median, ratio
from benchfs.lifecycle.stage import BenchfsSide, LocalSide, stage
from benchfs.probes.system import drop_caches
from benchfs.units import KIB, MIB

TOOLS = ("stage-in", "stage-in stored", "stage-out", "cp -r", "cp -r + sync")
FORMS = ("warm", "cold")
"""Each tool as it runs right after the tree was made or staged (its source in the page
cache), and with the page cache dropped before it (as at a job's end: nothing cached)."""
TARGET_IN = 0.85
"""Stage-in (its default check) at least this fraction of `cp -r` + `sync`'s bandwidth."""
TARGET_OUT = 0.8
"""Stage-out at least this fraction of `cp -r` + `sync`'s bandwidth, warm and cold."""
SMALL_TARGET = 0.6
"""Small files staged in (inline, the default) at least this fraction of the create rate."""
SMALL_CP_TARGET = 2.0
"""Small files staged in (inline) at least this multiple of `cp -r` + `sync`'s rate."""
SMALL_SIZE = 4 * KIB
SMALL_LAYOUTS = {
    "inline": [],
    "chunkfile": ["layout.inline_max=0"],
    "packed": ["layout.inline_max=0", "storage.layout=packed", f"layout.chunk_size={SMALL_SIZE}"],
}
"""How each way of keeping small files is configured (over the staging cluster's settings)."""


@dataclass(frozen=True)
class StagingSettings:
    files: int = 64
    file_size: int = 64 * MIB
    small_files: int = 100_000
    servers: int = 2
    threads: int = 4
    repeats: int = 5

    @classmethod
    def quick(cls) -> StagingSettings:
        return cls(files=4, file_size=8 * MIB, small_files=200, repeats=1)


def _make_source(src: Path, settings: StagingSettings) -> None:
    src.mkdir()
    block = os.urandom(MIB)
    for i in range(settings.files):
        with open(src / f"f{i:03d}", "wb") as f:
            for j in range(settings.file_size // MIB):
                f.write(block[j % 7 :] + block[: j % 7])  # distinct blocks, no compression luck


def _make_small(src: Path, count: int) -> None:
    """`count` files of 4 KiB, 1,000 to a directory."""
    data = os.urandom(SMALL_SIZE + count)
    for i in range(count):
        d = src / f"d{i // 1000:03d}"
        if i % 1000 == 0:
            d.mkdir(parents=True)
        (d / f"s{i:06d}").write_bytes(data[i : i + SMALL_SIZE])


def _remove_tree(client: Client, path: str) -> None:
    for name, kind in client.readdir(path):
        child = f"{path}/{name}"
        if kind == "dir":
            _remove_tree(client, child)
        else:
            client.unlink(child)
    client.rmdir(path)


def _device_of(path: Path) -> str | None:
    """The /proc/diskstats name of the block device holding `path` (None if not listed)."""
    dev = os.stat(path).st_dev
    want = (os.major(dev), os.minor(dev))
    with open("/proc/diskstats") as f:
        for line in f:
            fields = line.split()
            if (int(fields[0]), int(fields[1])) == want:
                return fields[2]
    return None


def _device_bytes(device: str | None) -> tuple[int, int]:
    """(read, written) bytes of `device` since boot; (0, 0) when unknown."""
    if device is None:
        return 0, 0
    with open("/proc/diskstats") as f:
        for line in f:
            fields = line.split()
            if fields[2] == device:
                return int(fields[5]) * 512, int(fields[9]) * 512
    return 0, 0


def _timed(device: str | None, run: Callable[[], None]) -> tuple[float, int, int]:
    """Seconds `run` took, and the device's bytes read and written meanwhile."""
    r0, w0 = _device_bytes(device)
    t0 = time.perf_counter()
    run()
    elapsed = time.perf_counter() - t0
    r1, w1 = _device_bytes(device)
    return elapsed, r1 - r0, w1 - w0


def _cp(src: Path, dest: Path, sync: bool) -> None:
    subprocess.run(["cp", "-r", str(src), str(dest)], check=True)
    if sync:
        subprocess.run(["sync", "-f", str(dest)], check=True)


def run_staging(root: Path, settings: StagingSettings, benchfsd: str) -> dict[str, Any]:
    src, small = root / "src", root / "small"
    _make_source(src, settings)
    _make_small(small, settings.small_files)
    total = settings.files * settings.file_size
    device = _device_of(root)
    cluster = BenchCluster(
        root / "cluster", "staging", settings.servers, ["storage.direct_write=true"], benchfsd
    )
    cluster.start()
    seconds: dict[tuple[str, str], list[float]] = {(f, t): [] for f in FORMS for t in TOOLS}
    device_mib: dict[tuple[str, str], list[tuple[float, float]]] = {k: [] for k in seconds}
    dropped = True
    subprocess.run(["sync", "-f", str(root)], check=True)
    try:
        config = cluster.config_text()

        def connect() -> Client:
            return Client(cluster.registry, config)

        def timed(form: str, tool: str, run: Callable[[], None]) -> None:
            """One copy, the page cache dropped first in the cold form."""
            nonlocal dropped
            if form == "cold":
                dropped = drop_caches() and dropped
            measured = _timed(device, run)
            seconds[(form, tool)].append(measured[0])
            device_mib[(form, tool)].append((measured[1] / MIB, measured[2] / MIB))
            subprocess.run(["sync", "-f", str(root)], check=True)  # the next starts clean

        for step in interleave(list(FORMS), settings.repeats, TOOLS):
            form, n = step.case, f"{step.case}-{step.repeat}"
            if step.tool == "stage-out":
                continue  # right after its stage-in, below, so the tree is there
            if step.tool == "stage-in stored":
                side = BenchfsSide(f"/stored-{n}", connect, "stored")
                manifest = root / f"stage-in-stored-{n}.json"
                timed(form, step.tool, partial(stage, LocalSide(src), side, "in", manifest,
                                               settings.threads))  # fmt: skip
                side.close()
                with connect() as c:
                    _remove_tree(c, f"/stored-{n}")
                continue
            if step.tool != "stage-in":
                dest = root / f"cp-{n}"
                timed(form, step.tool, partial(_cp, src, dest, step.tool == "cp -r + sync"))
                shutil.rmtree(dest)
                continue
            for direction, src_side, dst_side in (
                ("in", LocalSide(src), BenchfsSide(f"/in-{n}", connect)),
                ("out", BenchfsSide(f"/in-{n}", connect), LocalSide(root / f"out-{n}")),
            ):
                tool = f"stage-{direction}"
                manifest = root / f"{tool}-{n}.json"
                timed(form, tool, partial(stage, src_side, dst_side, direction, manifest,
                                          settings.threads))  # fmt: skip
                for side in (src_side, dst_side):
                    if isinstance(side, BenchfsSide):
                        side.close()
            shutil.rmtree(root / f"out-{n}")
            with connect() as c:
                _remove_tree(c, f"/in-{n}")
    finally:
        cluster.stop()
    small_report = _small_files(root, small, settings, benchfsd)
    forms = {form: _form_report(form, total, seconds, device_mib) for form in FORMS}
    warm, cold = forms["warm"], forms["cold"]
    small_vs = small_report["ratio_vs_create"]
    small_vs_cp = small_report["ratio_vs_cp_sync"]
    beats = small_report["inline_vs_other_layouts"]

    def target(text: str, value: float | None, floor: float) -> dict[str, Any]:
        return {"target": text, "value": value, "met": None if value is None else value >= floor}

    return {
        "files": settings.files,
        "file_size": settings.file_size,
        "servers": settings.servers,
        "threads": settings.threads,
        "repeats": settings.repeats,
        **warm,
        "cold": cold,
        "cache_dropped": dropped,
        "device": device,
        "small": small_report,
        "targets": [
            target(f"stage-in >= {TARGET_IN}x cp -r + sync", warm["ratio_vs_cp_sync"], TARGET_IN),
            target(
                f"stage-in, cold, >= {TARGET_IN}x cp -r + sync, cold",
                cold["ratio_vs_cp_sync"],
                TARGET_IN,
            ),
            target(
                f"stage-out >= {TARGET_OUT}x cp -r + sync",
                warm["stage_out_ratio_vs_cp_sync"],
                TARGET_OUT,
            ),
            target(
                f"stage-out, cold, >= {TARGET_OUT}x cp -r + sync, cold",
                cold["stage_out_ratio_vs_cp_sync"],
                TARGET_OUT,
            ),
            target(
                f"small files staged in >= {SMALL_TARGET}x the create rate", small_vs, SMALL_TARGET
            ),
            target(
                f"small files staged in >= {SMALL_CP_TARGET}x cp -r + sync",
                small_vs_cp,
                SMALL_CP_TARGET,
            ),
            target("small files: inline beats chunkfile and packed", beats, 1.0),
        ],
        "data_dir": str(root),
    }


def _form_report(
    form: str,
    total: int,
    seconds: dict[tuple[str, str], list[float]],
    device_mib: dict[tuple[str, str], list[tuple[float, float]]],
) -> dict[str, Any]:
    """One form's figures: per tool its seconds, MiB/s (medians) and device MiB; the ratios."""
    mib_s = {tool: total / MIB / median(seconds[(form, tool)]) for tool in TOOLS}
    durable = mib_s["cp -r + sync"]
    return {
        "seconds": {tool: seconds[(form, tool)] for tool in TOOLS},
        "mib_s": mib_s,
        "device_mib": {
            tool: {
                "read": median(r for r, _ in device_mib[(form, tool)]),
                "written": median(w for _, w in device_mib[(form, tool)]),
            }
            for tool in TOOLS
        },
        "ratio_vs_cp": ratio(mib_s["stage-in"], mib_s["cp -r"]),
        "ratio_vs_cp_sync": ratio(mib_s["stage-in"], durable),
        "stage_out_ratio_vs_cp_sync": ratio(mib_s["stage-out"], durable),
        "stored_ratio_vs_cp_sync": ratio(mib_s["stage-in stored"], durable),
    }


def _small_files(
    root: Path, small: Path, settings: StagingSettings, benchfsd: str
) -> dict[str, Any]:
    """The small tree staged in on a cluster per layout (SMALL_LAYOUTS), `cp -r` + `sync` of it,
    and the create rate of as many clients as staging has threads on the default cluster,
    interleaved; files per second, medians."""
    count = settings.small_files
    clusters = {
        layout: BenchCluster(root / f"small-{layout}", "staging", settings.servers,
                             ["storage.direct_write=true", *extra], benchfsd)
        for layout, extra in SMALL_LAYOUTS.items()
    }  # fmt: skip
    tools = (*(f"stage-in {layout}" for layout in SMALL_LAYOUTS), "cp -r + sync", "create")
    rates: dict[str, list[float]] = {tool: [] for tool in tools}
    try:
        for c in clusters.values():
            c.start()
        connect = {
            layout: partial(Client, c.registry, c.config_text()) for layout, c in clusters.items()
        }
        creators = [connect["inline"]() for _ in range(settings.threads)]
        try:
            for step in interleave(["small"], settings.repeats, tools):
                n = step.repeat
                if step.tool == "create":
                    per_client = count // len(creators)
                    rates["create"].append(_create_rate(creators, per_client, f"/create-{n}"))
                elif step.tool.startswith("stage-in "):
                    layout = step.tool.removeprefix("stage-in ")
                    side = BenchfsSide(f"/small-{n}", connect[layout])
                    t0 = time.perf_counter()
                    stage(LocalSide(small), side, "in", root / f"small-{layout}-{n}.json",
                          settings.threads)  # fmt: skip
                    rates[step.tool].append(count / (time.perf_counter() - t0))
                    side.close()
                    with connect[layout]() as c:
                        _remove_tree(c, f"/small-{n}")
                else:
                    t0 = time.perf_counter()
                    _cp(small, root / f"small-cp-{n}", sync=True)
                    rates["cp -r + sync"].append(count / (time.perf_counter() - t0))
                    shutil.rmtree(root / f"small-cp-{n}")
                subprocess.run(["sync", "-f", str(root)], check=True)
        finally:
            for c in creators:
                c.close()
    finally:
        for c in clusters.values():
            c.stop()
    files_s = {tool: median(v) for tool, v in rates.items()}
    inline = files_s["stage-in inline"]
    versus = {
        layout: ratio(inline, files_s[f"stage-in {layout}"]) for layout in ("chunkfile", "packed")
    }
    known = [v for v in versus.values() if v is not None]
    return {
        "files": count,
        "file_size": SMALL_SIZE,
        "files_s": files_s,
        "ratio_vs_create": ratio(inline, files_s["create"]),
        "ratio_vs_cp_sync": ratio(inline, files_s["cp -r + sync"]),
        "inline_vs_chunkfile": versus["chunkfile"],
        "inline_vs_packed": versus["packed"],
        "inline_vs_other_layouts": min(known) if len(known) == len(versus) else None,
    }


def _create_rate(clients: list[Client], per_client: int, top: str) -> float:
    """Empty files created per second by every client at once, each in its own directory
    under `top` (removed afterwards)."""
    clients[0].mkdir(top)
    for i in range(len(clients)):
        clients[0].mkdir(f"{top}/{i}")

    def create(c: Client, i: int) -> None:
        for k in range(per_client):
            c.open(f"{top}/{i}/f{k}", os.O_RDWR | os.O_CREAT | os.O_EXCL).close()

    took = on_threads(clients, create)[0]
    _remove_tree(clients[0], top)
    return per_client * len(clients) / took


def render(console: Console, report: dict[str, Any]) -> None:
    for form, figures in (("warm", report), ("cold: page cache dropped first", report["cold"])):
        table = report_table(
            f"benchfs-bench staging ({form}): {report['files']} files x "
            f"{report['file_size'] // MIB} MiB, {report['servers']} servers, "
            f"{report['threads']} threads, median of {report['repeats']}",
            ["MiB/s", "seconds", "device read MiB", "device written MiB"],
        )
        for tool in TOOLS:
            dev = figures["device_mib"][tool]
            table.add_row(
                tool,
                fmt(figures["mib_s"][tool], 1),
                fmt(median(figures["seconds"][tool]), 2),
                fmt(dev["read"]),
                fmt(dev["written"]),
            )
        console.print(table)
    small = report["small"]
    table = report_table(
        f"small files: {small['files']} x {small['file_size'] // KIB} KiB", ["files/s"]
    )
    for tool, rate in small["files_s"].items():
        table.add_row(tool, fmt(rate))
    console.print(table)
    cold = report["cold"]
    lines = [
        ("stage-in / cp -r", fmt(report["ratio_vs_cp"], 2) + "x"),
        ("stage-in / cp -r + sync", fmt(report["ratio_vs_cp_sync"], 2) + "x"),
        ("stage-in stored / cp -r + sync", fmt(report["stored_ratio_vs_cp_sync"], 2) + "x"),
        ("stage-out / cp -r + sync", fmt(report["stage_out_ratio_vs_cp_sync"], 2) + "x"),
        ("cold stage-in / cp -r + sync", fmt(cold["ratio_vs_cp_sync"], 2) + "x"),
        ("cold stage-out / cp -r + sync", fmt(cold["stage_out_ratio_vs_cp_sync"], 2) + "x"),
        ("small stage-in (inline) / create", fmt(small["ratio_vs_create"], 2) + "x"),
        ("small stage-in (inline) / cp -r + sync", fmt(small["ratio_vs_cp_sync"], 2) + "x"),
        ("small stage-in inline / chunkfile", fmt(small["inline_vs_chunkfile"], 2) + "x"),
        ("small stage-in inline / packed", fmt(small["inline_vs_packed"], 2) + "x"),
    ]
    if not report["cache_dropped"]:
        lines.append(("note", "page cache not dropped (not root): the cold form ran warm"))
    print_lines_and_targets(console, lines, report["targets"])

"""Pipeline study: what `client.read_ahead` and `client.write_behind` let one sequential reader
or writer take from the disk.

A 2-server local cluster keeps its data on the disk (the directory given, not tmpfs), with the
default configuration otherwise (direct writes, buffered reads on the servers). For every
setting and transfer size a fresh client either writes a file from start to end and fsyncs it
(write-behind), or reads one from start to end with `readinto` after the page cache is dropped
(read-ahead). fio does the same on the same disk in the same transfer size as the reference
(psync, one job; writes direct with a final fsync, reads buffered, as the servers do them).
Repeats are interleaved; medians and ratios to fio go to results.md and results.json beside
this file. The defaults of both settings were chosen from this table (docs/storage.md).

    .venv/bin/python studies/pipeline/run.py [--dir /var/tmp/benchfs-pipeline] [--size 1024]
        [--repeats 3] [--settings 0,8M,32M,64M] [--transfers 128K,1M,4M]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import time
from pathlib import Path

from benchfs import _core
from benchfs.cluster import LocalCluster
from benchfs.config import resolve_config_text
from benchfs.probes.fio import find_fio, run_fio
from benchfs.probes.system import drop_caches
from benchfs.units import format_size, parse_size

HERE = Path(__file__).resolve().parent
MIB = 1 << 20
KEYS = {"write": "client.write_behind", "read": "client.read_ahead"}


def client_config(root: Path, key: str, value: str) -> str:
    return resolve_config_text(
        None,
        [
            "cluster.expected_servers=2",
            f"cluster.registry_dir={root / 'registry'}",
            f"{key}={value}",
        ],
    )


def cold() -> None:
    if not drop_caches():
        raise SystemExit("cannot drop the page cache (needs root)")


def benchfs_run(root: Path, direction: str, setting: str, transfer: int, size: int) -> float:
    """MiB/s of one client writing (then fsyncing) or reading /data in `transfer` bytes."""
    client = _core.Client(str(root / "registry"), client_config(root, KEYS[direction], setting))
    try:
        cold()
        view = memoryview(bytearray(os.urandom(transfer)))
        done = 0
        start = time.perf_counter()
        if direction == "write":
            f = client.open("/data", os.O_CREAT | os.O_TRUNC, 0o644)
            while done < size:
                done += f.write(done, view[: size - done])
            f.fsync()
        else:
            f = client.open("/data")
            while got := f.readinto(done, view):
                done += got
        seconds = time.perf_counter() - start
        f.close()
    finally:
        client.close()
    if done != size:
        raise SystemExit(f"{direction} moved {done} bytes of {size}")
    return size / seconds / MIB


def fio_run(fio: str, path: Path, direction: str, transfer: int, size: int) -> float:
    cold()
    how = ["--direct=1", "--end_fsync=1"] if direction == "write" else ["--direct=0"]
    argv = [
        fio, f"--name=seq{direction}", f"--filename={path}", f"--rw={direction}",
        f"--bs={transfer}", f"--size={size}", "--ioengine=psync", "--numjobs=1", *how,
        "--output-format=json",
    ]  # fmt: skip
    return run_fio(argv, direction).mib_s


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--dir", type=Path, default=Path("/var/tmp/benchfs-pipeline"))
    ap.add_argument("--size", type=int, default=1024, help="file size in MiB")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--settings", default="0,8M,32M,64M", help="values of both keys")
    ap.add_argument("--transfers", default="128K,1M,4M")
    a = ap.parse_args()
    settings = a.settings.split(",")
    transfers = [parse_size(t) for t in a.transfers.split(",")]
    size = a.size * MIB
    root = a.dir
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    fio = find_fio()
    reference = root / "fio.dat"
    samples: dict[tuple[str, int, str], list[float]] = {}
    cluster = LocalCluster.start_in(root, client_config(root, KEYS["read"], "0"), ["n0", "n1"], 30)
    try:
        for _ in range(a.repeats):
            for direction in ("write", "read"):  # each read reads what the write before wrote
                for transfer in transfers:
                    key = (direction, transfer, "fio")
                    mib_s = fio_run(fio, reference, direction, transfer, size)
                    samples.setdefault(key, []).append(mib_s)
                    for setting in settings:
                        mib_s = benchfs_run(root, direction, setting, transfer, size)
                        samples.setdefault((direction, transfer, setting), []).append(mib_s)
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
    rows = []
    for direction in ("write", "read"):
        for transfer in transfers:
            theirs = statistics.median(samples[(direction, transfer, "fio")])
            for setting in settings:
                mine = samples[(direction, transfer, setting)]
                rows.append(
                    {
                        "direction": direction,
                        "key": KEYS[direction],
                        "transfer": transfer,
                        "setting": setting,
                        "mib_s": round(statistics.median(mine)),
                        "fio_mib_s": round(theirs),
                        "ratio": round(statistics.median(mine) / theirs, 2),
                        "samples": [round(x) for x in mine],
                    }
                )
    (HERE / "results.json").write_text(json.dumps(rows, indent=1) + "\n")
    lines = [
        "| direction | transfer | setting | BenchFS MiB/s | fio MiB/s | ratio |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        lines.append(
            f"| {r['direction']} | {format_size(r['transfer'])} | {r['key']} = {r['setting']} | "
            f"{r['mib_s']} | {r['fio_mib_s']} | {r['ratio']} |"
        )
    load = os.getloadavg()
    note = (
        f"\n{a.size} MiB file, 2 servers on one disk, one client, medians of {a.repeats} "
        f"interleaved repeats; load average at the end {load[0]:.2f}.\n"
    )
    (HERE / "results.md").write_text("\n".join(lines) + "\n" + note)
    print("\n".join(lines) + note)


if __name__ == "__main__":
    main()

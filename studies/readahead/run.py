"""Read-ahead study: how much `client.read_ahead` lets one sequential reader take from the disk.

A 2-server local cluster keeps its data on the disk (the directory given, not tmpfs), with the
default configuration (buffered reads on the servers). One client writes a file, then, for every
read-ahead setting and transfer size, a fresh client reads it from start to end with `readinto`
after the page cache is dropped; fio reads a file of the same size on the same disk in the same
transfer size (psync, buffered, one job) as the reference. Repeats are interleaved; medians and
ratios to fio go to results.md and results.json beside this file. The default of
`client.read_ahead` was chosen from this table (docs/storage.md).

    .venv/bin/python studies/readahead/run.py [--dir /var/tmp/benchfs-readahead] [--size 1024]
        [--repeats 3] [--read-ahead 0,8M,16M,32M,64M] [--transfers 128K,1M,4M]
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


def client_config(root: Path, read_ahead: str) -> str:
    return resolve_config_text(
        None,
        [
            "cluster.expected_servers=2",
            f"cluster.registry_dir={root / 'registry'}",
            f"client.read_ahead={read_ahead}",
        ],
    )


def benchfs_read(root: Path, read_ahead: str, transfer: int, size: int) -> float:
    """MiB/s of one client reading /big from start to end in `transfer` bytes."""
    client = _core.Client(str(root / "registry"), client_config(root, read_ahead))
    try:
        if not drop_caches():
            raise SystemExit("cannot drop the page cache (needs root)")
        f = client.open("/big")
        view = memoryview(bytearray(transfer))
        done = 0
        start = time.perf_counter()
        while got := f.readinto(done, view):
            done += got
        seconds = time.perf_counter() - start
        f.close()
    finally:
        client.close()
    if done != size:
        raise SystemExit(f"read {done} bytes of {size}")
    return size / seconds / MIB


def fio_read(fio: str, path: Path, transfer: int, size: int) -> float:
    if not drop_caches():
        raise SystemExit("cannot drop the page cache (needs root)")
    argv = [
        fio, "--name=seqread", f"--filename={path}", "--rw=read", f"--bs={transfer}",
        f"--size={size}", "--ioengine=psync", "--direct=0", "--numjobs=1", "--output-format=json",
    ]  # fmt: skip
    return run_fio(argv, "read").mib_s


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--dir", type=Path, default=Path("/var/tmp/benchfs-readahead"))
    ap.add_argument("--size", type=int, default=1024, help="file size in MiB")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--read-ahead", default="0,8M,16M,32M,64M")
    ap.add_argument("--transfers", default="128K,1M,4M")
    a = ap.parse_args()
    settings = a.read_ahead.split(",")
    transfers = [parse_size(t) for t in a.transfers.split(",")]
    size = a.size * MIB
    root = a.dir
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    fio = find_fio()
    samples: dict[str, list[float]] = {}
    cluster = LocalCluster.start_in(root, client_config(root, "0"), ["n0", "n1"], 30)
    try:
        writer = _core.Client(str(root / "registry"), client_config(root, "0"))
        f = writer.open("/big", os.O_CREAT, 0o644)
        block = os.urandom(4 * MIB)
        for offset in range(0, size, len(block)):
            f.write(offset, block[: size - offset])
        f.close()
        writer.close()
        reference = root / "fio.dat"
        with open(reference, "wb") as out:
            for offset in range(0, size, len(block)):
                out.write(block[: size - offset])
        for _ in range(a.repeats):
            for transfer in transfers:
                key = f"fio {transfer}"
                samples.setdefault(key, []).append(fio_read(fio, reference, transfer, size))
                for ra in settings:
                    key = f"{ra} {transfer}"
                    samples.setdefault(key, []).append(benchfs_read(root, ra, transfer, size))
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
    rows = []
    for transfer in transfers:
        theirs = statistics.median(samples[f"fio {transfer}"])
        for ra in settings:
            mine = statistics.median(samples[f"{ra} {transfer}"])
            rows.append(
                {
                    "transfer": transfer,
                    "read_ahead": ra,
                    "mib_s": round(mine),
                    "fio_mib_s": round(theirs),
                    "ratio": round(mine / theirs, 2),
                    "samples": [round(x) for x in samples[f"{ra} {transfer}"]],
                }
            )
    (HERE / "results.json").write_text(json.dumps(rows, indent=1) + "\n")
    lines = [
        "| transfer | client.read_ahead | BenchFS MiB/s | fio MiB/s | ratio |",
        "| --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        lines.append(
            f"| {format_size(r['transfer'])} | {r['read_ahead']} | {r['mib_s']} | "
            f"{r['fio_mib_s']} | {r['ratio']} |"
        )
    load = os.getloadavg()
    note = (
        f"\n{a.size} MiB file, 2 servers on one disk, one reader, medians of {a.repeats} "
        f"interleaved repeats; load average at the end {load[0]:.2f}.\n"
    )
    (HERE / "results.md").write_text("\n".join(lines) + "\n" + note)
    print("\n".join(lines) + note)


if __name__ == "__main__":
    main()

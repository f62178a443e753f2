"""Layout study: one file per chunk vs chunks packed into large files (issue 3).

Creates, writes and reads 100k chunks of 64 KiB and 2k chunks of 4 MiB with each layout,
through the storage engine alone (`benchfs._core.bench_storage`), direct I/O, page cache
dropped before every read, repeats interleaved; writes results.csv and results.md beside this
file. Scales the counts down (and says so) when the scratch file system is short of space.

    .venv/bin/python studies/layout/run.py [--dir /var/tmp/benchfs-layout] [--repeats 3]
"""

from __future__ import annotations

import argparse
import csv
import shutil
import statistics
import subprocess
from pathlib import Path

from benchfs import _core

KIB, MIB = 1 << 10, 1 << 20
CASES = [("100k x 64KiB", 64 * KIB, 100_000), ("2k x 4MiB", 4 * MIB, 2_000)]
LAYOUTS = ["chunkfile", "packed"]
HERE = Path(__file__).resolve().parent


def drop_caches() -> None:
    subprocess.run("sync; echo 3 > /proc/sys/vm/drop_caches", shell=True, check=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dir", default="/var/tmp/benchfs-layout")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--qd", type=int, default=32)
    args = parser.parse_args()
    root = Path(args.dir)
    root.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(root).free
    rows: list[dict[str, object]] = []
    for name, chunk, count in CASES:
        need = chunk * count * 1.2
        scale = min(1.0, free * 0.5 / need)
        n = max(1, int(count * scale))
        if n < count:
            print(f"{name}: only {free / 2**30:.1f} GiB free, scaled to {n} chunks")
        for repeat in range(args.repeats):
            order = LAYOUTS if repeat % 2 == 0 else LAYOUTS[::-1]
            for layout in order:
                d = root / f"{layout}-{chunk}"
                shutil.rmtree(d, ignore_errors=True)
                drop_caches()
                w = _core.bench_storage(
                    str(d), "seqwrite", chunk, args.qd, n * chunk, chunk, True, True, layout
                )
                drop_caches()
                r = _core.bench_storage(
                    str(d), "seqread", chunk, args.qd, n * chunk, chunk, True, True, layout
                )
                rows.append(
                    {
                        "case": name,
                        "layout": layout,
                        "repeat": repeat,
                        "chunks": n,
                        "create_write_s": w["seconds"],
                        "write_mib_s": w["mib_s"],
                        "read_s": r["seconds"],
                        "read_mib_s": r["mib_s"],
                        "write_p99_us": w["p99_us"],
                        "read_p99_us": r["p99_us"],
                    }
                )
                print(rows[-1])
                shutil.rmtree(d, ignore_errors=True)
    with (HERE / "results.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    lines = [
        "| case | layout | chunks | create+write s | write MiB/s | read s | read MiB/s |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, _chunk, _count in CASES:
        for layout in LAYOUTS:
            sel = [r for r in rows if r["case"] == name and r["layout"] == layout]
            med = {
                k: statistics.median(float(r[k]) for r in sel)  # type: ignore[arg-type]
                for k in ("create_write_s", "write_mib_s", "read_s", "read_mib_s")
            }
            lines.append(
                f"| {name} | {layout} | {sel[0]['chunks']} | {med['create_write_s']:.2f} | "
                f"{med['write_mib_s']:.0f} | {med['read_s']:.2f} | {med['read_mib_s']:.0f} |"
            )
    (HERE / "results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()

"""How fast does a run's telemetry load into pandas, per candidate on-disk format?

Writes one synthetic run (servers x snapshots, with the record mix of a busy server: every
counter and histogram statistic plus ~200 non-empty buckets per snapshot) in BenchFS's binary
format (docs/telemetry.md), loads it with `benchfs.telemetry.load`, then writes the same rows
as columnar CSV and, if pyarrow is importable, as Parquet, and loads those into equivalent
DataFrames. Prints one JSON line per format: rows, bytes on disk, best load time of 3.

    .venv/bin/python studies/telemetry_format.py [--servers 4] [--snapshots 3600]

The numbers in docs/telemetry.md come from this script.
"""

from __future__ import annotations

import argparse
import json
import struct
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd

from benchfs import telemetry

OPS = ["write", "read", "fsync", "meta"]
METRICS = [
    (1, "ops", "counter", True),
    (2, "bytes", "counter", True),
    (3, "errors", "counter", True),
    (4, "pool_waits", "counter", False),
    (5, "handle_hits", "counter", False),
    (6, "handle_misses", "counter", False),
    (7, "rejected_busy", "counter", False),
    (8, "malformed", "counter", False),
    (9, "queue_depth", "gauge", False),
    (10, "in_service", "gauge", False),
    (11, "buffers_free", "gauge", False),
    (16, "inflight_at_submit", "histogram", False),
    (17, "submit_batch", "histogram", False),
    (18, "queue_wait_ns", "histogram", True),
    (19, "device_ns", "histogram", True),
    (20, "total_ns", "histogram", True),
]
BUCKETS_PER_HISTOGRAM = {16: 30, 17: 20, 18: 25, 19: 25, 20: 25}
"""Non-empty buckets per histogram (read and write only for per-op ones): ~200 a snapshot."""


def header(server: int) -> bytes:
    h = {
        "format": "benchfs-telemetry",
        "version": 1,
        "source": "server",
        "id": server,
        "worker": 0,
        "node": f"node-{server}",
        "pid": 1,
        "created_unix_ns": 0,
        "byte_order": "little",
        "record_size": 32,
        "ops": OPS,
        "histogram": {"scheme": "log-linear", "sub_bucket_bits": 2, "buckets": 252},
        "metrics": [
            {"id": i, "name": n, "kind": k, "per_op": p, "unit": ""} for i, n, k, p in METRICS
        ],
    }
    text = json.dumps(h).encode()
    text += b" " * (-(16 + len(text)) % 32)
    return b"BFSTELEM" + struct.pack("<II", 1, len(text)) + text


def snapshot_template(server: int) -> np.ndarray:
    """The records of one snapshot (values filled in per snapshot)."""
    rows: list[tuple[int, int, int]] = []  # metric, op, bucket
    for mid, _, kind, per_op in METRICS:
        ops = range(4) if per_op else [0xFF]
        for op in ops:
            if kind != "histogram":
                rows.append((mid, op, 0xFFFF))
                continue
            rows += [(mid, op, b) for b in (0xFFFE, 0xFFFD, 0xFFFC, 0xFFFB)]
            if op in (0, 1, 0xFF):
                first = 1 if mid in (16, 17) else 40
                rows += [(mid, op, first + b) for b in range(BUCKETS_PER_HISTOGRAM[mid])]
    rows.append((0, 0xFF, 0xFFFF))
    rec = np.zeros(len(rows), dtype=telemetry.RECORD_DTYPE)
    rec["metric"], rec["op"], rec["bucket"] = np.array(rows).T
    rec["id"] = server
    rec["value"][-1] = len(rows) - 1
    return rec


def write_binary(directory: Path, servers: int, snapshots: int) -> int:
    rng = np.random.default_rng(1)
    records = 0
    for server in range(servers):
        tpl = snapshot_template(server)
        all_rec = np.tile(tpl, snapshots)
        seq = np.repeat(np.arange(snapshots, dtype=np.uint32), len(tpl))
        all_rec["seq"] = seq
        all_rec["t_ns"] = 1_700_000_000_000_000_000 + seq.astype(np.uint64) * 1_000_000_000
        body = all_rec["metric"] != 0
        all_rec["value"][body] = np.cumsum(rng.integers(0, 100, body.sum()))
        with open(directory / f"server-{server}-w0.tel", "wb") as f:
            f.write(header(server))
            all_rec.tofile(f)
        records += int(body.sum())
    return records


def best_of(n: int, fn: Callable[[], object]) -> float:
    times = []
    for _ in range(n):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def size(paths: list[Path]) -> int:
    return sum(p.stat().st_size for p in paths)


CAT = ["source", "node", "metric", "op", "kind"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", type=int, default=4)
    parser.add_argument("--snapshots", type=int, default=3600)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        (d / "bin").mkdir()
        records = write_binary(d / "bin", args.servers, args.snapshots)
        loaded = telemetry.load(d / "bin")
        rows = len(loaded.counters) + len(loaded.histograms)
        assert rows == records, (rows, records)
        base = {"servers": args.servers, "snapshots": args.snapshots, "rows": rows}

        def report(fmt: str, paths: list[Path], seconds: float) -> None:
            line = {"format": fmt, **base, "bytes": size(paths), "load_s": round(seconds, 3)}
            print(json.dumps(line), flush=True)

        bins = sorted((d / "bin").glob("*.tel"))
        report("binary", bins, best_of(args.repeats, lambda: telemetry.load(d / "bin")))

        # Columnar CSV of the same two frames, loaded with dtypes and categories as above.
        csvs = [d / "counters.csv", d / "histograms.csv"]
        for frame, path in zip((loaded.counters, loaded.histograms), csvs, strict=True):
            out = frame.assign(t=pd.DatetimeIndex(frame["t"]).asi8)
            out.to_csv(path, index=False)

        def load_csv() -> None:
            for path in csvs:
                df = pd.read_csv(path, dtype={c: "category" for c in CAT})
                df["t"] = pd.to_datetime(df["t"], unit="ns", utc=True)

        report("csv", csvs, best_of(args.repeats, load_csv))

        try:
            import pyarrow  # noqa: F401
        except ImportError:
            print(json.dumps({"format": "parquet", "skipped": "pyarrow not installed"}))
            return
        pqs = [d / "counters.parquet", d / "histograms.parquet"]
        for frame, path in zip((loaded.counters, loaded.histograms), pqs, strict=True):
            frame.to_parquet(path, index=False)
        report("parquet", pqs, best_of(args.repeats, lambda: [pd.read_parquet(p) for p in pqs]))


if __name__ == "__main__":
    main()

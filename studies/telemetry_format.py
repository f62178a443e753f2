"""How fast does a run's telemetry load into pandas, per candidate on-disk format?

Writes one synthetic run (servers x snapshots, with the record mix of a busy server: every
counter and histogram statistic plus ~200 non-empty buckets per snapshot) with the core's own
telemetry writer (`benchfs._core.SyntheticTelemetry`; format: docs/telemetry.md), loads it with
`benchfs.telemetry.load`, then writes the same rows
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

from benchfs import _core, telemetry

HISTOGRAM_VALUES = {
    "inflight_at_submit": [1, 2, 3, *range(4, 128, 4)],
    "submit_batch": [1, 2, 3, *range(4, 80, 4)],
    "queue_wait_ns": [int(1_000 * 1.19**i) for i in range(25)],
    "device_ns": [int(20_000 * 1.19**i) for i in range(25)],
    "total_ns": [int(25_000 * 1.19**i) for i in range(25)],
}
"""Values recorded into each histogram per snapshot (for read and write, for per-op ones):
about 200 non-empty buckets a snapshot, the mix of a busy server."""


def write_binary(directory: Path, servers: int, snapshots: int) -> int:
    """The run's files, written by the core's own writer; returns the records written
    (end-of-snapshot markers not counted)."""
    rng = np.random.default_rng(1)
    for server in range(servers):
        w = _core.SyntheticTelemetry(directory, "server", server, 0, f"node-{server}")
        for k in range(snapshots):
            for op in ("write", "read"):
                n = int(rng.integers(1, 100))
                w.add("ops", n, op)
                w.add("bytes", n * 1_048_576, op)
                for name in ("queue_wait_ns", "device_ns", "total_ns"):
                    w.record(name, HISTOGRAM_VALUES[name], op)
            for name in ("pool_waits", "handle_hits", "handle_misses"):
                w.add(name, int(rng.integers(0, 100)))
            w.set("queue_depth", int(rng.integers(0, 64)))
            w.record("inflight_at_submit", HISTOGRAM_VALUES["inflight_at_submit"])
            w.record("submit_batch", HISTOGRAM_VALUES["submit_batch"])
            w.snapshot(1_700_000_000_000_000_000 + k * 1_000_000_000)
    records = 0
    for path in directory.glob("*.tel"):
        data = path.read_bytes()
        (header_len,) = struct.unpack_from("<I", data, 12)
        records += (len(data) - 16 - header_len) // telemetry.RECORD_DTYPE.itemsize
    return records - servers * snapshots


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

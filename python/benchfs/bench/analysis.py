"""`benchfs-bench analysis`: the analysis at scale, and what telemetry costs the servers.

1. Generates a results directory whose telemetry holds N per-operation trace records (default
   10 million) in the documented trace format, plus the servers' snapshot files, then times
   loading it (`benchfs.analysis.load_run`) and computing every standard table and insight.
2. Measures the telemetry overhead as CPU time per operation on the server's storage path
   (`_core.bench_telemetry`: the chunk store with the server's clock reads, `record_op`, trace
   records and snapshots, no network) with snapshots only and with per-operation tracing,
   against `telemetry.enabled = false`: interleaved repeats, medians. Small reads from the
   page cache keep the operation cheap, so the share is the largest the path can show.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console

from benchfs import _core
from benchfs.analysis import compute_tables, evaluate, load_run
from benchfs.analysis.thresholds import Thresholds
from benchfs.bench.render import print_lines_and_targets
from benchfs.bench.stats import median
from benchfs.errors import BenchError, errno_name
from benchfs.telemetry import (
    BUCKETS,
    MAGIC,
    NO_OP,
    NO_TARGET,
    RECORD_DTYPE_V2,
    TRACE_DTYPE,
    TRACE_MAGIC,
)
from benchfs.units import MIB

__all__ = ["MODES", "AnalysisBench", "bucket_index", "generate_run"]

OPS = ["write", "read", "fsync", "meta"]
MODES = ("off", "snapshots", "trace")
"""Telemetry modes of the overhead measurement, in the order of even-numbered repeats."""
OVERHEAD_BLOCK = 4096
"""Bytes per read in the overhead measurement (small: the cheapest operation the path has)."""
OVERHEAD_DEPTH = 16
OVERHEAD_DATASET = 64 * MIB
OVERHEAD_INTERVAL_MS = 100
"""The shortest snapshot interval the configuration allows (the most snapshot work)."""
OVERHEAD_TRACE_RECORDS = 262144
"""Trace ring per snapshot interval: room for every read of an interval at this path's rate
(~700k reads/s here), so that the trace case records every operation (drops would make it
cheaper); the report gives `trace_dropped`."""
SNAPSHOT_S = 10
"""Seconds between the generated snapshots."""
RUN_S = 60
"""Length of the generated run."""
# Server metric ids (docs/telemetry.md) of what the generator writes.
COUNTERS = [(1, "ops", True), (2, "bytes", True), (4, "pool_waits", False)]
COUNTERS += [(5, "handle_hits", False), (6, "handle_misses", False)]
GAUGES = [(11, "buffers_free", False)]
HISTOGRAMS = [(16, "inflight_at_submit", False), (17, "submit_batch", False)]
HISTOGRAMS += [(18, "queue_wait_ns", True), (19, "device_ns", True), (20, "total_ns", True)]


def bucket_index(values: np.ndarray) -> np.ndarray:
    """The log-linear bucket of every value (docs/telemetry.md), vectorised, for v < 2^53."""
    v = values.astype(np.uint64)
    _, exp = np.frexp(np.maximum(v, 1).astype(np.float64))
    e = (exp - 1).astype(np.int64)
    shift = np.clip(e - 2, 0, None).astype(np.uint64)
    sub = (v >> shift) & np.uint64(3)
    big = 4 * (e - 1) + sub.astype(np.int64)
    return np.where(v < 4, v.astype(np.int64), big)


def _header(magic: bytes, version: int, header: dict[str, Any], align: int) -> bytes:
    text = json.dumps(header).encode()
    text += b" " * ((-(16 + len(text))) % align)
    return magic + np.array([version, len(text)], dtype="<u4").tobytes() + text


def _tel_header(server: int, node: str) -> bytes:
    metrics = [
        {"id": i, "name": n, "kind": "counter", "per_op": p, "per_target": False, "unit": ""}
        for i, n, p in COUNTERS
    ]
    metrics += [
        {"id": i, "name": n, "kind": "gauge", "per_op": p, "per_target": False, "unit": ""}
        for i, n, p in GAUGES
    ]
    metrics += [
        {"id": i, "name": n, "kind": "histogram", "per_op": p, "per_target": False, "unit": ""}
        for i, n, p in HISTOGRAMS
    ]
    header = {
        "format": "benchfs-telemetry", "version": 2, "source": "server", "id": server,
        "worker": 0, "node": node, "byte_order": "little", "record_size": 32, "ops": OPS,
        "no_op": NO_OP, "no_target": NO_TARGET, "end_metric": 0,
        "histogram": {"scheme": "log-linear", "sub_bucket_bits": 2, "buckets": BUCKETS},
        "metrics": metrics,
    }  # fmt: skip
    return _header(MAGIC, 2, header, 32)


def _snapshot(server: int, seq: int, t_ns: int, series: list[tuple[int, int, int, int]]) -> bytes:
    """One snapshot: (metric, op, bucket, value) records, then the end record."""
    n = len(series)
    rec = np.zeros(n + 1, dtype=RECORD_DTYPE_V2)
    arr = np.array(series, dtype=np.uint64).reshape(-1, 4)
    rec["t_ns"] = t_ns
    rec["id"] = server
    rec["seq"] = seq
    rec["target"] = NO_TARGET
    rec["metric"][:n], rec["op"][:n] = arr[:, 0], arr[:, 1]
    rec["bucket"][:n], rec["value"][:n] = arr[:, 2], arr[:, 3]
    rec["op"][n], rec["bucket"][n], rec["value"][n] = NO_OP, 0xFFFF, n
    return rec.tobytes()


def _hist_records(metric: int, op: int, values: np.ndarray) -> list[tuple[int, int, int, int]]:
    counts = np.bincount(bucket_index(values), minlength=BUCKETS) if len(values) else None
    out = [
        (metric, op, 0xFFFE, len(values)),
        (metric, op, 0xFFFD, int(values.sum()) if len(values) else 0),
        (metric, op, 0xFFFC, int(values.min()) if len(values) else 0),
        (metric, op, 0xFFFB, int(values.max()) if len(values) else 0),
    ]
    if counts is not None:
        out += [(metric, op, int(b), int(counts[b])) for b in np.flatnonzero(counts)]
    return out


def generate_run(root: Path, records: int, servers: int = 16, seed: int = 9) -> Path:
    """A results directory with `records` trace records over `servers` servers (one slow)."""
    rng = np.random.default_rng(seed)
    run = root / "20270101T000000Z-local-bench0"
    tel = run / "telemetry"
    tel.mkdir(parents=True)
    t0 = 1_798_761_600 * 10**9
    per = np.full(servers, records // servers)
    per[: records % servers] += 1
    manifest = {
        "schema_version": 2, "mode": "local",
        "started": "2027-01-01T00:00:00.000Z", "finished": "2027-01-01T00:01:00.000Z",
        "membership": [{"id": s, "node": f"bnode{s:03d}"} for s in range(servers)],
        "workload": None, "outcome": {"status": "ok", "code": None, "message": None},
    }  # fmt: skip
    (run / "manifest.json").write_text(json.dumps(manifest))
    (run / "config.toml").write_text("[telemetry]\ninterval_ms = 10000\n")
    for s in range(servers):
        n = int(per[s])
        node = f"bnode{s:03d}"
        rec = np.zeros(n, dtype=TRACE_DTYPE)
        t = np.sort(rng.integers(0, RUN_S * 10**9, n)).astype(np.uint64)
        op = (rng.random(n) < 0.5).astype(np.uint8)  # 0 write, 1 read
        scale = 300e6 if s == servers - 1 else 0.8e6  # the last server is the slow node
        total = (rng.lognormal(0, 0.4, n) * scale).astype(np.uint64) + np.uint64(1000)
        queue = (total // np.uint64(10)).astype(np.uint64)
        rec["t_ns"] = t + np.uint64(t0)
        rec["queue_ns"], rec["device_ns"], rec["total_ns"] = queue, total - queue, total
        rec["file_lo"] = rng.integers(0, 736, n).astype(np.uint64)
        rec["file_hi"] = 1
        rec["chunk"] = rng.integers(0, 4096, n).astype(np.uint64)
        rec["bytes"] = MIB
        rec["server"], rec["op"] = s, op
        header = {
            "format": "benchfs-trace", "version": 1, "source": "server", "id": s, "worker": 0,
            "node": node, "byte_order": "little", "record_size": TRACE_DTYPE.itemsize,
            "ops": OPS, "ring_records": 65536,
        }  # fmt: skip
        with (tel / f"server-{s}-w0.trace").open("wb") as f:
            f.write(_header(TRACE_MAGIC, 1, header, 8))
            rec.tofile(f)
        depth = rng.integers(1, 33, max(n // 4, 1)).astype(np.uint64)
        with (tel / f"server-{s}-w0.tel").open("wb") as f:
            f.write(_tel_header(s, node))
            for k, end_s in enumerate(range(SNAPSHOT_S, RUN_S + 1, SNAPSHOT_S)):
                upto = int(np.searchsorted(t, np.uint64(end_s * 10**9)))
                series: list[tuple[int, int, int, int]] = []
                ops_done = [int((op[:upto] == 0).sum()), int((op[:upto] == 1).sum()), 0, 0]
                for code in range(4):
                    series.append((1, code, 0xFFFF, ops_done[code]))
                for code in range(4):
                    series.append((2, code, 0xFFFF, ops_done[code] * MIB))
                series += [(4, NO_OP, 0xFFFF, 0), (5, NO_OP, 0xFFFF, upto), (6, NO_OP, 0xFFFF, 0)]
                series.append((11, NO_OP, 0xFFFF, 32))
                share = depth[: len(depth) * upto // max(n, 1)]
                series += _hist_records(16, NO_OP, share)
                series += _hist_records(17, NO_OP, np.minimum(share, 8))
                for metric, values in ((18, queue), (19, total - queue), (20, total)):
                    for code in range(4):
                        series += _hist_records(metric, code, values[:upto][op[:upto] == code])
                f.write(_snapshot(s, k, t0 + end_s * 10**9, series))
    return run


@dataclass
class AnalysisBench:
    """Load/tables timing on generated telemetry, and the snapshot overhead on real servers."""

    workdir: Path
    records: int
    servers: int
    thresholds: Thresholds
    overhead: bool
    repeats: int
    overhead_ops: int
    progress: Callable[[str], None] = field(default=lambda message: None)

    def time_analysis(self) -> dict[str, Any]:
        self.progress(f"generating {self.records:,} trace records over {self.servers} servers")
        gen = self.workdir / "generated"
        run_dir = generate_run(gen, self.records, self.servers)
        size = sum(p.stat().st_size for p in (run_dir / "telemetry").iterdir())
        self.progress(f"loading {size / MIB:,.0f} MiB of telemetry and computing every table")
        t0 = time.perf_counter()
        run = load_run(run_dir)
        t1 = time.perf_counter()
        tables = compute_tables(run, self.thresholds)
        insights = evaluate(run, tables, self.thresholds)
        t2 = time.perf_counter()
        loaded = 0 if run.trace is None else len(run.trace)
        if loaded != self.records:
            raise BenchError("EIO", f"loaded {loaded} trace records, generated {self.records}")
        slow = [i for i in insights if i.id == "BFS-003" and i.fired]
        shutil.rmtree(gen, ignore_errors=True)
        return {
            "records": loaded,
            "load_s": t1 - t0,
            "tables_s": t2 - t1,
            "telemetry_bytes": size,
            "tables": {name: len(frame) for name, frame in tables.frames().items()},
            "slow_node_found": bool(
                slow and slow[0].data.get("nodes") == [f"bnode{self.servers - 1:03d}"]
            ),
        }

    def measure_overhead(self) -> dict[str, Any]:
        """CPU per storage-path read with telemetry off, snapshots and traces, alternating."""
        driver = getattr(_core, "bench_telemetry", None)
        if driver is None:
            raise BenchError(
                "ENOENT",
                f"benchfs._core ({_core.__file__}) has no bench_telemetry: rebuild with "
                "`make build`",
            )
        self.progress(
            f"overhead: {self.repeats} rounds of {self.overhead_ops:,} reads per mode "
            f"({', '.join(MODES)}), alternating"
        )
        try:
            result = driver(
                str(self.workdir / "overhead-data"),
                str(self.workdir / "overhead-telemetry"),
                self.repeats,
                self.overhead_ops,
                block_size=OVERHEAD_BLOCK,
                queue_depth=OVERHEAD_DEPTH,
                dataset_bytes=OVERHEAD_DATASET,
                interval_ms=OVERHEAD_INTERVAL_MS,
                trace_records=OVERHEAD_TRACE_RECORDS,
            )
        except (OSError, ValueError, RuntimeError) as e:
            raise BenchError("EIO", f"bench_telemetry: {e}") from e
        finally:
            shutil.rmtree(self.workdir / "overhead-data", ignore_errors=True)
            shutil.rmtree(self.workdir / "overhead-telemetry", ignore_errors=True)
        blocks = {mode: np.asarray(result[mode]["cpu_ns_per_op"], dtype=float) for mode in MODES}
        off = blocks["off"]

        def overhead(mode: str) -> float:
            """Median over rounds of the round's CPU/op against the same round's off block."""
            return median((blocks[mode] / off - 1.0) * 100)

        return {
            "overhead_snapshots_pct": overhead("snapshots"),
            "overhead_trace_pct": overhead("trace"),
            "cpu_ns_per_op": {mode: median(blocks[mode]) for mode in MODES},
            "trace_dropped": int(result["trace"]["trace_dropped"]),
            "rounds": self.repeats,
            "ops_per_block": self.overhead_ops,
            "block_size": OVERHEAD_BLOCK,
            "queue_depth": OVERHEAD_DEPTH,
            "interval_ms": OVERHEAD_INTERVAL_MS,
            "trace_records": OVERHEAD_TRACE_RECORDS,
            "seconds": float(result["seconds"]),
            "raw": {mode: dict(result[mode]) for mode in MODES},
        }

    def run(self) -> dict[str, Any]:
        report: dict[str, Any] = self.time_analysis()
        if self.overhead:
            over = self.measure_overhead()
            report["overhead_snapshots_pct"] = over.pop("overhead_snapshots_pct")
            report["overhead_trace_pct"] = over.pop("overhead_trace_pct")
            report["overhead"] = over
        else:
            report["overhead_snapshots_pct"] = None
            report["overhead_trace_pct"] = None
            report["overhead"] = None
        return report


RECORDS = {"full": 10_000_000, "quick": 200_000}
TABLES_TARGET_S = 10.0


def run_analysis(
    root: Path,
    records: int,
    servers: int,
    thresholds: Thresholds,
    overhead: bool,
    repeats: int,
    overhead_ops: int,
    progress: Callable[[str], None],
) -> dict[str, Any]:
    """The whole `analysis` benchmark in a fresh directory under `root`, removed afterwards."""
    started = time.monotonic()
    try:
        root.mkdir(parents=True, exist_ok=True)
        workdir = Path(tempfile.mkdtemp(prefix="benchfs-bench-analysis-", dir=root))
    except OSError as e:
        raise BenchError(errno_name(e), f"scratch directory under {root}: {e}") from e
    try:
        bench = AnalysisBench(
            workdir=workdir,
            records=records,
            servers=servers,
            thresholds=thresholds,
            overhead=overhead,
            repeats=repeats,
            overhead_ops=overhead_ops,
            progress=progress,
        )
        report = bench.run()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    report["servers"] = servers
    report["elapsed_s"] = round(time.monotonic() - started, 3)
    report["targets"] = targets(report)
    return report


def targets(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The analysis targets (the load target is for 10 M records; n/a below that)."""
    found: list[dict[str, Any]] = []
    total = report["load_s"] + report["tables_s"]
    if report["records"] >= RECORDS["full"]:
        found.append(
            {
                "target": f"{report['records']:,} op records loaded and all tables in <= 10 s",
                "value": total,
                "met": total <= TABLES_TARGET_S,
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


def render(console: Console, report: dict[str, Any]) -> None:
    """Load and table times, the overheads and the targets, for people."""
    snap, trace = report["overhead_snapshots_pct"], report["overhead_trace_pct"]
    lines = [
        ("records", f"{report['records']:,} over {report['servers']} servers"),
        ("load", f"{report['load_s']:.2f} s ({report['telemetry_bytes'] / MIB:,.0f} MiB)"),
        ("tables", f"{report['tables_s']:.2f} s (every standard table and insight)"),
        ("snapshots", "not measured" if snap is None else f"overhead {snap:+.2f}% CPU per op"),
        ("tracing", "not measured" if trace is None else f"overhead {trace:+.2f}% CPU per op"),
    ]
    print_lines_and_targets(console, lines, report["targets"])

"""`benchfs-bench rpc`: the network layer measured against UCX itself, then under overload.

Servers keep their data on tmpfs with buffered I/O, so what is measured is the transport and
the RPC layer, not a disk. Three parts, in one invocation:

- **Cases** (one client process, one `benchfsd`, over UCX TCP and over shared memory):
  `write-4m` and `read-4m` (bandwidth of 4 MiB chunk requests, 8 in flight) beside
  `ucx_perftest -t ucp_am_bw -s 4194304 -O 8`, and `rtt-null`, `rtt-write-4k`, `rtt-read-4k`
  (round trips timed one by one) beside `ucx_perftest -t ucp_am_lat` (whose one-way latency
  is doubled into a round trip). BenchFS and ucx_perftest alternate case by case, in
  interleaved repeats; the report gives medians.
- **Overload**, shaped like seed 002: 16 client processes x 64 chunk requests in flight against
  2 servers with 8 buffers each, 1 MiB chunks, over TCP, for a fixed time; throughput and the
  p99 chunk op time come from the servers' telemetry over the steady part of the load, timeouts
  and retries from every client's per-server counters. **Peak** is the best throughput of the
  same clients with windows of 1, 2 and 4 and 64 buffers per server.
- **Rendezvous threshold study** (full mode): `write-4m` and `read-4m` over TCP with
  `network.rndv_threshold` at UCX's default, 64 KiB and 1 MiB.

Method and how to read the numbers: docs/bench.md.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from benchfs import telemetry
from benchfs.bench.stats import Bucket, histogram_quantile, interleave, median, ratio
from benchfs.cluster import LocalCluster, ServerExited, child_env
from benchfs.config import parse_config, resolve_config_text
from benchfs.errors import BenchError, errno_name
from benchfs.probes.perftest import find_perftest, run_perftest
from benchfs.probes.system import free_bytes, remove_path
from benchfs.procs import LineProcess
from benchfs.units import GIB, KIB, MIB, format_size

__all__ = [
    "CASE_NAMES",
    "PEAK_WINDOWS",
    "TOOLS",
    "TRANSPORTS",
    "Case",
    "OpWindow",
    "RpcBench",
    "Settings",
    "Transport",
    "filesystem_type",
    "op_window",
    "summarize_case",
    "summarize_overload",
    "wait_telemetry",
]


CASE_NAMES = ("write-4m", "read-4m", "rtt-null", "rtt-write-4k", "rtt-read-4k")
TOOLS = ("benchfs", "ucx_perftest")

BW_CHUNK = 4 * MIB
BW_INFLIGHT = 8
"""Chunk requests in flight in the bandwidth cases: each call moves 8 chunks of 4 MiB."""
BW_CALL = BW_INFLIGHT * BW_CHUNK
SMALL = 4 * KIB

LOAD_SERVERS = 2
LOAD_CHUNK = MIB
LOAD_INFLIGHT = 64
LOAD_CALL = 2 * LOAD_INFLIGHT * LOAD_CHUNK
"""Each load call moves 128 MiB (64 transfers of 2 MiB, 128 chunk requests of 1 MiB), so a
window of 64 stays full for most of the call."""
LOAD_BUFFERS = 8
PEAK_BUFFERS = 64
PEAK_WINDOWS = (1, 2, 4)
LOAD_PHASES = ("overload", *(f"peak-w{w}" for w in PEAK_WINDOWS))
TELEMETRY_INTERVAL_MS = 100
TELEMETRY_WAIT_S = 10.0

RNDV_THRESHOLDS = (0, 64 * KIB, MIB)
"""network.rndv_threshold values of the study; 0 keeps UCX's own threshold."""

SERVER_START_TIMEOUT_S = 30.0
CLIENT_READY_TIMEOUT_S = 120.0
ANSWER_MARGIN_S = 60.0
PERFTEST_TIMEOUT_S = 120.0
HEADROOM = 512 * MIB


@dataclass(frozen=True)
class Transport:
    """A UCX transport selection: `tls` goes to `network.transports` and to `UCX_TLS`."""

    name: str
    tls: str
    peer_error_handling: bool
    """Shared memory alone cannot detect failed peers (UCX refuses to connect): false for it."""

    def overrides(self) -> list[str]:
        return [
            f"network.transports={self.tls}",
            f"network.peer_error_handling={str(self.peer_error_handling).lower()}",
        ]


TRANSPORTS = (Transport("tcp", "tcp", True), Transport("shm", "shm,self", False))


@dataclass(frozen=True)
class Case:
    """One case of the comparison: a name of CASE_NAMES over one transport."""

    transport: Transport
    name: str

    @property
    def bandwidth(self) -> bool:
        return self.name.endswith("-4m")

    @property
    def op(self) -> str:
        """What the client does: write, read (bandwidth, round trips) or null (round trip)."""
        return {"write-4m": "write", "read-4m": "read"}.get(self.name) or self.name.split("-")[1]

    @property
    def server_op(self) -> str:
        """The operation the server's telemetry counts it under."""
        return "meta" if self.op == "null" else self.op

    @property
    def perftest(self) -> tuple[str, int]:
        """ucx_perftest's test and message size for this case."""
        if self.bandwidth:
            return "ucp_am_bw", BW_CHUNK
        return "ucp_am_lat", 8 if self.name == "rtt-null" else SMALL

    def __str__(self) -> str:
        return f"{self.name} over {self.transport.name}"


@dataclass(frozen=True)
class Settings:
    """How long and how often everything runs (full mode or --quick)."""

    repeats: int
    bw_seconds: float
    rtt_count: int
    rtt_seconds: float
    perftest_bw_iters: int
    perftest_bw_warmup: int
    perftest_lat_iters: int
    perftest_lat_warmup: int
    perftest_p99: bool
    load_seconds: float
    load_ramp_s: float
    load_clients: int
    rndv_study: bool

    @staticmethod
    def full(repeats: int = 3) -> Settings:
        return Settings(
            repeats=repeats,
            bw_seconds=2.0,
            rtt_count=5000,
            rtt_seconds=3.0,
            perftest_bw_iters=1000,
            perftest_bw_warmup=20,
            perftest_lat_iters=20000,
            perftest_lat_warmup=1000,
            perftest_p99=True,
            load_seconds=10.0,
            load_ramp_s=1.0,
            load_clients=16,
            rndv_study=True,
        )

    @staticmethod
    def quick(repeats: int = 1) -> Settings:
        return Settings(
            repeats=repeats,
            bw_seconds=0.5,
            rtt_count=1000,
            rtt_seconds=1.0,
            perftest_bw_iters=100,
            perftest_bw_warmup=10,
            perftest_lat_iters=5000,
            perftest_lat_warmup=500,
            perftest_p99=False,
            load_seconds=2.0,
            load_ramp_s=0.5,
            load_clients=4,
            rndv_study=False,
        )


@dataclass
class Cluster:
    """`servers` benchfsd daemons on tmpfs (own registry, config, data) and their clients."""

    root: Path
    name: str
    servers: int
    overrides: Sequence[str]
    benchfsd: str
    with_telemetry: bool = False
    cluster: LocalCluster | None = None
    clients: list[LineProcess] = field(default_factory=list)
    started_clients: int = 0

    @property
    def registry(self) -> Path:
        return self.root / "registry"

    @property
    def telemetry_dir(self) -> Path:
        return self.root / "telemetry"

    @property
    def config_path(self) -> Path:
        return self.root / "config.toml"

    def config_text(self, extra: Sequence[str] = ()) -> str:
        """Defaults (and the user's layers), then the benchmark's settings, then `extra`."""
        overrides = [
            f"cluster.expected_servers={self.servers}",
            f"cluster.registry_dir={self.registry}",
            "storage.direct_write=false",
            "storage.direct_read=false",
        ]
        if self.with_telemetry:
            overrides += [
                f"telemetry.dir={self.telemetry_dir}",
                f"telemetry.interval_ms={TELEMETRY_INTERVAL_MS}",
            ]
        try:
            return resolve_config_text(None, [*overrides, *self.overrides, *extra])
        except (ValueError, FileNotFoundError) as e:
            raise BenchError("EINVAL", f"configuration of the {self.name} servers: {e}") from e

    def start(self) -> None:
        nodes = [f"bench-{self.name}-{i}" for i in range(self.servers)]
        self.root.mkdir(parents=True)
        try:
            self.cluster = LocalCluster.start_in(
                self.root, self.config_text(), nodes, SERVER_START_TIMEOUT_S, benchfsd=self.benchfsd
            )
        except (ServerExited, TimeoutError) as e:
            raise BenchError("EHOSTDOWN", f"benchfsd ({self.name}) did not start: {e}") from e

    def settings(self, extra: Sequence[str] = ()) -> dict[str, Any]:
        return parse_config(self.config_text(extra))

    def start_clients(
        self, count: int, call_size: int, prepare: bool, extra: Sequence[str] = ()
    ) -> list[LineProcess]:
        """Start `count` client processes with this config plus `extra`; wait until ready."""
        assert self.cluster is not None
        text = self.config_text(extra)
        digest = hashlib.sha256(text.encode()).hexdigest()[:12]
        path = self.root / f"client-{digest}.toml"
        path.write_text(text)
        started = []
        for i in range(count):
            self.started_clients += 1
            argv = [
                sys.executable,
                "-m",
                "benchfs.clients.calls",
                "--registry",
                str(self.registry),
                "--config",
                str(path),
                "--name",
                f"client-{i}",
                "--call-size",
                str(call_size),
            ]
            if not prepare:
                argv.append("--no-prepare")
            log = self.root / f"client-{self.started_clients}.log"
            proc = LineProcess(argv, log, "client process", child_env())
            self.clients.append(proc)
            started.append(proc)
        for proc in started:
            proc.receive(CLIENT_READY_TIMEOUT_S)
        return started

    def check_alive(self) -> None:
        assert self.cluster is not None
        try:
            self.cluster.check_alive()
        except ServerExited as e:
            raise BenchError("EHOSTDOWN", f"{self.name}: {e}") from e

    def stop_clients(self) -> None:
        for proc in self.clients:
            proc.close()
        self.clients.clear()

    def stop(self) -> None:
        self.stop_clients()
        if self.cluster is not None:
            self.cluster.stop(grace_s=10.0)


@dataclass(frozen=True)
class Pair:
    """One server and the one client process of the one-to-one cases."""

    cluster: Cluster
    client: LineProcess


@dataclass(frozen=True)
class OpWindow:
    """What the servers did for one op between two snapshots of each worker (telemetry)."""

    seconds: float
    bytes: int
    ops: int
    mib_s: float
    p50_us: float
    p99_us: float
    mean_us: float
    device_p50_us: float
    queue_wait_p50_us: float
    errors: int
    rejected_busy: int
    pool_waits: int

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def filesystem_type(path: Path) -> str | None:
    """The type of the file system holding `path` (longest mount point of /proc/self/mounts)."""
    try:
        mounts = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return None
    target = os.path.realpath(path)
    best, kind = "", None
    for line in mounts:
        fields = line.split()
        if len(fields) < 3:
            continue
        point = fields[1].replace("\\040", " ")
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, kind = point, fields[2]
    return kind


def _quantile_us(buckets: list[Bucket], q: float) -> float:
    """Quantile of a nanosecond histogram in µs, interpolated over each bucket's whole width."""
    widened = [Bucket(b.lo, b.hi + 1, b.count) if b.hi > b.lo else b for b in buckets]
    return histogram_quantile(widened, q) / 1000


def wait_telemetry(directory: Path, after: float, timeout_s: float) -> telemetry.Telemetry:
    """The servers' telemetry once every worker has a snapshot at or after `after` (Unix s)."""
    deadline = time.monotonic() + timeout_s
    after_ns = int(after * 1e9)
    while True:
        try:
            tel = telemetry.load(directory)
        except FileNotFoundError:
            tel = None
        except ValueError as e:
            raise BenchError("EIO", f"telemetry in {directory}: {e}") from e
        if tel is not None and len(tel.counters):
            last = tel.counters.groupby(["server", "worker"], observed=True)["t"].max()
            if pd.DatetimeIndex(last).asi8.min() >= after_ns:
                return tel
        if time.monotonic() >= deadline:
            raise BenchError(
                "ETIMEDOUT", f"no telemetry snapshot in {directory} within {timeout_s:g} s"
            )
        time.sleep(TELEMETRY_INTERVAL_MS / 2000)


HISTOGRAMS = {"total": "total_ns", "device": "device_ns", "queue_wait": "queue_wait_ns"}


def op_window(
    tel: telemetry.Telemetry, start: float, end: float, op: str, enclose: bool
) -> OpWindow:
    """The servers' work on `op` ("write", "read", "meta") between `start` and `end`.

    Each server worker's window is bounded by two of its snapshots: with `enclose`, the last at
    or before `start` (none: its start, when all was zero) and the first at or after `end`, so
    that everything between the two moments is counted; without, the first at or after `start`
    and the last at or before `end`, so that only the time in between is (a steady part of a
    load). Counters and histograms are differenced between the two; the throughput is the sum
    over workers of bytes / time between their snapshots.
    """
    c, h = tel.counters, tel.histograms
    if len(c) == 0:
        raise BenchError("EIO", "telemetry holds no snapshot")
    c_t, h_t = pd.DatetimeIndex(c["t"]).asi8, pd.DatetimeIndex(h["t"]).asi8
    c_server, c_worker = c["server"].to_numpy(), c["worker"].to_numpy()
    c_name = c["metric"].astype(str).to_numpy() + "/" + c["op"].astype(str).to_numpy()
    c_value = c["value"].to_numpy()
    h_server, h_worker = h["server"].to_numpy(), h["worker"].to_numpy()
    h_metric, h_op = h["metric"].astype(str).to_numpy(), h["op"].astype(str).to_numpy()
    start_ns, end_ns = int(start * 1e9), int(end * 1e9)
    names = {
        "bytes": f"bytes/{op}",
        "ops": f"ops/{op}",
        "errors": f"errors/{op}",
        "sum": f"total_ns.sum/{op}",
        "rejected_busy": "rejected_busy/",
        "pool_waits": "pool_waits/",
    }
    totals = dict.fromkeys(names, 0)
    rate = 0.0
    spans: list[float] = []
    buckets: dict[str, dict[int, list[int]]] = {k: {} for k in HISTOGRAMS}
    for server, worker in sorted(set(zip(c_server.tolist(), c_worker.tolist(), strict=True))):
        mine = (c_server == server) & (c_worker == worker)
        times = np.unique(c_t[mine])
        if enclose:
            before, after = times[times <= start_ns], times[times >= end_ns]
            t_a = int(before[-1]) if len(before) else None
            t_b = int(after[0]) if len(after) else None
        else:
            inside = times[(times >= start_ns) & (times <= end_ns)]
            t_a = int(inside[0]) if len(inside) >= 2 else None
            t_b = int(inside[-1]) if len(inside) >= 2 else None
        if t_b is None or (t_a is None and not enclose):
            raise BenchError(
                "EIO",
                f"telemetry of server {server} worker {worker} has no snapshots around the "
                f"{end - start:.2f} s measurement window",
            )
        at_b = mine & (c_t == t_b)
        at_a = mine & (c_t == t_a) if t_a is not None else np.zeros_like(mine)
        moved = 0
        for key, name in names.items():
            diff = int(c_value[at_b & (c_name == name)].sum())
            diff -= int(c_value[at_a & (c_name == name)].sum())
            totals[key] += diff
            moved = diff if key == "bytes" else moved
        span = (t_b - (t_a if t_a is not None else int(times[0]))) / 1e9
        spans.append(span)
        rate += moved / span if span > 0 else 0.0
        h_mine = (h_server == server) & (h_worker == worker) & (h_op == op)
        for key, metric in HISTOGRAMS.items():
            of_metric = h_mine & (h_metric == metric)
            for sign, t in ((1, t_b), (-1, t_a)):
                if t is None:
                    continue
                part = h[of_metric & (h_t == t)]
                for bucket, lo, hi, count in zip(
                    part["bucket"], part["bucket_lo"], part["bucket_hi"], part["count"], strict=True
                ):
                    entry = buckets[key].setdefault(int(bucket), [int(lo), int(hi), 0])
                    entry[2] += sign * int(count)
    found = {
        key: [Bucket(lo, hi, n) for lo, hi, n in b.values() if n > 0] for key, b in buckets.items()
    }
    if not found["total"] or totals["ops"] <= 0:
        raise BenchError("EIO", f"the servers recorded no {op} operations in the window")

    def q(key: str, quantile: float) -> float:
        return _quantile_us(found[key], quantile) if found[key] else 0.0

    return OpWindow(
        seconds=min(spans),
        bytes=totals["bytes"],
        ops=totals["ops"],
        mib_s=rate / MIB,
        p50_us=q("total", 0.5),
        p99_us=q("total", 0.99),
        mean_us=totals["sum"] / totals["ops"] / 1000 if totals["sum"] > 0 else 0.0,
        device_p50_us=q("device", 0.5),
        queue_wait_p50_us=q("queue_wait", 0.5),
        errors=totals["errors"],
        rejected_busy=totals["rejected_busy"],
        pool_waits=totals["pool_waits"],
    )


def summarize_case(case: Case, runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """One row of `cases`: medians over the repeats of each tool's per-run figures."""
    ours, theirs = runs["benchfs"], runs["ucx_perftest"]
    test, size = case.perftest
    row: dict[str, Any] = {
        "transport": case.transport.name,
        "name": case.name,
        "mib_s": None,
        "perftest_mib_s": None,
        "ratio": None,
        "p50_us": None,
        "p99_us": None,
        "perftest_us": None,
    }
    if case.bandwidth:
        row["mib_s"] = median(r["mib_s"] for r in ours)
        row["perftest_mib_s"] = median(r["mib_s"] for r in theirs)
        row["ratio"] = ratio(row["mib_s"], row["perftest_mib_s"])
    else:
        row["p50_us"] = median(r["p50_us"] for r in ours)
        row["p99_us"] = median(r["p99_us"] for r in ours)
        row["perftest_us"] = median(r["rtt_p50_us"] for r in theirs)
        p99s = [r["rtt_p99_us"] for r in theirs if r.get("rtt_p99_us") is not None]
        row["perftest_p99_us"] = median(p99s) if p99s else None
        row["p50_over_perftest"] = ratio(row["p50_us"], row["perftest_us"])
        row["perftest_sleep_us"] = median(r["rtt_sleep_p50_us"] for r in theirs)
    row["server_p50_us"] = median(r["server"]["p50_us"] for r in ours)
    row["server_device_p50_us"] = median(r["server"]["device_p50_us"] for r in ours)
    row["tls"] = case.transport.tls
    row["perftest_test"] = test
    row["perftest_size"] = size
    row["raw"] = {"benchfs": ours, "ucx_perftest": theirs}
    return row


def summarize_overload(
    runs: dict[str, list[dict[str, Any]]], settings: Settings, config: dict[str, Any]
) -> dict[str, Any]:
    """The `overload` object: medians per phase over the repeats; counts summed over them."""
    over = runs["overload"]
    by_window = {w: median(r["mib_s"] for r in runs[f"peak-w{w}"]) for w in PEAK_WINDOWS}
    best = max(by_window, key=lambda w: by_window[w])
    mib_s = median(r["mib_s"] for r in over)
    peak_counts = [r for w in PEAK_WINDOWS for r in runs[f"peak-w{w}"]]
    return {
        "mib_s": mib_s,
        "peak_mib_s": by_window[best],
        "p99_us": median(r["p99_us"] for r in over),
        "timeouts": sum(r["timeouts"] for r in over),
        "retries": sum(r["retries"] for r in over),
        "ratio_to_peak": ratio(mib_s, by_window[best]),
        "peak_window": best,
        "peak_by_window": {str(w): v for w, v in by_window.items()},
        "p50_us": median(r["p50_us"] for r in over),
        "failures": sum(r["failures"] for r in over),
        "failed_calls": sum(r["failed_calls"] for r in over),
        "rejected_busy": sum(r["rejected_busy"] for r in over),
        "pool_waits": sum(r["pool_waits"] for r in over),
        "client_mib_s": median(r["client_mib_s"] for r in over),
        "call_p99_us": median(r["call_p99_us"] for r in over),
        "peak_timeouts": sum(r["timeouts"] for r in peak_counts),
        "peak_retries": sum(r["retries"] for r in peak_counts),
        "op": "write",
        "transport": "tcp",
        "clients": settings.load_clients,
        "inflight_per_client": LOAD_INFLIGHT,
        "servers": LOAD_SERVERS,
        "buffer_count": LOAD_BUFFERS,
        "peak_buffer_count": PEAK_BUFFERS,
        "peak_windows": list(PEAK_WINDOWS),
        "chunk_size": LOAD_CHUNK,
        "transfer_size": 2 * LOAD_CHUNK,
        "call_size": LOAD_CALL,
        "duration_s": settings.load_seconds,
        "window_from_s": settings.load_ramp_s,
        "repeats": settings.repeats,
        "request_timeout_s": config["client"]["request_timeout_s"],
        "max_retries": config["client"]["max_retries"],
        "server_config": config,
        "raw": runs,
    }


@dataclass
class RpcBench:
    """The whole `rpc` benchmark in a fresh directory under `root` (see the module docstring)."""

    root: Path
    settings: Settings
    benchfsd: str
    progress: Callable[[str], None] = lambda message: None
    note: Callable[[str], None] = lambda message: None
    perftest: str = field(default_factory=find_perftest)
    workdir: Path | None = None
    clusters: list[Cluster] = field(default_factory=list)

    def need_bytes(self) -> int:
        """tmpfs bytes the servers hold at most: the load files, the bandwidth files."""
        load = 2 * self.settings.load_clients * LOAD_CALL
        pairs = (len(TRANSPORTS) + (len(RNDV_THRESHOLDS) if self.settings.rndv_study else 0)) * (
            BW_CALL + SMALL
        )
        return load + pairs + HEADROOM

    def check(self) -> None:
        """Fail early: the configurations must be accepted and the files must fit."""
        for transport in TRANSPORTS:
            Cluster(Path("/"), "check", 1, transport.overrides(), self.benchfsd).config_text()
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            free = free_bytes(self.root)
        except OSError as e:
            raise BenchError(errno_name(e), f"data directory root {self.root}: {e}") from e
        fs = filesystem_type(self.root)
        if fs != "tmpfs":
            self.note(
                f"{self.root} is on {fs or 'an unknown file system'}, not tmpfs: the figures "
                "include that file system's cost"
            )
        if free < self.need_bytes():
            raise BenchError(
                "ENOSPC",
                f"{self.root} has {free / GIB:.1f} GiB free; the benchmark's servers hold up to "
                f"{self.need_bytes() / GIB:.1f} GiB (in memory, on tmpfs)",
            )

    def run(self) -> dict[str, Any]:
        self.check()
        try:
            self.workdir = Path(tempfile.mkdtemp(prefix="benchfs-bench-", dir=self.root))
        except OSError as e:
            raise BenchError(errno_name(e), f"data directory under {self.root}: {e}") from e
        self.progress(f"working in {self.workdir} (tmpfs, buffered I/O)")
        try:
            cases = self._cases()
            study = self._rndv_study() if self.settings.rndv_study else None
            overload = self._overload()
        finally:
            for cluster in self.clusters:
                cluster.stop()
            self.clusters.clear()
            remove_path(self.workdir)
        return {"cases": cases, "overload": overload, "rndv_threshold_study": study}

    def _cluster(self, name: str, servers: int, overrides: Sequence[str], tel: bool) -> Cluster:
        assert self.workdir is not None
        cluster = Cluster(self.workdir / name, name, servers, overrides, self.benchfsd, tel)
        self.clusters.append(cluster)
        cluster.start()
        return cluster

    def _stop(self, cluster: Cluster) -> None:
        cluster.stop()
        self.clusters.remove(cluster)
        remove_path(cluster.root)

    def _pair(self, name: str, overrides: Sequence[str]) -> Pair:
        """One benchfsd and one client process with 32 MiB calls (its files written)."""
        cluster = self._cluster(name, 1, [f"layout.chunk_size={BW_CHUNK}", *overrides], True)
        (client,) = cluster.start_clients(1, BW_CALL, prepare=True)
        return Pair(cluster, client)

    def _benchfs(self, case: Case, pair: Pair) -> dict[str, Any]:
        """One BenchFS measurement, with the server's own figures for the same requests."""
        s = self.settings
        start = time.time()
        if case.bandwidth:
            pair.client.send(f"bw {case.op} {s.bw_seconds}")
            answer = pair.client.receive(s.bw_seconds + ANSWER_MARGIN_S)
            answer["mib_s"] = answer["bytes"] / MIB / answer["seconds"]
        else:
            pair.client.send(f"rtt {case.op} {s.rtt_count} {s.rtt_seconds}")
            answer = pair.client.receive(s.rtt_seconds + ANSWER_MARGIN_S)
        end = time.time()
        tel = wait_telemetry(pair.cluster.telemetry_dir, end, TELEMETRY_WAIT_S)
        answer["server"] = op_window(tel, start, end, case.server_op, enclose=True).to_json()
        return answer

    def _run_perftest(self, case: Case, iters: int, warmup: int, extra: list[str]) -> Any:
        assert self.workdir is not None
        test, size = case.perftest
        return run_perftest(
            test,
            size,
            iters,
            warmup,
            case.transport.tls,
            self.workdir,
            PERFTEST_TIMEOUT_S,
            extra,
            perftest=self.perftest,
        )

    def _perftest(self, case: Case) -> dict[str, Any]:
        """One ucx_perftest measurement: bandwidth, or round trips (polling, p99, sleeping)."""
        s = self.settings
        if case.bandwidth:
            bw = self._run_perftest(
                case, s.perftest_bw_iters, s.perftest_bw_warmup, ["-O", str(BW_INFLIGHT)]
            )
            return {"mib_s": bw.mib_s, "msg_rate": bw.msg_rate, "command": bw.command}
        iters, warmup = s.perftest_lat_iters, s.perftest_lat_warmup
        lat = self._run_perftest(case, iters, warmup, [])
        rank, one_way = lat.percentile
        sleep = self._run_perftest(case, iters, warmup, ["-E", "sleep"])
        found: dict[str, Any] = {
            "rtt_p50_us": 2 * one_way,
            "one_way_p50_us": one_way,
            "percentile_rank": rank,
            "rtt_mean_us": 2 * lat.latency_us,
            "rtt_p99_us": None,
            "rtt_sleep_p50_us": 2 * sleep.percentile[1],
            "command": lat.command,
            "command_sleep": sleep.command,
        }
        if s.perftest_p99:
            p99 = self._run_perftest(case, iters, warmup, ["-R", "99"])
            found["rtt_p99_us"] = 2 * p99.percentile[1]
            found["command_p99"] = p99.command
        return found

    def _cases(self) -> list[dict[str, Any]]:
        s = self.settings
        pairs: dict[str, Pair] = {}
        for transport in TRANSPORTS:
            self.progress(f"starting benchfsd and a client over {transport.name} ({transport.tls})")
            pairs[transport.name] = self._pair(f"pair-{transport.name}", transport.overrides())
        cases = [Case(t, name) for t in TRANSPORTS for name in CASE_NAMES]
        runs: dict[Case, dict[str, list[dict[str, Any]]]] = {
            c: {t: [] for t in TOOLS} for c in cases
        }
        for step in interleave(cases, s.repeats, tools=TOOLS):
            self.progress(f"repeat {step.repeat + 1}/{s.repeats}: {step.case}, {step.tool}")
            if step.tool == "benchfs":
                figures = self._benchfs(step.case, pairs[step.case.transport.name])
            else:
                figures = self._perftest(step.case)
            runs[step.case][step.tool].append(figures)
        for pair in pairs.values():
            pair.cluster.check_alive()
            self._stop(pair.cluster)
        return [summarize_case(c, runs[c]) for c in cases]

    def _rndv_study(self) -> dict[str, Any]:
        s = self.settings
        tcp = TRANSPORTS[0]
        pairs: dict[str, Pair] = {}
        for threshold in RNDV_THRESHOLDS:
            self.progress(f"rendezvous study: benchfsd with network.rndv_threshold={threshold}")
            pairs[str(threshold)] = self._pair(
                f"rndv-{threshold}", [*tcp.overrides(), f"network.rndv_threshold={threshold}"]
            )
        names = ["write-4m", "read-4m"]
        runs: dict[str, dict[str, list[dict[str, Any]]]] = {
            str(t): {n: [] for n in names} for t in RNDV_THRESHOLDS
        }
        for step in interleave(names, s.repeats, tools=list(pairs)):
            self.progress(
                f"rendezvous study: repeat {step.repeat + 1}/{s.repeats}, {step.case}, "
                f"rndv_threshold={step.tool}"
            )
            runs[step.tool][step.case].append(self._benchfs(Case(tcp, step.case), pairs[step.tool]))
        for pair in pairs.values():
            pair.cluster.check_alive()
            self._stop(pair.cluster)
        rows = []
        for threshold in RNDV_THRESHOLDS:
            mine = runs[str(threshold)]
            row: dict[str, Any] = {
                "rndv_threshold": threshold,
                "label": "UCX default" if threshold == 0 else format_size(threshold),
            }
            for n in names:
                row[f"{n}_mib_s"] = median(r["mib_s"] for r in mine[n])
                row[f"{n}_server_p50_us"] = median(r["server"]["p50_us"] for r in mine[n])
            row["raw"] = {n: [r["mib_s"] for r in mine[n]] for n in names}
            rows.append(row)
        best = {n: max(rows, key=lambda r, n=n: r[f"{n}_mib_s"])["rndv_threshold"] for n in names}
        return {
            "transport": "tcp",
            "chunk_size": BW_CHUNK,
            "inflight": BW_INFLIGHT,
            "repeats": s.repeats,
            "rows": rows,
            "best": best,
        }

    def _overload(self) -> dict[str, Any]:
        s = self.settings
        common = [
            f"layout.chunk_size={LOAD_CHUNK}",
            f"client.max_inflight_per_server={LOAD_INFLIGHT}",
            *TRANSPORTS[0].overrides(),
        ]
        self.progress(
            f"overload: starting {LOAD_SERVERS} servers with {LOAD_BUFFERS} buffers each and "
            f"{LOAD_SERVERS} with {PEAK_BUFFERS}"
        )
        over = self._cluster(
            "overload", LOAD_SERVERS, [*common, f"storage.buffer_count={LOAD_BUFFERS}"], True
        )
        peak = self._cluster(
            "peak", LOAD_SERVERS, [*common, f"storage.buffer_count={PEAK_BUFFERS}"], True
        )
        runs: dict[str, list[dict[str, Any]]] = {phase: [] for phase in LOAD_PHASES}
        for step in interleave(["load"], s.repeats, tools=LOAD_PHASES):
            window = LOAD_INFLIGHT if step.tool == "overload" else int(step.tool.split("-w")[1])
            cluster = over if step.tool == "overload" else peak
            self.progress(
                f"overload: repeat {step.repeat + 1}/{s.repeats}, {step.tool}: "
                f"{s.load_clients} clients x {window} in flight for {s.load_seconds:g} s"
            )
            runs[step.tool].append(self._load(cluster, window))
        config = over.settings([f"client.max_inflight={LOAD_INFLIGHT}"])
        return summarize_overload(runs, s, config)

    def _load(self, cluster: Cluster, window: int) -> dict[str, Any]:
        """One timed write load of all clients against `cluster` with `window` in flight each."""
        s = self.settings
        extra = [f"client.max_inflight={window}"]
        client_config = cluster.settings(extra)["client"]
        clients = cluster.start_clients(s.load_clients, LOAD_CALL, prepare=False, extra=extra)
        patience = (
            s.load_seconds
            + client_config["request_timeout_s"] * (client_config["max_retries"] + 1)
            + ANSWER_MARGIN_S
        )
        go = time.time()
        t0 = time.perf_counter()
        for client in clients:
            client.send(f"load write {s.load_seconds}")
        answers = [client.receive(patience) for client in clients]
        wall = time.perf_counter() - t0
        cluster.stop_clients()
        cluster.check_alive()
        end = go + s.load_seconds
        tel = wait_telemetry(cluster.telemetry_dir, end, TELEMETRY_WAIT_S)
        win = op_window(tel, go + s.load_ramp_s, end, "write", enclose=False)
        servers = [stat for a in answers for stat in a["servers"]]
        errors = [a["first_error"] for a in answers if a["first_error"]]
        total = sum(int(a["bytes"]) for a in answers)
        return {
            "window": window,
            "mib_s": win.mib_s,
            "p50_us": win.p50_us,
            "p99_us": win.p99_us,
            "timeouts": sum(int(x["timeouts"]) for x in servers),
            "retries": sum(int(x["retries"]) for x in servers),
            "failures": sum(int(x["failures"]) for x in servers),
            "requests": sum(int(x["requests"]) for x in servers),
            "failed_calls": sum(int(a["errors"]) for a in answers),
            "first_error": errors[0] if errors else None,
            "rejected_busy": win.rejected_busy,
            "pool_waits": win.pool_waits,
            "client_mib_s": total / MIB / wall,
            "call_p99_us": max(float(a.get("call_p99_us") or 0.0) for a in answers),
            "wall_s": wall,
            "server_window": win.to_json(),
        }

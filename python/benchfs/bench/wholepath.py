"""The whole path: one `benchfsd`, several client processes, figures from the server's telemetry.

Three measurements, on two daemons started side by side (telemetry on, telemetry off):

- depth: 4 reader processes, each with `client.max_inflight=16` and 16-chunk reads, keep 64
  chunk reads in flight for a fixed time; the telemetry-on server's snapshots taken before
  and after give the device's in-flight depth at submit, the share of depth-1 submits and the
  op times, and Little's law connects them (`explain`);
- idle CPU: the same daemon left idle, CPU% of one core from /proc/<pid>/stat;
- telemetry overhead: server CPU time per chunk read under the same load, telemetry on vs off,
  interleaved over the repeats.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchfs.bench.stats import interleave, median
from benchfs.bench.telemetry_view import Window, load_snapshots, window
from benchfs.cluster import LocalCluster, ServerExited, child_env, find_benchfsd
from benchfs.config import parse_config, resolve_config_text
from benchfs.errors import BenchError
from benchfs.probes.system import cpu_seconds, drop_caches
from benchfs.procs import LineProcess
from benchfs.units import MIB

__all__ = ["BenchServer", "Load", "WholePathBench", "depth_summary", "explain"]

READY_TIMEOUT_S = 300.0
SERVER_START_TIMEOUT_S = 30.0
SNAPSHOT_TIMEOUT_S = 10.0
SETTLE_S = 0.5
"""Pause after a load before the idle measurement starts (in-flight work drains)."""


@dataclass(frozen=True)
class Load:
    """One timed read load against one server."""

    bytes: int
    reads: int
    chunk_ops: int
    seconds: float
    server_cpu_s: float
    started: float
    ended: float

    @property
    def cpu_us_per_op(self) -> float:
        return self.server_cpu_s / self.chunk_ops * 1e6 if self.chunk_ops else float("inf")

    def to_json(self) -> dict[str, Any]:
        return {
            "bytes": self.bytes,
            "chunk_ops": self.chunk_ops,
            "seconds": self.seconds,
            "server_cpu_s": self.server_cpu_s,
            "cpu_us_per_op": self.cpu_us_per_op,
            "mib_s": self.bytes / MIB / self.seconds if self.seconds > 0 else 0.0,
        }


@dataclass
class BenchServer:
    """One `benchfsd` (its own registry, config, data and telemetry) and its readers."""

    root: Path
    name: str
    overrides: Sequence[str]
    benchfsd: str
    chunk_size: int
    cluster: LocalCluster | None = None
    readers: list[LineProcess] = field(default_factory=list)

    @property
    def telemetry_dir(self) -> Path:
        return self.root / "telemetry"

    @property
    def config_path(self) -> Path:
        assert self.cluster is not None and self.cluster.config_path is not None
        return self.cluster.config_path

    @property
    def pid(self) -> int:
        assert self.cluster is not None
        return self.cluster.daemons[0].pid

    def config_text(self) -> str:
        """The daemon's effective configuration: defaults (and the user's layers), then ours."""
        overrides = [f"telemetry.dir={self.telemetry_dir}", *self.overrides]
        try:
            return resolve_config_text(None, overrides)
        except (ValueError, FileNotFoundError) as e:
            raise BenchError("EINVAL", f"whole-path server configuration: {e}") from e

    def start(self) -> None:
        text = self.config_text()
        self.telemetry_dir.mkdir(parents=True)
        try:
            self.cluster = LocalCluster.start_in(
                self.root,
                text,
                [f"bench-{self.name}"],
                SERVER_START_TIMEOUT_S,
                benchfsd=self.benchfsd,
            )
        except (ServerExited, TimeoutError) as e:
            raise BenchError("EHOSTDOWN", f"benchfsd ({self.name}) did not start: {e}") from e

    def start_readers(self, count: int, file_size: int, range_size: int) -> None:
        """Start `count` readers; each writes its own file (untimed) and reports ready."""
        assert self.cluster is not None
        for i in range(count):
            argv = [
                sys.executable,
                "-m",
                "benchfs.clients.range_reader",
                "--registry",
                str(self.cluster.registry_dir),
                "--config",
                str(self.config_path),
                "--path",
                f"/bench-{i}.dat",
                "--file-size",
                str(file_size),
                "--range-size",
                str(range_size),
            ]
            self.readers.append(
                LineProcess(argv, self.root / f"reader-{i}.log", "reader process", child_env())
            )
        for reader in self.readers:
            reader.receive(READY_TIMEOUT_S)

    def load(self, seconds: float) -> Load:
        """All readers read for `seconds`; server CPU time is taken around the whole load."""
        assert self.cluster is not None
        self.cluster.check_alive()
        cpu0, started = cpu_seconds(self.pid), time.time()
        t0 = time.perf_counter()
        for reader in self.readers:
            reader.send(f"read {seconds}")
        answers = [r.receive(seconds + 120) for r in self.readers]
        wall = time.perf_counter() - t0
        cpu1, ended = cpu_seconds(self.pid), time.time()
        total = sum(int(a["bytes"]) for a in answers)
        return Load(
            bytes=total,
            reads=sum(int(a["reads"]) for a in answers),
            chunk_ops=total // self.chunk_size,
            seconds=wall,
            server_cpu_s=cpu1 - cpu0,
            started=started,
            ended=ended,
        )

    def idle_cpu_pct(self, seconds: float) -> float:
        """CPU% of one core the daemon used while idle for `seconds`."""
        cpu0, t0 = cpu_seconds(self.pid), time.perf_counter()
        time.sleep(seconds)
        cpu1, t1 = cpu_seconds(self.pid), time.perf_counter()
        assert self.cluster is not None
        self.cluster.check_alive()
        return (cpu1 - cpu0) / (t1 - t0) * 100

    def stop(self) -> None:
        for reader in self.readers:
            reader.close()
        self.readers.clear()
        if self.cluster is not None:
            self.cluster.stop(grace_s=10.0)


def explain(win: Window, load: Load, p50_us: float) -> tuple[str, dict[str, float]]:
    """Little's law at the device, spelled out: mean time there = mean depth / ops per second.

    Then the mean op time split into its parts: waiting before submission, the device, and
    the rest (reading the request, replying).
    """
    ops_per_s = win.device_ops / load.seconds
    service_us = 1e6 / ops_per_s
    predicted_us = win.mean_inflight * service_us
    rest_us = win.total_mean_us - win.queue_wait_mean_us - win.device_mean_us
    figures = {
        "device_ops": float(win.device_ops),
        "device_ops_per_s": ops_per_s,
        "device_service_us": service_us,
        "predicted_device_us": predicted_us,
        "device_mean_us": win.device_mean_us,
        "device_p50_us": win.device_p50_us,
        "queue_share_of_p50": predicted_us / p50_us if p50_us > 0 else 0.0,
        "op_mean_us": win.total_mean_us,
        "queue_wait_mean_us": win.queue_wait_mean_us,
        "other_mean_us": rest_us,
    }
    text = (
        f"the device completed {win.device_ops} reads in {load.seconds:.2f} s = "
        f"{ops_per_s:,.0f} ops/s, one every {service_us:,.1f} µs; with "
        f"{win.mean_inflight:.1f} reads in flight on average, Little's law gives "
        f"{win.mean_inflight:.1f} x {service_us:,.1f} µs = {predicted_us:,.0f} µs per read at "
        f"the device (measured mean device time {win.device_mean_us:,.0f} µs); the median op "
        f"time is {p50_us:,.0f} µs, so the device queue accounts for "
        f"{100 * figures['queue_share_of_p50']:.0f}% of it"
    )
    if win.total_mean_us > 0:
        text += (
            f". Mean op time {win.total_mean_us:,.0f} µs = waiting before submission "
            f"{win.queue_wait_mean_us:,.0f} µs + device {win.device_mean_us:,.0f} µs + "
            f"other {rest_us:,.0f} µs"
        )
    return text, figures


def depth_summary(win: Window, load: Load) -> dict[str, Any]:
    """The "depth" object of the report."""
    text, figures = explain(win, load, win.total_p50_us)
    return {
        "mean_inflight": win.mean_inflight,
        "share_depth1": win.share_depth1,
        "p50_us": win.total_p50_us,
        "p99_us": win.total_p99_us,
        "explanation": text,
        **figures,
        "load": load.to_json(),
    }


@dataclass
class WholePathBench:
    """Depth, idle CPU and telemetry overhead (see the module docstring)."""

    workdir: Path
    duration_s: float
    idle_s: float
    overhead_repeats: int
    file_size: int
    clients: int = 4
    inflight_per_client: int = 16
    chunk_size: int = MIB
    progress: Callable[[str], None] = lambda message: None
    benchfsd: str = field(default_factory=find_benchfsd)

    def _server(self, name: str, telemetry: bool) -> BenchServer:
        overrides = [
            f"layout.chunk_size={self.chunk_size}",
            f"client.max_inflight={self.inflight_per_client}",
            "storage.direct_read=true",
            f"telemetry.enabled={str(telemetry).lower()}",
        ]
        return BenchServer(
            self.workdir / name, name, overrides, self.benchfsd, chunk_size=self.chunk_size
        )

    def check(self) -> None:
        """Fail early (before the storage cases) if this build rejects the configuration."""
        for telemetry in (True, False):
            self._server("check", telemetry).config_text()

    def run(self) -> dict[str, Any]:
        on = self._server("telemetry-on", True)
        off = self._server("telemetry-off", False)
        try:
            return self._run(on, off)
        finally:
            on.stop()
            off.stop()

    def _run(self, on: BenchServer, off: BenchServer) -> dict[str, Any]:
        range_size = self.inflight_per_client * self.chunk_size
        self.progress(
            f"whole path: starting 2 benchfsd (telemetry on, off) and {self.clients} readers "
            "each, writing their files"
        )
        for server in (on, off):
            server.start()
            server.start_readers(self.clients, self.file_size, range_size)
        drop_caches()

        self.progress(
            f"whole path: {self.clients} readers x {self.inflight_per_client} chunk reads in "
            f"flight for {self.duration_s:g} s"
        )
        before = load_snapshots(on.telemetry_dir, after=time.time(), timeout_s=SNAPSHOT_TIMEOUT_S)
        load = on.load(self.duration_s)
        after = load_snapshots(on.telemetry_dir, after=load.ended, timeout_s=SNAPSHOT_TIMEOUT_S)
        depth = depth_summary(window(before, after), load)

        self.progress(f"whole path: idle server for {self.idle_s:g} s")
        time.sleep(SETTLE_S)
        idle = on.idle_cpu_pct(self.idle_s)

        runs: dict[str, list[Load]] = {"on": [], "off": []}
        servers = {"on": on, "off": off}
        for step in interleave(["load"], self.overhead_repeats, tools=("on", "off")):
            self.progress(
                f"telemetry overhead: repeat {step.repeat + 1}/{self.overhead_repeats}, "
                f"telemetry {step.tool}"
            )
            runs[step.tool].append(servers[step.tool].load(self.duration_s))
        per_op = {k: median(r.cpu_us_per_op for r in v) for k, v in runs.items()}
        overhead = (per_op["on"] - per_op["off"]) / per_op["off"] * 100
        return {
            "depth": depth,
            "idle_cpu_pct": idle,
            "idle_seconds": self.idle_s,
            "telemetry_overhead_pct": overhead,
            "telemetry_overhead": {
                "cpu_us_per_op_on": per_op["on"],
                "cpu_us_per_op_off": per_op["off"],
                "repeats": self.overhead_repeats,
                "raw": {k: [r.to_json() for r in v] for k, v in runs.items()},
            },
            "whole_path": {
                "clients": self.clients,
                "inflight_per_client": self.inflight_per_client,
                "chunk_size": self.chunk_size,
                "file_size_per_client": self.file_size,
                "duration_s": self.duration_s,
                "direct_read": True,
                "server_config": parse_config(on.config_path.read_text()),
            },
        }

"""`benchfs-bench rpc`: the network layer measured against UCX itself, then under overload.

Servers keep their data on tmpfs with buffered I/O, so what is measured is the transport and
the RPC layer, not a disk. Three parts, in one invocation:

- **Cases** (one client process, one `benchfsd`, over UCX TCP and over shared memory):
  `write-4m` and `read-4m` (bandwidth of 4 MiB chunk requests, 8 in flight) beside
  `ucx_perftest -t ucp_am_bw -s 4194304 -O 8` twice: as UCX runs by default, and as BenchFS
  runs UCX (`-e`, peer error handling, where BenchFS has it: over TCP; and BenchFS's
  protocol generation, `UCX_PROTO_ENABLE=n` unless `network.ucx_proto_v2`); over shared
  memory, whether UCX accepts `-e` is tried and its answer reported; and `rtt-null`,
  `rtt-write-4k`, `rtt-read-4k` (round trips timed one by one) beside `ucx_perftest -t
  ucp_am_lat` (whose one-way latency is doubled into a round trip). BenchFS and ucx_perftest
  alternate case by case, in interleaved repeats; the report gives medians and ranges. The
  bandwidth cases also run against a server that keeps nothing (`storage.layout = "discard"`,
  a benchmark's setting): the protocol alone, against ucx_perftest as BenchFS runs UCX; and
  the storing server is compared with the limit of a transport and a store in series,
  `1/(1/perftest + 1/copy)`, where `copy` is the store's own copy (4 MiB buffers into or out
  of a tmpfs file of the call's working set) measured in the same run.
- **Overload**: 64 client processes x 64 chunk requests in flight against 4 servers with 8
  buffers each, 512 KiB chunks (1 MiB up to 16 clients), over TCP, for a fixed time;
  throughput and the p99 chunk op time come from the servers' telemetry over the steady part of
  the load, timeouts and retries from every client's per-server counters, and the steadiness
  (the worst 1 s window over the best, the first and last 2 s left out) from the same
  telemetry. **Peak** is the best throughput of the same clients with windows of 1, 2 and 4
  and 64 buffers per server.
- **Rendezvous threshold study** (full mode): `write-4m` and `read-4m` over TCP with
  `network.rndv_threshold` at UCX's default, 64 KiB and 1 MiB.

Method and how to read the numbers: docs/bench.md.
"""

from __future__ import annotations

import contextlib
import dataclasses
import mmap
import os
import re
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from benchfs import __version__, telemetry
from benchfs.bench.cluster import BenchCluster
from benchfs.bench.render import duration, fmt, print_lines_and_targets, report_table
from benchfs.bench.stats import interleave, median, ratio
from benchfs.bench.telemetry_view import op_window, wait_telemetry
from benchfs.errors import BenchError, errno_name
from benchfs.probes.perftest import PerftestError, find_perftest, run_perftest
from benchfs.probes.system import filesystem_type, free_bytes, remove_path, tool_version
from benchfs.procs import LineProcess
from benchfs.simnodes import ApartNodes, apart_nodes
from benchfs.ucx import find_tool
from benchfs.units import GIB, KIB, MIB, format_size

__all__ = [
    "CASE_NAMES",
    "PEAK_WINDOWS",
    "TOOLS",
    "TRANSPORTS",
    "Case",
    "RpcBench",
    "RpcSettings",
    "Transport",
    "render",
    "run_rpc",
    "summarize_case",
    "summarize_overload",
    "targets",
]


CASE_NAMES = ("write-4m", "read-4m", "rtt-null", "rtt-null-rust", "rtt-write-4k", "rtt-read-4k")
TOOLS = ("benchfs", "ucx_perftest", "ucx_perftest_as_benchfs", "benchfs_discard", "copy")
"""BenchFS, ucx_perftest as UCX runs by default, and ucx_perftest as BenchFS runs UCX; the
bandwidth cases only: BenchFS with a server that keeps nothing, and the store's own copy."""
BANDWIDTH_ONLY = frozenset({"ucx_perftest_as_benchfs", "benchfs_discard", "copy"})

BW_CHUNK = 4 * MIB
BW_INFLIGHT = 8
"""Chunk requests in flight in the bandwidth cases: each call moves 8 chunks of 4 MiB."""
BW_CALL = BW_INFLIGHT * BW_CHUNK
SMALL = 4 * KIB

LOAD_INFLIGHT = 64
LOAD_MEMORY = 4 << 30
"""What the load's calls may hold in all (each client's buffer, and its file on tmpfs as much
again): 64 clients would otherwise need 16 GiB of this machine's 24."""
LOAD_BUFFERS = 8
PEAK_BUFFERS = 64
PEAK_WINDOWS = (1, 2, 4)
LOAD_PHASES = ("overload", *(f"peak-w{w}" for w in PEAK_WINDOWS))
TELEMETRY_WAIT_S = 10.0

SCALING_SERVERS = (1, 2, 4)
SCALING_CLIENTS = 2
NETNS_NODES = max(SCALING_SERVERS) + SCALING_CLIENTS
"""--netns: servers on n1..n4, the scaling's clients on n5 and n6 (the cases: n1 and n2)."""

RNDV_THRESHOLDS = (0, 64 * KIB, MIB)
"""network.rndv_threshold values of the study; 0 keeps UCX's own threshold."""

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
        """What the client does: write, read (bandwidth, round trips) or null (round trip; timed
        in Rust: null-rust)."""
        named = {"write-4m": "write", "read-4m": "read", "rtt-null-rust": "null-rust"}
        return named.get(self.name) or self.name.split("-")[1]

    @property
    def server_op(self) -> str:
        """The operation the server's telemetry counts it under."""
        return "meta" if self.op.startswith("null") else self.op

    def perftest_as_benchfs(self, proto_v2: bool) -> tuple[list[str], dict[str, str]]:
        """ucx_perftest's extra arguments and environment to run UCX as BenchFS does: with
        peer error handling where BenchFS has it, and the same protocol generation."""
        args = ["-e"] if self.transport.peer_error_handling else []
        return args, {"UCX_PROTO_ENABLE": "y" if proto_v2 else "n"}

    @property
    def perftest(self) -> tuple[str, int]:
        """ucx_perftest's test and message size for this case."""
        if self.bandwidth:
            return "ucp_am_bw", BW_CHUNK
        return "ucp_am_lat", 8 if self.op.startswith("null") else SMALL

    def __str__(self) -> str:
        return f"{self.name} over {self.transport.name}"


@dataclass(frozen=True)
class RpcSettings:
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
    load_servers: int
    rndv_study: bool
    netns: bool = False
    """Between nodes in network namespaces: the cases over TCP and the scaling, no overload."""

    @property
    def load_chunk(self) -> int:
        """1 MiB chunks, smaller when the clients' calls would hold more than LOAD_MEMORY."""
        chunk = MIB
        while chunk > 64 * KIB and self.load_clients * self.load_call_of(chunk) > LOAD_MEMORY:
            chunk //= 2
        return chunk

    @staticmethod
    def load_call_of(chunk: int) -> int:
        """A load call: 64 transfers of 2 chunks, so a window of 64 chunk requests stays full
        for most of the call."""
        return 2 * LOAD_INFLIGHT * chunk

    @property
    def load_call(self) -> int:
        return self.load_call_of(self.load_chunk)

    @staticmethod
    def full(repeats: int = 5) -> RpcSettings:
        return RpcSettings(
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
            load_clients=64,
            load_servers=4,
            rndv_study=True,
        )

    @staticmethod
    def quick(repeats: int = 1) -> RpcSettings:
        return RpcSettings(
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
            load_servers=2,
            rndv_study=False,
        )


@dataclass(frozen=True)
class Pair:
    """One server and the one client process of the one-to-one cases."""

    cluster: BenchCluster
    client: LineProcess


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
        "perftest_as_benchfs_mib_s": None,
        "ratio_as_benchfs": None,
        "discard_mib_s": None,
        "ratio_discard_as_benchfs": None,
        "copy_mib_s": None,
        "storing_limit_mib_s": None,
        "ratio_storing_limit": None,
        "p50_us": None,
        "p99_us": None,
        "perftest_us": None,
    }
    if case.bandwidth:
        same = runs.get("ucx_perftest_as_benchfs", [])
        row["mib_s"] = median(r["mib_s"] for r in ours)
        row["perftest_mib_s"] = median(r["mib_s"] for r in theirs)
        row["ratio"] = ratio(row["mib_s"], row["perftest_mib_s"])
        row["perftest_as_benchfs_mib_s"] = median(r["mib_s"] for r in same) if same else None
        row["ratio_as_benchfs"] = (
            ratio(row["mib_s"], row["perftest_as_benchfs_mib_s"]) if same else None
        )
        row["perftest_as_benchfs"] = same[0]["mode"] if same else None
        discard, copy = runs.get("benchfs_discard", []), runs.get("copy", [])
        row["discard_mib_s"] = median(r["mib_s"] for r in discard) if discard else None
        row["ratio_discard_as_benchfs"] = (
            ratio(row["discard_mib_s"], row["perftest_as_benchfs_mib_s"])
            if discard and same
            else None
        )
        row["copy_mib_s"] = median(r["mib_s"] for r in copy) if copy else None
        row["storing_limit_mib_s"] = (
            1 / (1 / row["perftest_as_benchfs_mib_s"] + 1 / row["copy_mib_s"])
            if same and copy and row["perftest_as_benchfs_mib_s"] and row["copy_mib_s"]
            else None
        )
        row["ratio_storing_limit"] = ratio(row["mib_s"], row["storing_limit_mib_s"])
        # The range of the repeats, each tool's: how far one run may be from the median.
        row["spread_mib_s"] = {
            tool: [min(r["mib_s"] for r in rs), max(r["mib_s"] for r in rs)]
            for tool, rs in (("benchfs", ours), ("ucx_perftest", theirs),
                             ("ucx_perftest_as_benchfs", same), ("benchfs_discard", discard),
                             ("copy", copy)) if rs
        }  # fmt: skip
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
    row["raw"] = {tool: runs.get(tool, []) for tool in TOOLS}
    return row


def python_call_us(rows: list[dict[str, Any]]) -> None:
    """Sets `python_call_us` on each transport's rtt-null row: its p50 less rtt-null-rust's
    (the same stats timed in Rust), the Python call's own cost."""
    rust = {r["transport"]: r["p50_us"] for r in rows if r["name"] == "rtt-null-rust"}
    for row in rows:
        if row["name"] == "rtt-null" and rust.get(row["transport"]) is not None:
            row["python_call_us"] = row["p50_us"] - rust[row["transport"]]


def summarize_overload(
    runs: dict[str, list[dict[str, Any]]], settings: RpcSettings, config: dict[str, Any]
) -> dict[str, Any]:
    """The `overload` object: medians per phase over the repeats; counts summed over them."""
    over = runs["overload"]
    by_window = {w: median(r["mib_s"] for r in runs[f"peak-w{w}"]) for w in PEAK_WINDOWS}
    best = max(by_window, key=lambda w: by_window[w])
    mib_s = median(r["mib_s"] for r in over)
    steady = [r["steady_share"] for r in over if r["steady_share"] is not None]
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
        "servers": settings.load_servers,
        "steady_share": min(steady) if steady else None,
        "steady_windows_mib_s": [r["windows_mib_s"] for r in over],
        "buffer_count": LOAD_BUFFERS,
        "peak_buffer_count": PEAK_BUFFERS,
        "peak_windows": list(PEAK_WINDOWS),
        "chunk_size": settings.load_chunk,
        "transfer_size": 2 * settings.load_chunk,
        "call_size": settings.load_call,
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
    settings: RpcSettings
    benchfsd: str
    progress: Callable[[str], None] = lambda message: None
    note: Callable[[str], None] = lambda message: None
    perftest: str = field(default_factory=find_perftest)
    workdir: Path | None = None
    clusters: list[BenchCluster] = field(default_factory=list)
    nodes: ApartNodes | None = None

    @property
    def transports(self) -> tuple[Transport, ...]:
        """Both, or TCP alone between nodes (shared memory does not cross nodes)."""
        return TRANSPORTS[:1] if self.settings.netns else TRANSPORTS

    def need_bytes(self) -> int:
        """tmpfs bytes the servers hold at most: the load files, the bandwidth files."""
        if self.settings.netns:
            files = len(self.transports) + len(SCALING_SERVERS) * SCALING_CLIENTS
            return files * (BW_CALL + SMALL) + HEADROOM
        load = 2 * self.settings.load_clients * self.settings.load_call
        pairs = (len(TRANSPORTS) + (len(RNDV_THRESHOLDS) if self.settings.rndv_study else 0)) * (
            BW_CALL + SMALL
        )
        return load + pairs + HEADROOM

    def check(self) -> None:
        """Fail early: the configurations must be accepted and the files must fit."""
        for transport in TRANSPORTS:
            BenchCluster(Path("/"), "check", 1, transport.overrides(), self.benchfsd).config_text()
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
            with contextlib.ExitStack() as stack:
                if self.settings.netns:
                    self.progress(f"making {NETNS_NODES} nodes in network namespaces")
                    self.nodes = stack.enter_context(apart_nodes(NETNS_NODES))
                try:
                    return self._parts()
                finally:
                    # Before the namespaces go.
                    for cluster in self.clusters:
                        cluster.stop()
                    self.clusters.clear()
        finally:
            remove_path(self.workdir)

    def _parts(self) -> dict[str, Any]:
        cases = self._cases()
        if self.settings.netns:
            scaling = self._scaling()
            return {"cases": cases, "overload": None, "rndv_threshold_study": None,
                    "scaling": scaling}  # fmt: skip
        study = self._rndv_study() if self.settings.rndv_study else None
        overload = self._overload()
        return {"cases": cases, "overload": overload, "rndv_threshold_study": study,
                "scaling": None}  # fmt: skip

    def _cluster(
        self,
        name: str,
        servers: int,
        overrides: Sequence[str],
        tel: bool,
        nodes: Sequence[str] = (),
    ) -> BenchCluster:
        """`servers` daemons; between nodes, daemon i on nodes[i] (clients: a prefix each)."""
        assert self.workdir is not None
        # The chunk path is what is measured: no file kept with its name (layout.inline_max).
        overrides = ["layout.inline_max=0", *overrides]
        cluster = BenchCluster(self.workdir / name, name, servers, overrides, self.benchfsd, tel)
        if self.nodes is not None:
            cluster.server_prefixes = [self.nodes.prefix(n) for n in nodes]
        self.clusters.append(cluster)
        cluster.start()
        return cluster

    def _stop(self, cluster: BenchCluster) -> None:
        cluster.stop()
        self.clusters.remove(cluster)
        remove_path(cluster.root)

    def _pair(self, name: str, overrides: Sequence[str]) -> Pair:
        """One benchfsd and one client process with 32 MiB calls (its files written); between
        nodes, the server on n1 and the client on n2."""
        # Each write answered before the next call: the cases time requests, as ucx_perftest's
        # round trips do (write-behind would time copies into the client's buffers).
        chunk = [f"layout.chunk_size={BW_CHUNK}", "client.write_behind=0", *overrides]
        cluster = self._cluster(name, 1, chunk, True, nodes=["n1"])
        prefix = self.nodes.prefix("n2") if self.nodes is not None else ()
        (client,) = cluster.start_clients(1, BW_CALL, prepare=True, prefix=prefix)
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

    def _run_perftest(
        self,
        case: Case,
        iters: int,
        warmup: int,
        extra: list[str],
        env: dict[str, str] | None = None,
    ) -> Any:
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
            apart=None
            if self.nodes is None
            else (self.nodes.prefix("n1"), self.nodes.prefix("n2"), self.nodes.address("n1")),
            extra_env=env,
        )

    def _perftest_as_benchfs(self, case: Case, proto_v2: bool) -> dict[str, Any]:
        """One ucx_perftest bandwidth measurement with UCX run as BenchFS runs it."""
        s = self.settings
        args, env = case.perftest_as_benchfs(proto_v2)
        bw = self._run_perftest(
            case, s.perftest_bw_iters, s.perftest_bw_warmup, ["-O", str(BW_INFLIGHT), *args], env
        )
        mode = ", ".join([*args, *(f"{k}={v}" for k, v in env.items())])
        return {"mib_s": bw.mib_s, "msg_rate": bw.msg_rate, "command": bw.command, "mode": mode}

    def _copy(self, case: Case) -> dict[str, Any]:
        """The storing server's copy beyond the transport's: 4 MiB buffers written into (or
        read out of) a tmpfs file of one call's working set (8 chunks, pages already there,
        as the pair's file is), for as long as a BenchFS measurement. The buffers rotate
        over 8 distinct ones, as the server's pool buffers do: one reused buffer would copy
        from a warm cache, which the server never does."""
        assert self.workdir is not None
        path = self.workdir / "copy"
        bufs = [mmap.mmap(-1, BW_CHUNK) for _ in range(BW_INFLIGHT)]
        views = [memoryview(b) for b in bufs]
        fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
        try:
            for i, view in enumerate(views):
                view[:] = bytes([i]) * BW_CHUNK
                os.pwrite(fd, view, i * BW_CHUNK)
            moved, i = 0, 0
            start = time.perf_counter()
            while (elapsed := time.perf_counter() - start) < self.settings.bw_seconds:
                view = views[i % BW_INFLIGHT]
                at = ((i * 3) % BW_INFLIGHT) * BW_CHUNK  # another buffer for each place
                if case.op == "write":
                    moved += os.pwrite(fd, view, at)
                else:
                    moved += os.preadv(fd, [view], at)
                i += 1
        finally:
            os.close(fd)
            for view, buf in zip(views, bufs, strict=True):
                view.release()
                buf.close()
            path.unlink(missing_ok=True)
        return {"mib_s": moved / MIB / elapsed, "bytes": moved, "seconds": elapsed}

    def _error_handling_over(self, transport: Transport) -> str | None:
        """What UCX answers to ucx_perftest with peer error handling (`-e`) over `transport`:
        None if it runs, else its error, in one line."""
        s = self.settings
        try:
            self._run_perftest(
                Case(transport, "write-4m"), s.perftest_bw_warmup + 1, s.perftest_bw_warmup,
                ["-e"],
            )  # fmt: skip
        except PerftestError as e:
            errors = [line for line in str(e).splitlines() if "ERROR" in line]
            return (errors[-1].split("ERROR", 1)[1].strip() if errors else str(e))[:300]
        return None

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
        discards: dict[str, Pair] = {}
        for transport in self.transports:
            self.progress(f"starting benchfsd and a client over {transport.name} ({transport.tls})")
            pairs[transport.name] = self._pair(f"pair-{transport.name}", transport.overrides())
            discards[transport.name] = self._pair(
                f"discard-{transport.name}", [*transport.overrides(), "storage.layout=discard"]
            )
        cases = [Case(t, name) for t in self.transports for name in CASE_NAMES]
        runs: dict[Case, dict[str, list[dict[str, Any]]]] = {
            c: {t: [] for t in TOOLS} for c in cases
        }
        proto_v2 = {
            name: bool(pair.cluster.settings()["network"]["ucx_proto_v2"])
            for name, pair in pairs.items()
        }
        for step in interleave(cases, s.repeats, tools=TOOLS):
            if step.tool in BANDWIDTH_ONLY and not step.case.bandwidth:
                continue
            if step.tool == "ucx_perftest" and step.case.op == "null-rust":
                continue  # the same ucx_perftest as rtt-null's, taken from there below
            self.progress(f"repeat {step.repeat + 1}/{s.repeats}: {step.case}, {step.tool}")
            if step.tool == "benchfs":
                figures = self._benchfs(step.case, pairs[step.case.transport.name])
            elif step.tool == "benchfs_discard":
                figures = self._benchfs(step.case, discards[step.case.transport.name])
            elif step.tool == "copy":
                figures = self._copy(step.case)
            elif step.tool == "ucx_perftest":
                figures = self._perftest(step.case)
            else:
                figures = self._perftest_as_benchfs(step.case, proto_v2[step.case.transport.name])
            runs[step.case][step.tool].append(figures)
        for c in cases:
            if c.op == "null-rust":
                runs[c]["ucx_perftest"] = runs[Case(c.transport, "rtt-null")]["ucx_perftest"]
        for pair in [*pairs.values(), *discards.values()]:
            pair.cluster.check_alive()
            self._stop(pair.cluster)
        # Where BenchFS runs without failure detection: does UCX allow it there?
        refused = {
            t.name: self._error_handling_over(t)
            for t in self.transports
            if not t.peer_error_handling
        }
        rows = [summarize_case(c, runs[c]) for c in cases]
        for row in rows:
            if row["mib_s"] is not None:
                row["error_handling_refused"] = refused.get(row["transport"])
        python_call_us(rows)
        return rows

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

    def _scaling(self) -> dict[str, Any]:
        """write-4m and read-4m of SCALING_CLIENTS client processes (each on a node of its own)
        against 1, 2 and 4 servers on other nodes, interleaved over the repeats."""
        assert self.nodes is not None
        s = self.settings
        first_client = max(SCALING_SERVERS) + 1
        client_nodes = [f"n{first_client + i}" for i in range(SCALING_CLIENTS)]
        setups: dict[int, list[LineProcess]] = {}
        for n in SCALING_SERVERS:
            self.progress(
                f"scaling: {n} server(s) on n1..n{n}, clients on {', '.join(client_nodes)}"
            )
            cluster = self._cluster(
                f"scale-{n}",
                n,
                [f"layout.chunk_size={BW_CHUNK}", *TRANSPORTS[0].overrides()],
                False,
                nodes=[f"n{i + 1}" for i in range(n)],
            )
            setups[n] = [
                cluster.start_clients(1, BW_CALL, prepare=True, prefix=self.nodes.prefix(c))[0]
                for c in client_nodes
            ]
        runs: dict[int, dict[str, list[float]]] = {n: {"write": [], "read": []} for n in setups}
        for step in interleave(["write", "read"], s.repeats, tools=[str(n) for n in setups]):
            n = int(step.tool)
            self.progress(
                f"scaling: repeat {step.repeat + 1}/{s.repeats}, {n} server(s), {step.case}"
            )
            for client in setups[n]:
                client.send(f"bw {step.case} {s.bw_seconds}")
            answers = [c.receive(s.bw_seconds + ANSWER_MARGIN_S) for c in setups[n]]
            runs[n][step.case].append(sum(a["bytes"] / MIB / a["seconds"] for a in answers))
        rows = []
        for n in setups:
            row: dict[str, Any] = {"servers": n}
            for op in ("write", "read"):
                row[f"{op}_mib_s"] = median(runs[n][op])
                row[f"{op}_speedup"] = ratio(row[f"{op}_mib_s"], median(runs[1][op]))
                row[f"{op}_samples"] = runs[n][op]
            rows.append(row)
        return {
            "clients": SCALING_CLIENTS,
            "client_nodes": client_nodes,
            "chunk_size": BW_CHUNK,
            "call_size": BW_CALL,
            "transport": "tcp",
            "rows": rows,
        }

    def _overload(self) -> dict[str, Any]:
        s = self.settings
        common = [
            f"layout.chunk_size={s.load_chunk}",
            f"client.max_inflight_per_server={LOAD_INFLIGHT}",
            *TRANSPORTS[0].overrides(),
        ]
        self.progress(
            f"overload: starting {s.load_servers} servers with {LOAD_BUFFERS} buffers each and "
            f"{s.load_servers} with {PEAK_BUFFERS}"
        )
        over = self._cluster(
            "overload", s.load_servers, [*common, f"storage.buffer_count={LOAD_BUFFERS}"], True
        )
        peak = self._cluster(
            "peak", s.load_servers, [*common, f"storage.buffer_count={PEAK_BUFFERS}"], True
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

    @staticmethod
    def _second(tel: telemetry.Telemetry, start: float) -> float:
        """The servers' write MiB/s in the second from `start`: 0 when none completed."""
        try:
            return op_window(tel, start, start + 1.0, "write", enclose=False).mib_s
        except BenchError as e:
            if "no write operations" not in str(e):
                raise
            return 0.0

    def _load(self, cluster: BenchCluster, window: int) -> dict[str, Any]:
        """One timed write load of all clients against `cluster` with `window` in flight each."""
        s = self.settings
        extra = [f"client.max_inflight={window}"]
        client_config = cluster.settings(extra)["client"]
        clients = cluster.start_clients(s.load_clients, s.load_call, prepare=False, extra=extra)
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
        # Steadiness: each second of the load but its first and last STEADY_EDGE_S.
        starts = [go + STEADY_EDGE_S + k for k in range(int(s.load_seconds - 2 * STEADY_EDGE_S))]
        windows = [self._second(tel, t) for t in starts]
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
            "windows_mib_s": windows,
            "steady_share": min(windows) / max(windows) if windows and max(windows) > 0 else None,
        }


RPC_PROTOCOL_TARGET = 0.8
"""A server that keeps nothing, against ucx_perftest as BenchFS runs UCX."""
RPC_STORING_TARGET = 0.8
"""A storing server, against the transport and the store's copy in series."""
"""4 MiB requests against ucx_perftest run as BenchFS runs UCX (the same error handling and
protocol generation; not the default mode, which BenchFS cannot run in safely over TCP)."""
RPC_RTT_TARGET_US = {"shm": 25.0, "tcp": 60.0}
RPC_NULL_RUST_SHM_US = 3.0
"""A null round trip timed in Rust, over shared memory."""
RPC_NULL_RUST_OVER_PERFTEST = 1.5
"""A null round trip timed in Rust over TCP, against ucx_perftest's round trip."""
RPC_PEAK_SHARE_TARGET = 0.9
RPC_STEADY_TARGET = 0.9
STEADY_EDGE_S = 2.0
"""Seconds at either end of a load left out of its steadiness (ramp-up and wind-down)."""
FULL_LOAD_CLIENTS = RpcSettings.full().load_clients


def run_rpc(
    root: Path,
    settings: RpcSettings,
    benchfsd: str,
    quick: bool,
    progress: Callable[[str], None],
    note: Callable[[str], None],
) -> dict[str, Any]:
    """The whole `rpc` benchmark under `root` (tmpfs), with its targets and method notes."""
    started = time.monotonic()
    bench = RpcBench(root, settings, benchfsd, progress=progress, note=note)
    results = bench.run()
    report: dict[str, Any] = {
        **results,
        "data_dir": str(bench.workdir),
        "io_mode": "buffered",
        "data_fs": filesystem_type(root),
        "direct_write": False,
        "direct_read": False,
        "case_names": list(CASE_NAMES),
        "overload_inflight": LOAD_INFLIGHT,
        "repeats": settings.repeats,
        "quick": quick,
        "settings": dataclasses.asdict(settings),
        "versions": {
            "benchfs": __version__,
            "ucx": ucx_version(),
            "ucx_perftest": bench.perftest,
        },
        "elapsed_s": round(time.monotonic() - started, 3),
    }
    report["targets"] = targets(report)
    report["notes"] = method_notes(settings, quick)
    return report


def targets(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The rpc targets, checked against this report's medians."""
    found: list[dict[str, Any]] = []
    for case in report["cases"]:
        name, transport = case["name"], case["transport"]
        for key, what, limit in (
            ("ratio_discard_as_benchfs",
             "a server that keeps nothing: ratio to ucx_perftest as BenchFS runs UCX",
             RPC_PROTOCOL_TARGET),
            ("ratio_storing_limit", "storing on tmpfs: ratio to 1/(1/perftest + 1/copy)",
             RPC_STORING_TARGET),
        ):  # fmt: skip
            value = case.get(key)
            if name in ("write-4m", "read-4m") and value is not None:
                found.append(
                    {
                        "target": f"{name} over {transport}, {what} >= {limit}",
                        "value": value,
                        "met": value >= limit,
                    }
                )
        if name == "rtt-null-rust" and case["p50_us"] is not None:
            if transport == "shm":
                limit, what = RPC_NULL_RUST_SHM_US, f"{RPC_NULL_RUST_SHM_US:g} µs"
            else:
                limit = RPC_NULL_RUST_OVER_PERFTEST * (case.get("perftest_us") or 0.0)
                what = f"{RPC_NULL_RUST_OVER_PERFTEST:g} x ucx_perftest's round trip"
            found.append(
                {
                    "target": f"{name} over {transport} (Rust API): p50 <= {what}",
                    "value": case["p50_us"],
                    "met": limit > 0 and case["p50_us"] <= limit,
                }
            )
        if name in ("rtt-write-4k", "rtt-read-4k") and case["p50_us"] is not None:
            limit = RPC_RTT_TARGET_US[transport]
            found.append(
                {
                    "target": f"{name} over {transport}: p50 <= {limit:g} µs",
                    "value": case["p50_us"],
                    "met": case["p50_us"] <= limit,
                }
            )
    over = report["overload"]
    if over is None:
        return found
    found.append(
        {
            "target": "overload: zero timeouts",
            "value": over["timeouts"],
            "met": over["timeouts"] == 0,
        }
    )
    found.append(
        {"target": "overload: zero retries", "value": over["retries"], "met": over["retries"] == 0}
    )
    found.append(
        {
            "target": "overload: zero failed calls",
            "value": over["failed_calls"],
            "met": over["failed_calls"] == 0,
        }
    )
    steady = over["steady_share"]
    if steady is not None:
        found.append(
            {
                "target": f"overload: every 1 s window >= {RPC_STEADY_TARGET} x the best",
                "value": steady,
                "met": steady >= RPC_STEADY_TARGET,
            }
        )
    share = over["ratio_to_peak"]
    found.append(
        {
            "target": f"overload: throughput >= {RPC_PEAK_SHARE_TARGET} x peak",
            "value": share,
            "met": share is not None and share >= RPC_PEAK_SHARE_TARGET,
        }
    )
    return found


def case_lines(cases: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """Per bandwidth case: how ucx_perftest ran as BenchFS does, and each tool's range over
    the repeats; where UCX refused failure detection, its answer."""
    lines = []
    refusals: dict[str, str] = {}
    for case in cases:
        spread = case.get("spread_mib_s")
        if not spread:
            continue
        ranges = ", ".join(
            f"{tool.replace('_', ' ')} {fmt(lo, 0)}-{fmt(hi, 0)}"
            for tool, (lo, hi) in spread.items()
        )
        mode = case.get("perftest_as_benchfs") or "?"
        lines.append(
            (f"{case['transport']} {case['name']}", f"perftest as benchfs: {mode}; MiB/s {ranges}")
        )
        if case.get("error_handling_refused"):
            refusals[case["transport"]] = case["error_handling_refused"]
    for transport, why in refusals.items():
        lines.append((f"{transport} -e", f"ucx_perftest with error handling (-e): {why}"))
    for case in cases:
        if case.get("python_call_us") is not None:
            lines.append(
                (
                    f"{case['transport']} python call",
                    f"rtt-null less rtt-null-rust: {fmt(case['python_call_us'], 1)} µs of "
                    f"{fmt(case['p50_us'], 1)} µs is the Python call's own",
                )
            )
    return lines


def overload_lines(over: dict[str, Any]) -> list[tuple[str, str]]:
    """The overload and peak, their op times, faults and steadiness."""
    peaks = ", ".join(f"w{w} {fmt(v, 0)}" for w, v in over["peak_by_window"].items())
    lines = [
        (
            "overload",
            f"{over['clients']} clients x {over['inflight_per_client']} in flight, "
            f"{over['servers']} servers x {over['buffer_count']} buffers, "
            f"{format_size(over['transfer_size'])} transfers over "
            f"{format_size(over['chunk_size'])} chunks ({over['op']}, {over['transport']}, "
            f"{over['duration_s']:g} s): {fmt(over['mib_s'], 0)} MiB/s = "
            f"{fmt(over['ratio_to_peak'], 2)} x peak",
        ),
        (
            "peak",
            f"{fmt(over['peak_mib_s'], 0)} MiB/s (window {over['peak_window']}, "
            f"{over['peak_buffer_count']} buffers; by window: {peaks})",
        ),
        (
            "chunk ops",
            f"p50 {duration(over['p50_us'])}, p99 {duration(over['p99_us'])} at the servers "
            f"(arrival to reply ready); slowest client's call p99 "
            f"{duration(over['call_p99_us'])}",
        ),
        (
            "faults",
            f"timeouts {over['timeouts']}, retries {over['retries']}, failures "
            f"{over['failures']}, failed calls {over['failed_calls']}, refused busy "
            f"{over['rejected_busy']}, buffer waits {over['pool_waits']}",
        ),
        (
            "steadiness",
            "worst 1 s window / best: "
            + (
                f"{fmt(over['steady_share'], 2)} (first and last {STEADY_EDGE_S:g} s left out)"
                if over["steady_share"] is not None
                else f"- (a load of {over['duration_s']:g} s has no second between its edges)"
            ),
        ),
    ]
    return lines


def scaling_lines(scaling: dict[str, Any]) -> list[tuple[str, str]]:
    """One line per cluster size: aggregate MiB/s and the speed-up over one server."""
    lines = []
    for row in scaling["rows"]:
        figures = ", ".join(
            f"{op} {fmt(row[f'{op}_mib_s'], 0)} MiB/s ({fmt(row[f'{op}_speedup'], 2)}x)"
            for op in ("write", "read")
        )
        lines.append((f"{row['servers']} server{'s' if row['servers'] > 1 else ''}", figures))
    lines.append(
        (
            "scaling",
            f"{scaling['clients']} clients on {', '.join(scaling['client_nodes'])}, servers on "
            f"n1.., each its own network namespace ({scaling['transport']}); "
            f"{format_size(scaling['call_size'])} calls of {format_size(scaling['chunk_size'])} "
            "chunks; (Nx) = over 1 server",
        )
    )
    return lines


def render(console: Console, report: dict[str, Any]) -> None:
    """The table of cases, the overload lines and the rendezvous study, for people."""
    table = report_table(
        "benchfs-bench rpc: medians (bandwidth in MiB/s, round trips in µs)",
        [
            "benchfs\nMiB/s",
            "perftest as\nbenchfs",
            "ratio",
            "keeping\nnothing",
            "ratio",
            "store's\ncopy",
            "in series",
            "ratio",
            "benchfs\np50",
            "benchfs\np99",
            "perftest\np50",
            "perftest\np99",
            "perftest\nsleep p50",
            "server\np50",
        ],
    )

    def judged(value: float | None, target: float) -> str:
        if value is None:
            return fmt(value, 2)
        return f"[{'green' if value >= target else 'yellow'}]{fmt(value, 2)}[/]"

    for case in report["cases"]:
        table.add_row(
            f"{case['transport']} {case['name']}",
            fmt(case["mib_s"], 0),
            fmt(case.get("perftest_as_benchfs_mib_s"), 0),
            fmt(case.get("ratio_as_benchfs"), 2),
            fmt(case.get("discard_mib_s"), 0),
            judged(case.get("ratio_discard_as_benchfs"), RPC_PROTOCOL_TARGET),
            fmt(case.get("copy_mib_s"), 0),
            fmt(case.get("storing_limit_mib_s"), 0),
            judged(case.get("ratio_storing_limit"), RPC_STORING_TARGET),
            fmt(case["p50_us"], 1),
            fmt(case["p99_us"], 1),
            fmt(case["perftest_us"], 1),
            fmt(case.get("perftest_p99_us"), 1),
            fmt(case.get("perftest_sleep_us"), 1),
            fmt(case.get("server_p50_us"), 1),
        )
    console.print(table)
    over = report["overload"]
    lines = case_lines(report["cases"])
    lines += overload_lines(over) if over is not None else scaling_lines(report["scaling"])
    study = report.get("rndv_threshold_study")
    if study:
        lines.append(
            (
                "rndv study",
                "; ".join(
                    f"{row['label']}: write-4m {fmt(row['write-4m_mib_s'], 0)}, read-4m "
                    f"{fmt(row['read-4m_mib_s'], 0)} MiB/s"
                    for row in study["rows"]
                )
                + " (tcp)",
            )
        )
    lines.append(
        (
            "settings",
            f"data on {report['data_dir']} ({report['data_fs']}, {report['io_mode']} I/O), "
            f"{report['repeats']} repeat{'s' if report['repeats'] != 1 else ''}, "
            f"UCX {report['versions']['ucx'] or '?'}",
        )
    )
    print_lines_and_targets(console, lines, report["targets"])
    for text in report["notes"]:
        console.print(f"  note: {escape(text)}", highlight=False, soft_wrap=True)


def method_notes(settings: RpcSettings, quick: bool) -> list[str]:
    """What the output's figures are, said where they are read."""
    notes = [
        "rtt-null is Client.stat on a 1-server cluster (BenchFS has no null op): one "
        "round trip to the metadata owner, no payload and no disk; rtt-null-rust is the same "
        "stats timed in Rust (no interpreter per call): the difference is the Python call's",
        "perftest RTT = 2 x ucx_perftest's ucp_am_lat latency, which is one-way (half the "
        "ping-pong round trip); ucx_perftest busy-polls, BenchFS sleeps in the kernel when idle",
    ]
    if settings.netns:
        return [
            *notes,
            "between nodes: every process in a network namespace of its own with one veth link "
            "to a bridge, UCX on that link over TCP (UCX_NET_DEVICES=eth0 UCX_TLS=tcp); the "
            "cases' server and ucx_perftest's responder on n1, the client and initiator on n2",
            "no overload and no rendezvous study between nodes (run without --netns)",
        ]
    notes += [
        "overload p50/p99_us are chunk write times at the servers (request arrival to reply "
        "ready, from telemetry) over the load minus its first "
        f"{settings.load_ramp_s:g} s; each client call moves 128 MiB (64 transfers of 2 MiB)",
    ]
    if settings.load_clients != FULL_LOAD_CLIENTS:
        why = " (--quick: 16 processes are heavy on a small host)" if quick else ""
        notes.append(
            f"overload and peak ran with {settings.load_clients} client processes, "
            f"not {FULL_LOAD_CLIENTS}{why}"
        )
    if not settings.rndv_study:
        notes.append("no rendezvous threshold study (--quick or --no-rndv-study)")
    return notes


def ucx_version() -> str | None:
    try:
        line = tool_version([find_tool("ucx_info"), "-v"])
    except FileNotFoundError:
        return None
    found = re.search(r"\d+(?:\.\d+)+", line or "")
    return found.group(0) if found else None

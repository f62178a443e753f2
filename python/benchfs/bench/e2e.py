"""`benchfs-bench e2e`: the built-in IOR workload on a local cluster against fio on the disk.

One local cluster of 2 `benchfsd` servers whose data directories are on the real disk (the
directory given, not tmpfs), and per case two tools moving the same bytes:

- benchfs: `benchfs.workloads.ior` as 2 MPI ranks, file per process, one 64 MiB block each,
  in the case's transfer size (`-w -F -k`, then `-r -F`, which removes the files after the
  read, as IOR does); bandwidth is IOR's (all bytes over the span from the first open to the
  last close).
- fio: 2 jobs (`numjobs=2`), a 64 MiB file each in the same data directory, `bs` = the
  transfer size, psync, with `--direct` as the servers have it (storage.direct_write for the
  write, storage.direct_read for the read); bandwidth is fio's aggregate.

Cases: 1 MiB and 4 MiB transfers over the default chunk size, and 2 MiB transfers over 1 MiB
chunks, each written then read. A file's layout (its chunk size) is set by the servers when it
is created, so the 1 MiB-chunk case has its own 2-server cluster started with
`layout.chunk_size=1M` (a client's setting alone would not change the layout). Repeats are
interleaved (`benchfs.bench.stats.interleave`), the page cache is dropped before every write
and read (`drop_caches`, as the storage bench does), and the report gives medians.

The transport's limit: each case also runs `ucx_perftest -t ucp_am_bw` as BenchFS runs UCX (the
configuration's transports, peer error handling (`-e`) and protocol generation), with the
case's request size (a transfer, or a chunk where a transfer spans several) and as many in
flight as the two ranks have, moving at least the bytes of one phase. Each case is reported
against the lower of fio and the transport (`limit_mib_s`, `binds`), so that a ratio says
which limit binds; the ratio to fio is kept beside it.

The cost of copies: each case runs a third tool, `benchfs-x2`, the same IOR on clusters of the
same shape started with `layout.replicas=2` (every chunk on both servers), reported as its
ratio to `benchfs` (one copy) in the same interleaved schedule.

With `--netns` the nodes are apart (`benchfs.simnodes.apart_nodes`): the servers on n1 and
n2, the ranks on n3, each node its own network namespace, so every byte crosses a link over
TCP; fio runs on the disk as before.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from benchfs.bench.cluster import BenchCluster
from benchfs.bench.render import print_lines_and_targets, print_ratio_cases
from benchfs.bench.stats import interleave, median, ratio
from benchfs.cluster import child_env
from benchfs.config import load_config
from benchfs.errors import BenchError, ParseError
from benchfs.mpi import MpiLauncher
from benchfs.parsers import parse_ior_json
from benchfs.probes.fio import find_fio, run_fio
from benchfs.probes.perftest import find_perftest, run_perftest
from benchfs.probes.system import drop_caches, remove_path
from benchfs.simnodes import ApartNodes, apart_nodes
from benchfs.units import MIB, format_size

TOOLS = ("benchfs", "benchfs-x2", "fio", "transport")
DIRECTIONS = ("write", "read")
TARGET_RATIO = {"write": 0.9, "read": 0.95}
"""Per direction, on one host, against the binding limit (the lower of fio and the transport)."""
COPIES_TARGET = {"write": 0.45, "read": 0.95}
"""Two copies against one, per direction: a write moves and stores every byte twice over a
network and a disk both copies share here; a read reads one copy."""
COPIES = 2
"""The copy count of `benchfs-x2`."""
NETNS_TARGET_RATIO = 0.8
"""Between nodes in network namespaces (--netns), against the binding limit."""
RANKS = 2
WORKLOAD_TIMEOUT_S = 600.0
TRANSPORT_MIN_BYTES = 256 * MIB
"""ucx_perftest moves at least this much per measurement (a phase of --quick is too short to
give a steady figure)."""
TRANSPORT_WARMUP = 10


@dataclass(frozen=True)
class Geometry:
    """One transfer size over one chunk size (None: the configuration's chunk size)."""

    transfer: int
    chunk: int | None = None

    @property
    def name(self) -> str:
        base = f"t{_short(self.transfer)}"
        return base if self.chunk is None else f"{base}-chunk{_short(self.chunk)}"

    def request(self, default_chunk: int) -> int:
        """Bytes per request: a transfer, or a chunk where a transfer spans several."""
        return min(self.transfer, self.chunk or default_chunk)


def _short(n: int) -> str:
    """4MiB -> 4m, as IOR's options write sizes."""
    return format_size(n).lower().removesuffix("ib")


GEOMETRIES = (Geometry(MIB), Geometry(4 * MIB), Geometry(2 * MIB, MIB))


@dataclass(frozen=True)
class E2ESettings:
    repeats: int = 3
    block_size: int = 64 * MIB
    """Bytes per rank (one IOR block) and per fio job."""

    @classmethod
    def quick(cls) -> E2ESettings:
        return cls(repeats=1, block_size=8 * MIB)


class E2EBench:
    """The clusters (one per chunk size; None: the configuration's) and the fio directory of
    one run."""

    def __init__(
        self,
        root: Path,
        settings: E2ESettings,
        clusters: dict[tuple[int | None, int], BenchCluster],
        rank_env: dict[str, str] | None = None,
        apart: tuple[list[str], list[str], str] | None = None,
    ) -> None:
        self.root = root
        self.rank_env = rank_env or {}
        self.apart = apart
        """(a server node's prefix, the ranks' node's prefix, the server node's address)"""
        self.settings = settings
        self.clusters = clusters
        config = load_config()
        storage = config["storage"]
        self.direct = {"write": bool(storage["direct_write"]), "read": bool(storage["direct_read"])}
        self.network = config["network"]
        self.default_chunk = int(config["layout"]["chunk_size"])
        self.fio = find_fio()
        self.perftest = find_perftest()
        self.fio_dir = root / "fio"
        self.fio_dir.mkdir()
        self.launcher = MpiLauncher()
        self.configs = {k: c.config_path for k, c in clusters.items()}
        self.cache_dropped = True

    def drop(self) -> None:
        self.cache_dropped = drop_caches() and self.cache_dropped

    def ior(self, g: Geometry, direction: str, copies: int = 1) -> float:
        """One IOR phase as 2 ranks on the cluster of `copies`; MiB/s from the workload's own
        JSON."""
        key = (g.chunk, copies)
        out = self.root / "ior.json"
        remove_path(out)
        argv = [
            sys.executable,
            "-m",
            "benchfs.workloads.ior",
            *(["-w", "-k"] if direction == "write" else ["-r"]),
            *("-F", "-t", str(g.transfer), "-b", str(self.settings.block_size)),
            *("-o", f"/e2e-{g.name}", "--json", str(out)),
            *("--registry", str(self.clusters[key].registry)),
            *("--config", str(self.configs[key])),
        ]
        cmd = self.launcher.command(RANKS, argv)
        proc = subprocess.Popen(
            cmd,
            env=self.launcher.env({**child_env(), **self.rank_env}),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        try:
            output, _ = proc.communicate(timeout=WORKLOAD_TIMEOUT_S)
        except BaseException:
            os.killpg(proc.pid, signal.SIGKILL)  # the whole mpiexec session, ranks included
            proc.communicate()
            raise
        if proc.returncode != 0:
            raise BenchError(
                "EIO", f"IOR workload {g.name} {direction} failed ({proc.returncode}): {output}"
            )
        try:
            rows = parse_ior_json(out.read_text(), str(out))
        except (OSError, ParseError) as e:
            raise BenchError("EIO", f"IOR workload {g.name} {direction}: {e}") from e
        return next(r.bw_mib_s for r in rows if r.kind == "summary")

    def fio_run(self, g: Geometry, direction: str) -> float:
        argv = [
            self.fio,
            "--output-format=json",
            f"--name=e2e-{g.name}",
            f"--directory={self.fio_dir}",
            f"--rw={direction}",
            f"--bs={g.transfer}",
            f"--size={self.settings.block_size}",
            "--ioengine=psync",
            f"--direct={int(self.direct[direction])}",
            f"--numjobs={RANKS}",
            "--group_reporting=1",
        ]
        return run_fio(argv, direction, timeout_s=WORKLOAD_TIMEOUT_S).mib_s

    def transport_run(self, g: Geometry) -> float:
        """ucx_perftest as BenchFS runs UCX, with the case's request size and requests in
        flight; MiB/s."""
        size = g.request(self.default_chunk)
        in_flight = RANKS * (g.transfer // size)
        iterations = max(RANKS * self.settings.block_size, TRANSPORT_MIN_BYTES) // size
        args = ["-O", str(in_flight), *(["-e"] if self.network["peer_error_handling"] else [])]
        env = {"UCX_PROTO_ENABLE": "y" if self.network["ucx_proto_v2"] else "n"}
        return run_perftest(
            "ucp_am_bw",
            size,
            iterations,
            TRANSPORT_WARMUP,
            self.network["transports"] or None,
            self.root,
            WORKLOAD_TIMEOUT_S,
            args,
            perftest=self.perftest,
            apart=self.apart,
            extra_env=env,
        ).mib_s

    def measure(self, g: Geometry, tool: str) -> dict[str, float]:
        """Write, then read back, with the page cache dropped before each; then free the space."""
        result = {}
        for direction in DIRECTIONS:
            if tool == "transport":
                result[direction] = self.transport_run(g)
                continue
            self.drop()
            if tool == "benchfs":
                result[direction] = self.ior(g, direction)
            elif tool == "benchfs-x2":
                result[direction] = self.ior(g, direction, COPIES)
            else:
                result[direction] = self.fio_run(g, direction)
        if tool == "fio":
            for entry in self.fio_dir.iterdir():
                remove_path(entry)
        return result


def e2e_targets(cases: list[dict[str, Any]], netns: bool = False) -> list[dict[str, Any]]:
    def target(case: dict[str, Any]) -> float:
        return NETNS_TARGET_RATIO if netns else TARGET_RATIO[case["direction"]]

    def met(value: float | None, floor: float) -> bool | None:
        return None if value is None else value >= floor

    return [
        {
            "target": f"{c['name']}: ratio to the binding limit ({c['binds']}) >= {target(c):g}",
            "value": c["limit_ratio"],
            "met": met(c["limit_ratio"], target(c)),
        }
        for c in cases
    ] + [
        {
            "target": f"{c['name']}: {COPIES} copies >= {COPIES_TARGET[c['direction']]:g}x of one",
            "value": c["copies_ratio"],
            "met": met(c["copies_ratio"], COPIES_TARGET[c["direction"]]),
        }
        for c in cases
    ]


def run_e2e(
    root: Path,
    settings: E2ESettings,
    benchfsd: str,
    progress: Callable[[str], None] = lambda _: None,
    netns: bool = False,
) -> dict[str, Any]:
    """Starts the clusters, runs the interleaved schedule, stops everything; with `netns`, on
    nodes apart (servers on n1 and n2, the ranks on n3)."""
    with contextlib.ExitStack() as stack:
        nodes = stack.enter_context(apart_nodes(RANKS + 1)) if netns else None
        return _run_e2e(root, settings, benchfsd, progress, nodes)


def _run_e2e(
    root: Path,
    settings: E2ESettings,
    benchfsd: str,
    progress: Callable[[str], None],
    nodes: ApartNodes | None,
) -> dict[str, Any]:
    storage = load_config()["storage"]
    # The servers' I/O mode is the configuration's (not the tmpfs benches' buffered override).
    overrides = [
        f"storage.direct_write={str(bool(storage['direct_write'])).lower()}",
        f"storage.direct_read={str(bool(storage['direct_read'])).lower()}",
    ]
    clusters: dict[tuple[int | None, int], BenchCluster] = {}
    for g in GEOMETRIES:
        for copies in (1, COPIES):
            if (g.chunk, copies) in clusters:
                continue
            layout = [] if g.chunk is None else [f"layout.chunk_size={g.chunk}"]
            name = "e2e" + ("" if g.chunk is None else f"-c{g.chunk}") + f"-x{copies}"
            clusters[(g.chunk, copies)] = BenchCluster(
                root / f"cluster-{name}",
                name,
                2,
                [*overrides, *layout, f"layout.replicas={copies}"],
                benchfsd,
            )
    if nodes is not None:
        for cluster in clusters.values():
            cluster.server_prefixes = [nodes.prefix(f"n{i + 1}") for i in range(cluster.servers)]
    samples: dict[tuple[str, str, str], list[float]] = {}
    try:
        for cluster in clusters.values():
            cluster.start()
        ranks_node = f"n{RANKS + 1}"
        rank_env, apart = None, None
        if nodes is not None:
            rank_env = nodes.rank_env(ranks_node)
            apart = (nodes.prefix("n1"), nodes.prefix(ranks_node), nodes.address("n1"))
        bench = E2EBench(root, settings, clusters, rank_env, apart)
        steps = interleave(list(GEOMETRIES), settings.repeats, TOOLS)
        for i, step in enumerate(steps, 1):
            progress(f"[{i}/{len(steps)}] {step.case.name} {step.tool}")
            for direction, value in bench.measure(step.case, step.tool).items():
                samples.setdefault((step.case.name, direction, step.tool), []).append(value)
    finally:
        for cluster in clusters.values():
            cluster.stop()  # also one whose start failed half-way; a no-op if never started
    cases = []
    for g in GEOMETRIES:
        for direction in DIRECTIONS:
            ours = samples[(g.name, direction, "benchfs")]
            copies = samples[(g.name, direction, "benchfs-x2")]
            theirs = samples[(g.name, direction, "fio")]
            transport = samples[(g.name, direction, "transport")]
            limit = min(median(theirs), median(transport))
            cases.append(
                {
                    "name": f"{direction}-{g.name}",
                    "mib_s": median(ours),
                    "fio_mib_s": median(theirs),
                    "ratio": ratio(median(ours), median(theirs)),
                    "direction": direction,
                    "transfer_size": g.transfer,
                    "chunk_size": g.chunk or int(load_config()["layout"]["chunk_size"]),
                    "samples": ours,
                    "fio_samples": theirs,
                    "copies_mib_s": median(copies),
                    "copies_ratio": ratio(median(copies), median(ours)),
                    "copies_samples": copies,
                    "transport_mib_s": median(transport),
                    "transport_samples": transport,
                    "limit_mib_s": limit,
                    "binds": "fio" if median(theirs) <= median(transport) else "transport",
                    "limit_ratio": ratio(median(ours), limit),
                }
            )
    return {
        "cases": cases,
        "targets": e2e_targets(cases, nodes is not None),
        "netns": nodes is not None,
        "data_dir": str(root),
        "servers": 2,
        "copies": COPIES,
        "ranks": RANKS,
        "block_size": settings.block_size,
        "repeats": settings.repeats,
        "direct_write": bench.direct["write"],
        "direct_read": bench.direct["read"],
        "cache_dropped": bench.cache_dropped,
    }


def render(console: Console, report: dict[str, Any]) -> None:
    """BenchFS beside fio, case by case, for people."""
    print_ratio_cases(
        console,
        f"benchfs-bench e2e: medians of {report['repeats']} (MiB/s)",
        ("benchfs", "limit"),
        "limit_mib_s",
        [
            {**c, "name": f"{c['name']} ({c['binds']})", "ratio": c["limit_ratio"]}
            for c in report["cases"]
        ],
    )
    print_ratio_cases(
        console,
        "the limits (MiB/s)",
        ("fio", "transport"),
        "transport_mib_s",
        [
            {**c, "mib_s": c["fio_mib_s"], "ratio": ratio(c["fio_mib_s"], c["transport_mib_s"])}
            for c in report["cases"]
        ],
    )
    print_ratio_cases(
        console,
        f"the cost of {report['copies']} copies (layout.replicas={report['copies']})",
        (f"benchfs x{report['copies']}", "benchfs"),
        "one_copy_mib_s",
        [
            {
                "name": c["name"],
                "mib_s": c["copies_mib_s"],
                "one_copy_mib_s": c["mib_s"],
                "ratio": c["copies_ratio"],
            }
            for c in report["cases"]
        ],
    )
    io = f"direct_write={report['direct_write']}, direct_read={report['direct_read']}"
    lines = [
        ("limit", "the lower of fio and ucx_perftest as BenchFS runs UCX"),
        ("data", f"{report['data_dir']} ({report['data_fs']}), {io}"),
        (
            "shape",
            f"{report['servers']} servers, {report['ranks']} ranks x "
            f"{format_size(report['block_size'])}, file per process; fio {report['ranks']} jobs",
        ),
    ]
    if report.get("netns"):
        where = "servers on n1 and n2, ranks on n3: network namespaces on a bridge, UCX over TCP"
        lines.append(("nodes", where))
    if not report["cache_dropped"]:
        lines.append(("note", "page cache not dropped (not root): reads may hit the cache"))
    print_lines_and_targets(console, lines, report["targets"])

"""Network probe: bandwidth and round trips between node pairs over BenchFS's own transport.

For each pair (a, b), one `benchfsd` runs under a's command prefix (its data on tmpfs, so no
disk is measured) and one client process (`benchfs.clients.calls`, i.e. `benchfs._core`
over UCX) under b's: it writes, then reads a call of 4 chunks again and again for a few
seconds each, then times 4 KiB write round trips one by one. Pairs run one at a time so that
they do not share the links they measure.

When the nodes are simulated on this host (a local screen) and `network.transports` is empty, the
probe uses `tcp`, since UCX would otherwise pick shared memory and bypass the network; a node
whose traffic must use one interface says so in its prefix (`env UCX_NET_DEVICES=eth0`).
"""

from __future__ import annotations

import contextlib
import itertools
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchfs.cluster import LocalCluster, child_env
from benchfs.config import parse_config, resolve_config_text
from benchfs.errors import BenchfsError
from benchfs.nodes import Node
from benchfs.procs import LineProcess

__all__ = ["PairResult", "measure_pair", "pairs_of"]

CHUNK = 1 << 20
CALL = 4 * CHUNK
READY_TIMEOUT_S = 60.0
RTT_CALLS = 300


@dataclass
class PairResult:
    """What one pair measured (or why it could not)."""

    server: str
    client: str
    write_mib_s: float | None = None
    read_mib_s: float | None = None
    rtt_p50_us: float | None = None
    rtt_p99_us: float | None = None
    error: str | None = None

    @property
    def key(self) -> str:
        return f"{self.server}<->{self.client}"

    @property
    def mib_s(self) -> float | None:
        """The slower direction: a shaped link shows in one of them at least."""
        both = [v for v in (self.write_mib_s, self.read_mib_s) if v is not None]
        return min(both) if both else None

    def to_json(self) -> dict[str, Any]:
        return {"pair": self.key, **vars(self), "mib_s": self.mib_s}


def pairs_of(nodes: Sequence[Node], all_pairs_up_to: int = 8) -> list[tuple[Node, Node]]:
    """Every pair for up to `all_pairs_up_to` nodes; beyond, each node with its next and its
    opposite in the ring (2n pairs, every node in four)."""
    n = len(nodes)
    if n <= all_pairs_up_to:
        return list(itertools.combinations(nodes, 2))
    chosen: dict[tuple[int, int], None] = {}
    for i in range(n):
        for j in ((i + 1) % n, (i + n // 2) % n):
            chosen[(min(i, j), max(i, j))] = None
    return [(nodes[i], nodes[j]) for i, j in chosen]


def _config(config_text: str, simulated: bool) -> str:
    overrides = [
        f"layout.chunk_size={CHUNK}",
        "storage.direct_write=false",
        "storage.direct_read=false",
        "client.request_timeout_s=30.0",
    ]
    if simulated and not parse_config(config_text)["network"]["transports"]:
        overrides.append("network.transports=tcp")
    with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as f:
        f.write(config_text)
        base = f.name
    try:
        return resolve_config_text(base, overrides)
    finally:
        Path(base).unlink(missing_ok=True)


def measure_pair(
    server: Node,
    client: Node,
    raw_dir: Path,
    config_text: str,
    seconds: float,
    simulated: bool,
) -> PairResult:
    """Measure one pair; failures are recorded in the result, never raised."""
    result = PairResult(server.name, client.name)
    root = raw_dir / f"{server.name}--{client.name}"
    root.mkdir(parents=True, exist_ok=True)
    data = Path(tempfile.mkdtemp(prefix=f"benchfs-diagnose-net-{server.name}-", dir="/dev/shm"))
    cluster: LocalCluster | None = None
    reader: LineProcess | None = None
    try:
        cluster = LocalCluster.start_in(
            root,
            _config(config_text, simulated),
            [server.name],
            READY_TIMEOUT_S,
            data_dirs=[data],
            prefix=server.command_prefix,
        )
        argv = client.command(
            [
                sys.executable,
                "-m",
                "benchfs.clients.calls",
                "--registry",
                str(cluster.registry_dir),
                "--config",
                str(cluster.config_path),
                "--name",
                f"probe-{client.name}",
                "--call-size",
                str(CALL),
            ]
        )
        reader = LineProcess(argv, root / "client.log", "client process", child_env())
        reader.receive(READY_TIMEOUT_S)
        answers: dict[str, Any] = {}
        for op in ("write", "read"):
            reader.send(f"bw {op} {seconds:g}")
            a = reader.receive(seconds + READY_TIMEOUT_S)
            answers[f"bw_{op}"] = a
            mib_s = a["bytes"] / (1 << 20) / a["seconds"] if a["seconds"] > 0 else None
            setattr(result, f"{op}_mib_s", mib_s)
        reader.send(f"rtt write {RTT_CALLS} {seconds:g}")
        a = reader.receive(seconds + READY_TIMEOUT_S)
        answers["rtt_write"] = a
        result.rtt_p50_us, result.rtt_p99_us = a["p50_us"], a["p99_us"]
        (root / "answers.json").write_text(repr(answers) + "\n")
    except (BenchfsError, TimeoutError, OSError, ValueError) as e:
        result.error = f"{type(e).__name__}: {e}"
    finally:
        if reader is not None:
            reader.close()
        if cluster is not None:
            cluster.stop(grace_s=5.0)
        shutil.rmtree(data, ignore_errors=True)
        with contextlib.suppress(OSError):
            (root / "registry").rmdir()
    return result


def measure_pairs(
    pairs: Sequence[tuple[Node, Node]],
    raw_dir: Path,
    config_text: str,
    seconds: float,
    deadline: float,
    simulated: bool,
) -> list[PairResult]:
    """`pairs` (e.g. `pairs_of(nodes)`) in turn, until `deadline` (monotonic). `simulated`:
    all nodes run on this host."""
    out = []
    for a, b in pairs:
        if time.monotonic() >= deadline:
            out.append(PairResult(a.name, b.name, error="not measured: time budget spent"))
            continue
        out.append(measure_pair(a, b, raw_dir, config_text, seconds, simulated))
    return out

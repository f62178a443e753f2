"""`benchfs-bench meta`: create, stat and unlink throughput of the metadata service.

Several clients (one `benchfs.Client` each, on its own thread; every call releases the GIL)
each work in their own directory on a local cluster whose servers keep data on tmpfs. Each
phase starts on a barrier and ends when the last client finishes, so ops/s is the whole
cluster's rate for that phase. Create is `open(O_CREAT | O_EXCL)` + `close` (two metadata
requests: the parent's entry and the inode); unlink is one request to the inode's owner plus
one to the parent's (no data to free: the files are empty).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from benchfs import Client
from benchfs.bench.cluster import BenchCluster
from benchfs.bench.render import fmt, report_table

PHASES = ("create", "stat", "unlink")


@dataclass(frozen=True)
class MetaSettings:
    servers: int = 4
    clients: int = 4
    files: int = 10_000
    """Files in total, split evenly over the clients."""

    @classmethod
    def quick(cls) -> MetaSettings:
        return cls(servers=2, clients=2, files=400)


def _phase(clients: list[Client], work: Callable[[Client, int], None]) -> float:
    """Runs `work(client, index)` on every client at once; returns the wall time."""
    barrier = threading.Barrier(len(clients) + 1)
    errors: list[BaseException] = []

    def run(c: Client, i: int) -> None:
        barrier.wait()
        try:
            work(c, i)
        except BaseException as e:  # reported below, never lost
            errors.append(e)

    threads = [threading.Thread(target=run, args=(c, i)) for i, c in enumerate(clients)]
    for t in threads:
        t.start()
    barrier.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    if errors:
        raise errors[0]
    return elapsed


def run_meta(root: Path, settings: MetaSettings, benchfsd: str) -> dict[str, Any]:
    """Starts the cluster, runs the three phases, stops everything; returns the report body."""
    cluster = BenchCluster(root / "meta", "meta", settings.servers, [], benchfsd)
    per_client = settings.files // settings.clients
    cluster.start()
    try:
        config = cluster.config_text()
        clients = [Client(str(cluster.registry), config=config) for _ in range(settings.clients)]
        try:
            for i in range(settings.clients):
                clients[0].mkdir(f"/c{i}")

            def create(c: Client, i: int) -> None:
                for n in range(per_client):
                    c.open(f"/c{i}/f{n}", os.O_RDWR | os.O_CREAT | os.O_EXCL).close()

            def stat(c: Client, i: int) -> None:
                for n in range(per_client):
                    c.stat(f"/c{i}/f{n}")

            def unlink(c: Client, i: int) -> None:
                for n in range(per_client):
                    c.unlink(f"/c{i}/f{n}")

            cases = []
            for name, work in zip(PHASES, (create, stat, unlink), strict=True):
                seconds = _phase(clients, work)
                ops = per_client * settings.clients
                cases.append({"name": name, "ops": ops, "seconds": seconds, "ops_s": ops / seconds})
            left = sum(len(clients[0].readdir(f"/c{i}")) for i in range(settings.clients))
            if left:
                raise OSError(f"{left} entries left after unlink")
        finally:
            for c in clients:
                c.close()
    finally:
        cluster.stop()
    return {
        "cases": cases,
        "servers": settings.servers,
        "clients": settings.clients,
        "files": per_client * settings.clients,
        "data_dir": str(cluster.root),
    }


def render(console: Console, report: dict[str, Any]) -> None:
    """The phases' throughput, for people."""
    table = report_table(
        f"benchfs-bench meta: {report['files']} files, {report['clients']} clients, "
        f"{report['servers']} servers",
        ["ops", "seconds", "ops/s"],
    )
    for c in report["cases"]:
        table.add_row(c["name"], str(c["ops"]), fmt(c["seconds"], 2), fmt(c["ops_s"], 0))
    console.print(table)

"""The benchmarks' own clusters: `benchfsd` daemons with their data on tmpfs (or a chosen
directory), and client processes (`benchfs.clients.calls`) driven over JSON lines."""

from __future__ import annotations

import hashlib
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchfs.cluster import LocalCluster, ServerExited, child_env
from benchfs.config import parse_config, resolve_config_text
from benchfs.errors import BenchError
from benchfs.procs import LineProcess

TELEMETRY_INTERVAL_MS = 100
SERVER_START_TIMEOUT_S = 30.0
CLIENT_READY_TIMEOUT_S = 120.0


@dataclass
class BenchCluster:
    """`servers` benchfsd daemons on tmpfs (own registry, config, data) and their clients."""

    root: Path
    name: str
    servers: int
    overrides: Sequence[str]
    benchfsd: str
    with_telemetry: bool = False
    server_prefixes: Sequence[Sequence[str]] | None = None
    """Daemon i runs under server_prefixes[i] (its node, e.g. a network namespace)."""
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
                self.root,
                self.config_text(),
                nodes,
                SERVER_START_TIMEOUT_S,
                prefixes=self.server_prefixes,
                benchfsd=self.benchfsd,
                # A benchmark's servers may keep nothing (storage.layout = "discard").
                extra_args=["--benchmark"],
            )
        except (ServerExited, TimeoutError) as e:
            raise BenchError("EHOSTDOWN", f"benchfsd ({self.name}) did not start: {e}") from e

    def settings(self, extra: Sequence[str] = ()) -> dict[str, Any]:
        return parse_config(self.config_text(extra))

    def start_clients(
        self,
        count: int,
        call_size: int,
        prepare: bool,
        extra: Sequence[str] = (),
        prefix: Sequence[str] = (),
    ) -> list[LineProcess]:
        """Start `count` client processes with this config plus `extra`, under `prefix` (their
        node's); wait until they are ready."""
        assert self.cluster is not None
        text = self.config_text(extra)
        digest = hashlib.sha256(text.encode()).hexdigest()[:12]
        path = self.root / f"client-{digest}.toml"
        path.write_text(text)
        started = []
        for i in range(count):
            self.started_clients += 1
            argv = [
                *prefix,
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


def on_threads(clients: Sequence[Any], work: Callable[[Any, int], Any]) -> tuple[float, list[Any]]:
    """`work(client, index)` on every client at once, each on its own thread, started on a
    barrier: the wall time until the last ends, and their results. The first error is raised
    after all have ended (never lost)."""
    barrier = threading.Barrier(len(clients) + 1)
    results: list[Any] = [None] * len(clients)
    errors: list[BaseException] = []

    def run(c: Any, i: int) -> None:
        barrier.wait()
        try:
            results[i] = work(c, i)
        except BaseException as e:  # raised below
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
    return elapsed, results

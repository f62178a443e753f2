"""Fixtures that start real BenchFS servers (in-process or `benchfsd` daemons) in a tmp dir.

Every fixture stops what it started, and the daemon fixture checks that no daemon outlives
its test.
"""

from __future__ import annotations

import contextlib
import io
import os
import shlex
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from benchfs import Server, _core
from benchfs.cluster import LocalCluster
from benchfs.config import resolve_config_text
from benchfs.mount import Mounted, is_mounted, mounted
from benchfs.procs import pid_alive
from benchfs.workloads.rw import Pattern

# Small chunks so that modest test files span many chunks and every server; short timeouts
# so that fault tests fail fast.
TEST_OVERRIDES = (
    "layout.chunk_size=65536",
    "cluster.connect_timeout_s=10.0",
    "client.request_timeout_s=5.0",
)


def config_text(*overrides: str) -> str:
    """Effective config text for tests: TEST_OVERRIDES, then `overrides`."""
    return resolve_config_text(None, [*TEST_OVERRIDES, *overrides])


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked serial never run beside others: refused under pytest-xdist's workers (make
    test-python runs them in a second part, alone)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        serial = [item.nodeid for item in items if item.get_closest_marker("serial")]
        if serial:
            raise pytest.UsageError(
                f"{len(serial)} tests marked serial selected under -n (first: {serial[0]}); "
                'select them with -m "not serial", and run them alone'
            )


@pytest.fixture(autouse=True)
def _isolated_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep the user's BENCHFS_* variables out of the tests (each test sets what it needs), and
    no kernel tracing of runs."""
    for key in list(os.environ):
        if key.startswith("BENCHFS_"):
            monkeypatch.delenv(key)
    # The kernel tracers cost seconds per run (compiling, folding profiles): only the tests of
    # kernel tracing turn them on.
    monkeypatch.setenv("BENCHFS_RUN_KERNEL_TRACE", "false")


@dataclass
class InProcessCluster:
    """Servers running on threads of the test process, sharing one registry."""

    registry: Path
    config: str
    servers: list[Server]

    def stop(self) -> None:
        for server in self.servers:
            server.stop()


@pytest.fixture
def inproc_cluster(tmp_path: Path) -> Iterator[Callable[..., InProcessCluster]]:
    """Factory: `inproc_cluster(n, *overrides)` starts n servers and waits for all of them."""
    started: list[InProcessCluster] = []

    def start(n: int, *overrides: str) -> InProcessCluster:
        index = len(started)
        registry = tmp_path / f"registry-{index}"
        registry.mkdir(mode=0o700)
        config = config_text(f"cluster.expected_servers={n}", *overrides)
        cluster = InProcessCluster(registry, config, [])
        started.append(cluster)
        for i in range(n):
            data = tmp_path / f"data-{index}-{i}"
            data.mkdir()
            cluster.servers.append(
                Server(str(registry), str(data), i, config=config, node=f"test-{i}")
            )
        _core.wait_for_servers(str(registry), n, 10.0)
        return cluster

    yield start
    for cluster in started:
        cluster.stop()


@pytest.fixture
def daemon_cluster(tmp_path: Path) -> Iterator[Callable[..., LocalCluster]]:
    """Factory: `daemon_cluster(n, *overrides)` starts n `benchfsd` daemons and waits for them."""
    started: list[LocalCluster] = []

    def start(n: int, *overrides: str) -> LocalCluster:
        base = tmp_path / f"daemons-{len(started)}"
        nodes = [f"test-{i}" for i in range(n)]
        cluster = LocalCluster.start_in(base, config_text(*overrides), nodes, 15.0)
        started.append(cluster)
        return cluster

    yield start
    for cluster in started:
        cluster.stop(grace_s=5.0)
        assert cluster.leftover_pids() == []


def checked_mount(cluster: LocalCluster, point: Path) -> Iterator[Mounted]:
    """`benchfs-mount` of `cluster` at `point` (made here) for the length of a generator; at
    its end the mount must have exited cleanly, without forcing, and be gone."""
    point.mkdir()
    with mounted(cluster.registry_dir, point, config_path=cluster.config_path) as m:
        yield m
    assert m.returncode == 0, m.output()
    assert m.forced == [], m.output()
    assert not is_mounted(point)


def data_for(seed: int, offset: int, length: int) -> bytes:
    """Test data where every 8-byte word names its seed and file offset (see workloads.rw)."""
    return Pattern(seed).bytes_at(offset, length)


def benchfs_run_command() -> list[str]:
    """The installed `benchfs-run` console script (next to this Python, else on PATH)."""
    beside = Path(sys.executable).parent / "benchfs-run"
    if beside.exists():
        return [str(beside)]
    found = shutil.which("benchfs-run")
    return [found] if found else [sys.executable, "-m", "benchfs.cli.run"]


def alive(pids: Sequence[int]) -> list[int]:
    return [p for p in pids if pid_alive(p)]


def run_bounded(
    cmd: list[str], timeout: float, **kwargs: object
) -> subprocess.CompletedProcess[str]:
    """Runs `cmd` in its own process group, killed whole if it outlives `timeout`; whatever
    it left running in the group is killed when it ends."""
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        **kwargs,  # type: ignore[call-overload]
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{shlex.join(cmd)} timed out after {timeout}s:\n{out}\n{err}")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def interrupt_once_the_workload_runs(
    proc: subprocess.Popen[str], results: Path, delay_s: float = 0.0, timeout_s: float = 60.0
) -> tuple[Path, str, str]:
    """Wait (bounded) until a `benchfs-run` writing under `results` records its workload
    process, then Ctrl-C it; returns (manifest path, stdout, stderr). Kills it on failure."""
    import time

    from benchfs.results import read_json

    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            found = list(results.glob("*/manifest.json"))
            if found and any(p["role"] == "workload" for p in read_json(found[0])["processes"]):
                break
            time.sleep(0.1)
        else:
            pytest.fail("the workload never started")
        time.sleep(delay_s)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
        return found[0], out, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def rendered(render: Callable[[Console, dict[str, Any]], None], report: dict[str, Any]) -> str:
    """What a benchmark's terminal report prints for `report` (its --json object): the same
    figures must render for people, not only as JSON."""
    out = io.StringIO()
    render(Console(file=out, width=160, color_system=None), report)
    return out.getvalue()

"""The network layer under faults: a killed server, a stopped-and-resumed server, a client
from another job. Real `benchfsd` daemons, bounded by short request timeouts."""

from __future__ import annotations

import errno
import os
import shutil
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from benchfs import Client, File, _core
from benchfs.cluster import LocalCluster
from benchfs.units import KIB
from conftest import data_for

FAST = ("client.request_timeout_s=3.0", "client.max_retries=1", "client.retry_backoff_ms=20")


def files_on(client: Client, server: int, count: int, prefix: str, size: int) -> list[File]:
    """Open handles on `count` new files whose first chunk lives on `server`, each holding
    `size` bytes already written and published (fsync), so that rewriting them touches only
    that server: no metadata owner is asked again, and closing has nothing to publish."""
    found: list[File] = []
    i = 0
    while len(found) < count:
        path = f"/{prefix}-{i}"
        f = client.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL)
        if client.locate(path, 0) == server:
            assert f.pwrite(bytes(size), 0) == size
            f.fsync()
            found.append(f)
        else:
            f.close()
        i += 1
    return found


@pytest.mark.timeout(120)
def test_killed_server_fails_only_the_clients_that_touch_it(
    daemon_cluster: Callable[..., LocalCluster],
) -> None:
    # Files with chunks from the start (none kept with its name at its metadata owner).
    cluster = daemon_cluster(3, *FAST, "layout.inline_max=0")
    config = cluster.config_path.read_text()
    victim = 2
    size = 64 * KIB  # one chunk: each file lives on exactly one server
    results: dict[int, BaseException | None] = {}
    started = threading.Barrier(7)

    def writer(rank: int) -> None:
        target = rank % 3
        try:
            with Client(str(cluster.registry_dir), config) as client:
                files = files_on(client, target, 400, f"r{rank}", size)
                started.wait(timeout=30)
                for n, f in enumerate(files):
                    data = data_for(rank * 1000 + n, 0, size)
                    f.pwrite(data, 0)
                    assert f.pread(size, 0) == data
                    if target != victim:
                        time.sleep(0.002)
                for f in files:
                    f.close()
            results[rank] = None
        except BaseException as e:  # inspected below
            results[rank] = e

    threads = [threading.Thread(target=writer, args=(r,)) for r in range(6)]
    for t in threads:
        t.start()
    started.wait(timeout=30)
    time.sleep(0.3)
    os.kill(cluster.daemons[victim].pid, signal.SIGKILL)
    killed_at = time.monotonic()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "a client hung"
    assert time.monotonic() - killed_at < 3.0 * 2 + 10, "clients took longer than the timeouts"
    for rank, outcome in sorted(results.items()):
        if rank % 3 == victim:
            assert isinstance(outcome, OSError), f"client {rank} did not fail: {outcome!r}"
            assert "server 2" in str(outcome)
        else:
            assert outcome is None, f"client {rank} failed: {outcome!r}"


@pytest.mark.timeout(120)
def test_stopped_and_resumed_server_completes_every_request(
    daemon_cluster: Callable[..., LocalCluster],
) -> None:
    cluster = daemon_cluster(2, "client.request_timeout_s=5.0", "client.max_retries=0")
    config = cluster.config_path.read_text()
    data = data_for(3, 0, 2048 * KIB)
    with Client(str(cluster.registry_dir), config) as client:
        f = client.open("/paused", os.O_RDWR | os.O_CREAT)
        paused = cluster.daemons[1].pid
        os.kill(paused, signal.SIGSTOP)
        resume = threading.Timer(1.5, os.kill, args=(paused, signal.SIGCONT))
        resume.start()
        try:
            start = time.monotonic()
            assert f.pwrite(data, 0) == len(data)
            f.flush()  # answered here (written behind)
            assert time.monotonic() - start >= 1.0, "the write did not wait for the stopped server"
            assert f.pread(len(data), 0) == data
            f.close()
            with client.open("/paused") as again:
                assert again.pread(len(data) + 1, 0) == data
            stats = {s["id"]: s for s in client.server_stats()}
            assert stats[1]["timeouts"] == 0 and stats[1]["failures"] == 0
        finally:
            resume.join()
            os.kill(paused, signal.SIGCONT)


@pytest.mark.serial
def test_timed_out_reads_are_retried_and_counted(
    daemon_cluster: Callable[..., LocalCluster],
) -> None:
    """A server stopped longer than the timeout: reads are retried (with backoff) until it
    resumes; each retry is counted against that server."""
    cluster = daemon_cluster(
        1, "client.request_timeout_s=0.5", "client.max_retries=5", "client.retry_backoff_ms=50"
    )
    config = cluster.config_path.read_text()
    data = data_for(9, 0, 64 * KIB)
    with Client(str(cluster.registry_dir), config) as client:
        with client.open("/retry", os.O_RDWR | os.O_CREAT) as f:
            f.pwrite(data, 0)
        f = client.open("/retry", "r+")
        pid = cluster.daemons[0].pid
        os.kill(pid, signal.SIGSTOP)
        resume = threading.Timer(1.2, os.kill, args=(pid, signal.SIGCONT))
        resume.start()
        try:
            assert f.pread(len(data), 0) == data
        finally:
            resume.join()
            os.kill(pid, signal.SIGCONT)
        f.close()
        stats = client.server_stats()[0]
        assert stats["retries"] >= 1
        assert stats["timeouts"] == stats["retries"]
        assert stats["failures"] == 0


def test_client_of_another_job_is_refused_and_logged_once(
    daemon_cluster: Callable[..., LocalCluster], tmp_path: Path
) -> None:
    cluster = daemon_cluster(1)
    config = cluster.config_path.read_text()
    stranger = tmp_path / "other-job-registry"
    stranger.mkdir(mode=0o700)
    for entry in cluster.registry_dir.glob("server-*.json"):
        shutil.copy(entry, stranger / entry.name)
    (stranger / _core.JOB_SECRET_FILE).write_text("ab" * 32)
    with Client(str(stranger), config) as intruder:
        for _ in range(3):
            with pytest.raises(PermissionError) as refused:
                intruder.open("/x", os.O_RDWR | os.O_CREAT)
            assert refused.value.errno == errno.EACCES
            assert "server 0" in str(refused.value)
    with Client(str(cluster.registry_dir), config) as member:
        with member.open("/x", os.O_RDWR | os.O_CREAT | os.O_EXCL) as f:
            f.pwrite(b"mine", 0)
        with member.open("/x") as f:
            assert f.pread(5, 0) == b"mine"
    cluster.stop(grace_s=5.0)
    log = cluster.daemons[0].log_path.read_text()
    assert log.count("refused a request without this job's token") == 1, log


def test_client_without_a_job_secret_fails_clearly(
    daemon_cluster: Callable[..., LocalCluster], tmp_path: Path
) -> None:
    cluster = daemon_cluster(1)
    bare = tmp_path / "no-secret"
    bare.mkdir()
    for entry in cluster.registry_dir.glob("server-*.json"):
        shutil.copy(entry, bare / entry.name)
    with pytest.raises(ValueError, match=r"job\.secret"):
        Client(str(bare), cluster.config_path.read_text())

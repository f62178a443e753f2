"""Bad input and faults: missing servers, broken registry entries, servers killed mid-run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from benchfs import Client, Server, _core
from benchfs.results import read_json
from conftest import (
    MIB,
    alive,
    benchfs_run_command,
    config_text,
    data_for,
    interrupt_once_the_workload_runs,
)


@pytest.mark.timeout(60)
def test_client_with_missing_servers_fails_in_time_naming_them(inproc_cluster) -> None:
    cluster = inproc_cluster(2)
    config = config_text("cluster.connect_timeout_s=1.0")
    start = time.monotonic()
    with pytest.raises(TimeoutError) as info:
        Client(str(cluster.registry), config=config, expected_servers=4)
    elapsed = time.monotonic() - start
    assert 0.9 <= elapsed < 4.0, elapsed
    message = str(info.value)
    assert "4" in message and "[0, 1]" in message and "[2, 3]" in message, message


@pytest.mark.timeout(60)
def test_expected_servers_from_config(inproc_cluster) -> None:
    """Without the argument, cluster.expected_servers decides how many servers to wait for."""
    cluster = inproc_cluster(2)
    with pytest.raises(TimeoutError, match=r"\[2\]"):
        Client(
            str(cluster.registry),
            config=config_text("cluster.expected_servers=3", "cluster.connect_timeout_s=0.5"),
        )
    with Client(str(cluster.registry), config=cluster.config) as client:
        assert client.server_ids() == [0, 1]


@pytest.mark.timeout(60)
def test_wait_for_servers_reports_membership_sorted_by_numeric_id(tmp_path: Path) -> None:
    registry = tmp_path / "registry"
    registry.mkdir()
    # Ids are 0..N-1 of the configured membership; three of eleven are enough to tell numeric
    # from text order ("10" < "2").
    config = config_text("cluster.expected_servers=11")
    ids = [10, 2, 1]
    servers = []
    try:
        for sid in ids:
            (tmp_path / f"d{sid}").mkdir()
            servers.append(
                Server(str(registry), str(tmp_path / f"d{sid}"), sid, config=config, node=f"n{sid}")
            )
        members = _core.wait_for_servers(str(registry), 3, 10.0)
        assert [m["id"] for m in members] == [1, 2, 10]
        assert [m["node"] for m in members] == ["n1", "n2", "n10"]
        assert all(isinstance(m["pid"], int) and m["host"] for m in members)
    finally:
        for server in servers:
            server.stop()
    # stop() removed the entries, and stopping twice is harmless.
    assert not list(registry.glob("server-*.json"))
    servers[0].stop()


def _truncated_entry(registry: Path) -> bytes:
    text = (registry / "server-0.json").read_bytes()
    return text[: len(text) // 2]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["empty", "truncated", "garbage", "wrong-shape"])
def test_bad_registry_entry_is_a_clear_error(inproc_cluster, kind: str) -> None:
    cluster = inproc_cluster(1)
    contents = {
        "empty": b"",
        "truncated": _truncated_entry(cluster.registry),
        "garbage": b"\x00\xff\xfe not json at all \x9c",
        "wrong-shape": json.dumps({"id": "one", "node": 3}).encode(),
    }[kind]
    bad = cluster.registry / "server-1.json"
    bad.write_bytes(contents)
    with pytest.raises(ValueError, match=r"server-1\.json"):
        _core.wait_for_servers(str(cluster.registry), 2, 2.0)
    with pytest.raises(ValueError, match=r"server-1\.json"):
        Client(str(cluster.registry), config=cluster.config, expected_servers=2)
    # Removing the bad entry lets the healthy server be found again.
    bad.unlink()
    assert [m["id"] for m in _core.wait_for_servers(str(cluster.registry), 1, 2.0)] == [0]


@pytest.mark.timeout(60)
def test_client_fails_within_request_timeout_when_a_server_is_killed(daemon_cluster) -> None:
    request_timeout = 2.0
    cluster = daemon_cluster(2, f"client.request_timeout_s={request_timeout}")
    assert cluster.config_path is not None
    config = cluster.config_path.read_text()
    writing = threading.Event()
    outcome: dict[str, Any] = {}
    data = data_for(3, 0, 4 * MIB)  # 64 chunks of 64 KiB: every write reaches both servers

    def writer() -> None:
        client = None
        f = None
        try:
            client = Client(str(cluster.registry_dir), config=config)
            f = client.open("/victim.dat", os.O_RDWR | os.O_CREAT)
            deadline = time.monotonic() + 30
            i = 0
            while time.monotonic() < deadline:
                f.pwrite(data, (i % 8) * len(data))
                i += 1
                writing.set()
            outcome["error"] = AssertionError("writes kept succeeding after the kill")
        except BaseException as e:
            outcome["error"] = e
            outcome["at"] = time.monotonic()
        finally:
            writing.set()
            if f is not None:
                try:
                    f.close()  # publishing may need the dead server too
                except OSError as e:
                    outcome["close_error"] = e
                del f
            if client is not None:
                try:
                    client.close()
                except OSError as e:
                    outcome["close_error"] = e
                # The client must be dropped on its own thread, not via a saved traceback.
                del client
            if "error" in outcome:
                outcome["error"].__traceback__ = None

    thread = threading.Thread(target=writer)
    thread.start()
    assert writing.wait(20), "the client never wrote"
    killed_at = time.monotonic()
    cluster.kill(1, signal.SIGKILL)
    thread.join(timeout=request_timeout + 20)
    assert not thread.is_alive(), "the client hung after its server died"
    error = outcome.get("error")
    assert isinstance(error, OSError), repr(error)
    assert error.errno is not None, repr(error)
    assert outcome["at"] - killed_at < request_timeout + 3.0


def _run(args: list[str], timeout: float, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        benchfs_run_command() + args, capture_output=True, text=True, timeout=timeout, cwd=cwd
    )


def _started_pids(manifest: dict[str, Any]) -> list[int]:
    pids = []
    for record in manifest["processes"]:
        pids.append(record["pid"])
        pids.extend(record.get("children", []))
    return pids


@pytest.mark.timeout(120)
def test_run_with_server_killed_fails_and_leaves_no_process(tmp_path: Path) -> None:
    result = _run(
        [
            "local",
            "--servers=2",
            "--clients=2",
            "--file-size=1G",
            "--transfer-size=1M",
            "--set=client.request_timeout_s=2.0",
            "--kill-server-after=1.0",
            f"--results-root={tmp_path / 'results'}",
            "--json",
        ],
        timeout=100,
        cwd=tmp_path,
    )
    assert result.returncode == 1, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["outcome"] == "failed"
    assert report["code"] == "EHOSTDOWN"
    assert "server 1" in report["message"] and "killed by signal 9" in report["message"]
    assert report["verified"] is False
    assert "error EHOSTDOWN" in result.stderr

    manifest = read_json(Path(report["results_dir"]) / "manifest.json")
    assert manifest["outcome"]["status"] == "failed"
    assert manifest["outcome"]["code"] == "EHOSTDOWN"
    assert [e["kind"] for e in manifest["events"]][:2] == ["fault-injection", "server-died"]
    roles = [p["role"] for p in manifest["processes"]]
    assert roles.count("benchfsd") == 2 and "workload" in roles
    assert alive(_started_pids(manifest)) == []
    assert manifest["scratch_dirs"]
    assert not any(Path(d).exists() for d in manifest["scratch_dirs"].values())


@pytest.mark.timeout(120)
def test_run_interrupted_tears_down(tmp_path: Path) -> None:
    """Ctrl-C during the workload stops everything, records "interrupted" and exits 130."""
    results = tmp_path / "results"
    proc = subprocess.Popen(
        [*benchfs_run_command(), "local", "--file-size=2G", f"--results-root={results}", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )
    manifest_path, stdout, stderr = interrupt_once_the_workload_runs(proc, results)
    assert proc.returncode == 130, stdout + stderr
    report = json.loads(stdout)
    assert (report["outcome"], report["code"]) == ("interrupted", "EINTR")
    manifest = read_json(manifest_path)
    assert manifest["outcome"]["status"] == "interrupted"
    assert alive(_started_pids(manifest)) == []


@pytest.mark.timeout(120)
def test_run_timeout_stops_the_workload_and_its_ranks(tmp_path: Path) -> None:
    result = _run(
        ["local", "--file-size=4G", "--timeout=1.5", f"--results-root={tmp_path}", "--json"],
        timeout=100,
        cwd=tmp_path,
    )
    assert result.returncode == 1, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["code"] == "ETIMEDOUT"
    assert "--timeout 1.5" in report["message"]
    manifest = read_json(Path(report["results_dir"]) / "manifest.json")
    (mpiexec,) = [p for p in manifest["processes"] if p["role"] == "workload"]
    assert mpiexec["children"], "the ranks under mpiexec were not recorded"
    assert alive(_started_pids(manifest)) == []
    assert manifest["timings_s"]["workload"] < 15

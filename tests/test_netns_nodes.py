"""Nodes that are apart on one host (`benchfs-run nodes --netns`): each node its own network
namespace and address on a bridge; servers run in theirs, MPI ranks start outside theirs (where
mpiexec's connections are) and their client enters it (BENCHFS_NETNS). Real namespaces, real
mpiexec, bytes counted on the links."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from benchfs.client import Client
from benchfs.nodes import load_nodes
from benchfs.simnodes import namespace_pids, namespaces, tcpmem
from benchfs.units import MIB
from conftest import InProcessCluster, benchfs_run_command
from test_lifecycle import BIN, exports
from test_preload import own_env

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None, reason="network namespaces need root and ip"
)

TAG = f"bt{os.getpid() % 100000}"


def run(*args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*benchfs_run_command(), *args], capture_output=True, text=True, timeout=timeout
    )


def link_bytes(ns: str) -> tuple[int, int]:
    """(received, sent) bytes of the node's one link."""
    base = Path("/sys/class/net/eth0/statistics")
    out = subprocess.run(
        ["ip", "netns", "exec", ns, "cat", str(base / "rx_bytes"), str(base / "tx_bytes")],
        capture_output=True,
        text=True,
        check=True,
    )
    rx, tx = out.stdout.split()
    return int(rx), int(tx)


@contextmanager
def netns_job(base: Path, tag: str, *start_args: str) -> Iterator[dict[str, str]]:
    """A job started by `benchfs start --nodes-file N START_ARGS` on 4 nodes in network
    namespaces (`benchfs-run nodes --netns 4`, tag `tag`, under `base`): its environment
    with the job's exports. Then stopped, and the namespaces removed."""
    nodes = base / "nodes.toml"
    made = run("nodes", "--netns", "4", "--netns-tag", tag, "--scratch", str(base / "scratch"),
               "-o", str(nodes))  # fmt: skip
    assert made.returncode == 0, made.stderr
    env = own_env()
    try:
        started = subprocess.run(
            [str(BIN / "benchfs"), "start", "--nodes-file", str(nodes), *start_args,
             "--results-root", str(base / "results")],
            env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert started.returncode == 0, started.stderr
        env.update(exports(started.stdout))
        try:
            yield env
        finally:
            stopped = subprocess.run(
                [str(BIN / "benchfs"), "stop"], env=env, capture_output=True, text=True,
                timeout=120,
            )  # fmt: skip
            assert stopped.returncode == 0, stopped.stderr
    finally:
        removed = run("nodes", "--remove-netns", "--netns-tag", tag)
        assert removed.returncode == 0, removed.stderr


@pytest.fixture
def nodes_file(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "nodes.toml"
    made = run("nodes", "--netns", "3", "--netns-tag", TAG, "--scratch", str(tmp_path / "scratch"),
               "-o", str(path))  # fmt: skip
    try:
        assert made.returncode == 0, made.stderr
        yield path
    finally:
        removed = run("nodes", "--remove-netns", "--netns-tag", TAG)
        assert removed.returncode == 0, removed.stderr
        assert namespaces(TAG) == []


def test_a_run_on_namespaced_nodes_moves_every_byte_over_their_links(
    nodes_file: Path, tmp_path: Path
) -> None:
    nodes = load_nodes(nodes_file)
    assert [n.netns for n in nodes] == [f"{TAG}-n1", f"{TAG}-n2", f"{TAG}-n3"]
    assert all(Path(n.scratch).is_dir() for n in nodes)
    before = link_bytes(f"{TAG}-n3")
    out = run("launch", "--nodes-file", str(nodes_file), "--server-nodes", "2", "--clients", "2",
              "--file-size", "16M", "--results-root", str(tmp_path / "results"), "--json",
              "--no-analysis")  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    report = json.loads(out.stdout)
    assert report["outcome"] == "ok" and report["verified"], report
    rx, tx = (after - was for after, was in zip(link_bytes(f"{TAG}-n3"), before, strict=True))
    # Both ranks are on n3 and the servers on n1 and n2: 32 MiB each way crossed n3's link.
    assert tx >= 32 * MIB and rx >= 32 * MIB, (rx, tx)
    manifest = json.loads((Path(report["results_dir"]) / "manifest.json").read_text())
    servers = [p for p in manifest["processes"] if p["role"] == "benchfsd"]
    assert [p["argv"][:4] for p in servers] == [
        ["ip", "netns", "exec", f"{TAG}-n1"],
        ["ip", "netns", "exec", f"{TAG}-n2"],
    ]
    assert {n["name"]: n["netns"] for n in manifest["nodes"]}["n3"] == f"{TAG}-n3"
    # Each node's own TCP counters (its namespace's), before and after: n3 sent the 32 MiB.
    counted = json.loads((Path(report["results_dir"]) / "network" / "n3.json").read_text())
    assert counted["netns"] == f"{TAG}-n3"
    assert counted["delta"]["Tcp.OutSegs"] >= 32 * MIB // 65536, counted["delta"]
    assert counted["delta"]["TcpExt.TCPTimeouts"] >= 0


@pytest.mark.serial
def test_the_nodes_get_the_tcp_memory_of_as_many_hosts(tmp_path: Path) -> None:
    """Namespaces share the host's one TCP memory budget (net.ipv4.tcp_mem): `--netns N`
    raises it to N nodes' worth (capped at half the host's memory) and says so; removing the
    last such nodes restores the value found first."""
    tag = f"tm{os.getpid() % 100000}"
    made = run("nodes", "--netns", "3", "--netns-tag", tag, "--scratch", str(tmp_path / "s"))
    original = None
    try:
        assert made.returncode == 0, made.stderr
        if not tcpmem.STATE.exists():  # this host's budget is 3 nodes' worth already
            assert "tcp_mem" not in made.stderr
        else:
            state = json.loads(tcpmem.STATE.read_text())
            assert tag in state["tags"]
            original = tuple(state["original"])
            assert tcpmem.read_tcp_mem()[1] >= tcpmem.budget_for(3, original)[1] > original[1]
    finally:
        removed = run("nodes", "--remove-netns", "--netns-tag", tag)
        assert removed.returncode == 0, removed.stderr
    if tcpmem.STATE.exists():  # nodes of another tag (a test running beside this one) remain
        assert tag not in json.loads(tcpmem.STATE.read_text())["tags"]
    elif original is not None:
        assert tcpmem.read_tcp_mem() == original
        assert "net.ipv4.tcp_mem restored" in removed.stderr


def test_namespaces_in_use_stay_and_bad_requests_get_one_line(nodes_file: Path) -> None:
    sleeper = subprocess.Popen(["ip", "netns", "exec", f"{TAG}-n2", "sleep", "60"])
    try:
        deadline = time.monotonic() + 10
        while sleeper.pid not in namespace_pids(f"{TAG}-n2") and time.monotonic() < deadline:
            time.sleep(0.01)
        refused = run("nodes", "--remove-netns", "--netns-tag", TAG)
        assert refused.returncode != 0
        assert "EBUSY" in refused.stderr and f"{TAG}-n2: {sleeper.pid}" in refused.stderr
        assert len(refused.stderr.strip().splitlines()) == 1
        assert len(namespaces(TAG)) == 4
    finally:
        sleeper.send_signal(signal.SIGKILL)
        sleeper.wait()
    again = run("nodes", "--netns", "2", "--netns-tag", TAG)
    assert again.returncode != 0 and "EEXIST" in again.stderr and f"{TAG}-n1" in again.stderr
    for args, words in [
        (["--netns", "0", "--netns-tag", TAG], "1 to 250"),
        (["--netns", "2", "--netns-tag", "no-dash"], "letters and digits"),
        (["--netns", "2", "--remove-netns"], "give one of"),
        ([], "give one of"),
    ]:
        out = run("nodes", *args)
        assert out.returncode == 2, (args, out.stderr)
        assert words in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert len(namespaces(TAG)) == 4


def test_a_client_told_an_unknown_namespace_fails_naming_it(
    inproc_cluster: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster: InProcessCluster = inproc_cluster(1)  # type: ignore[operator]
    monkeypatch.setenv("BENCHFS_NETNS", f"{TAG}-none")
    with pytest.raises(Exception) as caught:
        Client(str(cluster.registry), cluster.config)
    assert f'BENCHFS_NETNS="{TAG}-none": cannot open /run/netns/{TAG}-none' in str(caught.value)

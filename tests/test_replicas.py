"""Copies of chunks (`layout.replicas`): a lost server loses no byte.

Real daemons and real faults: SIGKILL of a server in the middle of writes and reads, SIGSTOP
of one past the request timeout (as a cut link looks to its clients), a killed server restarted
on its stale data, `benchfs repair`, and a whole run of the built-in IOR (write, read, check
both, reordered reads) through a server's SIGKILL. Every byte is checked against its pattern.
Placement and balance are tested in Rust (placement.rs) and by the placement study.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from benchfs import Client, _core
from benchfs.cluster import LocalCluster
from benchfs.lifecycle.repair import repair
from benchfs.lifecycle.status import copies_status
from benchfs.nodes import NodesFileError, dump_nodes, parse_nodes
from benchfs.results import read_json
from benchfs.simnodes import apart_nodes
from conftest import config_text, data_for
from test_faults import _run
from test_persistence import kill, restart

TIMEOUT_S = 2.0
OVERRIDES = (
    "layout.replicas=2",
    "layout.chunk_size=65536",
    f"client.request_timeout_s={TIMEOUT_S}",
    "client.max_retries=1",
)


def _files_off(client: Client, servers: set[int], count: int, prefix: str = "/f") -> list[str]:
    """`count` paths whose metadata lives on none of `servers` (metadata has one copy: a lost
    owner loses its names, whatever their data's copies)."""
    names = (f"{prefix}{i}" for i in range(10_000))
    return [n for n in names if client.locate_metadata(n) not in servers][:count]


def _write(client: Client, files: dict[str, bytes]) -> None:
    for path, data in files.items():
        with client.open(path, "wb") as f:
            f.write(data)


def _check(client: Client, files: dict[str, bytes]) -> None:
    for path, data in files.items():
        with client.open(path, "rb") as f:
            assert f.read() == data, path


@pytest.mark.timeout(120)
@pytest.mark.serial
def test_a_killed_server_loses_no_byte_and_repair_restores_the_copies(
    daemon_cluster: Callable[..., LocalCluster],
) -> None:
    """Four servers, two copies: files written, one server SIGKILLed, every file read back
    at once (failover within a second), changed without it (it is declared lost), listed by
    status as short of copies; repair re-creates their copies and a second server's SIGKILL
    then loses nothing either."""
    cluster = daemon_cluster(4, *OVERRIDES)
    config = cluster.config_path.read_text()
    with Client(cluster.registry_dir, config) as client:
        root = client.locate_metadata("/")
        first, second = [s for s in range(4) if s != root][:2]
        paths = _files_off(client, {first, second}, 8)
        files = {p: data_for(i, 0, 300_000 + 4099 * i) for i, p in enumerate(paths)}
        _write(client, files)
        st = client.stat(paths[0])
        assert st.replicas == 2
        copies = client.locate_copies(paths[0], 0)
        assert len(set(copies)) == 2, copies
        # The staging path (checked writes) keeps two copies whose stored checksums agree.
        staged = data_for(99, 0, 200_000)
        (result,) = client._core.put_files([(paths[-1], staged, 0o644, 0)])
        assert not isinstance(result, OSError), result
        files[paths[-1]] = staged

        kill(cluster, [first])
        started = time.monotonic()
        with client.open(paths[0], "rb") as f:
            assert f.read() == files[paths[0]]
        assert time.monotonic() - started < 1.0
        _check(client, files)
        assert client.checksum(paths[1]).size == len(files[paths[1]])

        # Changes go on without it: writes, a truncate, a removal.
        files[paths[0]] = data_for(1000, 0, 500_000)
        _write(client, {paths[0]: files[paths[0]]})
        client.truncate(paths[1], 70_000)
        files[paths[1]] = files[paths[1]][:70_000]
        client.unlink(paths[2])
        del files[paths[2]]
        _check(client, files)
        assert client.lost_servers() == {"lost": [first], "repaired": [], "joining": []}

        status = copies_status(client, client.statfs())
        assert status["not_answering"] == [first]
        short = {f["path"]: (f["asked"], f["left"]) for f in status["files_short"]}
        assert short and set(short.values()) == {(2, 1)}, short

        report = repair(client)
        assert report.complete, report.as_dict()
        assert report.lost == [first] and report.copies > 0 and report.lost_chunks == 0
        assert client.lost_servers()["repaired"] == [first]
        assert copies_status(client, client.statfs())["files_short"] is None

        kill(cluster, [second])
    with Client(cluster.registry_dir, config) as client:
        _check(client, files)


@pytest.mark.timeout(120)
@pytest.mark.serial
def test_a_silent_server_is_left_within_the_request_timeout(
    daemon_cluster: Callable[..., LocalCluster],
) -> None:
    """A server SIGSTOPped (what a cut link looks like from its clients: no answer, no
    error) holds the first copy of a chunk: its read goes to the other copy after one request
    timeout, and a write waits no longer either."""
    cluster = daemon_cluster(3, *OVERRIDES)
    with Client(cluster.registry_dir, cluster.config_path.read_text()) as client:
        root = client.locate_metadata("/")
        victim = next(s for s in range(3) if s != root)
        paths = _files_off(client, {victim}, 40)
        _write(client, dict.fromkeys(paths, b""))  # layouts are chosen at create time
        first = next(p for p in paths if client.locate_copies(p, 0)[0] == victim)
        data = data_for(7, 0, 65536)
        _write(client, {first: data})
        cluster.kill(victim, signal.SIGSTOP)
        try:
            started = time.monotonic()
            with client.open(first, "rb") as f:
                assert f.read() == data
            assert time.monotonic() - started < TIMEOUT_S + 1.0
            later = data_for(8, 0, 65536)
            started = time.monotonic()
            _write(client, {first: later})
            assert time.monotonic() - started < TIMEOUT_S + 1.0
            _check(client, {first: later})
        finally:
            cluster.kill(victim, signal.SIGCONT)
        # Resumed, it answers again but holds a stale copy: it was declared lost, so no
        # client reads it (a new one included).
        assert client.lost_servers()["lost"] == [victim]
    with Client(cluster.registry_dir, cluster.config_path.read_text()) as client:
        _check(client, {first: later})


#: A client on a node of its own: writes files, says which server holds the first copy of the
#: chunk of a file whose names live elsewhere, then, told to, reads it back and times the read.
LINK_CLIENT = """
import json, sys, time
from benchfs import Client
client = Client(sys.argv[1], open(sys.argv[2]).read())
root = client.locate_metadata("/")
data = bytes(range(256)) * 256
for i in range(40):
    path = f"/cut{i}"
    with client.open(path, "wb") as f:
        f.write(data)
    first = client.locate_copies(path, 0)[0]
    if first not in (root, client.locate_metadata(path)):
        break
print(json.dumps({"path": path, "first": first}), flush=True)
sys.stdin.readline()
started = time.monotonic()
with client.open(path, "rb") as f:
    same = f.read() == data
print(json.dumps({"same": same, "read_s": time.monotonic() - started}), flush=True)
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root")
@pytest.mark.timeout(120)
@pytest.mark.serial
def test_a_node_whose_link_is_cut_is_left_within_the_request_timeout(tmp_path: Path) -> None:
    """Servers on three nodes apart (network namespaces on a bridge), a client on a fourth;
    the link of the node holding a chunk's first copy is cut (`ip link set eth0 down`): the
    client's read of it goes to the other copy within one request timeout."""
    config = config_text(*OVERRIDES)
    with apart_nodes(4) as nodes:
        cluster = LocalCluster.start_in(
            tmp_path / "cluster", config, ["n1", "n2", "n3"], 30.0,
            prefixes=[nodes.prefix(n) for n in ("n1", "n2", "n3")],
        )  # fmt: skip
        try:
            client = subprocess.Popen(
                [*nodes.prefix("n4"), sys.executable, "-c", LINK_CLIENT,
                 str(cluster.registry_dir), str(cluster.config_path)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            )  # fmt: skip
            assert client.stdout is not None and client.stdin is not None
            placed = json.loads(client.stdout.readline())
            namespace = nodes.nodes[f"n{placed['first'] + 1}"].namespace
            subprocess.run(
                ["ip", "netns", "exec", namespace, "ip", "link", "set", "eth0", "down"], check=True
            )
            client.stdin.write("go\n")
            client.stdin.flush()
            read = json.loads(client.stdout.readline())
            assert client.wait(30) == 0
            assert read["same"], read
            # One timeout on the silent copy, then the other copy.
            assert TIMEOUT_S - 0.5 < read["read_s"] < TIMEOUT_S + 1.0, read
        finally:
            cluster.stop(grace_s=5.0)


@pytest.mark.timeout(120)
def test_a_restarted_server_is_not_read_until_repair_catches_it_up(
    daemon_cluster: Callable[..., LocalCluster],
) -> None:
    """Killed, written without, restarted on its old data: its copies are stale, and no
    client reads them (it stays declared lost). `benchfs repair` catches it up (a file cut
    meanwhile is cut there too), and it is used again: with the third server then killed,
    every chunk it shares with that server is served by it alone, byte for byte."""
    cluster = daemon_cluster(3, *OVERRIDES)
    config = cluster.config_path.read_text()
    with Client(cluster.registry_dir, config) as client:
        root = client.locate_metadata("/")
        victim, other = (s for s in range(3) if s != root)
        paths = _files_off(client, {victim, other}, 6)
        files = {p: data_for(i, 0, 250_000) for i, p in enumerate(paths)}
        _write(client, files)
        kill(cluster, [victim])
        files = {p: data_for(100 + i, 0, 250_000) for i, p in enumerate(paths)}
        _write(client, files)
        client.truncate(paths[0], 1000)  # its stale bytes beyond must not come back
        files[paths[0]] = files[paths[0]][:1000]
    restart(cluster, [victim])
    with Client(cluster.registry_dir, config) as client:
        _check(client, files)
        assert client.lost_servers()["lost"] == [victim]
        report = repair(client)
        assert report.complete and report.rejoining == [victim], report.as_dict()
        assert report.copies > 0
        assert client.lost_servers() == {"lost": [], "repaired": [], "joining": []}
        with client.open(paths[0], "r+b") as f:  # regrown: a hole, not the old bytes
            f.seek(200_000)
            f.write(b"end")
        files[paths[0]] += bytes(200_000 - 1000) + b"end"
        _check(client, files)
    kill(cluster, [other])
    with Client(cluster.registry_dir, config) as client:
        assert any(client.locate_copies(p, 0)[0] == victim for p in paths)
        _check(client, files)


@pytest.mark.timeout(180)
def test_builtin_ior_completes_through_a_killed_server(tmp_path: Path) -> None:
    """`benchfs-run` with the built-in IOR writing, reading and checking both (-w -r -W -R
    -C) for eight iterations, and server 3 SIGKILLed in their middle: the run completes and
    every byte checks."""
    test_file = next(
        f"/ior{i}"
        for i in range(100)
        if 3 not in (_core.metadata_server(f"/ior{i}", 4, 1), _core.metadata_server("/", 4, 1))
    )
    ior = f"-w -r -W -R -C -i 8 -t 1M -b 16M -o {test_file}"
    result = _run(
        [
            "launch",
            "--servers=4",
            "--clients=4",
            "--workload=ior",
            f"--ior-args={ior}",
            "--set=layout.replicas=2",
            f"--set=client.request_timeout_s={TIMEOUT_S}",
            "--kill-server-after=1.5",
            f"--results-root={tmp_path / 'results'}",
            "--json",
        ],
        timeout=170,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["outcome"] == "ok" and report["verified"] is True, report
    run = Path(report["results_dir"])
    events = [e["kind"] for e in read_json(run / "manifest.json")["events"]]
    assert events[:2] == ["fault-injection", "server-died"], events
    output = (run / "workload" / "output.log").read_text()
    assert "server 3 declared lost" in output
    # The kill landed a second or more before the workload ended: phases ran without server 3.
    manifest = read_json(run / "manifest.json")
    assert manifest["timings_s"]["workload"] > 2.5, manifest["timings_s"]
    # Simulated nodes of one host are one failure domain: copies on distinct servers of it.
    assert len({m["domain"] for m in manifest["membership"]}) == 1, manifest["membership"]
    summary = read_json(run / "workload" / "summary.json")
    assert summary["errors"] == [] and summary["verified"] and summary["verify_requested"], summary


def test_a_nodes_file_names_failure_domains() -> None:
    """`domain` in the nodes file, its default (the host), its round trip and bad values."""
    text = (
        '[[node]]\nname = "a"\nhost = "h1"\nscratch = "/s"\ndomain = "rack1"\n'
        '[[node]]\nname = "b"\nhost = "h1"\nscratch = "/s"\n'
    )
    a, b = parse_nodes(text, "nodes.toml")
    assert (a.failure_domain, b.failure_domain) == ("rack1", "h1")
    assert parse_nodes(dump_nodes([a, b]), "again") == [a, b]
    with pytest.raises(NodesFileError, match=r"nodes.toml: node\[0\].domain 'a b': use letters"):
        parse_nodes(text.replace('"rack1"', '"a b"'), "nodes.toml")

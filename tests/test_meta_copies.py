"""Copies of the metadata (`layout.replicas` 2): a lost node loses no name.

Real daemons and real faults: SIGKILL of the server holding the root directory's names,
SIGSTOP of a metadata owner past the request timeout and its resumption after changes went to
the next copy, a client whose route to the owner is cut (network namespaces) while another
still reaches it, `benchfs repair` making stand-ins complete or catching a restarted owner up,
then a second server's loss. Every name, size and byte is checked against a model of what the
clients did. The placement of the copies and the order of the record's events are tested in
Rust (placement.rs); the owner's kill in the middle of the built-in mdtest in test_mdtest.py.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from benchfs import Client, _core
from benchfs.cluster import LocalCluster
from benchfs.lifecycle.repair import repair
from benchfs.simnodes import apart_nodes
from conftest import config_text, data_for
from test_persistence import kill, restart

TIMEOUT_S = 2.0
OVERRIDES = (
    "layout.replicas=2",
    "layout.chunk_size=65536",
    f"client.request_timeout_s={TIMEOUT_S}",
    "client.max_retries=1",
)
#: A call that meets a silent owner returns within its timeouts, then the next copy answers.
FAILOVER_S = TIMEOUT_S * 2 + 1.5

Model = dict[str, bytes | None]
"""Path -> a file's bytes, or None for a directory."""


def _build(client: Client, model: Model, dirs: int = 4, files: int = 12) -> None:
    for d in range(dirs):
        top = f"/d{d}"
        client.mkdir(top)
        model[top] = None
        client.mkdir(f"{top}/sub")
        model[f"{top}/sub"] = None
        for i in range(files):
            path = f"{top}/f{i}" if i % 3 else f"{top}/sub/f{i}"
            data = data_for(d * 100 + i, 0, 1000 + 977 * i)
            with client.open(path, "wb") as f:
                # In two writes: the larger files are kept with their names, then outgrow
                # `layout.inline_max` (8 KiB) and move into chunks.
                f.write(data[:600])
                f.write(data[600:])
            model[path] = data


def _change(client: Client, model: Model, tag: str) -> None:
    """Removes, renames, rewrites and creates names all over the tree (model kept)."""
    files = sorted(p for p, v in model.items() if v is not None)
    for n, path in enumerate(files):
        if n % 5 == 0:
            client.unlink(path)
            del model[path]
        elif n % 5 == 1:
            to = f"{path}-{tag}"
            client.rename(path, to)
            model[to] = model.pop(path)
        elif n % 5 == 2:
            data = data_for(7000 + n, 0, 3000 + n)
            with client.open(path, "wb") as f:
                f.write(data)
            model[path] = data
    for d in sorted(p for p, v in model.items() if v is None):
        path = f"{d}/new-{tag}"
        data = data_for(9000 + len(model), 0, 555)
        with client.open(path, "wb") as f:
            f.write(data)
        model[path] = data
    client.mkdir(f"/dir-{tag}")
    model[f"/dir-{tag}"] = None


def _check(client: Client, model: Model) -> None:
    """Every listing, kind, size and byte is the model's."""
    dirs = ["/", *sorted(p for p, v in model.items() if v is None)]
    for d in dirs:
        parent = d if d != "/" else ""
        want = {p.rsplit("/", 1)[1] for p in model if p.rsplit("/", 1)[0] == parent}
        assert set(client.listdir(d)) == want, (d, set(client.listdir(d)) ^ want)
    for path, data in model.items():
        st = client.stat(path)
        if data is None:
            assert st.is_dir(), path
            continue
        assert st.st_size == len(data), path
        with client.open(path, "rb") as f:
            assert f.read() == data, path


def _names_on(client: Client, server: int, prefix: str, count: int) -> list[str]:
    """`count` new paths under `prefix` whose metadata owner is on `server`."""
    names = (f"{prefix}/n{i}" for i in range(100_000))
    return [n for n in names if client.locate_metadata(n) == server][:count]


@pytest.mark.timeout(150)
@pytest.mark.parametrize("back", ["stand-in", "restarted"])
@pytest.mark.serial
def test_a_killed_owner_loses_no_name_and_repair_makes_a_second_loss_safe(
    daemon_cluster: Callable[..., LocalCluster], back: str
) -> None:
    """Four servers, two copies of everything: the server holding the root directory's names
    is SIGKILLed; every name, size and byte is there at once, and the tree changes without
    it. `repair` then hands its copies' state to the servers standing in for it, or, restarted
    on its stale data, catches it up before it serves again; a second server's SIGKILL (the
    copy serving the root's names then) loses nothing either."""
    cluster = daemon_cluster(4, *OVERRIDES)
    config = cluster.config_path.read_text()
    model: Model = {}
    with Client(cluster.registry_dir, config) as client:
        _build(client, model)
        victim = client.locate_metadata("/")
        assert client.locate_metadata_copies("/")[0] == victim
    kill(cluster, [victim])
    with Client(cluster.registry_dir, config) as client:
        started = time.monotonic()
        _check(client, model)
        assert time.monotonic() - started < FAILOVER_S + 5.0
        _change(client, model, "without")
        _check(client, model)
        assert client.lost_servers()["lost"] == [victim]
        assert victim not in client.locate_metadata_copies("/")
    if back == "restarted":
        restart(cluster, [victim])
    with Client(cluster.registry_dir, config) as client:
        _check(client, model)  # a restarted owner is not read before it is caught up
        report = repair(client)
        assert report.complete, report.as_dict()
        assert report.metadata_records > len(model), report.as_dict()
        if back == "restarted":
            assert report.rejoining == [victim]
            assert client.lost_servers() == {"lost": [], "repaired": [], "joining": []}
            assert client.locate_metadata_copies("/")[0] == victim  # it serves again
        else:
            assert client.lost_servers() == {"lost": [victim], "repaired": [victim], "joining": []}
        _change(client, model, "repaired")
        second = client.locate_metadata_copies("/")[0]
    kill(cluster, [second])
    with Client(cluster.registry_dir, config) as client:
        _check(client, model)
        _change(client, model, "second")
        _check(client, model)


@pytest.mark.timeout(120)
@pytest.mark.serial
def test_a_paused_owner_resumed_after_changes_serves_nothing_stale(
    daemon_cluster: Callable[..., LocalCluster],
) -> None:
    """A client SIGSTOPs nothing but meets a paused owner: its changes go to the next copy
    after the timeout (the owner is declared lost). Resumed, the owner answers again, and a
    second client that saw the old names and never read the record since asks it: it refuses
    (ESTALE), the client reads the record, and gets the new names from the serving copy. New
    names that client makes are seen by the first; a new client agrees with both."""
    cluster = daemon_cluster(3, *OVERRIDES)
    config = cluster.config_path.read_text()
    a = Client(cluster.registry_dir, config)
    b = Client(cluster.registry_dir, config)
    try:
        root = a.locate_metadata("/")
        victim = next(s for s in range(3) if s != root)
        a.mkdir("/p")
        paths = _names_on(a, victim, "/p", 4)
        for i, p in enumerate(paths):
            with a.open(p, "wb") as f:
                f.write(data_for(i, 0, 100))
        assert [b.stat(p).st_size for p in paths] == [100] * 4  # b's view: victim serves
        cluster.kill(victim, signal.SIGSTOP)
        try:
            started = time.monotonic()
            with a.open(paths[0], "wb") as f:
                f.write(data_for(50, 0, 7777))
            assert time.monotonic() - started < FAILOVER_S
            a.unlink(paths[1])
            a.rename(paths[2], "/p/renamed")
            fresh = _names_on(a, victim, "/p", 6)[4:]
            with a.open(fresh[0], "wb") as f:
                f.write(b"made while the owner was paused")
        finally:
            cluster.kill(victim, signal.SIGCONT)
        assert a.lost_servers()["lost"] == [victim]
        time.sleep(0.5)  # resumed and serving its queue
        # b never read the record since: it asks the resumed owner, which refuses.
        assert b.stat(paths[0]).st_size == 7777
        with b.open(paths[0], "rb") as f:
            assert f.read() == data_for(50, 0, 7777)
        with pytest.raises(FileNotFoundError):
            b.stat(paths[1])
        with pytest.raises(FileNotFoundError):
            b.stat(paths[2])
        assert b.stat("/p/renamed").st_size == 100
        with b.open(fresh[0], "rb") as f:
            assert f.read() == b"made while the owner was paused"
        with b.open(fresh[1], "wb") as f:
            f.write(b"made by b")
        assert a.stat(fresh[1]).st_size == len(b"made by b")
        want = {p.rsplit("/", 1)[1] for p in [paths[0], paths[3], "/p/renamed", *fresh]}
        assert set(a.listdir("/p")) == want
        assert set(b.listdir("/p")) == want
        with Client(cluster.registry_dir, config) as c:
            assert set(c.listdir("/p")) == want
            assert c.stat(paths[0]).st_size == 7777
    finally:
        a.close()
        b.close()
    log = next(d for d in cluster.daemons if d.server_id == victim).log_path.read_text()
    assert "panicked" not in log


#: A client on a node of its own: makes names (their owner given), prints them, then when told
#: makes more and prints every name it sees under /cut with its size.
CUT_CLIENT = """
import json, sys
from benchfs import Client
client = Client(sys.argv[1], open(sys.argv[2]).read())
tag = sys.argv[3]
def names(owner, count):
    out = (f"/cut/{tag}{i}" for i in range(100000))
    return [n for n in out if client.locate_metadata(n) == owner][:count]
def listing():
    return {n: client.stat("/cut/" + n).st_size for n in client.listdir("/cut")}
for line in sys.stdin:
    cmd = json.loads(line)
    if cmd["op"] == "make":
        made = names(cmd["owner"], cmd["count"])
        for i, p in enumerate(made):
            with client.open(p, "wb") as f:
                f.write(b"x" * (10 + i))
        print(json.dumps({"made": made, "lost": client.lost_servers()["lost"]}), flush=True)
    elif cmd["op"] == "mkdir":
        client.mkdir(cmd["path"])
        print(json.dumps({}), flush=True)
    elif cmd["op"] == "list":
        print(json.dumps({"listing": listing(), "lost": client.lost_servers()["lost"]}), flush=True)
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root")
@pytest.mark.timeout(150)
@pytest.mark.serial
def test_a_client_cut_off_from_the_owner_moves_every_client(tmp_path: Path) -> None:
    """Servers on three nodes apart, clients on a fourth and a fifth. The fourth's route to
    the node of a metadata owner is cut (a blackhole route: the others still reach it): its
    next change there goes to the next copy, after it declared the owner lost. The fifth still
    reaches the owner, which now refuses it, so it moves too: both see the same names, those
    each made before and after the cut."""
    config = config_text(*OVERRIDES)
    with apart_nodes(5) as nodes:
        cluster = LocalCluster.start_in(
            tmp_path / "cluster", config, ["n1", "n2", "n3"], 30.0,
            prefixes=[nodes.prefix(n) for n in ("n1", "n2", "n3")],
        )  # fmt: skip
        clients: dict[str, subprocess.Popen[str]] = {}
        try:
            # Clients outside the nodes' network reach no server (and declare none lost).
            owner = next(s for s in range(3) if s != _core.metadata_server("/cut", 3, 1))
            for name, tag in (("n4", "x"), ("n5", "y")):
                clients[name] = subprocess.Popen(
                    [*nodes.prefix(name), sys.executable, "-c", CUT_CLIENT,
                     str(cluster.registry_dir), str(cluster.config_path), tag],
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                )  # fmt: skip

            def ask(name: str, **cmd: object) -> dict[str, object]:
                proc = clients[name]
                assert proc.stdin is not None and proc.stdout is not None
                proc.stdin.write(json.dumps(cmd) + "\n")
                proc.stdin.flush()
                line = proc.stdout.readline()
                assert line, f"client on {name} exited ({proc.wait(10)})"
                return json.loads(line)

            ask("n5", op="mkdir", path="/cut")
            before = [ask(n, op="make", owner=owner, count=3)["made"] for n in ("n4", "n5")]
            address = nodes.nodes[f"n{owner + 1}"].address
            subprocess.run(
                ["ip", "netns", "exec", nodes.nodes["n4"].namespace,
                 "ip", "route", "add", "blackhole", f"{address}/32"],
                check=True,
            )  # fmt: skip
            started = time.monotonic()
            cut = ask("n4", op="make", owner=owner, count=6)
            assert time.monotonic() - started < FAILOVER_S + 2.0
            assert cut["lost"] == [owner], cut
            later = ask("n5", op="make", owner=owner, count=5)
            assert later["lost"] == [owner], later
            made = [*before[0], *before[1], *cut["made"], *later["made"]]  # type: ignore[misc]
            want = {p.rsplit("/", 1)[1] for p in made}
            for name in ("n4", "n5"):
                seen = ask(name, op="list")["listing"]
                assert set(seen) == want, (name, set(seen) ^ want)  # type: ignore[arg-type]
        finally:
            for proc in clients.values():
                if proc.stdin is not None:
                    proc.stdin.close()
                try:
                    proc.wait(20)
                except subprocess.TimeoutExpired:
                    proc.kill()
            cluster.stop(grace_s=5.0)


@pytest.mark.timeout(90)
def test_held_locks_are_lost_with_their_server_and_the_holder_is_told(
    daemon_cluster: Callable[..., LocalCluster],
) -> None:
    """Locks live with the server keeping them and have no copies: when it is lost, the copy
    serving its names starts with no locks. The holder is told on its next lock call (ENOLCK,
    once); a new lock on the file is then granted by the new server."""
    cluster = daemon_cluster(3, *OVERRIDES)
    config = cluster.config_path.read_text()
    with Client(cluster.registry_dir, config) as client:
        root = client.locate_metadata("/")
        victim = next(s for s in range(3) if s != root)
        handles: list[tuple[str, Any]] = []
        held: list[tuple[str, Any]] = []
        # Which server keeps a file's locks follows from its id, which is drawn at random:
        # lock files until the victim keeps some (12 files missed it 0.8% of the time).
        for i in range(100):
            if len(handles) >= 12 and held:
                break
            f = client.open(f"/locked{i}", "wb")
            f.write(b"data")
            assert f.lock(exclusive=True)
            handles.append((f"/locked{i}", f))
            if client.locate_locks(f"/locked{i}") == victim:
                held.append((f"/locked{i}", f))
        assert held, "no file's locks on the victim in 100 files"
        kill(cluster, [victim])
        path, f = held[0]
        with pytest.raises(OSError) as told:
            f.lock(exclusive=True, start=0, length=10)
        assert told.value.errno == errno.ENOLCK, told.value
        assert "lost" in str(told.value)
        assert client.locate_locks(path) != victim
        assert f.lock(exclusive=True, start=0, length=10)  # the new keeper grants it
        for _, h in handles:
            h.close()


@pytest.mark.long
@pytest.mark.timeout(600)
@pytest.mark.parametrize("round_", range(20))
def test_metadata_faults_20_rounds(
    daemon_cluster: Callable[..., LocalCluster], tmp_path: Path, round_: int
) -> None:
    """`make test-long`: each failure test above, 20 rounds (the killed owner both ways)."""
    test_a_killed_owner_loses_no_name_and_repair_makes_a_second_loss_safe(
        daemon_cluster, ("stand-in", "restarted")[round_ % 2]
    )
    test_a_paused_owner_resumed_after_changes_serves_nothing_stale(daemon_cluster)
    if os.geteuid() == 0:
        test_a_client_cut_off_from_the_owner_moves_every_client(tmp_path / "cut")
    test_held_locks_are_lost_with_their_server_and_the_holder_is_told(daemon_cluster)

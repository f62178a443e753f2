"""The namespace survives a server restart: servers killed with SIGKILL and restarted on their
data directories serve every file and directory they owned, byte for byte, with complete
listings; the durability modes."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from benchfs import Client
from benchfs.cluster import LocalCluster, ServerExited
from conftest import config_text, data_for

SIZES = [0, 1, 4095, 65536, 65537, 300_001, 1 << 20]


def populate(client: Client) -> dict[str, bytes]:
    """Directories three deep and files of many sizes striped over every server."""
    files: dict[str, bytes] = {}
    for d in ("/a", "/a/b", "/a/b/c", "/x"):
        client.mkdir(d)
    for i in range(60):
        path = ["/a", "/a/b", "/a/b/c", "/x", ""][i % 5] + f"/f{i:02d}"
        data = data_for(i, 0, SIZES[i % len(SIZES)])
        with client.open(path, "w") as f:
            f.write(data)
        files[path] = data
    client.chmod("/a/f00", 0o600)
    client.utime("/x/f03", 1_234_567_890_000_000_123)
    return files


def check(client: Client, files: dict[str, bytes]) -> None:
    for path, data in files.items():
        with client.open(path) as f:
            assert f.read() == data, path
    listed = {d: client.listdir(d) for d in ("/", "/a", "/a/b", "/a/b/c", "/x")}
    for path in files:
        parent, name = path.rsplit("/", 1)
        assert name in listed[parent or "/"], path
    assert sorted(listed["/a"]) == sorted(
        ["b", *(n.rsplit("/", 1)[1] for n in files if n.startswith("/a/f"))]
    )
    assert client.stat("/a/f00").st_mode & 0o7777 == 0o600
    assert client.stat("/x/f03").st_mtime_ns == 1_234_567_890_000_000_123


def kill(cluster: LocalCluster, ids: list[int]) -> None:
    """SIGKILL servers `ids` (their registry entries stay, as after a crash)."""
    for sid in ids:
        daemon = next(d for d in cluster.daemons if d.server_id == sid)
        os.kill(daemon.pid, signal.SIGKILL)
        daemon.proc.wait()
    cluster.daemons = [d for d in cluster.daemons if d.server_id not in ids]


def restart(cluster: LocalCluster, ids: list[int]) -> None:
    """Start servers `ids` again on their own data directories and wait until each new
    process has registered."""
    root = cluster.registry_dir.parent
    new = {
        sid: cluster.start(sid, root / f"data-{sid}", root / f"server-{sid}.log", f"test-{sid}").pid
        for sid in ids
    }
    deadline = time.monotonic() + 20
    entries: dict[int, int] = {}
    while time.monotonic() < deadline:
        entries = {
            sid: json.loads((cluster.registry_dir / f"server-{sid}.json").read_text())["pid"]
            for sid in ids
            if (cluster.registry_dir / f"server-{sid}.json").exists()
        }
        if entries == new:
            return
        cluster.check_alive()
        time.sleep(0.05)
    pytest.fail(f"restarted servers did not register: {entries} != {new}")


def kill_and_restart(cluster: LocalCluster, ids: list[int]) -> None:
    kill(cluster, ids)
    restart(cluster, ids)


@pytest.mark.timeout(90)
@pytest.mark.parametrize(
    ("which", "layout"), [("one", "chunkfile"), ("all", "chunkfile"), ("all", "packed")]
)
def test_servers_killed_and_restarted_serve_every_name(
    daemon_cluster: Callable[..., LocalCluster], which: str, layout: str
) -> None:
    """The packed layout's index survives the kill too (its journal)."""
    cluster = daemon_cluster(3, f"storage.layout={layout}")
    config = cluster.config_path.read_text()
    with Client(cluster.registry_dir, config) as client:
        files = populate(client)
    kill_and_restart(cluster, [1] if which == "one" else [0, 1, 2])
    with Client(cluster.registry_dir, config) as client:
        check(client, files)
        # It keeps working: new names, and the id sequence does not repeat.
        with client.open("/a/after", "w") as f:
            f.write(b"after the restart")
        ids = {client.stat(p).id for p in files} | {client.stat("/a/after").id}
        assert len(ids) == len(files) + 1


@pytest.mark.timeout(60)
def test_a_store_of_another_cluster_shape_is_refused(
    daemon_cluster: Callable[..., LocalCluster], tmp_path: Path
) -> None:
    cluster = daemon_cluster(2)
    with Client(cluster.registry_dir, cluster.config_path.read_text()) as client:
        client.mkdir("/kept")
    cluster.stop(grace_s=5.0)
    # One server on server 0's data: the paths it owned belong to other owners now.
    with pytest.raises(ServerExited) as refused:
        LocalCluster.start_in(
            tmp_path / "alone", config_text(), ["test-0"], 10.0,
            data_dirs=[cluster.registry_dir.parent / "data-0"],
        )  # fmt: skip
    assert "written by metadata owner 0 of 2" in str(refused.value)
    assert "this worker is owner 0 of 1" in str(refused.value)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", ["memory", "none", "fsync", "close"])
def test_durability_modes(daemon_cluster: Callable[..., LocalCluster], mode: str) -> None:
    """`close` makes a written file's data durable before close returns (an fsync of every
    server holding it); the other modes publish the size only. `fsync` and `close` keep the
    namespace across a restart as `none` does; `memory` forgets it."""
    cluster = daemon_cluster(2, f"storage.durability={mode}")
    config = cluster.config_path.read_text()
    with Client(cluster.registry_dir, config) as client:
        f = client.open("/f", "w")
        f.write(data_for(5, 0, 300_000))
        before = sum(s["requests"] for s in client.server_stats())
        f.close()
        sent = sum(s["requests"] for s in client.server_stats()) - before
    # close: an fsync to each of the 2 servers holding chunks, then the size; else the size
    assert sent == (3 if mode == "close" else 1), sent
    kill_and_restart(cluster, [0, 1])
    with Client(cluster.registry_dir, config) as client:
        if mode == "memory":
            assert not client.exists("/f")
        else:
            with client.open("/f") as f:
                assert f.read() == data_for(5, 0, 300_000)


def owner(path: str, servers: int) -> int:
    """The metadata owner of `path` (docs/protocol.md; one worker per server)."""
    import xxhash

    return xxhash.xxh3_64_intdigest(path.encode(), seed=0x6D657461) % servers


def pick(servers: int, taken: set[int], pattern: str) -> str:
    """The first name `pattern.format(i)` whose metadata owner is not in `taken`."""
    return next(p for i in range(1000) if owner(p := pattern.format(i), servers) not in taken)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("op", ["unlink", "rename"])
def test_an_operation_cut_between_its_steps_is_completed_by_removing_the_name(
    daemon_cluster: Callable[..., LocalCluster], op: str
) -> None:
    """A real cut: the owner of the last step's directory is killed (SIGKILL) before the
    operation, whose earlier steps then land on the other servers while the last one fails.
    With that owner restarted, the name is listed but gone (docs/namespace.md); removing it
    completes the operation, after which stat, listdir and open agree."""
    cluster = daemon_cluster(3)
    config = cluster.config_path.read_text()
    parent = owner("/a", 3)
    source = pick(3, {parent}, "/a/x{}")
    target_dir = pick(3, {parent}, "/b{}")
    target = pick(3, {parent}, target_dir + "/y{}")
    with Client(cluster.registry_dir, config) as client:
        for d in ("/a", target_dir):
            client.mkdir(d)
        with client.open(source, "w") as f:
            f.write(b"soon cut")
        kill(cluster, [parent])
        with pytest.raises(OSError):  # the last step's owner is down
            if op == "unlink":
                client.unlink(source)
            else:
                client.rename(source, target)
    restart(cluster, [parent])
    name = source.rsplit("/", 1)[1]
    with Client(cluster.registry_dir, config) as client:
        if op == "rename":  # the rest of the rename landed
            with client.open(target) as f:
                assert f.read() == b"soon cut"
        assert name in client.listdir("/a") and not client.exists(source)
        with pytest.raises(FileNotFoundError):
            client.open(source)
        client.unlink(source)  # completes the cut operation
        assert name not in client.listdir("/a") and not client.exists(source)
        with pytest.raises(FileNotFoundError):
            client.unlink(source)
        client.rmdir("/a")

"""The namespace survives a server restart: servers killed with SIGKILL and restarted on their
data directories serve every file and directory they owned, byte for byte, with complete
listings; the durability modes."""

from __future__ import annotations

import json
import os
import random
import signal
import stat
import subprocess
import sys
import threading
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
        # Small files kept their bytes with their names (the default `layout.inline_max`).
        assert client.stat(path).inline == (len(data) <= 8192), path
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


def agree(client: Client, path: str) -> bool:
    """Whether `path` exists, asserting that stat, its parent's listing and open agree."""
    parent, name = path.rsplit("/", 1)
    listed = name in client.listdir(parent or "/")
    exists = client.exists(path)
    try:
        if stat.S_ISDIR(client.stat(path).st_mode):
            client.listdir(path)
        else:
            client.open(path).close()
        opened = True
    except FileNotFoundError:
        opened = False
    assert listed == exists == opened, f"{path}: listed {listed}, stat {exists}, open {opened}"
    return exists


CRASH_SCRIPT = """
import sys
from benchfs import Client
registry, config, op, a, b = sys.argv[1:]
with Client(registry, open(config).read()) as c:
    if op == "create":
        c.open(a, "w").close()
    elif op == "rename":
        c.rename(a, b)
    else:
        getattr(c, op)(a)
raise SystemExit("the crash point was not reached")
"""

# (op, step, source, target, what exists after the crash: source, target)
CRASHES = [
    ("create", 1, "/new", "", (False, False)),
    ("mkdir", 1, "/newdir", "", (False, False)),
    ("unlink", 1, "/u1", "", (True, False)),
    ("unlink", 2, "/u2", "", (False, False)),
    ("rmdir", 1, "/d1", "", (True, False)),
    ("rmdir", 2, "/d2", "", (False, False)),
    ("rename", 1, "/r1", "/t/r1", (True, False)),
    ("rename", 2, "/r2", "/t/r2", (True, False)),
    ("rename", 3, "/r3", "/t/r3", (True, True)),
    ("rename", 4, "/r4", "/t/r4", (False, True)),
]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", ["none", "fsync"])
def test_a_server_killed_mid_group_loses_no_answered_change(
    daemon_cluster: Callable[..., LocalCluster], mode: str
) -> None:
    """Group commit: 4 clients create, rename and remove names as fast as they can while a
    server is killed with SIGKILL at a random moment (its groups of changes mid-way); restarted
    on its data directory, it serves every change a client had been answered, and nothing it
    had removed."""
    cluster = daemon_cluster(2, f"storage.durability={mode}", "client.request_timeout_s=5")
    config = cluster.config_path.read_text()
    answered: list[set[str]] = [set() for _ in range(4)]
    removed: list[set[str]] = [set() for _ in range(4)]
    stop = threading.Event()

    def work(k: int) -> None:
        with Client(cluster.registry_dir, config) as client:
            client.mkdir(f"/t{k}")
            i = 0
            while not stop.is_set():
                path = f"/t{k}/f{i}"
                i += 1
                try:
                    with client.open(path, "w"):
                        pass
                    answered[k].add(path)
                    if i % 3 == 1:
                        client.rename(path, path + "r")
                        answered[k].discard(path)
                        answered[k].add(path + "r")
                    elif i % 5 == 2:
                        client.unlink(path)
                        answered[k].discard(path)
                        removed[k].add(path)
                except OSError:
                    # The killed server's names fail from here on; the names of a call that
                    # failed are in either state.
                    answered[k] -= {path, path + "r"}
                    return

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    time.sleep(random.uniform(0.5, 1.5))
    kill(cluster, [1])
    stop.set()
    for t in threads:
        t.join(timeout=60)
        assert not t.is_alive()
    restart(cluster, [1])
    names = set().union(*answered)
    assert len(names) > 100, len(names)  # the kill came mid-load
    with Client(cluster.registry_dir, config) as client:
        for k in range(4):
            listed = set(client.listdir(f"/t{k}"))
            for path in answered[k]:
                assert client.stat(path).st_size == 0, path
                assert path.rsplit("/", 1)[1] in listed, path
            for path in removed[k]:
                with pytest.raises(FileNotFoundError):
                    client.stat(path)


@pytest.mark.timeout(90)
def test_a_client_killed_between_the_steps_leaves_a_namespace_that_agrees(
    daemon_cluster: Callable[..., LocalCluster], tmp_path: Path
) -> None:
    """A real crash at every step boundary of every multi-owner operation: the client process
    kills itself (SIGKILL, `BENCHFS_CRASH_AT`) right after the step. Stat, the parent's
    listing and open then agree on every name (docs/namespace.md), files keep their bytes,
    and redoing or removing the name finishes the operation."""
    cluster = daemon_cluster(3)
    config = cluster.config_path.read_text()
    script = tmp_path / "crash.py"
    script.write_text(CRASH_SCRIPT)
    with Client(cluster.registry_dir, config) as client:
        client.mkdir("/t")
        for op, _, source, _, _ in CRASHES:
            if op == "rmdir":
                client.mkdir(source)
            elif op not in ("create", "mkdir"):
                with client.open(source, "w") as f:
                    f.write(data_for(len(source), 0, 70_000))
        for op, step, source, target, expected in CRASHES:
            env = {**os.environ, "BENCHFS_CRASH_AT": f"{op}:{step}"}
            args = [str(cluster.registry_dir), str(cluster.config_path), op, source, target]
            done = subprocess.run(
                [sys.executable, str(script), *args], env=env, capture_output=True, text=True
            )
            assert done.returncode == -signal.SIGKILL, (op, step, done.stderr)
            found = (agree(client, source), agree(client, target) if target else False)
            assert found == expected, (op, step, found)
            for path, there in zip((source, target), found, strict=True):
                if there and op != "rmdir":
                    with client.open(path) as f:
                        assert f.read() == data_for(len(source), 0, 70_000), (op, step, path)
        # Finishing: redo the cut rename (the second name goes, the data stays), create the
        # name again, remove what is left.
        client.rename("/r3", "/t/r3")
        assert not agree(client, "/r3") and agree(client, "/t/r3")
        with client.open("/t/r3") as f:
            assert f.read() == data_for(len("/r3"), 0, 70_000)
        with client.open("/new", "w") as f:
            f.write(b"again")
        assert agree(client, "/new")
        for op, _, source, target, _ in CRASHES:
            for path in filter(None, (source, target)):
                if client.exists(path):
                    (client.rmdir if op in ("mkdir", "rmdir") else client.unlink)(path)
                assert not agree(client, path)
        client.rmdir("/t")
        assert client.listdir("/") == []


def test_a_directory_listing_empty_is_removed_despite_dangling_names(
    daemon_cluster: Callable[..., LocalCluster], tmp_path: Path
) -> None:
    """A create cut after its first step leaves a name without an inode: the directory lists
    as empty, and rmdir removes it (and the dangling name) instead of saying ENOTEMPTY."""
    cluster = daemon_cluster(2)
    script = tmp_path / "crash.py"
    script.write_text(CRASH_SCRIPT)
    with Client(cluster.registry_dir, cluster.config_path.read_text()) as client:
        client.mkdir("/c")
        env = {**os.environ, "BENCHFS_CRASH_AT": "create:1"}
        args = [str(cluster.registry_dir), str(cluster.config_path), "create", "/c/f", ""]
        done = subprocess.run([sys.executable, str(script), *args], env=env, capture_output=True)
        assert done.returncode == -signal.SIGKILL
        assert client.listdir("/c") == [] and not client.exists("/c/f")
        client.rmdir("/c")
        assert not agree(client, "/c")


@pytest.mark.timeout(90)
@pytest.mark.parametrize("op", ["unlink", "rename"])
def test_a_server_down_between_the_steps_leaves_a_namespace_that_agrees(
    daemon_cluster: Callable[..., LocalCluster], op: str
) -> None:
    """A real cut on the server side: the owner of the inode the operation changes last is
    killed (SIGKILL) before the operation (unlink: the file's; rename: the target's), whose
    first steps then land on the other servers while that step fails. With that owner
    restarted, stat, listing and open agree, the file keeps its bytes, and redoing the
    operation completes it."""
    cluster = daemon_cluster(3)
    config = cluster.config_path.read_text()
    parent = owner("/a", 3)
    source = pick(3, {parent}, "/a/x{}")
    target_dir = pick(3, {owner(source, 3)}, "/b{}")
    target = pick(3, {parent, owner(source, 3), owner(target_dir, 3)}, target_dir + "/y{}")
    down = owner(source if op == "unlink" else target, 3)
    data = data_for(9, 0, 200_000)
    with Client(cluster.registry_dir, config) as client:
        for d in ("/a", target_dir):
            client.mkdir(d)
        with client.open(source, "w") as f:
            f.write(data)
        kill(cluster, [down])
        with pytest.raises(OSError):  # that owner is down
            if op == "unlink":
                client.unlink(source)
            else:
                client.rename(source, target)
    restart(cluster, [down])
    with Client(cluster.registry_dir, config) as client:
        assert agree(client, source) and not agree(client, target)
        with client.open(source) as f:
            assert f.read() == data
        if op == "rename":
            client.rename(source, target)
            assert agree(client, target)
            with client.open(target) as f:
                assert f.read() == data
        else:
            client.unlink(source)
        assert not agree(client, source)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("layout", ["chunkfile", "packed"])
def test_a_file_cut_after_a_restart_keeps_no_stale_byte(
    daemon_cluster: Callable[..., LocalCluster], layout: str
) -> None:
    """Chunks written before a restart are known to the restarted store: a truncate cuts
    them, so the file grown again reads zeros where they were (not their old bytes)."""
    cluster = daemon_cluster(2, f"storage.layout={layout}", "layout.chunk_size=65536")
    config = cluster.config_path.read_text()
    data = data_for(5, 0, 300_000)
    with Client(cluster.registry_dir, config) as client:
        with client.open("/cut", "w") as f:
            f.write(data)
    kill_and_restart(cluster, [0, 1])
    with Client(cluster.registry_dir, config) as client:
        client.truncate("/cut", 1000)
        with client.open("/cut", "r+b") as f:
            f.seek(250_000)
            f.write(b"x")
        with client.open("/cut") as f:
            assert f.read() == data[:1000] + bytes(249_000) + b"x"

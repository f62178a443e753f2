"""Symbolic links through the Python API on a real cluster: made, read and followed (relative,
absolute, dangling, among directories, in chains and loops), renamed, removed, listed, found,
and kept across a server restart; absolute targets outside BenchFS refused in one line."""

from __future__ import annotations

import errno
import os
from collections.abc import Callable

import pytest

from benchfs import Client
from benchfs.cluster import LocalCluster
from test_persistence import kill_and_restart


def error_of(call: Callable[[], object]) -> int:
    with pytest.raises(OSError) as raised:
        call()
    assert raised.value.errno is not None
    return raised.value.errno


MOUNT = "/mnt/bfs"


@pytest.fixture(autouse=True)
def mounted_at(monkeypatch: pytest.MonkeyPatch) -> None:
    """Absolute targets are host paths: BenchFS is seen at MOUNT (and /benchfs, the
    interposition library's default prefix)."""
    monkeypatch.setenv("BENCHFS_MOUNT", MOUNT)
    monkeypatch.delenv("BENCHFS_PRELOAD_PREFIX", raising=False)


def tree(client: Client) -> None:
    """/d/f (5 bytes); /d/rel -> f; /abs -> MOUNT/d; /dangling -> MOUNT/nowhere."""
    client.mkdir("/d")
    with client.open("/d/f", "w") as f:
        f.write(b"hello")
    client.symlink("f", "/d/rel")
    client.symlink(f"{MOUNT}/d", "/abs")
    client.symlink(f"{MOUNT}/nowhere", "/dangling")


@pytest.mark.timeout(60)
def test_links_are_made_read_and_followed(daemon_cluster: Callable[..., LocalCluster]) -> None:
    cluster = daemon_cluster(3)
    with Client(cluster.registry_dir, cluster.config_path.read_text()) as client:
        tree(client)
        assert client.readlink("/d/rel") == "f" and client.readlink("/abs") == f"{MOUNT}/d"
        own = client.lstat("/d/rel")
        assert own.is_symlink() and own.st_size == 1 and own.st_mode & 0o170000 == 0o120000
        assert client.stat("/d/rel").is_file() and client.stat("/d/rel").st_size == 5
        assert client.stat("/d/rel").id == client.stat("/d/f").id
        # Through a link among the directories, and a link at the end: two links.
        with client.open("/abs/rel") as f:
            assert f.read() == b"hello"
        assert client.listdir("/abs") == ["f", "rel"]
        assert client.readdir("/") == [("abs", "symlink"), ("d", "dir"), ("dangling", "symlink")]
        # Names made through a linked directory land in its target.
        with client.open("/abs/new", "w") as f:
            f.write(b"x")
        client.mkdir("/abs/sub")
        assert client.stat("/d/new").st_size == 1 and client.stat("/d/sub").is_dir()
        # Dangling: its own attributes are there, its target's are not; creating through it
        # makes the target (as open(2) with O_CREAT does).
        assert client.islink("/dangling") and not client.exists("/dangling")
        assert error_of(lambda: client.stat("/dangling")) == errno.ENOENT
        with client.open("/dangling", "w") as f:
            f.write(b"made")
        assert client.stat("/nowhere").st_size == 4
        # chmod, utime and truncate follow the link.
        client.chmod("/d/rel", 0o600)
        client.truncate("/d/rel", 2)
        assert client.stat("/d/f").st_mode & 0o7777 == 0o600
        assert client.stat("/d/f").st_size == 2
        assert client.lstat("/d/rel").st_mode & 0o7777 == 0o777


@pytest.mark.timeout(60)
def test_bad_uses_get_one_clear_errno(daemon_cluster: Callable[..., LocalCluster]) -> None:
    cluster = daemon_cluster(2)
    with Client(cluster.registry_dir, cluster.config_path.read_text()) as client:
        tree(client)
        assert error_of(lambda: client.symlink("x", "/d/f")) == errno.EEXIST
        assert error_of(lambda: client.symlink("x", "/d/rel")) == errno.EEXIST
        assert error_of(lambda: client.symlink("", "/empty")) == errno.ENOENT
        assert error_of(lambda: client.symlink("x" * 5000, "/long")) == errno.ENAMETOOLONG
        assert error_of(lambda: client.readlink("/d/f")) == errno.EINVAL
        assert error_of(lambda: client.readlink("/none")) == errno.ENOENT
        assert error_of(lambda: client.mkdir("/d/rel")) == errno.EEXIST
        assert error_of(lambda: client.rmdir("/abs")) == errno.ENOTDIR
        assert error_of(lambda: client.open("/d/rel", os.O_RDONLY | os.O_NOFOLLOW)) == errno.ELOOP
        assert error_of(lambda: client.open("/d/rel", os.O_CREAT | os.O_EXCL)) == errno.EEXIST
        # A file in the middle of a path is not a directory, link or not.
        assert error_of(lambda: client.stat("/d/rel/x")) == errno.ENOTDIR
        # Loops, and chains: 40 links are followed, the 41st is ELOOP.
        client.symlink("/benchfs/loop-b", "/loop-a")
        client.symlink(f"{MOUNT}/loop-a", "/loop-b")
        assert error_of(lambda: client.stat("/loop-a")) == errno.ELOOP
        assert error_of(lambda: client.open("/loop-a/x", "w")) == errno.ELOOP
        previous = f"{MOUNT}/d/f"
        for i in range(41):
            client.symlink(previous, f"/chain{i}")
            previous = f"{MOUNT}/chain{i}"
        assert client.stat("/chain39").st_size == 5
        assert error_of(lambda: client.stat("/chain40")) == errno.ELOOP
        assert client.lstat("/chain40").is_symlink()


@pytest.mark.timeout(60)
def test_absolute_targets_outside_benchfs_are_refused_in_one_line(
    daemon_cluster: Callable[..., LocalCluster],
) -> None:
    cluster = daemon_cluster(2)
    with Client(cluster.registry_dir, cluster.config_path.read_text()) as client:
        tree(client)
        client.symlink("/usr", "/out")
        client.symlink(f"{MOUNT}X/d", "/beside")
        client.symlink(f"{MOUNT}/d/../../../etc", "/up")
        # The link itself is there and reads as written; following it is EXDEV, naming
        # where it leads on the host.
        assert client.readlink("/out") == "/usr" and client.lstat("/out").is_symlink()
        for path, host in [
            ("/out", "/usr"),
            ("/out/lib/x", "/usr/lib/x"),
            ("/beside", f"{MOUNT}X/d"),
            ("/up", "/etc"),
        ]:
            with pytest.raises(OSError) as raised:
                client.stat(path)
            assert raised.value.errno == errno.EXDEV
            assert str(raised.value).endswith(f"a symbolic link leads outside BenchFS, to {host}")
            assert "\n" not in str(raised.value)
        assert error_of(lambda: client.open("/out/new", "w")) == errno.EXDEV
        assert error_of(lambda: client.listdir("/out")) == errno.EXDEV
        client.unlink("/out")
        # The mount point itself and the interposition library's default prefix are inside.
        client.symlink(MOUNT, "/root-link")
        client.symlink("/benchfs/d/f", "/by-prefix")
        assert client.stat("/root-link/d/f").st_size == 5
        assert client.stat("/by-prefix").st_size == 5
    # client.link_roots adds host directories; "/" makes every absolute target BenchFS's.
    config = cluster.config_path.read_text()
    with Client(
        cluster.registry_dir, config.replace('link_roots = ""', 'link_roots = "/"')
    ) as client:
        client.symlink("/d/f", "/plain")
        assert client.stat("/plain").st_size == 5
    with pytest.raises(ValueError, match=r'client\.link_roots: "rel" is not an absolute path'):
        Client(cluster.registry_dir, config.replace('link_roots = ""', 'link_roots = "/a:rel"'))


@pytest.mark.timeout(60)
def test_links_are_renamed_removed_and_replaced(
    daemon_cluster: Callable[..., LocalCluster],
) -> None:
    cluster = daemon_cluster(3)
    with Client(cluster.registry_dir, cluster.config_path.read_text()) as client:
        tree(client)
        client.rename("/d/rel", "/d/moved")
        assert client.readlink("/d/moved") == "f" and client.stat("/d/moved").st_size == 5
        assert error_of(lambda: client.lstat("/d/rel")) == errno.ENOENT
        # Removing a link leaves its target; removing the target leaves the link dangling.
        client.unlink("/d/moved")
        assert client.stat("/d/f").st_size == 5
        client.symlink("f", "/d/again")
        client.unlink("/d/f")
        assert client.islink("/d/again") and not client.exists("/d/again")
        # A file renamed over a link replaces the link, and lists as a file.
        with client.open("/d/g", "w") as f:
            f.write(b"g")
        client.rename("/d/g", "/d/again")
        assert client.lstat("/d/again").is_file()
        assert client.readdir("/d") == [("again", "file")]
        # A link renamed over a file replaces it.
        client.symlink("again", "/d/l2")
        with client.open("/d/victim", "w") as f:
            f.write(b"v")
        client.rename("/d/l2", "/d/victim")
        assert client.readlink("/d/victim") == "again"
        assert dict(client.readdir("/d")) == {"again": "file", "victim": "symlink"}
        found = client.find("/", kind="symlink")
        assert sorted(m.path for m in found.found) == ["/abs", "/d/victim", "/dangling"]


@pytest.mark.timeout(90)
def test_links_survive_a_restart(daemon_cluster: Callable[..., LocalCluster]) -> None:
    cluster = daemon_cluster(3)
    config = cluster.config_path.read_text()
    with Client(cluster.registry_dir, config) as client:
        tree(client)
    kill_and_restart(cluster, [0, 1, 2])
    with Client(cluster.registry_dir, config) as client:
        assert client.readlink("/d/rel") == "f" and client.readlink("/abs") == f"{MOUNT}/d"
        with client.open("/abs/rel") as f:
            assert f.read() == b"hello"
        assert client.islink("/dangling") and not client.exists("/dangling")

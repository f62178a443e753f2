"""The FUSE mount end to end: fio with verification, POSIX behaviour through plain os calls,
parallel readers, a busy mount point, and SIGTERM. Every test mounts a 2-server `benchfsd`
cluster through `benchfs.mount.mounted`, which always unmounts (see docs/mount.md)."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import mmap
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from benchfs import Client
from benchfs.cluster import LocalCluster
from benchfs.mount import Mounted, find_benchfs_mount, is_mounted, mounted
from benchfs.units import MIB
from conftest import checked_mount, data_for

pytestmark = pytest.mark.skipif(
    not os.path.exists("/dev/fuse") or shutil.which("fusermount3") is None,
    reason="needs /dev/fuse and fusermount3 (scripts/bootstrap installs fuse3)",
)

FIO = shutil.which("fio")


@pytest.fixture
def cluster(daemon_cluster: Callable[..., LocalCluster]) -> LocalCluster:
    return daemon_cluster(2)


@pytest.fixture
def mount(cluster: LocalCluster, tmp_path: Path) -> Iterator[Mounted]:
    yield from checked_mount(cluster, tmp_path / "mnt")


def run_fio(directory: Path, *args: str) -> dict:
    """Runs fio; fails on a non-zero exit or any job error, returns its JSON."""
    assert FIO is not None
    done = subprocess.run(
        [FIO, f"--directory={directory}", "--output-format=json", *args],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
        cwd=directory.parent,  # fio leaves its verify state files in the working directory
    )
    assert done.returncode == 0, f"fio {args}: {done.stderr}\n{done.stdout[-2000:]}"
    report = json.loads(done.stdout[done.stdout.index("{") :])
    for job in report["jobs"]:
        assert job["error"] == 0, f"fio job {job['jobname']}: error {job['error']}"
    return report


@pytest.mark.skipif(FIO is None, reason="fio is not installed")
@pytest.mark.parametrize(
    ("jobs", "bs", "direct"),
    [
        (2, 4096, 1),
        (4, 128 * 1024, 1),
        (2, MIB, 1),
        (4, MIB, 0),
        (2, 4096, 0),
        (2, 3333, 0),  # odd size: unaligned requests through the page cache
    ],
)
def test_fio_verifies_through_the_mount(mount: Mounted, jobs: int, bs: int, direct: int) -> None:
    size = 4 * MIB
    per_job = size // bs * bs  # fio writes whole blocks
    common = [
        f"--bs={bs}",
        f"--numjobs={jobs}",
        f"--direct={direct}",
        f"--size={per_job}",
        "--ioengine=psync",
        "--verify=crc32c",
        "--name=v",
    ]
    # Write with verification headers, then (a second fio, fresh opens) read back and verify.
    written = run_fio(mount.mountpoint, "--rw=write", "--do_verify=0", *common)
    assert sum(j["write"]["io_bytes"] for j in written["jobs"]) == jobs * per_job
    verified = run_fio(mount.mountpoint, "--rw=write", "--verify_only", *common)
    assert sum(j["read"]["io_bytes"] for j in verified["jobs"]) == jobs * per_job
    for k in range(jobs):
        assert os.stat(mount.mountpoint / f"v.{k}.0").st_size == per_job


def test_posix_behaviour(mount: Mounted, cluster: LocalCluster) -> None:
    root = mount.mountpoint
    path = root / "f.bin"
    # create, exclusive create
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o640)
    body = data_for(1, 0, 3 * MIB + 123)
    assert os.write(fd, body) == len(body)
    assert os.fstat(fd).st_size == len(body)
    os.close(fd)
    assert os.stat(path).st_size == len(body)
    assert os.stat(path).st_mode & 0o777 == 0o640
    with pytest.raises(FileExistsError):
        os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    assert path.read_bytes() == body

    # append: to the end the handle knows
    tail = b"appended" * 1000
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    os.write(fd, tail)
    os.close(fd)
    body += tail
    assert path.read_bytes() == body

    # truncate: shrink, then grow with zeros (by path and through a handle)
    os.truncate(path, 1000)
    assert os.stat(path).st_size == 1000
    fd = os.open(path, os.O_RDWR)
    os.ftruncate(fd, 5000)
    os.close(fd)
    assert path.read_bytes() == body[:1000] + bytes(4000)

    # O_TRUNC on open
    fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
    os.write(fd, b"xyz")
    os.close(fd)
    assert path.read_bytes() == b"xyz"

    # rename: file over file (the old target's data is gone, the source keeps its bytes)
    other = root / "other.bin"
    other.write_bytes(b"other")
    os.rename(path, other)
    assert not path.exists()
    assert other.read_bytes() == b"xyz"

    # rename of an open file: its descriptor keeps writing, the size lands on the new name
    fd = os.open(other, os.O_WRONLY)
    os.pwrite(fd, b"0123456789", 3)
    os.rename(other, root / "moved.bin")
    os.pwrite(fd, b"abc", 13)
    os.close(fd)
    assert (root / "moved.bin").read_bytes() == b"xyz0123456789abc"
    os.rename(root / "moved.bin", other)

    # directories: mkdir, readdir, ENOTEMPTY, EXDEV for a non-empty directory, rmdir
    d = root / "d"
    os.mkdir(d)
    with pytest.raises(FileExistsError):
        os.mkdir(d)
    names = [f"n{k:03d}" for k in range(40)]
    for n in names:
        (d / n).write_bytes(n.encode())
    assert sorted(os.listdir(d)) == names
    assert sorted(os.listdir(root)) == ["d", "other.bin"]
    with pytest.raises(OSError) as e:
        os.rmdir(d)
    assert e.value.errno == errno.ENOTEMPTY
    with pytest.raises(OSError) as e:
        os.rename(d, root / "d2")
    assert e.value.errno == errno.EXDEV
    for n in names:
        assert (d / n).read_bytes() == n.encode()
        os.unlink(d / n)
    os.rename(d, root / "d2")  # empty: allowed
    assert os.listdir(root / "d2") == []
    os.rmdir(root / "d2")

    # errors for bad paths
    with pytest.raises(FileNotFoundError):
        os.stat(root / "missing")
    with pytest.raises(FileNotFoundError):
        os.open(root / "missing", os.O_RDONLY)
    with pytest.raises(FileNotFoundError):
        os.open(root / "nodir" / "f", os.O_CREAT | os.O_WRONLY)
    with pytest.raises(OSError) as e:
        os.open(root / ("x" * 256), os.O_CREAT | os.O_WRONLY)
    assert e.value.errno == errno.ENAMETOOLONG
    with pytest.raises(IsADirectoryError):
        os.open(root, os.O_WRONLY)
    with pytest.raises(OSError) as e:
        os.mkfifo(root / "fifo")
    assert e.value.errno == errno.EPERM
    # chmod and the modification time are stored (cp -p, touch -d, rsync -t keep them) and
    # seen by other clients; owners are not stored, so chown is refused unless it changes nothing
    os.chmod(other, 0o600)
    os.utime(other, ns=(1_000_000_000_000_000_007, 1_234_567_890_123_456_789))
    st = os.stat(other)
    assert (st.st_mode & 0o7777, st.st_mtime_ns) == (0o600, 1_234_567_890_123_456_789)
    with Client(str(cluster.registry_dir), cluster.config_path.read_text()) as c:
        seen = c.stat("/" + other.relative_to(root).as_posix())
        assert (seen.st_mode & 0o7777, seen.st_mtime_ns) == (0o600, 1_234_567_890_123_456_789)
    with pytest.raises(OSError) as e:
        os.chown(other, st.st_uid + 1, -1)
    assert e.value.errno == errno.EOPNOTSUPP
    os.chown(other, st.st_uid, st.st_gid)  # no change: accepted
    subprocess.run(["touch", "-d", "2020-01-02 03:04:05", str(other)], check=True)
    assert time.gmtime(os.stat(other).st_mtime)[:3] == (2020, 1, 2)


def test_unlink_of_an_open_file_keeps_it_readable_until_closed(mount: Mounted) -> None:
    root = mount.mountpoint
    path = root / "open.bin"
    body = data_for(2, 0, 2 * MIB + 7)
    path.write_bytes(body)
    fd = os.open(path, os.O_RDWR)
    os.unlink(path)
    assert not path.exists()
    hidden = [n for n in os.listdir(root) if n.startswith(".benchfs-unlinked-")]
    assert len(hidden) == 1, os.listdir(root)
    assert os.fstat(fd).st_nlink == 0
    assert os.pread(fd, len(body) + 10, 0) == body
    os.pwrite(fd, b"more", len(body))
    assert os.pread(fd, 10, len(body)) == b"more"
    # a new file under the old name is a different file
    path.write_bytes(b"new")
    assert os.pread(fd, 3, 0) == body[:3]
    os.close(fd)
    deadline = time.monotonic() + 10  # the release reaches the mount after close returns
    while any(n.startswith(".benchfs-unlinked-") for n in os.listdir(root)):
        assert time.monotonic() < deadline, os.listdir(root)
        time.sleep(0.05)
    assert sorted(os.listdir(root)) == ["open.bin"]
    assert path.read_bytes() == b"new"

    # renaming over an open file works the same way
    fd = os.open(path, os.O_RDONLY)
    (root / "src").write_bytes(b"replacement")
    os.rename(root / "src", path)
    assert os.pread(fd, 10, 0) == b"new"
    assert path.read_bytes() == b"replacement"
    os.close(fd)


def test_o_direct_with_aligned_buffers(mount: Mounted) -> None:
    path = mount.mountpoint / "direct.bin"
    size = 4 * MIB
    body = data_for(3, 0, size)
    buf = mmap.mmap(-1, size)  # page-aligned, as O_DIRECT wants
    buf[:] = body
    fd = os.open(path, os.O_CREAT | os.O_RDWR | os.O_DIRECT)
    try:
        assert os.pwrite(fd, buf, 0) == size
        os.fsync(fd)
        back = mmap.mmap(-1, size)
        assert os.preadv(fd, [back], 0) == size
        assert back[:] == body
        small = mmap.mmap(-1, 4096)
        assert os.preadv(fd, [small], size - 4096) == 4096
        assert small[:] == body[-4096:]
    finally:
        os.close(fd)
    assert os.stat(path).st_size == size
    assert path.read_bytes() == body


def test_two_readers_run_in_parallel(mount: Mounted) -> None:
    size = 32 * MIB
    paths = [mount.mountpoint / f"big{k}" for k in range(2)]
    for k, p in enumerate(paths):
        p.write_bytes(data_for(10 + k, 0, size))
    spans: dict[int, tuple[float, float]] = {}
    errors: list[BaseException] = []

    def reader(k: int) -> None:
        try:
            buf = mmap.mmap(-1, MIB)
            fd = os.open(paths[k], os.O_RDONLY | os.O_DIRECT)
            start = time.monotonic()
            try:
                for off in range(0, size, MIB):
                    assert os.preadv(fd, [buf], off) == MIB
                    assert buf[:] == data_for(10 + k, off, MIB)
            finally:
                os.close(fd)
            spans[k] = (start, time.monotonic())
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=reader, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a reader hung"
    assert errors == []
    (a0, a1), (b0, b1) = spans[0], spans[1]
    # Best effort (2 cores): the two readers were in flight at the same time.
    assert a0 < b1 and b0 < a1, spans


def test_busy_and_missing_mountpoints_are_refused(mount: Mounted, cluster: LocalCluster) -> None:
    for point, message in [(mount.mountpoint, "busy"), (mount.mountpoint / "nope", "exist")]:
        done = subprocess.run(
            [
                find_benchfs_mount(),
                "--registry",
                str(cluster.registry_dir),
                "--config",
                str(cluster.config_path),
                str(point),
            ],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert done.returncode == 1, done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and message in lines[0], done.stderr
    assert os.listdir(mount.mountpoint) == []  # the first mount is unharmed


def test_sigterm_unmounts_even_when_busy(cluster: LocalCluster, tmp_path: Path) -> None:
    point = tmp_path / "mnt"
    point.mkdir()
    with mounted(cluster.registry_dir, point, config_path=cluster.config_path, threads=2) as m:
        (point / "kept").write_bytes(b"kept")
        # 4 MiB direct transfers: the kernel must split them into 1 MiB requests, no smaller.
        buf = mmap.mmap(-1, 4 * MIB)
        buf[:] = data_for(5, 0, 4 * MIB)
        fd = os.open(point / "big", os.O_CREAT | os.O_RDWR | os.O_DIRECT)
        try:
            assert os.pwrite(fd, buf, 0) == 4 * MIB
            assert os.preadv(fd, [buf], 0) == 4 * MIB
        finally:
            os.close(fd)
    assert m.returncode == 0 and m.forced == [], m.output()
    assert not is_mounted(point)
    assert "unmounting" in m.output()
    served = m.output().split("served ")[-1]
    assert "reads: " in served and served.count("largest 1024 KiB") == 2, m.output()

    # A file still open at SIGTERM: the mount is detached lazily and the process exits 0.
    with mounted(cluster.registry_dir, point, config_path=cluster.config_path) as m:
        fd = os.open(point / "kept", os.O_RDONLY)
        try:
            start = time.monotonic()
            m.proc.terminate()
            assert m.proc.wait(timeout=30) == 0, m.output()
            assert time.monotonic() - start < 15
            assert not is_mounted(point)
        finally:
            # The connection is gone: close's flush fails (ENOTCONN), the descriptor is freed.
            with contextlib.suppress(OSError):
                os.close(fd)
    assert m.returncode == 0 and m.forced == [], m.output()
    assert "detached it lazily" in m.output()


def test_symbolic_links_through_the_mount(mount: Mounted, tmp_path: Path) -> None:
    """Links made with ln, read by the kernel (relative, absolute through the mount, dangling,
    to a directory), and a tree holding them packed with tar, unpacked into the mount and
    copied out with cp -a: each compared with the same steps on a local directory."""
    root = mount.mountpoint
    local = tmp_path / "local"
    local.mkdir()
    for base in (root, local):
        (base / "d").mkdir()
        (base / "d" / "f").write_bytes(b"data")
        subprocess.run(["ln", "-s", "f", str(base / "d" / "rel")], check=True)
        subprocess.run(["ln", "-s", str(base / "d"), str(base / "abs")], check=True)
        subprocess.run(["ln", "-s", "nowhere", str(base / "dangling")], check=True)
    assert os.readlink(root / "d" / "rel") == "f"
    assert (root / "d" / "rel").read_bytes() == b"data"
    assert (root / "abs" / "rel").read_bytes() == b"data"  # two links, one absolute
    assert os.lstat(root / "dangling").st_mode & 0o170000 == 0o120000
    assert not (root / "dangling").exists()
    assert sorted(os.listdir(root / "abs")) == ["f", "rel"]
    with pytest.raises(OSError) as e:
        os.open(root / "d" / "rel", os.O_RDONLY | os.O_NOFOLLOW)
    assert e.value.errno == errno.ELOOP
    # ls -l types them as links, as locally.
    listed = subprocess.run(
        ["ls", "-l", str(root / "d")], capture_output=True, text=True, check=True
    ).stdout
    assert "rel -> f" in listed and listed.count("\nl") == 1, listed
    # A tree with links through tar and cp -a, against the same on a local directory.
    archive = tmp_path / "tree.tar"
    subprocess.run(["tar", "cf", str(archive), "-C", str(local), "d", "dangling"], check=True)
    (root / "unpacked").mkdir()
    subprocess.run(["tar", "xf", str(archive), "-C", str(root / "unpacked")], check=True)
    assert os.readlink(root / "unpacked" / "d" / "rel") == "f"
    assert os.readlink(root / "unpacked" / "dangling") == "nowhere"
    out = tmp_path / "copied"
    subprocess.run(["cp", "-a", str(root / "unpacked"), str(out)], check=True)
    assert os.readlink(out / "d" / "rel") == "f" and (out / "d" / "rel").read_bytes() == b"data"
    # Hard links are refused as on a file system without them.
    refused = subprocess.run(
        ["ln", str(root / "d" / "f"), str(root / "hard")], capture_output=True, text=True
    )
    assert refused.returncode == 1 and refused.stderr.strip().endswith(": Operation not permitted")
    # Renamed and removed: the link, never its target.
    os.rename(root / "d" / "rel", root / "d" / "moved")
    assert os.readlink(root / "d" / "moved") == "f"
    os.unlink(root / "d" / "moved")
    assert (root / "d" / "f").read_bytes() == b"data"


WAIT_FOR_LOCK = r"""
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR)
print("waiting", flush=True)
fcntl.lockf(fd, fcntl.LOCK_EX)
print("granted", flush=True)
"""


@pytest.mark.timeout(120)
def test_lock_waiters_end_with_the_mount(cluster: LocalCluster, tmp_path: Path) -> None:
    """Waiting lock requests run on waiter threads, each with a client of its own. At the
    mount's end the idle ones close their clients before the process exits, and one still
    blocked in a wait does not race the exit: the mount exits 0 either way (it once died of
    SIGSEGV in UCX's exit-time clean-up)."""
    holder_point, waiter_point = tmp_path / "a", tmp_path / "b"
    holder_point.mkdir()
    waiter_point.mkdir()
    config = cluster.config_path

    def waiters(n: int, point: Path) -> list[subprocess.Popen[str]]:
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", WAIT_FOR_LOCK, str(point / "locked")],
                stdout=subprocess.PIPE,
                text=True,
            )
            for _ in range(n)
        ]
        for p in procs:
            assert p.stdout is not None and p.stdout.readline() == "waiting\n"
        return procs

    with mounted(cluster.registry_dir, holder_point, config_path=config) as holder:
        (holder_point / "locked").write_bytes(b"x" * 64)
        for blocked_at_end in (False, True):
            with mounted(cluster.registry_dir, waiter_point, config_path=config) as m:
                fd = os.open(holder_point / "locked", os.O_RDWR)
                fcntl.lockf(fd, fcntl.LOCK_EX)
                procs = waiters(8, waiter_point)
                time.sleep(0.5)  # every request is on a waiter thread
                os.close(fd)  # releases the lock: the eight take it in turn
                for p in procs:
                    assert p.wait(timeout=60) == 0 and p.stdout is not None
                    assert p.stdout.read() == "granted\n"
                stuck: list[subprocess.Popen[str]] = []
                if blocked_at_end:
                    fd = os.open(holder_point / "locked", os.O_RDWR)
                    fcntl.lockf(fd, fcntl.LOCK_EX)
                    stuck = waiters(1, waiter_point)
                    time.sleep(0.5)
                    m.proc.terminate()
                    assert m.proc.wait(timeout=30) == 0, m.output()
                    os.close(fd)
                for p in stuck:
                    p.kill()
                    p.wait(timeout=30)
            assert m.returncode == 0 and m.forced == [], m.output()
            assert not is_mounted(waiter_point)
            if blocked_at_end:
                assert "detached it lazily" in m.output(), m.output()
    assert holder.returncode == 0 and holder.forced == [], holder.output()


HOLD_LOCK = r"""
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR)
fcntl.lockf(fd, fcntl.LOCK_EX)
print("held", flush=True)
sys.stdin.read()
"""


@pytest.mark.timeout(60)
def test_a_close_releases_only_its_own_locks(cluster: LocalCluster, tmp_path: Path) -> None:
    """Another process opening and closing the locked file on the same mount releases
    nothing: each open file description is its own at RELEASE (once every description was
    handle 0, and any close let go of every lock taken through the mount on the file)."""
    here, there = tmp_path / "a", tmp_path / "b"
    here.mkdir()
    there.mkdir()
    config = cluster.config_path
    with (
        mounted(cluster.registry_dir, here, config_path=config) as m,
        mounted(cluster.registry_dir, there, config_path=config) as other,
    ):
        (here / "locked").write_bytes(b"x" * 64)
        holder = subprocess.Popen(
            [sys.executable, "-c", HOLD_LOCK, str(here / "locked")],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            assert holder.stdout is not None and holder.stdout.readline() == "held\n"
            for _ in range(3):  # opens and closes beside the holder's, on its mount
                os.close(os.open(here / "locked", os.O_RDONLY))
            fd = os.open(there / "locked", os.O_RDWR)
            try:
                with pytest.raises(OSError) as refused:
                    fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                assert refused.value.errno in (errno.EAGAIN, errno.EACCES)
            finally:
                os.close(fd)
        finally:
            assert holder.stdin is not None
            holder.stdin.close()
            assert holder.wait(timeout=30) == 0
    for mount in (m, other):
        assert mount.returncode == 0 and mount.forced == [], mount.output()

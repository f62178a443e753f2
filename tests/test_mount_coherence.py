"""Coherence of the FUSE mount under concurrency on one file: several jobs, handles, threads
and processes of one mount write and read the same file, and every byte read is checked.
The cases are the ones that once failed (docs/mount.md, "Coherence"): fio's own verification
with jobs writing interleaved blocks of one file, libaio random writes with many in flight,
O_DIRECT readers of a fresh write, readers while another thread writes and truncates, and
RENAME_NOREPLACE raced from two mounts."""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import shutil
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from benchfs.cluster import LocalCluster
from benchfs.mount import Mounted
from benchfs.telemetry import load
from benchfs.units import MIB
from conftest import checked_mount, data_for

pytestmark = pytest.mark.skipif(
    not os.path.exists("/dev/fuse") or shutil.which("fusermount3") is None,
    reason="needs /dev/fuse and fusermount3 (scripts/bootstrap installs fuse3)",
)

FIO = shutil.which("fio")
needs_fio = pytest.mark.skipif(FIO is None, reason="fio is not installed")


@pytest.fixture
def cluster(daemon_cluster: Callable[..., LocalCluster]) -> LocalCluster:
    return daemon_cluster(3)


@pytest.fixture
def mount(cluster: LocalCluster, tmp_path: Path) -> Iterator[Mounted]:
    yield from checked_mount(cluster, tmp_path / "mnt")


def fio(mount: Mounted, *args: str) -> None:
    """Runs fio in the mount; fails with fio's own words on any error or verify failure."""
    assert FIO is not None
    done = subprocess.run(
        [FIO, f"--directory={mount.mountpoint}", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=mount.mountpoint.parent,  # fio's verify state files go here
    )
    out = done.stderr + done.stdout
    assert done.returncode == 0 and "verify" not in done.stderr, f"fio {args}:\n{out[-3000:]}"


#: (block size, O_DIRECT, jobs): 47008 and 3333 are not page multiples.
INTERLEAVED = [
    (4096, 0, 4),
    (4096, 1, 2),
    (47008, 0, 3),
    (47008, 1, 3),
    (MIB, 0, 2),
    (MIB, 1, 4),
    (3333, 0, 2),
    (3333, 1, 3),
]


def fio_interleaved(mount: Mounted, bs: int, direct: int, jobs: int) -> None:
    """`jobs` jobs write disjoint interleaved blocks of one file (job k writes blocks k,
    k + jobs, ...) and each verifies its blocks while the others write (md5, backlog 64)."""
    blocks = max(8, min(96, (3 * MIB) // bs))
    fio(
        mount,
        "--name=shared",
        "--filename=shared.dat",
        f"--numjobs={jobs}",
        f"--rw=write:{bs * (jobs - 1)}",
        f"--bs={bs}",
        f"--offset_increment={bs}",
        f"--io_size={bs * blocks}",
        f"--size={bs * blocks * jobs}",
        "--verify=md5",
        "--verify_backlog=64",
        "--verify_fatal=1",
        f"--direct={direct}",
    )
    os.unlink(mount.mountpoint / "shared.dat")


def fio_libaio(mount: Mounted, direct: int, size: str = "24M") -> None:
    """Random writes of 4 KiB to 1 MiB, 16 in flight, then fio verifies every block."""
    fio(
        mount,
        "--name=aio",
        "--filename=aio.dat",
        "--ioengine=libaio",
        "--iodepth=16",
        f"--direct={direct}",
        "--rw=randwrite",
        "--bsrange=4k-1m",
        "--verify=md5",
        "--verify_fatal=1",
        f"--size={size}",
    )
    os.unlink(mount.mountpoint / "aio.dat")


def direct_readers_of_a_fresh_write(mount: Mounted, readers: int = 2) -> None:
    """One descriptor writes 1 MiB with O_DIRECT; threads with their own descriptors then read
    it at once, each read whole and right (they once got 0 bytes)."""
    path = mount.mountpoint / "fresh.dat"
    data = data_for(11, 0, MIB)
    buf = mmap.mmap(-1, MIB)  # page-aligned, as O_DIRECT wants
    buf.write(data)
    fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_DIRECT, 0o644)
    bad: list[str] = []
    try:
        assert os.pwrite(fd, buf, 0) == MIB

        def read() -> None:
            rfd = os.open(path, os.O_RDONLY | os.O_DIRECT)
            into = mmap.mmap(-1, MIB)
            try:
                for i in range(20):
                    got = os.preadv(rfd, [into], 0)
                    if got != MIB or into[:] != data:
                        bad.append(f"read {i}: {got} bytes, equal: {into[:got] == data[:got]}")
            finally:
                os.close(rfd)

        threads = [threading.Thread(target=read) for _ in range(readers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        os.close(fd)
        os.unlink(path)
    assert bad == [], bad


def _expected(seed: int, length: int) -> np.ndarray:
    return np.frombuffer(data_for(seed, 0, length), dtype=np.uint8)


def readers_while_writing_and_truncating(mount: Mounted, bs: int, direct: bool) -> None:
    """A writer thread rewrites one file round after round (round r: seed r), cutting it back
    once in the middle of each round, through its own descriptor; two reader threads with
    their own descriptors read the whole file meanwhile. At each checkpoint (all wait) a reader
    must see exactly what was written (not yet published), then exactly the first third after
    a truncate; in between, every byte read must be one the file held at some moment: round
    r's, round r-1's, or a zero of a truncated range."""
    path = mount.mountpoint / "moving.dat"
    size = min(2 * MIB, 128 * bs) + 12345  # not a block multiple; at most 128 writes a round
    flags = os.O_DIRECT if direct else 0
    rounds = 4
    wfd = os.open(path, os.O_CREAT | os.O_RDWR | flags, 0o644)
    checkpoint = threading.Barrier(3, timeout=60)
    writing = threading.Event()
    writing.set()
    problems: list[str] = []
    aligned = mmap.mmap(-1, max(bs, size + MIB))  # page-aligned, as O_DIRECT wants

    def read_all(fd: int) -> bytes:
        if not direct:
            return os.pread(fd, size + MIB, 0)
        into = mmap.mmap(-1, size + MIB)
        n = os.preadv(fd, [into], 0)
        return into[:n]

    def write(data: bytes, offset: int) -> None:
        if direct:
            aligned[: len(data)] = data
            done = os.pwrite(wfd, memoryview(aligned)[: len(data)], offset)
        else:
            done = os.pwrite(wfd, data, offset)
        assert done == len(data)

    def check_exact(fd: int, seed: int, length: int, what: str) -> None:
        got, want = read_all(fd), data_for(seed, 0, length)
        if got != want:
            at = next((i for i, (x, y) in enumerate(zip(got, want, strict=False)) if x != y), None)
            problems.append(f"{what}: read {len(got)} of {length} bytes, first wrong byte {at}")

    def reader() -> None:
        fd = os.open(path, os.O_RDONLY | flags)
        try:
            for r in range(rounds):
                while writing.is_set():
                    got = np.frombuffer(read_all(fd), dtype=np.uint8)
                    if len(got) > size:
                        problems.append(f"round {r}: read {len(got)} bytes of at most {size}")
                        continue
                    new, old = _expected(r, len(got)), _expected(max(r - 1, 0), len(got))
                    wrong = ~((got == 0) | (got == new) | (got == old))
                    if wrong.any():
                        at = int(np.argmax(wrong))
                        problems.append(f"round {r}: byte {at} is {got[at]}, from no round")
                checkpoint.wait()  # 1: round r written
                check_exact(fd, r, size, f"round {r} written")
                checkpoint.wait()  # 2
                checkpoint.wait()  # 3: cut to a third
                check_exact(fd, r, size // 3, f"round {r} truncated")
                checkpoint.wait()  # 4
                checkpoint.wait()  # 5: grown back with zeros, the next round under way
        finally:
            os.close(fd)

    threads = [threading.Thread(target=reader) for _ in range(2)]
    try:
        for t in threads:
            t.start()
        for r in range(rounds):
            data = data_for(r, 0, size)
            for off in range(0, size, bs):
                write(data[off : off + bs], off)
                if off == bs * 3:  # cut back to one block in the middle of the round
                    os.ftruncate(wfd, bs)
                    write(data[bs : bs * 4], bs)
            writing.clear()
            checkpoint.wait()  # 1
            checkpoint.wait()  # 2
            os.ftruncate(wfd, size // 3)
            checkpoint.wait()  # 3
            checkpoint.wait()  # 4
            os.ftruncate(wfd, size)
            writing.set()
            checkpoint.wait()  # 5
    except BaseException:
        # Only on failure: aborting after a normal last wait can break a reader that has not
        # yet woken from it.
        writing.clear()
        checkpoint.abort()
        raise
    finally:
        for t in threads:
            t.join(60)
        os.close(wfd)
        os.unlink(path)
    assert problems == [], problems[:10]


RENAME_NOREPLACE = 1
_libc = ctypes.CDLL(None, use_errno=True)


def renameat2_noreplace(src: Path, dst: Path) -> int:
    """renameat2(src, dst, RENAME_NOREPLACE): 0 or the errno."""
    at_fdcwd = -100
    done = _libc.renameat2(at_fdcwd, bytes(src), at_fdcwd, bytes(dst), RENAME_NOREPLACE)
    return 0 if done == 0 else ctypes.get_errno()


# --- make test: each case once --------------------------------------------------------------


@needs_fio
@pytest.mark.parametrize(("bs", "direct", "jobs"), INTERLEAVED)
def test_fio_jobs_writing_interleaved_blocks_of_one_file_verify(
    mount: Mounted, bs: int, direct: int, jobs: int
) -> None:
    fio_interleaved(mount, bs, direct, jobs)


@needs_fio
@pytest.mark.parametrize("direct", [1, 0])
def test_fio_libaio_random_writes_verify(mount: Mounted, direct: int) -> None:
    fio_libaio(mount, direct)


def test_direct_readers_see_a_fresh_write_at_once(mount: Mounted) -> None:
    direct_readers_of_a_fresh_write(mount)


#: (block size, O_DIRECT) of the writer thread.
MOVING = [(47008, False), (MIB, False), (4096, True), (MIB, True)]


@pytest.mark.parametrize(("bs", "direct"), MOVING)
def test_readers_while_another_thread_writes_and_truncates(
    mount: Mounted, bs: int, direct: bool
) -> None:
    readers_while_writing_and_truncating(mount, bs, direct)


def test_a_mount_writing_behind_stays_coherent(
    daemon_cluster: Callable[..., LocalCluster], tmp_path: Path
) -> None:
    """With client.write_behind set, a write returns before its servers answer; the mount's
    other threads and processes still read every byte at once (a read waits for the process's
    writes behind, whichever thread's client made them), fio's jobs verify, and a truncate
    falls between writes as without it."""
    cluster = daemon_cluster(3, "client.write_behind=32M")
    mounted_ = checked_mount(cluster, tmp_path / "mnt")
    mount = next(mounted_)
    try:
        direct_readers_of_a_fresh_write(mount)
        readers_while_writing_and_truncating(mount, 47008, False)
        readers_while_writing_and_truncating(mount, 4096, True)
        if FIO is not None:
            fio_interleaved(mount, 47008, 0, 3)
            fio_interleaved(mount, MIB, 1, 4)
    finally:
        next(mounted_, None)


def test_rename_noreplace_is_atomic_across_mounts(cluster: LocalCluster, tmp_path: Path) -> None:
    """Two mounts race RENAME_NOREPLACE onto the same names: exactly one wins each name and
    the name holds the winner's bytes (a check followed by a rename let both win)."""
    mounts = [checked_mount(cluster, tmp_path / f"mnt{k}") for k in range(2)]
    a, b = (next(m) for m in mounts)
    try:
        names = 40
        for i in range(names):
            (a.mountpoint / f"a{i}").write_bytes(b"a" * (i + 1))
            (b.mountpoint / f"b{i}").write_bytes(b"b" * (i + 1))
        outcomes: dict[str, list[int]] = {"a": [], "b": []}
        start = threading.Barrier(2)

        def race(side: str, m: Mounted) -> None:
            start.wait()
            for i in range(names):
                outcomes[side].append(
                    renameat2_noreplace(m.mountpoint / f"{side}{i}", m.mountpoint / f"t{i}")
                )

        threads = [threading.Thread(target=race, args=(s, m)) for s, m in (("a", a), ("b", b))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        for i in range(names):
            pair = (outcomes["a"][i], outcomes["b"][i])
            assert sorted(pair) == [0, errno.EEXIST], (i, pair)
            winner = "a" if pair[0] == 0 else "b"
            assert (a.mountpoint / f"t{i}").read_bytes() == winner.encode() * (i + 1), i
            loser = "b" if winner == "a" else "a"
            assert (a.mountpoint / f"{loser}{i}").exists(), i  # the loser keeps its name
    finally:
        for m in mounts:
            for _ in m:
                pass


def test_an_open_sees_sizes_another_mount_published(cluster: LocalCluster, tmp_path: Path) -> None:
    """Close-to-open across mounts for sizes too: mount B has the file's attributes cached
    (1 s); mount A grows it, then cuts it, each time closing; B's next open sees each size,
    within the attribute cache's lifetime."""
    mounts = [checked_mount(cluster, tmp_path / f"mnt{k}") for k in range(2)]
    a, b = (next(m) for m in mounts)
    try:
        for round_ in range(3):
            name = f"shared{round_}"
            (a.mountpoint / name).write_bytes(b"")
            assert (b.mountpoint / name).stat().st_size == 0  # now cached by B's kernel
            data = data_for(round_, 0, MIB + 17)
            (a.mountpoint / name).write_bytes(data)  # opened, written, closed: published
            assert (b.mountpoint / name).read_bytes() == data
            os.truncate(a.mountpoint / name, 100)
            with open(b.mountpoint / name, "rb") as f:
                assert os.fstat(f.fileno()).st_size == 100
                assert f.read() == data[:100]
    finally:
        for m in mounts:
            for _ in m:
                pass


def test_remove_right_after_close_from_several_threads(mount: Mounted) -> None:
    """The kernel sends a file's RELEASE after close() returned, and the mount's event loops
    run in parallel, so an unlink can be served before the RELEASE queued ahead of it (the
    file is then hidden and removed a moment later). What a program sees must not change:
    write, close, unlink and rmdir at once, from several threads, never fail, and nothing is
    left behind."""
    root = mount.mountpoint
    failures: list[str] = []

    def churn(worker: int) -> None:
        try:
            for i in range(150):
                d = root / f"w{worker}-{i}"
                d.mkdir()
                (d / "f").write_bytes(data_for(i, 0, 4096 + worker))
                os.unlink(d / "f")
                os.rmdir(d)
        except OSError as e:
            failures.append(f"thread {worker}: {e}")

    threads = [threading.Thread(target=churn, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not failures, failures
    assert os.listdir(root) == []


@needs_fio
def test_a_healthy_fio_run_counts_no_server_errors(
    daemon_cluster: Callable[..., LocalCluster], tmp_path: Path
) -> None:
    """Servers count only their own faults as errors (docs/telemetry.md): fio through the mount,
    shared-file and many-file jobs with creations, lookups of names not there yet and unlinks,
    leaves every server's `errors`, `malformed` and `rejected_busy` at 0."""
    tel_dir = tmp_path / "telemetry"
    cluster = daemon_cluster(3, f"telemetry.dir={tel_dir}")
    for m in checked_mount(cluster, tmp_path / "mnt"):
        fio_interleaved(m, 47008, 0, 3)
        fio_libaio(m, 1)
        fio(
            m,
            "--name=many",
            "--nrfiles=200",
            "--filesize=16k",
            "--rw=randrw",
            "--bs=4k",
            "--numjobs=2",
            "--verify=crc32c",
            "--unlink=1",
        )
    cluster.stop(grace_s=5.0)
    last = load(tel_dir).latest_counters()
    assert set(last["server"]) == {0, 1, 2}
    total = last.groupby("metric", observed=True)["value"].sum()
    assert total["ops"] > 1000
    for metric in ("errors", "malformed", "rejected_busy"):
        assert total[metric] == 0, last[last["metric"] == metric]


# --- make test-long: 20 consecutive runs of each ---------------------------------------------


@pytest.mark.long
@pytest.mark.timeout(1500)
def test_mount_coherence_20_runs(mount: Mounted) -> None:
    for run in range(20):
        print(f"run {run}")
        if FIO is not None:
            for bs, direct, jobs in INTERLEAVED:
                fio_interleaved(mount, bs, direct, jobs)
            fio_libaio(mount, 1, "64M")
            fio_libaio(mount, 0, "64M")
        direct_readers_of_a_fresh_write(mount)
        for bs, direct in MOVING:
            readers_while_writing_and_truncating(mount, bs, direct)

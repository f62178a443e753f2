"""Integration: real servers, several clients, unaligned I/O over many chunks, all verified."""

from __future__ import annotations

import errno
import itertools
import os
import random
import stat
import subprocess
import sys
import threading
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchfs import Client, File
from benchfs.cluster import child_env
from benchfs.mpi import MpiLauncher
from benchfs.results import read_json
from benchfs.units import KIB, MIB
from benchfs.workloads.rw import (
    Pattern,
    PatternBuffer,
    VerificationError,
    read_and_verify,
    write_file,
)
from conftest import config_text, data_for

CHUNK = 64 * KIB
CREATE = os.O_RDWR | os.O_CREAT


def write_in_random_pieces(f: File, seed: int, start: int, end: int) -> None:
    """Write [start, end) in pieces of random, unaligned sizes (and in a shuffled order)."""
    rng = random.Random(seed)
    cuts = sorted({start, end, *(rng.randrange(start, end) for _ in range(40))})
    pieces = list(itertools.pairwise(cuts))
    rng.shuffle(pieces)
    for lo, hi in pieces:
        assert f.pwrite(data_for(seed, lo, hi - lo), lo) == hi - lo


@contextmanager
def fails_with(code: int) -> Iterator[None]:
    """The block raises an OSError with errno `code`."""
    with pytest.raises(OSError) as failure:
        yield
    assert failure.value.errno == code, f"{failure.value!r}: expected {errno.errorcode[code]}"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("servers", [2, 4])
def test_clients_in_threads_verify_every_byte(inproc_cluster, servers: int) -> None:
    cluster = inproc_cluster(servers)
    clients = 4
    size = 3 * MIB + 12_345  # about 49 chunks, ending inside one
    shared_size = clients * 777_777
    errors: list[str] = []
    barrier = threading.Barrier(clients)

    def work(rank: int) -> None:
        try:
            with Client(str(cluster.registry), config=cluster.config) as client:
                assert client.server_ids() == list(range(servers))
                with client.open(f"/thread-{rank}.dat", CREATE | os.O_TRUNC) as f:
                    write_in_random_pieces(f, rank, 0, size)
                # Each client also fills its own unaligned slice of one shared file, through
                # its own handle; closing publishes the end it wrote.
                lo, hi = rank * 777_777, (rank + 1) * 777_777
                with client.open("/shared.dat", CREATE) as f:
                    write_in_random_pieces(f, 100, lo, hi)
                barrier.wait(timeout=60)
                # Read back another client's file, so the data crosses clients.
                peer = (rank + 1) % clients
                with client.open(f"/thread-{peer}.dat") as f:
                    assert f.size == size
                    got = f.pread(size, 0)
                assert got == data_for(peer, 0, size), f"client {rank} read bad data of {peer}"
                assert client.stat(f"/thread-{peer}.dat").st_size == size
                with client.open("/shared.dat") as f:
                    assert f.pread(shared_size + 1, 0) == data_for(100, 0, shared_size)
                assert client.stat("/shared.dat").st_size == shared_size
        except BaseException:
            # Keep the text only: a saved traceback would drop the client on another thread.
            errors.append(traceback.format_exc())
            barrier.abort()

    threads = [threading.Thread(target=work, args=(r,)) for r in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=100)
    assert not any(t.is_alive() for t in threads), "a client thread hung"
    assert not errors, errors[0]


@pytest.mark.timeout(60)
def test_holes_read_as_zeros_and_reads_past_end_are_short(inproc_cluster) -> None:
    cluster = inproc_cluster(3)
    with Client(str(cluster.registry), config=cluster.config) as client:
        # One write far into the file leaves a hole spanning several chunks before it.
        offset = 5 * CHUNK + 1_001
        data = data_for(7, offset, 3_000)
        size = offset + len(data)
        with client.open("/holes.dat", CREATE) as f:
            assert f.pwrite(data, offset) == len(data)
            assert f.size == size
            # The writer's own handle reads the hole before publishing.
            assert f.pread(size + 10, 0) == bytes(offset) + data
        assert client.stat("/holes.dat").st_size == size

        with client.open("/holes.dat", "r+") as f:
            assert f.size == size
            assert f.pread(offset, 0) == bytes(offset)
            assert f.pread(20, CHUNK - 10) == bytes(20)
            assert f.pread(10, offset - 5) == bytes(5) + data[:5]

            # Past the end: a short count, then nothing.
            assert f.pread(1_000, size - 100) == data[-100:]
            assert f.pread(10, size) == b""
            assert f.pread(10, size + 10 * CHUNK) == b""

            buf = bytearray(b"\xff" * 500)
            assert f.preadinto(buf, size - 200) == 200
            assert bytes(buf[:200]) == data[-200:]
            view = memoryview(bytearray(4 * KIB))
            assert f.preadinto(view, 2 * CHUNK) == 4 * KIB
            assert bytes(view) == bytes(4 * KIB)

            # Zero-length operations are no-ops.
            assert f.pwrite(b"", 10) == 0
            assert f.pread(0, 10) == b""
            assert f.size == size
        assert client.stat("/holes.dat").st_size == size


@pytest.mark.timeout(60)
def test_write_accepts_buffer_types_and_overwrites(inproc_cluster) -> None:
    cluster = inproc_cluster(2)
    with Client(str(cluster.registry), config=cluster.config) as client:
        base = data_for(1, 0, 3 * CHUNK)
        with client.open("/types.dat", CREATE) as f:
            assert f.pwrite(bytearray(base), 0) == len(base)
        patch = data_for(2, CHUNK - 3, 10)
        with client.open("/types.dat", "r+") as f:
            assert f.pwrite(memoryview(patch), CHUNK - 3) == 10
        want = base[: CHUNK - 3] + patch + base[CHUNK + 7 :]
        with client.open("/types.dat") as f:
            assert f.pread(len(base), 0) == want
        assert client.stat("/types.dat").st_size == len(base)


_file_counter = iter(range(1_000_000))


@pytest.mark.timeout(120)
def test_random_writes_match_a_model(inproc_cluster) -> None:
    """Any sequence of writes, read back anywhere, matches a plain bytearray model."""
    cluster = inproc_cluster(3, "layout.chunk_size=4096")
    client = Client(str(cluster.registry), config=cluster.config)
    writes = st.lists(
        st.tuples(st.integers(0, 40_000), st.integers(0, 10_000), st.integers(0, 1_000)),
        min_size=1,
        max_size=8,
    )
    reads = st.lists(st.tuples(st.integers(0, 52_000), st.integers(0, 20_000)), max_size=5)

    @settings(max_examples=40, deadline=None)
    @given(writes=writes, reads=reads)
    def check(writes: list[tuple[int, int, int]], reads: list[tuple[int, int]]) -> None:
        path = f"/model-{next(_file_counter)}.dat"
        model = bytearray()
        with client.open(path, CREATE | os.O_EXCL) as f:
            for offset, length, seed in writes:
                data = data_for(seed, offset, length)
                assert f.pwrite(data, offset) == length
                if length:
                    model.extend(bytes(max(0, offset + length - len(model))))
                    model[offset : offset + length] = data
            # The writer sees its own writes before publishing them.
            assert f.size == len(model)
            assert f.pread(len(model) + 100, 0) == bytes(model)
        assert client.stat(path).st_size == len(model)
        with client.open(path) as f:
            assert f.size == len(model)
            assert f.pread(len(model) + 100, 0) == bytes(model)
            for offset, length in reads:
                assert f.pread(length, offset) == bytes(model[offset : offset + length])

    try:
        check()
    finally:
        client.close()


@pytest.mark.timeout(60)
def test_verification_names_misplaced_data(inproc_cluster) -> None:
    """The workload's check reports whose bytes it found where, not only that they differ."""
    cluster = inproc_cluster(2)
    with Client(str(cluster.registry), config=cluster.config) as client:
        write_file(
            client, "/rank-0.dat", PatternBuffer(Pattern(1), 300_000, 65_536), 300_000, 65_536
        )
        with pytest.raises(
            VerificationError,
            match="expected data of rank 0 at offset 0, found data of rank 1 at offset 0",
        ):
            read_and_verify(
                client, "/rank-0.dat", PatternBuffer(Pattern(0), 300_000, 65_536), 300_000, 65_536
            )
        # A correct file passes, with an unaligned transfer size.
        data = PatternBuffer(Pattern(2), 300_001, 9_999)
        write_file(client, "/rank-2.dat", data, 300_001, 9_999)
        result = read_and_verify(client, "/rank-2.dat", data, 300_001, 9_999)
        assert result.bytes == 300_001


@pytest.mark.timeout(120)
def test_daemons_and_mpi_clients_cross_read(daemon_cluster, tmp_path: Path) -> None:
    """Four benchfsd daemons, three MPI client processes, unaligned transfers over many chunks."""
    cluster = daemon_cluster(4)
    out = tmp_path / "workload"
    launcher = MpiLauncher()
    cmd = launcher.command(
        3,
        [
            sys.executable,
            "-m",
            "benchfs.workloads.rw",
            "--registry",
            str(cluster.registry_dir),
            "--file-size",
            str(MIB + 4_321),
            "--transfer-size",
            "100003",
            "--out",
            str(out),
            "--config",
            str(cluster.config_path),
        ],
    )
    proc = subprocess.run(
        cmd, env=launcher.env(child_env()), capture_output=True, text=True, timeout=100
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = read_json(out / "summary.json")
    assert summary["verified"] is True
    assert summary["ranks"] == 3
    assert summary["servers"] == [0, 1, 2, 3]
    assert summary["bytes"] == 3 * (MIB + 4_321)
    assert summary["errors"] == []
    for rank in range(3):
        record = read_json(out / f"rank-{rank}.json")
        assert record["verified"] is True
        assert record["read"] == f"/rank-{(rank + 1) % 3}.dat"


# ---------------------------------------------------------------------------------------------
# The namespace through Python: paths, directories, errors, consistency, truncation


@pytest.mark.timeout(60)
def test_namespace_operations_and_their_errors(inproc_cluster) -> None:
    cluster = inproc_cluster(3)  # inodes and directory entries spread over three owners
    with Client(str(cluster.registry), config=cluster.config) as client:
        assert client.stat("/").kind == "dir"
        assert client.readdir("/") == []
        client.mkdir("/d")
        attr = client.stat("/d")
        assert (attr.kind, stat.S_IMODE(attr.st_mode)) == ("dir", 0o755)
        with fails_with(errno.EEXIST):
            client.mkdir("/d")

        data = data_for(1, 0, 3 * CHUNK + 5)
        with client.open("/d/f", CREATE | os.O_EXCL, 0o600) as f:
            assert (f.name, f.size) == ("/d/f", 0)
            assert f.pwrite(data, 0) == len(data)
            file_id = f.id
        assert f.closed
        attr = client.stat("/d/f")
        assert (attr.kind, attr.st_size, attr.id, stat.S_IMODE(attr.st_mode)) == (
            "file",
            len(data),
            file_id,
            0o600,
        )
        assert attr.chunk_size == CHUNK and 1 <= attr.stripe_count <= 3
        assert attr.st_mtime_ns > 0 and attr.st_ctime_ns > 0
        assert client.readdir("/") == [("d", "dir")]
        assert client.readdir("/d") == [("f", "file")]
        # Paths are normalized: the same file under another spelling.
        assert client.stat("//d/./f").id == file_id
        assert client.stat("/d/x/../f").id == file_id

        # Creating and opening.
        with fails_with(errno.EEXIST):
            client.open("/d/f", CREATE | os.O_EXCL)
        with fails_with(errno.ENOENT):
            client.open("/d/missing")
        with fails_with(errno.ENOENT):
            client.stat("/d/missing")
        with fails_with(errno.ENOENT):
            client.open("/nodir/f", CREATE)
        with fails_with(errno.ENOENT):
            client.mkdir("/nodir/sub")
        with fails_with(errno.ENOENT):
            client.readdir("/nodir")
        with fails_with(errno.EISDIR):
            client.open("/d", CREATE)
        with fails_with(errno.EISDIR):
            client.open("/d")
        with fails_with(errno.EISDIR):
            client.locate("/d", 0)
        with fails_with(errno.ENOTDIR):
            client.open("/d/f/x", CREATE)
        with fails_with(errno.ENOTDIR):
            client.mkdir("/d/f/sub")
        with fails_with(errno.ENOTDIR):
            client.readdir("/d/f")
        with fails_with(errno.EEXIST):
            client.mkdir("/d/f")
        # The failed creations left no entries behind.
        assert client.readdir("/") == [("d", "dir")]
        assert client.readdir("/d") == [("f", "file")]

        # Names and paths.
        with fails_with(errno.ENAMETOOLONG):
            client.open("/" + "n" * 256, CREATE)
        with fails_with(errno.ENAMETOOLONG):
            client.mkdir("/d/" + "n" * 256)
        with client.open("/d/" + "n" * 255, CREATE) as f:
            assert f.size == 0
        for bad in ("relative", "d/f", "/a\0b", "/..", "/d/../.."):
            with fails_with(errno.EINVAL):
                client.open(bad, CREATE)
            with fails_with(errno.EINVAL):
                client.stat(bad)
        with fails_with(errno.EINVAL):
            client.mkdir("/d/\0")

        # Directories that are not empty stay where they are.
        with fails_with(errno.ENOTEMPTY):
            client.rmdir("/d")
        with fails_with(errno.EXDEV):
            client.rename("/d", "/e")
        with fails_with(errno.ENOENT):
            client.stat("/e")
        assert client.readdir("/d") == sorted([("f", "file"), ("n" * 255, "file")])

        # Renaming a file moves its name, not its data.
        client.rename("/d/f", "/g")
        with fails_with(errno.ENOENT):
            client.stat("/d/f")
        attr = client.stat("/g")
        assert (attr.id, attr.st_size) == (file_id, len(data))
        with client.open("/g") as f:
            assert f.pread(len(data) + 10, 0) == data
        assert client.readdir("/") == [("d", "dir"), ("g", "file")]
        assert client.readdir("/d") == [("n" * 255, "file")]
        # A file replaces a file.
        with client.open("/h", CREATE) as f:
            f.pwrite(b"the old h", 0)
        client.rename("/g", "/h")
        with fails_with(errno.ENOENT):
            client.stat("/g")
        assert client.stat("/h").id == file_id
        with client.open("/h") as f:
            assert f.pread(len(data) + 10, 0) == data
        # An empty directory moves; a directory never moves into itself.
        client.mkdir("/empty")
        with fails_with(errno.EINVAL):
            client.rename("/empty", "/empty/inside")
        client.rename("/empty", "/moved")
        assert client.stat("/moved").kind == "dir"
        with fails_with(errno.ENOENT):
            client.stat("/empty")
        assert client.readdir("/") == [("d", "dir"), ("h", "file"), ("moved", "dir")]

        # Removing.
        with fails_with(errno.EISDIR):
            client.unlink("/d")
        with fails_with(errno.ENOTDIR):
            client.rmdir("/h")
        client.unlink("/d/" + "n" * 255)
        assert client.readdir("/d") == []
        client.rmdir("/d")
        with fails_with(errno.ENOENT):
            client.rmdir("/d")
        with fails_with(errno.ENOENT):
            client.unlink("/d/f")
        client.unlink("/h")
        with fails_with(errno.ENOENT):
            client.unlink("/h")
        with fails_with(errno.ENOENT):
            client.locate("/h", 0)
        client.rmdir("/moved")
        assert client.readdir("/") == []
        # The name can be used again: a new, empty file.
        with client.open("/h", CREATE) as f:
            assert f.size == 0 and f.id != file_id
            assert f.pread(100, 0) == b""


@pytest.mark.timeout(60)
def test_close_to_open_consistency(inproc_cluster) -> None:
    """The size is the largest end a writer published (at close or fsync); readers that
    opened earlier see it when they read past what they knew."""
    cluster = inproc_cluster(2)
    registry, config = str(cluster.registry), cluster.config
    data = data_for(3, 0, 5 * CHUNK + 77)
    with Client(registry, config=config) as writer, Client(registry, config=config) as reader:
        w = writer.open("/c2o.dat", CREATE)
        assert w.pwrite(data[: 2 * CHUNK], 0) == 2 * CHUNK
        # Nothing is published yet.
        assert reader.stat("/c2o.dat").st_size == 0
        early = reader.open("/c2o.dat")
        assert early.size == 0
        # fsync publishes.
        w.fsync()
        assert reader.stat("/c2o.dat").st_size == 2 * CHUNK
        assert w.pwrite(data[2 * CHUNK :], 2 * CHUNK) == len(data) - 2 * CHUNK
        assert w.size == len(data)
        assert w.pread(len(data) + 1, 0) == data  # a handle sees its own writes
        w.close()
        assert reader.stat("/c2o.dat").st_size == len(data)
        # The early reader asks again when it reads past the size it knew.
        assert early.pread(len(data) + 100, 0) == data
        assert early.size == len(data)
        early.close()
        # A writer with a smaller end does not shrink the file.
        with writer.open("/c2o.dat", CREATE) as small:
            assert small.pwrite(data[:10], 0) == 10
        assert reader.stat("/c2o.dat").st_size == len(data)
        with reader.open("/c2o.dat") as late:
            assert late.size == len(data)
            assert late.pread(len(data), 0) == data


@pytest.mark.timeout(120)
def test_shared_file_neighbours_from_separate_clients(inproc_cluster) -> None:
    """IOR-hard through the namespace: four clients, each with its own handle on one file,
    write neighbouring unaligned 47008-byte ranges; every byte survives and the size is the
    largest end, whichever writer closes last."""
    cluster = inproc_cluster(3)
    transfer, writers, per_writer = 47_008, 4, 10
    size = transfer * writers * per_writer
    expected = data_for(11, 0, size)
    path = "/ior-hard.dat"
    errors: list[str] = []
    start = threading.Barrier(writers)
    wrote = threading.Barrier(writers)
    closed = [threading.Event() for _ in range(writers)]

    def work(rank: int) -> None:
        try:
            with Client(str(cluster.registry), config=cluster.config) as client:
                f = client.open(path, CREATE)
                start.wait(timeout=30)
                ends = []
                for k in range(per_writer):
                    offset = (k * writers + rank) * transfer
                    chunk = expected[offset : offset + transfer]
                    assert f.pwrite(chunk, offset) == transfer
                    ends.append(offset + transfer)
                assert f.size >= max(ends)
                wrote.wait(timeout=60)
                # Close from the writer of the largest end down: later, smaller ends must not
                # shrink the published size.
                if rank + 1 < writers:
                    assert closed[rank + 1].wait(timeout=60)
                f.close()
                assert client.stat(path).st_size == size
                closed[rank].set()
        except BaseException:
            errors.append(traceback.format_exc())
            start.abort()
            wrote.abort()
            closed[rank].set()

    threads = [threading.Thread(target=work, args=(r,)) for r in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=100)
    assert not any(t.is_alive() for t in threads), "a writer hung"
    assert not errors, errors[0]
    with Client(str(cluster.registry), config=cluster.config) as client:
        assert client.stat(path).st_size == size
        with client.open(path) as f:
            assert f.size == size
            got = f.pread(size + 1, 0)
    assert len(got) == size
    bad = next((i for i in range(0, size, 8) if got[i : i + 8] != expected[i : i + 8]), None)
    assert bad is None, f"first wrong word at byte {bad} (transfer {bad // transfer})"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("layout", ["chunkfile", "packed"])
def test_truncation_frees_data(inproc_cluster, tmp_path: Path, layout: str) -> None:
    """Shrinking (truncate or O_TRUNC) frees the bytes beyond the new size: growing again
    reads zeros there, never the old data."""
    cluster = inproc_cluster(2, f"storage.layout={layout}")
    size = 5 * CHUNK + 123
    data = data_for(5, 0, size)
    cut = 2 * CHUNK + 100  # inside a chunk: part of it stays
    with Client(str(cluster.registry), config=cluster.config) as client:
        with client.open("/t.dat", CREATE) as f:
            assert f.pwrite(data, 0) == size
            file_id = f.id

        def chunk_files() -> list[int]:
            found = tmp_path.glob(f"data-*/chunks/{file_id[:2]}/{file_id}.*")
            return sorted(int(p.suffix[1:]) for p in found)

        if layout == "chunkfile":
            assert chunk_files() == [0, 1, 2, 3, 4, 5]

        client.truncate("/t.dat", cut)
        assert client.stat("/t.dat").st_size == cut
        if layout == "chunkfile":
            assert chunk_files() == [0, 1, 2]
        with client.open("/t.dat") as f:
            assert f.size == cut
            assert f.pread(size, 0) == data[:cut]
        # Growing again: the freed range reads as zeros, in the cut chunk and beyond.
        client.truncate("/t.dat", size)
        assert client.stat("/t.dat").st_size == size
        with client.open("/t.dat") as f:
            assert f.pread(size + 1, 0) == data[:cut] + bytes(size - cut)
        # Growing by a write past the end: zeros up to it.
        with client.open("/t.dat", "r+") as f:
            assert f.pwrite(b"tail", size + 10) == 4
        with client.open("/t.dat") as f:
            assert f.pread(size + 20, 0) == data[:cut] + bytes(size + 10 - cut) + b"tail"

        # O_TRUNC empties the file (same id), and its old data does not come back.
        with client.open("/t.dat", CREATE | os.O_TRUNC) as f:
            assert (f.size, f.id) == (0, file_id)
            assert client.stat("/t.dat").st_size == 0
            if layout == "chunkfile":
                assert chunk_files() == []
            assert f.pwrite(b"new", 3 * CHUNK + 7) == 3
        assert client.stat("/t.dat").st_size == 3 * CHUNK + 10
        with client.open("/t.dat") as f:
            assert f.pread(4 * CHUNK, 0) == bytes(3 * CHUNK + 7) + b"new"

        # Truncating to zero and unlinking free everything.
        client.truncate("/t.dat", 0)
        assert client.stat("/t.dat").st_size == 0
        with client.open("/t.dat") as f:
            assert f.pread(100, 0) == b""
        client.truncate("/t.dat", 2 * CHUNK)
        with client.open("/t.dat") as f:
            assert f.pread(2 * CHUNK, 0) == bytes(2 * CHUNK)
        with fails_with(errno.ENOENT):
            client.truncate("/missing.dat", 0)
        client.mkdir("/dir")
        with fails_with(errno.EISDIR):
            client.truncate("/dir", 0)
        with client.open("/u.dat", CREATE) as f:
            f.pwrite(data, 0)
            gone = f.id
        client.unlink("/u.dat")
        if layout == "chunkfile":
            assert not list(tmp_path.glob(f"data-*/chunks/*/{gone}.*"))


def test_a_client_chunk_size_that_cannot_apply_is_said_once(inproc_cluster, capfd) -> None:
    """The servers decide the chunk size: a client configured with another one says so once
    (on its first creation), and its files use the servers' chunks."""
    cluster = inproc_cluster(2, "layout.chunk_size=65536")
    with Client(str(cluster.registry), config=cluster.config) as same:
        with same.open("/agreed", os.O_RDWR | os.O_CREAT):
            pass
    assert "layout.chunk_size" not in capfd.readouterr().err
    mine = config_text("cluster.expected_servers=2", "layout.chunk_size=1M")
    with Client(str(cluster.registry), config=mine) as other:
        for name in ("/a", "/b", "/c"):
            with other.open(name, os.O_RDWR | os.O_CREAT) as f:
                f.pwrite(b"x" * 200_000, 0)
        assert other.stat("/a").chunk_size == 65536
    err = capfd.readouterr().err
    assert err.count("layout.chunk_size = 1048576 in this client's configuration") == 1, err
    assert "65536-byte chunks" in err

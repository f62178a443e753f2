"""Checksums of stored bytes (`Client.checksum`, protocol op 9): the servers hash each
chunk-aligned range as they read it back from their storage, and the result equals xxhash's
over the bytes that were written (holes as zeros, truncations cut), whichever server holds
each chunk. A byte changed on a server's disk after the write shows in the checksum, and a
staging that meets such a byte fails naming the range."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

import pytest
import xxhash
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchfs import Client
from benchfs.checksum import ChunkHasher, FileChecksum
from benchfs.lifecycle.stage import BenchfsSide, LocalSide, StageFailed, stage
from conftest import InProcessCluster

CHUNK = 64 * 1024


def ranges(data: bytes, chunk: int = CHUNK) -> tuple[str, ...]:
    """xxhash's own, range by range (not through ChunkHasher)."""
    return tuple(xxhash.xxh3_128_hexdigest(data[i : i + chunk]) for i in range(0, len(data), chunk))


@pytest.fixture
def client(inproc_cluster: Callable[..., InProcessCluster]) -> Iterator[Client]:
    cluster = inproc_cluster(3, f"layout.chunk_size={CHUNK}")
    with Client(str(cluster.registry), config=cluster.config) as c:
        yield c


@pytest.mark.parametrize("size", [0, 1, CHUNK - 1, CHUNK, CHUNK + 1, 7 * CHUNK + 17])
def test_the_servers_hash_what_was_written(client: Client, size: int) -> None:
    data = os.urandom(size)
    with client.open("/f", "wb") as f:
        f.write(data)
        assert f.chunk_size == CHUNK
        # Through the handle, before close published the size: the size it wrote.
        assert f.checksum() == FileChecksum(size, CHUNK, ranges(data))
    got = client.checksum("/f")
    assert got == FileChecksum(size, CHUNK, ranges(data))
    hasher = ChunkHasher(CHUNK)
    for i in range(0, size, 1000):  # pieces that do not line up with the ranges
        hasher.update(data[i : i + 1000])
    assert hasher.result() == got


def test_holes_truncation_and_links(client: Client) -> None:
    with client.open("/sparse", "wb") as f:  # chunks 0-2 never written: zeros
        f.seek(3 * CHUNK + 5)
        f.write(b"tail")
    want = bytes(3 * CHUNK + 5) + b"tail"
    assert client.checksum("/sparse").chunks == ranges(want)
    client.truncate("/sparse", CHUNK + 3)
    assert client.checksum("/sparse") == FileChecksum(CHUNK + 3, CHUNK, ranges(want[: CHUNK + 3]))
    client.symlink("sparse", "/link")
    assert client.checksum("/link") == client.checksum("/sparse")


def test_writes_behind_are_waited_for(inproc_cluster: Callable[..., InProcessCluster]) -> None:
    """The size is the owner's (published at close, fsync or a lock); within it, this client's
    overwrites still behind (client.write_behind) are in the checksum."""
    cluster = inproc_cluster(2, f"layout.chunk_size={CHUNK}", "client.write_behind=8M")
    with Client(str(cluster.registry), config=cluster.config) as c:
        data = bytearray(os.urandom(5 * CHUNK))
        with c.open("/wb", "wb") as f:
            f.write(data)
        with c.open("/wb", "r+b") as f:
            f.seek(2 * CHUNK + 7)
            f.write(b"overwritten")
            data[2 * CHUNK + 7 : 2 * CHUNK + 18] = b"overwritten"
            assert c.checksum("/wb").chunks == ranges(bytes(data))


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(writes=st.lists(st.tuples(st.integers(0, 4 * CHUNK), st.binary(min_size=1, max_size=9000))))
def test_any_writes_hash_as_the_bytes_read_back(
    client: Client, writes: list[tuple[int, bytes]]
) -> None:
    """One cluster for every example (the fixture's): each leaves nothing behind."""
    with client.open("/h", "wb") as f:
        for offset, data in writes:
            f.seek(offset)
            f.write(data)
    with client.open("/h", "rb") as f:
        back = f.read()
    assert client.checksum("/h") == FileChecksum(len(back), CHUNK, ranges(back))
    client.unlink("/h")


def test_bad_input_is_one_clear_error(client: Client) -> None:
    client.mkdir("/d")
    with pytest.raises(IsADirectoryError, match="checksum /d"):
        client.checksum("/d")
    with pytest.raises(FileNotFoundError, match="/nothing"):
        client.checksum("/nothing")
    with pytest.raises(OSError, match="checksum relative: Invalid argument"):
        client.checksum("relative")
    with pytest.raises(ValueError, match="chunk size 0"):
        ChunkHasher(0)


def stored_at(data_dirs: list[Path], marker: bytes) -> tuple[Path, int]:
    """The server file, and the offset in it, that holds `marker`."""
    for d in data_dirs:
        for p in d.rglob("*"):
            if p.is_file():
                at = p.read_bytes().find(marker)
                if at >= 0:
                    return p, at
    raise AssertionError("marker not found in any data directory")


class DamagedOnArrival(BenchfsSide):
    """BenchFS as the destination, where a byte of a stored chunk changes on the server's disk
    after the copy reached it and before it is checked (a device or server fault)."""

    def __init__(self, root: str, client: Client, data_dirs: list[Path], marker: bytes) -> None:
        super().__init__(root, lambda: client)
        self.data_dirs, self.marker = data_dirs, marker

    def checksum(self, f: BinaryIO) -> FileChecksum | None:
        path, at = stored_at(self.data_dirs, self.marker)
        with open(path, "r+b") as stored:
            stored.seek(at)
            stored.write(b"X")
        return super().checksum(f)


def test_a_byte_changed_on_a_server_fails_the_staging(
    inproc_cluster: Callable[..., InProcessCluster], tmp_path: Path
) -> None:
    cluster = inproc_cluster(2, f"layout.chunk_size={CHUNK}", "storage.direct_write=false")
    data_dirs = sorted(tmp_path.glob("data-*"))
    marker = os.urandom(16)
    src = tmp_path / "src"
    src.mkdir()
    body = bytearray(os.urandom(5 * CHUNK))
    body[2 * CHUNK + 100 : 2 * CHUNK + 116] = marker
    (src / "f").write_bytes(bytes(body))
    with Client(str(cluster.registry), config=cluster.config) as c:
        side = DamagedOnArrival("/in", c, data_dirs, marker)
        with pytest.raises(StageFailed, match=r"benchfs:/in/f: bytes 131072-196608 differ"):
            stage(LocalSide(src), side, "in", tmp_path / "m.json")
        # Undamaged, the same staging goes through, and stage-out of it checks the same way.
        stage(LocalSide(src), BenchfsSide("/in", lambda: c), "in", tmp_path / "m.json")
        out = tmp_path / "out"
        report = stage(BenchfsSide("/in", lambda: c), LocalSide(out), "out", tmp_path / "o.json")
        assert (out / "f").read_bytes() == bytes(body)
        assert report.manifest["files"][0]["chunks"] == list(ranges(bytes(body)))
        assert report.manifest["fsync_seconds"] > 0

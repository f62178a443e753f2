"""Checksums of stored bytes (`Client.checksum`, protocol op 9; checked writes, op 10, and
`Client.put_files`): the servers hash each chunk-aligned range as they read it back from their
storage, and the result equals xxhash's over the bytes that were written (holes as zeros,
truncations cut), whichever server holds each chunk. A byte changed on a server's disk after
the write shows in the checksum; a staging whose bytes were stored other than read fails
naming the range, large files and small."""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

import pytest
import xxhash
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchfs import Client
from benchfs.checksum import ChunkHasher, FileChecksum
from benchfs.lifecycle.stage import WHOLE_MAX, BenchfsSide, LocalSide, StageFailed, _join, stage
from benchfs.results import read_json
from conftest import InProcessCluster

if TYPE_CHECKING:
    from collections.abc import Buffer

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


@pytest.mark.parametrize("size", [0, 1, CHUNK, 3 * CHUNK + 5, 7 * CHUNK + 17])
def test_a_hashed_read_gives_the_bytes_and_their_ranges(client: Client, size: int) -> None:
    """readinto_hashed: the bytes as readinto gives them, with each chunk's hash as its
    server read it, also across holes (zeros) and at the end; an unaligned start is one line."""
    data = bytearray(os.urandom(size))
    with client.open("/h", "wb") as f:
        f.write(data[:CHUNK])
        if size > 2 * CHUNK:  # chunk 1 never written: a hole
            f.seek(2 * CHUNK)
            f.write(data[2 * CHUNK :])
            data[CHUNK : 2 * CHUNK] = bytes(CHUNK)
    data = data[:size]
    got, hashes = bytearray(), []
    buf = bytearray(2 * CHUNK)
    with client.open("/h", "rb") as f:
        while True:
            n, digests = f.readinto_hashed(buf)
            got += buf[:n]
            hashes += digests
            if n < len(buf):
                break
        assert f.readinto_hashed(buf) == (0, ())
        if size > 1:
            f.seek(1)
            with pytest.raises(ValueError, match="chunk boundary") as bad:
                f.readinto_hashed(buf)
            assert "\n" not in str(bad.value)
    assert got == data
    assert FileChecksum(size, CHUNK, tuple(hashes)) == client.checksum("/h")
    assert tuple(hashes) == ranges(bytes(data))


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


class ChangedInFlight(BenchfsSide):
    """BenchFS as the destination, where a byte of what is sent changes after the staging
    hashed it and before a server stores it (as a fault of the network or of a server's
    memory would change it): the servers' read-back no longer matches the source."""

    def __init__(self, root: str, client: Client, marker: bytes) -> None:
        super().__init__(root, lambda: client)
        self.marker = marker

    def changed(self, data: Buffer) -> bytes:
        return bytes(data).replace(self.marker, bytes([self.marker[0] ^ 0xFF]) + self.marker[1:])

    def open_write(self, rel: str, mode: int) -> AbstractContextManager[BinaryIO]:
        f = self.client.open(_join(self.root, rel), "w", perm=mode)
        real = f.write_checked
        f.write_checked = lambda data, check="stored": real(self.changed(data), check)  # type: ignore[method-assign]
        return f  # type: ignore[return-value]

    def put_whole(self, files: list[tuple[str, bytes, int, int]]) -> list[FileChecksum | OSError]:
        return super().put_whole([(r, self.changed(d), m, t) for r, d, m, t in files])


class ChangedOnItsWayOut(BenchfsSide):
    """BenchFS as the source, where a byte of what its servers read and hashed changes before
    the staging receives it (as a fault of the network or of the client's memory would)."""

    def __init__(self, root: str, client: Client, marker: bytes) -> None:
        super().__init__(root, lambda: client)
        self.marker = marker

    def open_read(self, rel: str) -> AbstractContextManager[BinaryIO]:
        f = self.client.open(_join(self.root, rel), "r")
        real = f.readinto_hashed
        marker = self.marker

        def changed(buf: bytearray) -> tuple[int, tuple[str, ...]]:
            n, digests = real(buf)
            at = bytes(buf[:n]).find(marker)
            if at >= 0:
                buf[at] ^= 0xFF
            return n, digests

        f.readinto_hashed = changed  # type: ignore[method-assign]
        return f  # type: ignore[return-value]


@pytest.mark.parametrize("size", [5 * CHUNK, WHOLE_MAX + 3 * CHUNK])
def test_a_byte_changed_on_its_way_fails_the_staging(
    inproc_cluster: Callable[..., InProcessCluster], tmp_path: Path, size: int
) -> None:
    """Small files (written whole) and large ones (written a block at a time)."""
    cluster = inproc_cluster(2, f"layout.chunk_size={CHUNK}", "storage.direct_write=false")
    marker = os.urandom(16)
    src = tmp_path / "src"
    src.mkdir()
    body = bytearray(os.urandom(size))
    body[2 * CHUNK + 100 : 2 * CHUNK + 116] = marker
    (src / "f").write_bytes(bytes(body))
    with Client(str(cluster.registry), config=cluster.config) as c:
        side = ChangedInFlight("/in", c, marker)
        with pytest.raises(StageFailed, match=r"benchfs:/in/f: bytes 131072-196608 differ"):
            stage(LocalSide(src), side, "in", tmp_path / "m.json")
        # Undamaged, the same staging goes through, and stage-out of it checks the same way.
        stage(LocalSide(src), BenchfsSide("/in", lambda: c), "in", tmp_path / "m.json")
        out = tmp_path / "out"
        report = stage(BenchfsSide("/in", lambda: c), LocalSide(out), "out", tmp_path / "o.json")
        assert (out / "f").read_bytes() == bytes(body)
        assert report.manifest["files"][0]["chunks"] == list(ranges(bytes(body)))
        assert report.manifest["fsync_seconds"] > 0
        with pytest.raises(StageFailed, match=r"benchfs:/in/f: bytes 131072-196608 differ"):
            stage(ChangedOnItsWayOut("/in", c, marker), LocalSide(tmp_path / "out2"), "out",
                  tmp_path / "o2.json")  # fmt: skip


def test_staging_records_what_its_check_covered(client: Client, tmp_path: Path) -> None:
    """Into BenchFS: the bytes as the servers received them by default, read back from their
    stores with `stored`; out of BenchFS always read back; a bad check is one line."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "small").write_bytes(os.urandom(1000))  # written whole
    (src / "big").write_bytes(os.urandom(WHOLE_MAX + 5))  # written a block at a time
    for check, into in (("received", "/r"), ("stored", "/s")):
        side = (
            BenchfsSide(into, lambda: client)
            if check == "received"
            else BenchfsSide(into, lambda: client, check)
        )
        report = stage(LocalSide(src), side, "in", tmp_path / f"{check}.json")
        assert report.manifest["check"] == check
        assert read_json(tmp_path / f"{check}.json")["check"] == check
        assert all(f["verified"] for f in report.manifest["files"])
    out = stage(BenchfsSide("/r", lambda: client), LocalSide(tmp_path / "out"), "out",
                tmp_path / "out.json")  # fmt: skip
    assert out.manifest["check"] == "stored"
    assert (tmp_path / "out" / "big").read_bytes() == (src / "big").read_bytes()
    with pytest.raises(ValueError, match="check must be one of received, stored, not 'device'"):
        BenchfsSide("/x", lambda: client, "device")


class Unreachable(BenchfsSide):
    """BenchFS as the destination, whose client cannot send a batch of small files at all."""

    def put_whole(self, files: list[tuple[str, bytes, int, int]]) -> list[FileChecksum | OSError]:
        raise OSError(113, "server 0 lost")


def test_a_batch_that_cannot_be_sent_fails_each_of_its_files(
    client: Client, tmp_path: Path
) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for i in range(3):
        (src / f"s{i}").write_bytes(os.urandom(100))
    (src / "big").write_bytes(os.urandom(WHOLE_MAX + 1))  # written a block at a time: staged
    with pytest.raises(StageFailed, match=r"3 files not staged: s0: \[Errno 113\] server 0 lost"):
        stage(LocalSide(src), Unreachable("/in", lambda: client), "in", tmp_path / "m.json")
    files = read_json(tmp_path / "m.json")["files"]
    assert [f["path"] for f in files] == ["big"]


def test_a_byte_changed_on_a_server_shows_in_the_checksum(
    inproc_cluster: Callable[..., InProcessCluster], tmp_path: Path
) -> None:
    cluster = inproc_cluster(2, f"layout.chunk_size={CHUNK}", "storage.direct_write=false")
    marker = os.urandom(16)
    body = bytearray(os.urandom(3 * CHUNK))
    body[CHUNK + 7 : CHUNK + 23] = marker
    with Client(str(cluster.registry), config=cluster.config) as c:
        with c.open("/f", "wb") as f:
            f.write(body)
        assert c.checksum("/f").chunks == ranges(bytes(body))
        path, at = stored_at(sorted(tmp_path.glob("data-*")), marker)
        with open(path, "r+b") as stored:
            stored.seek(at)
            stored.write(b"X")
        body[CHUNK + 7] = ord("X")
        assert c.checksum("/f").chunks == ranges(bytes(body))


@pytest.mark.parametrize("check", ["stored", "received"])
@pytest.mark.parametrize(
    "offset,size", [(0, 0), (0, 1), (0, CHUNK), (0, 5 * CHUNK + 3), (CHUNK - 2, 7), (17, 3 * CHUNK)]
)
def test_checked_writes_answer_with_what_was_stored(
    client: Client, offset: int, size: int, check: str
) -> None:
    """One hash per chunk part of the range written, as xxhash gives it over those bytes: read
    back from the store, or as the servers received them."""
    data = os.urandom(size)
    with client.open("/w", "wb") as f:
        f.seek(offset)
        got = f.write_checked(data, check)
        assert f.tell() == offset + size
    inner = range((offset // CHUNK + 1) * CHUNK, offset + size, CHUNK)
    cuts = sorted({offset, offset + size, *inner})
    parts = [data[a - offset : b - offset] for a, b in itertools.pairwise(cuts)]
    assert got == tuple(xxhash.xxh3_128_hexdigest(p) for p in parts)
    with client.open("/w", "rb") as f:
        assert f.read() == bytes(offset) + data


def test_a_checked_write_names_a_bad_check_in_one_line(client: Client) -> None:
    with client.open("/bad-check", "wb") as f:
        with pytest.raises(ValueError, match=r'check must be "received" or "stored", not "both"'):
            f.write_checked(b"x", "both")
    with pytest.raises(ValueError, match=r'check must be "received" or "stored", not ""'):
        client.put_files([("/bad-check", b"x", 0o644, 0)], "")
    assert client.stat("/bad-check").st_size == 0  # nothing was written


@pytest.mark.parametrize("check", ["stored", "received"])
def test_put_files_writes_whole_files_with_their_attributes(client: Client, check: str) -> None:
    client.mkdir("/p")
    client.mkdir("/p/dir")
    with client.open("/p/longer", "wb") as f:  # replaced: truncated, then written
        f.write(os.urandom(4 * CHUNK))
    client.symlink("dir", "/p/link")
    files = {
        "/p/empty": b"",
        "/p/small": os.urandom(100),
        "/p/longer": os.urandom(CHUNK + 5),
        "/p/link/through": os.urandom(3 * CHUNK),
    }
    batch = [(p, d, 0o640 + i, 10**18 + i) for i, (p, d) in enumerate(files.items())]
    bad = [
        ("/p/small/under", b"x", 0o644, 1),
        ("relative", b"x", 0o644, 1),
        ("/p/dir", b"x", 0o644, 1),
    ]
    results = client.put_files(batch[:2] + bad + batch[2:], check)
    errors = results[2:5]
    assert [type(e) for e in errors] == [NotADirectoryError, OSError, IsADirectoryError]
    assert "relative" in str(errors[1])
    for (path, data, mode, mtime), got in zip(batch, results[:2] + results[5:], strict=True):
        assert got == FileChecksum(len(data), CHUNK, ranges(data))
        st = client.stat(path)
        assert (st.st_size, st.st_mode & 0o7777, st.st_mtime_ns) == (len(data), mode, mtime)
        with client.open(path, "rb") as f:
            assert f.read() == data
    assert client.stat("/p/dir").kind == "dir"
    with pytest.raises(NotADirectoryError):
        client.stat("/p/small/under")

"""Small files kept with their names (`layout.inline_max`): one request to write or read them,
their bytes moved into chunks when they outgrow the limit (against concurrent writers and
handles opened before), and every operation seeing an ordinary file, byte for byte."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from benchfs import Client
from benchfs.checksum import ChunkHasher
from conftest import InProcessCluster, data_for

LIMIT = 4096
CHUNK = 65536  # conftest's layout.chunk_size


@pytest.fixture
def cluster(inproc_cluster: Callable[..., InProcessCluster]) -> InProcessCluster:
    return inproc_cluster(2, f"layout.inline_max={LIMIT}")


@pytest.fixture
def client(cluster: InProcessCluster) -> Iterator[Client]:
    with Client(cluster.registry, config=cluster.config) as c:
        yield c


def checksum_of(data: bytes, chunk_size: int = CHUNK) -> object:
    h = ChunkHasher(chunk_size)
    h.update(data)
    return h.result()


def test_a_small_file_is_inline_and_reads_back(client: Client) -> None:
    data = data_for(1, 0, 3901)
    with client.open("/s", "wb") as f:
        f.write(data[:1000])
        f.write(data[1000:])
    st = client.stat("/s")
    assert st.inline and st.st_size == len(data)
    with client.open("/s") as f:
        assert f.read() == data
        assert f.pread(10, 3895) == data[3895:]
        assert f.pread(10, 5000) == b""
    assert client.checksum("/s") == checksum_of(data)
    # Holes inside an inline file read as zeros.
    with client.open("/h", "wb") as f:
        f.pwrite(b"x", 100)
    with client.open("/h") as f:
        assert f.read() == bytes(100) + b"x"
    client.truncate("/h", 50)
    assert client.stat("/h").st_size == 50 and client.stat("/h").inline
    with client.open("/h") as f:
        assert f.read() == bytes(50)


@pytest.mark.parametrize("end", [LIMIT, LIMIT + 1, CHUNK + 7, 3 * CHUNK])
def test_writing_past_the_limit_moves_the_bytes_into_chunks(client: Client, end: int) -> None:
    data = data_for(2, 0, end)
    with client.open("/g", "wb") as f:
        f.write(data[:100])
        stale = client.open("/g", "r+b")  # opened while inline
        f.write(data[100:])
    assert client.stat("/g").inline == (end <= LIMIT)
    # The handle opened before reads the bytes its open found (close-to-open), and past them
    # asks the owner, which tells it where the bytes are now.
    assert stale.pread(end, 0) == data[:100]
    assert stale.pread(end, 100) == data[100:]
    stale.pwrite(b"Z", 3)
    stale.close()
    want = data[:3] + b"Z" + data[4:]
    with client.open("/g") as f:
        assert f.read() == want
    assert client.checksum("/g") == checksum_of(want)


def test_truncate_rename_unlink_and_links_keep_the_bytes(client: Client) -> None:
    data = data_for(3, 0, 2000)
    with client.open("/a", "wb") as f:
        f.write(data)
    st = client.stat("/a")
    client.rename("/a", "/d-b")
    assert not client.exists("/a")
    moved = client.stat("/d-b")
    assert moved.inline and moved.id == st.id and moved.st_size == 2000
    with client.open("/d-b") as f:
        assert f.read() == data
    client.symlink("d-b", "/l")
    with client.open("/l") as f:
        assert f.read() == data
    assert client.checksum("/l") == checksum_of(data)
    # Truncated past the limit: moved into chunks, zeros after the old end.
    client.truncate("/d-b", LIMIT + 10)
    assert not client.stat("/d-b").inline
    with client.open("/d-b") as f:
        assert f.read() == data + bytes(LIMIT + 10 - 2000)
    client.unlink("/d-b")
    assert not client.exists("/d-b")
    # A file renamed over an inline one replaces it; the old bytes are gone.
    for name, seed in (("/x", 4), ("/y", 5)):
        with client.open(name, "wb") as f:
            f.write(data_for(seed, 0, 300))
    client.rename("/x", "/y")
    with client.open("/y") as f:
        assert f.read() == data_for(4, 0, 300)


def test_put_files_keeps_small_files_in_one_request_and_large_in_chunks(client: Client) -> None:
    files = [
        ("/p/empty", b"", 0o600, 1_000_000_000),
        ("/p/small", data_for(6, 0, 4000), 0o640, 2_000_000_000),
        ("/p/large", data_for(7, 0, 3 * CHUNK + 5), 0o644, 3_000_000_000),
    ]
    client.mkdir("/p")
    sums = client.put_files(files, check="received")
    for (path, data, mode, mtime), got in zip(files, sums, strict=True):
        assert got == checksum_of(data), path
        st = client.stat(path)
        assert (st.st_size, st.st_mode & 0o7777, st.st_mtime_ns) == (len(data), mode, mtime)
        assert st.inline == (len(data) <= LIMIT)
        with client.open(path) as f:
            assert f.read() == data
        assert client.checksum(path) == checksum_of(data)
    # Put again over each: a large file where a small one was, and the reverse.
    again = [("/p/small", data_for(8, 0, 2 * CHUNK), 0o600, 5), ("/p/large", b"tiny", 0o600, 6)]
    client.put_files(again, check="stored")
    for path, data, _, _ in again:
        with client.open(path) as f:
            assert f.read() == data


WRITER = textwrap.dedent(
    """
    import sys
    from benchfs import Client
    registry, config, path, who, size = sys.argv[1:6]
    who, size = int(who), int(size)
    with Client(registry, config=open(config).read()) as c:
        f = c.open(path, "r+b")
        # Interleaved stripes of 512 bytes: every writer's bytes land in every range.
        for off in range(who * 512, size, 4 * 512):
            f.pwrite(bytes([65 + who]) * 512, off)
        f.close()
    """
)


def test_concurrent_writers_across_the_limit_lose_no_byte(
    cluster: InProcessCluster, client: Client, tmp_path: Path
) -> None:
    config = tmp_path / "config.toml"
    config.write_text(cluster.config)
    size = 4 * LIMIT
    for round_ in range(3):
        path = f"/race-{round_}"
        with client.open(path, "wb"):
            pass
        procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    WRITER,
                    str(cluster.registry),
                    str(config),
                    path,
                    str(w),
                    str(size),
                ],
                env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
            )
            for w in range(4)
        ]
        assert [p.wait(timeout=60) for p in procs] == [0] * 4
        want = b"".join(bytes([65 + (off // 512) % 4]) * 512 for off in range(0, size, 512))
        with client.open(path) as f:
            assert f.read() == want, path
        assert not client.stat(path).inline


def test_a_limit_beyond_a_reply_is_refused_in_one_line(tmp_path: Path) -> None:
    from conftest import config_text

    with pytest.raises(Exception) as refused:
        Client(str(tmp_path), config=config_text("layout.inline_max=1M"))
    assert "layout.inline_max must be at most 32 KiB" in str(refused.value)
    assert "\n" not in str(refused.value)

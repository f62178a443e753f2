"""The storage engine through the whole path: layouts, direct I/O edges, fsync, faults.

Loop-device tests make a small ext4 file system of their own (root is required, as on every
machine this project runs on) and always unmount and detach it.
"""

from __future__ import annotations

import errno
import os
import struct
import subprocess
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from benchfs import Client
from benchfs.cluster import LocalCluster
from benchfs.units import KIB, MIB
from conftest import InProcessCluster, data_for

CREATE = os.O_RDWR | os.O_CREAT

LAYOUTS = ["chunkfile", "packed"]
MODES = {
    "buffered": ("storage.direct_write=false", "storage.direct_read=false"),
    "direct": ("storage.direct_write=true", "storage.direct_read=true"),
}


@contextmanager
def loop_filesystem(
    tmp_path: Path, size_mib: int, *mount_options: str
) -> Iterator[tuple[Path, str]]:
    """A fresh ext4 on a loop device, mounted; yields (mountpoint, block device name)."""
    image = tmp_path / "fs.img"
    mountpoint = tmp_path / "mnt"
    mountpoint.mkdir()
    with image.open("wb") as f:
        f.truncate(size_mib * MIB)
    subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], check=True, timeout=60)
    device = subprocess.run(
        ["losetup", "--find", "--show", str(image)],
        check=True,
        capture_output=True,
        text=True,
        timeout=30,
    ).stdout.strip()
    try:
        options = ["-o", ",".join(mount_options)] if mount_options else []
        subprocess.run(["mount", *options, device, str(mountpoint)], check=True, timeout=30)
        try:
            yield mountpoint, Path(device).name
        finally:
            subprocess.run(["umount", str(mountpoint)], check=True, timeout=60)
    finally:
        subprocess.run(["losetup", "-d", device], check=True, timeout=30)


PACK_FILE_BYTES = 1 << 30


def packed_contents(packed: Path, file_id: str, size: int, slot_size: int = 64 * KIB) -> bytes:
    """The first `size` bytes of a file as worker 0's packed store keeps them on disk, read
    through its saved index (40-byte little-endian records: file id, chunk, slot, length;
    rust/benchfs-core/src/storage/packed.rs)."""
    records = packed.joinpath("w0.index").read_bytes()
    assert len(records) % 40 == 0
    slots_per_file = PACK_FILE_BYTES // slot_size
    out = bytearray(size)
    found = 0
    for at in range(0, len(records), 40):
        lo, hi, chunk, slot, length = struct.unpack_from("<QQQQQ", records, at)
        if lo | hi << 64 != int(file_id, 16):
            continue
        found += 1
        pack = packed / f"w0-{slot // slots_per_file:05}.pack"
        with pack.open("rb") as f:
            f.seek((slot % slots_per_file) * slot_size)
            stored = f.read(length)
        start = chunk * slot_size
        out[start : start + length] = stored[: max(0, size - start)]
    assert found == -(-size // slot_size), f"{found} chunks of {file_id} in the index"
    return bytes(out)


def flushes(device: str) -> int:
    """Completed flush requests of a block device (field 16 of /sys/block/<dev>/stat)."""
    fields = Path(f"/sys/block/{device}/stat").read_text().split()
    return int(fields[15])


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("mode", list(MODES))
def test_unaligned_ranges_round_trip(
    inproc_cluster: Callable[..., InProcessCluster], layout: str, mode: str
) -> None:
    cluster = inproc_cluster(2, f"storage.layout={layout}", *MODES[mode])
    with Client(str(cluster.registry), cluster.config) as client:
        cases = [(0, 1), (4095, 2), (4096, 4096), (5000, 100_000), (65_530, 20), (3, 300 * KIB)]
        for i, (offset, length) in enumerate(cases):
            path = f"/u{i}"
            data = data_for(i, offset, length)
            with client.open(path, CREATE) as f:
                assert f.pwrite(data, offset) == length
                assert f.pread(length, offset) == data
                # Unaligned sub-ranges read back through the aligned direct path.
                assert f.pread(length - 1, offset + 1) == data[1:]
                # Past the end of a chunk and of the file.
                assert f.pread(10, offset + length) == b""
                assert f.pwrite(b"", offset) == 0
            # The same through a fresh handle, once the size is published.
            assert client.stat(path).st_size == offset + length
            with client.open(path) as f:
                assert f.pread(offset + length + 10, 0) == bytes(offset) + data
                assert f.pread(length - 1, offset + 1) == data[1:]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("mode", list(MODES))
def test_concurrent_unaligned_neighbours_never_lose_bytes(
    inproc_cluster: Callable[..., InProcessCluster], layout: str, mode: str
) -> None:
    """IOR-hard: 47008-byte transfers from several clients interleaved in one shared file, so
    neighbours share 4 KiB blocks; a read-modify-write race would lose bytes."""
    cluster = inproc_cluster(
        2, "layout.chunk_size=1048576", f"storage.layout={layout}", *MODES[mode]
    )
    transfer, writers, per_writer = 47008, 4, 12
    size = transfer * writers * per_writer
    expected = data_for(7, 0, size)
    errors: list[BaseException] = []
    start = threading.Barrier(writers)

    def write(rank: int) -> None:
        try:
            with Client(str(cluster.registry), cluster.config) as client:
                # Each writer its own handle; closing publishes the largest end it wrote.
                with client.open("/shared", CREATE) as f:
                    start.wait(timeout=30)
                    for k in range(per_writer):
                        offset = (k * writers + rank) * transfer
                        f.pwrite(expected[offset : offset + transfer], offset)
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=write, args=(r,)) for r in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors
    with Client(str(cluster.registry), cluster.config) as client:
        assert client.stat("/shared").st_size == size
        with client.open("/shared") as f:
            got = f.pread(size, 0)
    bad = next((i for i in range(0, size, 8) if got[i : i + 8] != expected[i : i + 8]), None)
    assert bad is None, f"first wrong word at byte {bad}"


def test_more_requests_than_buffers_completes(
    inproc_cluster: Callable[..., InProcessCluster],
) -> None:
    cluster = inproc_cluster(1, "storage.buffer_count=2", "client.max_inflight=32")
    data = data_for(3, 0, 64 * 64 * KIB)
    with Client(str(cluster.registry), cluster.config) as client:
        with client.open("/many", CREATE) as f:
            assert f.pwrite(data, 0) == len(data)
            assert f.pread(len(data), 0) == data


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.serial
def test_fsync_flushes_the_device(tmp_path: Path, layout: str) -> None:
    from benchfs import Server, _core
    from conftest import config_text

    # A long journal commit interval keeps ext4 from flushing on its own during the test.
    with loop_filesystem(tmp_path, 64, "commit=600") as (mountpoint, device):
        registry = tmp_path / "registry"
        config = config_text(
            "cluster.expected_servers=1", f"storage.layout={layout}", "storage.direct_write=true"
        )
        server = Server(str(registry), str(mountpoint / "data"), 0, config=config)
        try:
            _core.wait_for_servers(str(registry), 1, 10.0)
            with Client(str(registry), config) as client:
                data = data_for(1, 0, 300 * KIB + 5)
                f = client.open("/durable", CREATE)
                f.pwrite(data, 0)
                before = flushes(device)
                f.pwrite(b"tail", len(data))
                assert flushes(device) == before, "a plain write flushed the device"
                f.fsync()
                assert flushes(device) > before, "fsync returned without a device flush"
                # fsync also publishes the size.
                assert client.stat("/durable").st_size == len(data) + 4
                with client.open("/never-written", CREATE) as empty:
                    empty.fsync()
                assert f.pread(len(data), 0) == data
                f.close()
        finally:
            server.stop()


@pytest.mark.serial
def test_full_disk_is_a_clear_error_and_the_server_keeps_serving(tmp_path: Path) -> None:
    from benchfs import Server, _core
    from conftest import config_text

    with loop_filesystem(tmp_path, 16) as (mountpoint, _device):
        registry = tmp_path / "registry"
        config = config_text("cluster.expected_servers=1")
        server = Server(str(registry), str(mountpoint / "data"), 0, config=config)
        try:
            _core.wait_for_servers(str(registry), 1, 10.0)
            with Client(str(registry), config) as client:
                small = data_for(2, 0, 100 * KIB)
                with client.open("/small", CREATE) as f:
                    f.pwrite(small, 0)
                # Raised by a write, or (written behind) by the close: never lost.
                with pytest.raises(OSError) as failure, client.open("/huge", CREATE) as f:
                    f.pwrite(bytes(64 * MIB), 0)
                assert failure.value.errno == errno.ENOSPC
                assert "server 0" in str(failure.value)
                with client.open("/small") as f:
                    assert f.pread(len(small), 0) == small
        finally:
            server.stop()


def test_deleted_chunk_file_is_an_error_not_zeros(
    inproc_cluster: Callable[..., InProcessCluster], tmp_path: Path
) -> None:
    cluster = inproc_cluster(1, "storage.handle_cache=1")
    with Client(str(cluster.registry), cluster.config) as client:
        data = data_for(5, 0, 128 * KIB)
        with client.open("/victim", CREATE) as f:
            f.pwrite(data, 0)
            victim_id = f.id
        chunk_files = sorted(tmp_path.glob("data-*/chunks/*/*.0"))
        assert [p.name for p in chunk_files] == [f"{victim_id}.0"]
        os.remove(chunk_files[0])
        with client.open("/other", CREATE) as f:
            f.pwrite(b"evicts the cached handle", 0)
        with client.open("/victim") as f:
            with pytest.raises(OSError) as failure:
                f.pread(10, 0)
            assert failure.value.errno == errno.ENODATA
            # The other chunk and other files are still served.
            assert f.pread(64 * KIB, 64 * KIB) == data[64 * KIB :]
        with client.open("/other") as f:
            assert f.pread(6, 0) == b"evicts"


def test_packed_index_survives_a_restart_and_a_truncated_index_is_refused(tmp_path: Path) -> None:
    from benchfs import Server
    from conftest import config_text

    registry, data_dir = tmp_path / "registry", tmp_path / "data"
    # Every file in chunks (none kept with its name): the index is what is tested.
    config = config_text(
        "cluster.expected_servers=1", "storage.layout=packed", "layout.inline_max=0"
    )
    data = data_for(11, 0, 200 * KIB + 3)
    want = bytes(5) + data
    server = Server(str(registry), str(data_dir), 0, config=config)
    with Client(str(registry), config) as client:
        with client.open("/kept", CREATE) as f:
            f.pwrite(data, 5)
            kept = f.id
    server.stop()
    # Where the chunks are kept: the index names each chunk's slot, the slot holds its bytes.
    assert packed_contents(data_dir / "packed", kept, len(want)) == want
    server = Server(str(registry), str(data_dir), 0, config=config)
    try:
        with Client(str(registry), config) as client:
            with client.open("/kept") as f:  # the namespace was kept too
                assert f.read() == want
            with client.open("/new", CREATE) as f:
                f.pwrite(b"after restart", 0)
                new = f.id
            with client.open("/new") as f:
                assert f.pread(13, 0) == b"after restart"
    finally:
        server.stop()
    # The restarted server loaded the index: it saved the old chunks with the new one, and
    # put the new chunk in a slot of its own.
    assert packed_contents(data_dir / "packed", kept, len(want)) == want
    assert packed_contents(data_dir / "packed", new, 13) == b"after restart"
    index = data_dir / "packed" / "w0.index"
    index.write_bytes(index.read_bytes()[:-3])
    with pytest.raises(ValueError, match="truncated"):
        Server(str(registry), str(data_dir), 0, config=config)


@pytest.mark.serial
def test_a_submit_timer_batches_sqes_and_costs_latency(tmp_path: Path) -> None:
    """The storage bench's timer-gated submission (what timer-batching designs do; servers
    never wait) gathers SQEs into batches and holds each I/O for about the timer."""
    from benchfs import _core

    def run(timer_us: int) -> dict[str, float]:
        return _core.bench_storage(
            str(tmp_path / f"data-{timer_us}"), "seqwrite", 64 * KIB, 8, 4 * MIB, MIB,
            direct_write=False, direct_read=False, submit_timer_us=timer_us,
        )  # fmt: skip

    immediate, held = run(0), run(20_000)
    assert held["mean_batch"] > 2 * immediate["mean_batch"], (immediate, held)
    assert held["p50_us"] >= 10_000 > immediate["p50_us"], (immediate, held)
    assert held["bytes"] == immediate["bytes"] == 4 * MIB


def test_server_registers_its_buffer_pool_with_io_uring(
    daemon_cluster: Callable[..., LocalCluster],
) -> None:
    """The kernel lists a ring's fixed buffers in fdinfo: every worker registers its pool."""
    cluster = daemon_cluster(1, "storage.buffer_count=5", "server.workers=2")
    fdinfo = Path(f"/proc/{cluster.daemons[0].pid}/fdinfo")
    counts = sorted(
        int(line.split()[1])
        for info in fdinfo.iterdir()
        for line in info.read_text().splitlines()
        if line.startswith("UserBufs:")
    )
    assert counts == [5, 5], f"registered buffers per ring: {counts}"

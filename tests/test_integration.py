"""Integration: real servers, several clients, unaligned I/O over many chunks, all verified."""

from __future__ import annotations

import itertools
import random
import subprocess
import sys
import threading
import traceback
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchfs import Client
from benchfs.cluster import child_env
from benchfs.mpi import MpiLauncher
from benchfs.results import read_json
from benchfs.workloads.rw import (
    Pattern,
    PatternBuffer,
    VerificationError,
    read_and_verify,
    write_file,
)
from conftest import KIB, MIB, data_for

CHUNK = 64 * KIB


def write_in_random_pieces(client: Client, path: str, seed: int, start: int, end: int) -> None:
    """Write [start, end) in pieces of random, unaligned sizes (and in a shuffled order)."""
    rng = random.Random(seed)
    cuts = sorted({start, end, *(rng.randrange(start, end) for _ in range(40))})
    pieces = list(itertools.pairwise(cuts))
    rng.shuffle(pieces)
    for lo, hi in pieces:
        assert client.write(path, lo, data_for(seed, lo, hi - lo)) == hi - lo


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
                own = f"/thread-{rank}.dat"
                write_in_random_pieces(client, own, rank, 0, size)
                # Each client also fills its own unaligned slice of one shared file.
                lo, hi = rank * 777_777, (rank + 1) * 777_777
                write_in_random_pieces(client, "/shared.dat", 100, lo, hi)
                barrier.wait(timeout=60)
                # Read back another client's file, so the data crosses clients.
                peer = (rank + 1) % clients
                got = client.read(f"/thread-{peer}.dat", 0, size)
                assert got == data_for(peer, 0, size), f"client {rank} read bad data of {peer}"
                assert client.file_size(f"/thread-{peer}.dat") == size
                assert client.read("/shared.dat", 0, shared_size) == data_for(100, 0, shared_size)
                assert client.file_size("/shared.dat") == shared_size
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
        assert client.write("/holes.dat", offset, data) == len(data)
        size = offset + len(data)
        assert client.file_size("/holes.dat") == size

        assert client.read("/holes.dat", 0, offset) == bytes(offset)
        assert client.read("/holes.dat", CHUNK - 10, 20) == bytes(20)
        assert client.read("/holes.dat", offset - 5, 10) == bytes(5) + data[:5]

        # Past the end: a short count, then nothing.
        assert client.read("/holes.dat", size - 100, 1_000) == data[-100:]
        assert client.read("/holes.dat", size, 10) == b""
        assert client.read("/holes.dat", size + 10 * CHUNK, 10) == b""

        buf = bytearray(b"\xff" * 500)
        assert client.readinto("/holes.dat", size - 200, buf) == 200
        assert bytes(buf[:200]) == data[-200:]
        view = memoryview(bytearray(4 * KIB))
        assert client.readinto("/holes.dat", 2 * CHUNK, view) == 4 * KIB
        assert bytes(view) == bytes(4 * KIB)

        # Zero-length operations are no-ops.
        assert client.write("/holes.dat", 10, b"") == 0
        assert client.read("/holes.dat", 10, 0) == b""
        assert client.file_size("/holes.dat") == size


@pytest.mark.timeout(60)
def test_write_accepts_buffer_types_and_overwrites(inproc_cluster) -> None:
    cluster = inproc_cluster(2)
    with Client(str(cluster.registry), config=cluster.config) as client:
        base = data_for(1, 0, 3 * CHUNK)
        assert client.write("/types.dat", 0, bytearray(base)) == len(base)
        patch = data_for(2, CHUNK - 3, 10)
        assert client.write("/types.dat", CHUNK - 3, memoryview(patch)) == 10
        want = base[: CHUNK - 3] + patch + base[CHUNK + 7 :]
        assert client.read("/types.dat", 0, len(base)) == want
        assert client.file_size("/types.dat") == len(base)


_file_counter = iter(range(1_000_000))


@pytest.mark.timeout(120)
def test_random_writes_match_a_model(inproc_cluster) -> None:
    """Any sequence of writes, read back anywhere, matches a plain bytearray model."""
    cluster = inproc_cluster(3, "client.chunk_size=4096")
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
        for offset, length, seed in writes:
            data = data_for(seed, offset, length)
            assert client.write(path, offset, data) == length
            if length:
                model.extend(bytes(max(0, offset + length - len(model))))
                model[offset : offset + length] = data
        assert client.file_size(path) == len(model)
        assert client.read(path, 0, len(model) + 100) == bytes(model)
        for offset, length in reads:
            assert client.read(path, offset, length) == bytes(model[offset : offset + length])

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

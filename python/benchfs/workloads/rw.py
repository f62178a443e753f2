"""Write-then-read MPI workload that verifies every byte.

Run under mpiexec: `python -m benchfs.workloads.rw --registry DIR --file-size B
--transfer-size T --out DIR [--config FILE]`. Rank r writes `/rank-<r>.dat` (B bytes in T-byte
transfers), all ranks meet at a barrier, then rank r reads the file of rank (r+1) % size so
that data crosses clients, and compares every byte with the writer's pattern.

Bandwidth is computed as IOR does: total bytes / (latest end - earliest start) over ranks,
each phase starting after a barrier. The timed loops include generating (write) and checking
(read) the pattern; its cost is reported separately as `pattern_s`.

Errors never leave a rank stuck in a collective: after every phase the ranks exchange their
status, and if any failed, all of them record it and exit non-zero together.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import socket
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchfs import Client
from benchfs.config import resolve_config_text
from benchfs.results import write_json_atomic
from benchfs.units import parse_size

WORD = 8
RANK_SHIFT = 40
"""A file holds at most 2**40 words (8 TiB) before the counter would reach the rank bits."""
MIB = 1 << 20


class VerificationError(Exception):
    """Bytes read back differ from what their writer wrote."""


class Pattern:
    """The contents of rank r's file: little-endian 64-bit word i is ((r + 1) << 40) | i.

    Every 8-byte word names its writer and its own offset, so data that lands at the wrong
    offset, in the wrong file or not at all (zeros) is detected, and a mismatch can say where
    the bytes it found came from.
    """

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.base = (rank + 1) << RANK_SHIFT
        self._templates: dict[int, tuple[int, int]] = {}

    def _template(self, words: int) -> tuple[int, int]:
        """(0, 1, ..., words-1) and (1, 1, ..., 1) as big integers of 64-bit lanes.

        Adding c * ones to the counter template adds c to every lane without carries, which
        generates a transfer's pattern in a few C-speed big-integer operations.
        """
        cached = self._templates.get(words)
        if cached is None:
            counter = int.from_bytes(
                b"".join(i.to_bytes(WORD, "little") for i in range(words)), "little"
            )
            ones = int.from_bytes((1).to_bytes(WORD, "little") * words, "little")
            cached = (counter, ones)
            self._templates[words] = cached
        return cached

    def bytes_at(self, offset: int, length: int) -> bytes:
        """The `length` bytes of this rank's file starting at byte `offset`."""
        if length <= 0:
            return b""
        first = offset // WORD
        last = -(-(offset + length) // WORD)
        if last >= 1 << RANK_SHIFT:
            raise ValueError(f"offset {offset + length} is beyond the pattern's 8 TiB range")
        words = last - first
        counter, ones = self._template(words)
        value = counter + (self.base + first) * ones
        data = value.to_bytes(words * WORD, "little")
        skip = offset - first * WORD
        return data if skip == 0 and len(data) == length else data[skip : skip + length]


def describe_word(word: bytes) -> str:
    """Say which rank and offset an 8-byte word of pattern data came from."""
    value = int.from_bytes(word, "little")
    if value == 0:
        return "zeros"
    rank = (value >> RANK_SHIFT) - 1
    index = value & ((1 << RANK_SHIFT) - 1)
    if 0 <= rank < 1 << 20:
        return f"data of rank {rank} at offset {index * WORD}"
    return f"unrecognised bytes {word.hex()}"


def first_mismatch(offset: int, got: bytes | bytearray, expected: bytes) -> str:
    """Describe the first differing byte of a transfer that starts at file offset `offset`."""
    limit = min(len(got), len(expected))
    i = next((k for k in range(limit) if got[k] != expected[k]), limit)
    at = offset + i
    word = (at // WORD) * WORD - offset  # the 8-byte word holding the byte, within the buffer
    if word >= 0 and word + WORD <= limit:
        want = describe_word(expected[word : word + WORD])
        found = describe_word(bytes(got[word : word + WORD]))
        return f"word at offset {offset + word} differs: expected {want}, found {found}"
    return f"byte at offset {at} differs"


@dataclass
class PhaseResult:
    """One rank's timed phase; times are MPI.Wtime seconds."""

    start: float = 0.0
    end: float = 0.0
    bytes: int = 0
    pattern_s: float = 0.0


def transfers(file_size: int, transfer_size: int) -> list[tuple[int, int]]:
    """(offset, length) of each transfer covering [0, file_size); the last one may be short."""
    return [
        (off, min(transfer_size, file_size - off)) for off in range(0, file_size, transfer_size)
    ]


def write_file(
    client: Client, path: str, pattern: Pattern, file_size: int, transfer_size: int
) -> PhaseResult:
    result = PhaseResult()
    for offset, length in transfers(file_size, transfer_size):
        t0 = time.perf_counter()
        data = pattern.bytes_at(offset, length)
        result.pattern_s += time.perf_counter() - t0
        written = client.write(path, offset, data)
        if written != length:
            raise OSError(f"short write of {path} at offset {offset}: {written} of {length} bytes")
        result.bytes += written
    return result


def read_and_verify(
    client: Client, path: str, pattern: Pattern, file_size: int, transfer_size: int
) -> PhaseResult:
    """Read the file and compare every byte; raises VerificationError at the first mismatch."""
    result = PhaseResult()
    buffers: dict[int, bytearray] = {}
    for offset, length in transfers(file_size, transfer_size):
        buf = buffers.setdefault(length, bytearray(length))
        got = client.readinto(path, offset, buf)
        if got != length:
            raise VerificationError(
                f"short read of {path} at offset {offset}: {got} of {length} bytes"
            )
        result.bytes += got
        t0 = time.perf_counter()
        expected = pattern.bytes_at(offset, length)
        same = buf == expected
        result.pattern_s += time.perf_counter() - t0
        if not same:
            raise VerificationError(f"{path}: {first_mismatch(offset, buf, expected)}")
    return result


def bandwidth_mib_s(total_bytes: int, starts: Sequence[float], ends: Sequence[float]) -> float:
    """IOR-style aggregate bandwidth: total bytes over the span from first start to last end."""
    span = max(ends) - min(starts)
    return total_bytes / MIB / span if span > 0 else 0.0


def file_path(rank: int) -> str:
    return f"/rank-{rank}.dat"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchfs.workloads.rw", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--registry", required=True, help="registry directory of the servers")
    parser.add_argument("--file-size", required=True, type=parse_size, help="bytes per rank")
    parser.add_argument("--transfer-size", required=True, type=parse_size, help="bytes per call")
    parser.add_argument("--out", required=True, type=Path, help="directory for the JSON results")
    parser.add_argument("--config", help="configuration file (default: $BENCHFS_CONFIG)")
    args = parser.parse_args(argv)
    if args.transfer_size <= 0:
        parser.error("--transfer-size must be positive")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Run the workload on MPI.COMM_WORLD; return 0 only if every rank verified every byte."""
    args = parse_args(argv)
    from mpi4py import MPI  # imported late so that --help works without an MPI runtime

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    peer = (rank + 1) % size
    record: dict[str, Any] = {
        "rank": rank,
        "ranks": size,
        "host": socket.gethostname(),
        "node": os.environ.get("BENCHFS_NODE_NAME"),
        "pid": os.getpid(),
        "wrote": file_path(rank),
        "read": file_path(peer),
        "file_size": args.file_size,
        "transfer_size": args.transfer_size,
        "write": None,
        "read_phase": None,
        "verified": False,
        "error": None,
    }
    errors: list[dict[str, Any]] = []
    client: Client | None = None
    write = read = PhaseResult()

    def step(name: str, action: Any) -> bool:
        """Run one phase on every rank; True if all succeeded, else record who failed and why."""
        error = None
        try:
            action()
        except Exception as e:  # every failure is reported, whatever its type
            code = getattr(e, "errno", None)
            error = {
                "phase": name,
                "type": type(e).__name__,
                "errno": errno.errorcode.get(code) if isinstance(code, int) else None,
                "message": f"{type(e).__name__}: {e}",
            }
            print(
                f"benchfs rw: rank {rank}: {name} failed: {error['message']}",
                file=sys.stderr,
                flush=True,
            )
            record["error"] = error
        for r, failure in enumerate(comm.allgather(error)):
            if failure is not None:
                errors.append({"rank": r, **failure})
        return not errors

    def connect() -> None:
        nonlocal client
        client = Client(str(args.registry), config=resolve_config_text(args.config))

    def do_write() -> None:
        nonlocal write
        assert client is not None
        comm.Barrier()
        start = MPI.Wtime()
        write = write_file(
            client, file_path(rank), Pattern(rank), args.file_size, args.transfer_size
        )
        write.start, write.end = start, MPI.Wtime()
        record["write"] = asdict(write)

    def do_read() -> None:
        nonlocal read
        assert client is not None
        comm.Barrier()
        start = MPI.Wtime()
        read = read_and_verify(
            client, file_path(peer), Pattern(peer), args.file_size, args.transfer_size
        )
        read.start, read.end = start, MPI.Wtime()
        record["read_phase"] = asdict(read)

    def check_size() -> None:
        assert client is not None
        size_seen = client.file_size(file_path(peer))
        if size_seen != args.file_size:
            raise VerificationError(
                f"{file_path(peer)} has size {size_seen}, expected {args.file_size}"
            )
        record["verified"] = True

    servers: list[int] = []
    ok = step("connect", connect)
    if ok and client is not None:
        servers = client.server_ids()
    # A failed phase must not hide a barrier from the ranks that passed it, so every step
    # (and its barrier) runs only when all ranks are still fine.
    ok = ok and step("write", do_write)
    ok = ok and step("read", do_read)
    ok = ok and step("file_size", check_size)
    if client is not None:
        try:
            client.close()
        except OSError as e:
            print(f"benchfs rw: rank {rank}: close failed: {e}", file=sys.stderr, flush=True)

    args.out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(args.out / f"rank-{rank}.json", record)
    phases = comm.gather((asdict(write), asdict(read), record["verified"]), root=0)
    if rank == 0:
        assert phases is not None
        writes = [p[0] for p in phases]
        reads = [p[1] for p in phases]
        summary = {
            "ranks": size,
            "servers": servers,
            "file_size": args.file_size,
            "transfer_size": args.transfer_size,
            "bytes": sum(w["bytes"] for w in writes),
            "bytes_read": sum(r["bytes"] for r in reads),
            "write_s": max(w["end"] for w in writes) - min(w["start"] for w in writes),
            "read_s": max(r["end"] for r in reads) - min(r["start"] for r in reads),
            "write_mib_s": bandwidth_mib_s(
                sum(w["bytes"] for w in writes),
                [w["start"] for w in writes],
                [w["end"] for w in writes],
            ),
            "read_mib_s": bandwidth_mib_s(
                sum(r["bytes"] for r in reads),
                [r["start"] for r in reads],
                [r["end"] for r in reads],
            ),
            "pattern_s": max(
                w["pattern_s"] + r["pattern_s"] for w, r in zip(writes, reads, strict=True)
            ),
            "verified": ok and all(p[2] for p in phases),
            "errors": errors,
        }
        if not ok:
            summary["write_mib_s"] = summary["read_mib_s"] = None
        write_json_atomic(args.out / "summary.json", summary)
        print(json.dumps(summary), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

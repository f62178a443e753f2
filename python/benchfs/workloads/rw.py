"""Write-then-read MPI workload that verifies every byte.

Run under mpiexec: `python -m benchfs.workloads.rw --registry DIR --file-size B
--transfer-size T --out DIR [--config FILE] [--repetitions N]`. Rank r writes `/rank-<r>.dat`
(B bytes in T-byte transfers), all ranks meet at a barrier, then rank r reads the file of rank
(r+1) % size so that data crosses clients, and compares every byte with the writer's pattern;
N times (the file rewritten each time). With N > 1 the summary's bandwidths are the means of
the iterations and `spread` gives their standard deviation, minimum, maximum and count.

Bandwidth is computed as IOR does: total bytes / (latest end - earliest start) over ranks,
each phase starting after a barrier. The data pattern is generated before the barrier; inside
the timed loops only slicing it and comparing with it remain (reported as `pattern_s`).

Errors never leave a rank stuck in a collective: after every phase the ranks exchange their
status, and if any failed, all of them record it and exit non-zero together.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import socket
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchfs import Client
from benchfs.config import resolve_config_text
from benchfs.rankexec import mark_up
from benchfs.results import write_json_atomic
from benchfs.spread import spread
from benchfs.stdio import keep_every_byte
from benchfs.units import MIB, parse_size
from benchfs.workloads.steps import VerificationError, agreed_step, wait_for_all

WORD = 8
RANK_SHIFT = 40
PERIOD_WORDS = (1 << 23) + 1
"""The pattern repeats every 64 MiB + 8 bytes: a period that is no power of two never lines up
with chunk boundaries, and files up to that size hold no repeated word at all."""
GENERATE_PIECE = 1 << 20


class Pattern:
    """The contents of rank r's file: little-endian 64-bit word i is
    ((r + 1) << 40) | (i mod PERIOD_WORDS).

    Every 8-byte word names its writer and its own offset (modulo the 64 MiB + 8 byte period),
    so data that lands at the wrong offset, in the wrong file or not at all (zeros) is
    detected, and a mismatch can say where the bytes it found came from.
    """

    def __init__(self, rank: int, period_words: int = PERIOD_WORDS) -> None:
        if not 0 <= rank < (1 << (64 - RANK_SHIFT)) - 1:
            raise ValueError(f"rank {rank} does not fit the pattern's rank bits")
        self.rank = rank
        self.base = (rank + 1) << RANK_SHIFT
        self.period_words = period_words
        self._templates: dict[int, tuple[int, int]] = {}

    @property
    def period(self) -> int:
        """Bytes after which the pattern repeats."""
        return self.period_words * WORD

    def _template(self, words: int) -> tuple[int, int]:
        """(0, 1, ..., words-1) and (1, 1, ..., 1) as big integers of 64-bit lanes.

        Adding c * ones to the counter adds c to every lane without carries, which generates
        a run of pattern words in a few C-speed big-integer operations.
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

    def _words(self, first: int, count: int) -> bytes:
        """Words first .. first+count-1 as bytes, for a run that does not wrap the period."""
        counter, ones = self._template(count)
        return (counter + (self.base + first) * ones).to_bytes(count * WORD, "little")

    def bytes_at(self, offset: int, length: int) -> bytes:
        """The `length` bytes of this rank's file starting at byte `offset`."""
        if length <= 0:
            return b""
        first = offset // WORD
        last = -(-(offset + length) // WORD)
        runs = []
        index = first
        while index < last:
            start = index % self.period_words
            count = min(last - index, self.period_words - start)
            runs.append(self._words(start, count))
            index += count
        data = runs[0] if len(runs) == 1 else b"".join(runs)
        skip = offset - first * WORD
        return data if skip == 0 and len(data) == length else data[skip : skip + length]


class PatternBuffer:
    """One rank's pattern for a whole file, generated before the timed loops.

    The loops then only take zero-copy slices of it, so the bandwidth measures BenchFS and
    not Python generating data. It holds min(file size, period + one transfer) bytes.
    """

    def __init__(self, pattern: Pattern, file_size: int, transfer_size: int) -> None:
        self.pattern = pattern
        self.wraps = file_size > pattern.period
        size = pattern.period + transfer_size if self.wraps else file_size
        data = bytearray(size)
        for offset in range(0, size, GENERATE_PIECE):
            length = min(GENERATE_PIECE, size - offset)
            data[offset : offset + length] = pattern.bytes_at(offset, length)
        self._view = memoryview(data).toreadonly()

    def view(self, offset: int, length: int) -> memoryview:
        """The pattern bytes of [offset, offset + length), for length <= the transfer size."""
        start = offset % self.pattern.period if self.wraps else offset
        return self._view[start : start + length]


def describe_word(word: bytes) -> str:
    """Say which rank and offset an 8-byte word of pattern data came from."""
    value = int.from_bytes(word, "little")
    if value == 0:
        return "zeros"
    rank = (value >> RANK_SHIFT) - 1
    index = value & ((1 << RANK_SHIFT) - 1)
    if 0 <= rank and index < PERIOD_WORDS:
        return f"data of rank {rank} at offset {index * WORD}"
    return f"unrecognised bytes {word.hex()}"


def first_mismatch(
    offset: int, got: bytes | bytearray | memoryview, expected: bytes | memoryview
) -> str:
    """Describe the first differing word of a transfer that starts at file offset `offset`."""
    got, expected = bytes(got), bytes(expected)
    limit = min(len(got), len(expected))
    i = next((k for k in range(limit) if got[k] != expected[k]), limit)
    at = offset + i
    word = (at // WORD) * WORD - offset  # the 8-byte word holding the byte, within the buffer
    if word >= 0 and word + WORD <= limit:
        want = describe_word(expected[word : word + WORD])
        found = describe_word(got[word : word + WORD])
        return f"word at offset {offset + word} differs: expected {want}, found {found}"
    return f"byte at offset {at} differs"


@dataclass
class PhaseResult:
    """One rank's timed phase; times are MPI.Wtime seconds."""

    start: float = 0.0
    end: float = 0.0
    bytes: int = 0
    pattern_s: float = 0.0
    first_s: float | None = None
    """Seconds from the phase's start (its open included) to its first transfer's return."""


def transfers(file_size: int, transfer_size: int) -> list[tuple[int, int]]:
    """(offset, length) of each transfer covering [0, file_size); the last one may be short."""
    return [
        (off, min(transfer_size, file_size - off)) for off in range(0, file_size, transfer_size)
    ]


def write_file(
    client: Client, path: str, pattern: PatternBuffer, file_size: int, transfer_size: int
) -> PhaseResult:
    result = PhaseResult()
    began = time.perf_counter()
    with client.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC) as f:
        for offset, length in transfers(file_size, transfer_size):
            t0 = time.perf_counter()
            data = pattern.view(offset, length)
            result.pattern_s += time.perf_counter() - t0
            written = f.pwrite(data, offset)
            if written != length:
                raise OSError(
                    errno.EIO,
                    f"short write of {path} at offset {offset}: {written} of {length} bytes",
                )
            result.bytes += written
            if result.first_s is None:
                result.first_s = time.perf_counter() - began
    return result


def read_and_verify(
    client: Client, path: str, pattern: PatternBuffer, file_size: int, transfer_size: int
) -> PhaseResult:
    """Read the file and compare every byte; raises VerificationError at the first mismatch."""
    result = PhaseResult()
    buffers: dict[int, bytearray] = {}
    began = time.perf_counter()
    with client.open(path) as f:
        for offset, length in transfers(file_size, transfer_size):
            buf = buffers.setdefault(length, bytearray(length))
            got = f.preadinto(buf, offset)
            if result.first_s is None:
                result.first_s = time.perf_counter() - began
            result.bytes += got
            if got != length:
                raise VerificationError(
                    f"short read of {path} at offset {offset}: {got} of {length} bytes"
                )
            t0 = time.perf_counter()
            expected = pattern.view(offset, length)
            same = buf == expected
            result.pattern_s += time.perf_counter() - t0
            if not same:
                raise VerificationError(f"{path}: {first_mismatch(offset, buf, expected)}")
    return result


def bandwidth_mib_s(total_bytes: int, starts: Sequence[float], ends: Sequence[float]) -> float:
    """IOR-style aggregate bandwidth: total bytes over the span from first start to last end."""
    span = max(ends) - min(starts)
    return total_bytes / MIB / span if span > 0 else 0.0


def _phase_bandwidth(phases: Sequence[dict[str, Any]]) -> float:
    """One iteration's phase over all ranks, as IOR computes it."""
    return bandwidth_mib_s(
        sum(p["bytes"] for p in phases), [p["start"] for p in phases], [p["end"] for p in phases]
    )


def _phase_seconds(phases: Sequence[dict[str, Any]]) -> float:
    return max(p["end"] for p in phases) - min(p["start"] for p in phases)


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
    parser.add_argument("--repetitions", type=int, default=1, help="write/read iterations")
    args = parser.parse_args(argv)
    if args.transfer_size <= 0:
        parser.error("--transfer-size must be positive")
    if args.repetitions < 1:
        parser.error("--repetitions must be at least 1")
    return args


def process_start_time() -> float | None:
    """When this process was created (Unix time, from /proc; None where that cannot be read):
    what the launcher and Python start-up took shows against the later timestamps."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        boot = next(
            float(line.split()[1])
            for line in Path("/proc/stat").read_text().splitlines()
            if line.startswith("btime ")
        )
    except (OSError, ValueError, IndexError, StopIteration):
        return None
    return boot + ticks / os.sysconf("SC_CLK_TCK")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the workload on MPI.COMM_WORLD; return 0 only if every rank verified every byte."""
    keep_every_byte()
    args = parse_args(argv)
    main_at = time.time()
    from mpi4py import MPI  # imported late so that --help works without an MPI runtime

    mpi_at = time.time()

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    peer = (rank + 1) % size
    record: dict[str, Any] = {
        "rank": rank,
        "ranks": size,
        "host": socket.gethostname(),
        "node": os.environ.get("BENCHFS_NODE_NAME"),
        "pid": os.getpid(),
        "timeline": {"process_start": process_start_time(), "main": main_at, "mpi_ready": mpi_at},
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
    pattern: PatternBuffer | None = None
    write, read = PhaseResult(), PhaseResult()

    def step(name: str, action: Callable[[], None]) -> bool:
        """Run `action` on every rank; True if all succeeded, else record who failed and why.

        The outcome is exchanged with an allgather, so every rank takes the same next step and
        no rank ever waits in a collective that another one skipped.
        """
        error, failures = agreed_step(comm, "rw", name, action)
        if error is not None:
            record["error"] = error
        errors.extend(failures)
        return not errors

    def timed_phase(name: str, prepare: Callable[[], None], work: Callable[[], None]) -> bool:
        """Prepare (untimed), meet at a barrier, then run the timed work: IOR's phase shape."""
        if not step(name, prepare):
            return False
        wait_for_all(comm)
        return step(name, work)

    def connect() -> None:
        nonlocal client
        started, cpu, fds = time.time(), time.process_time(), len(os.listdir("/proc/self/fd"))
        client = Client(str(args.registry), config=resolve_config_text(args.config))
        mark_up()
        record["connect"] = {
            "start": started,
            "end": time.time(),
            "cpu_s": time.process_time() - cpu,
            "descriptors": len(os.listdir("/proc/self/fd")) - fds,
        }

    def prepare_write() -> None:
        nonlocal pattern
        pattern = PatternBuffer(Pattern(rank), args.file_size, args.transfer_size)

    def do_write() -> None:
        nonlocal write
        assert client is not None and pattern is not None
        start, began = MPI.Wtime(), time.time()
        write = write_file(client, file_path(rank), pattern, args.file_size, args.transfer_size)
        write.start, write.end = start, MPI.Wtime()
        record["write"] = asdict(write)
        record["timeline"]["write"] = [began, time.time()]

    def prepare_read() -> None:
        nonlocal pattern
        pattern = None  # one pattern in memory at a time
        pattern = PatternBuffer(Pattern(peer), args.file_size, args.transfer_size)

    def do_read() -> None:
        nonlocal read
        assert client is not None and pattern is not None
        start, began = MPI.Wtime(), time.time()
        read = read_and_verify(client, file_path(peer), pattern, args.file_size, args.transfer_size)
        read.start, read.end = start, MPI.Wtime()
        record["read_phase"] = asdict(read)
        record["timeline"]["read"] = [began, time.time()]

    def check_size() -> None:
        assert client is not None
        size_seen = client.stat(file_path(peer)).st_size
        if size_seen != args.file_size:
            raise VerificationError(
                f"{file_path(peer)} has size {size_seen}, expected {args.file_size}"
            )
        record["verified"] = True

    servers: list[int] = []
    ok = step("connect", connect)
    if ok and client is not None:
        servers = client.server_ids()
    iterations: list[tuple[dict[str, Any], dict[str, Any]]] = []
    for _ in range(args.repetitions):
        ok = ok and timed_phase("write", prepare_write, do_write)
        ok = ok and timed_phase("read", prepare_read, do_read)
        ok = ok and step("file_size", check_size)
        if not ok:
            break
        iterations.append((asdict(write), asdict(read)))
    record["iterations"] = len(iterations)
    pattern = None
    if client is not None:
        try:
            client.close()
        except OSError as e:
            print(f"benchfs rw: rank {rank}: close failed: {e}", file=sys.stderr, flush=True)

    args.out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(args.out / f"rank-{rank}.json", record)
    # Every rank has the same iterations (each step's outcome is agreed by all).
    if not iterations:
        iterations = [(asdict(write), asdict(read))]
    gathered = comm.gather((iterations, record["verified"]), root=0)
    if rank == 0:
        assert gathered is not None
        per_iteration = [
            ([g[0][k][0] for g in gathered], [g[0][k][1] for g in gathered])
            for k in range(len(iterations))
        ]
        write_bw = [_phase_bandwidth(writes) for writes, _ in per_iteration]
        read_bw = [_phase_bandwidth(reads) for _, reads in per_iteration]
        summary = {
            "ranks": size,
            "servers": servers,
            "file_size": args.file_size,
            "transfer_size": args.transfer_size,
            "repetitions": args.repetitions,
            "bytes": sum(w["bytes"] for writes, _ in per_iteration for w in writes),
            "bytes_read": sum(r["bytes"] for _, reads in per_iteration for r in reads),
            "write_s": sum(_phase_seconds(writes) for writes, _ in per_iteration),
            "read_s": sum(_phase_seconds(reads) for _, reads in per_iteration),
            "write_mib_s": statistics.fmean(write_bw),
            "read_mib_s": statistics.fmean(read_bw),
            "pattern_s": max(
                sum(w[k][0]["pattern_s"] + w[k][1]["pattern_s"] for k in range(len(iterations)))
                for w, _ in gathered
            ),
            "verified": ok and all(g[1] for g in gathered),
            "errors": errors,
        }
        if len(per_iteration) > 1:
            summary["spread"] = {"write_mib_s": spread(write_bw), "read_mib_s": spread(read_bw)}
        if not ok:
            summary["write_mib_s"] = summary["read_mib_s"] = None
            summary.pop("spread", None)
        write_json_atomic(args.out / "summary.json", summary)
        print(json.dumps(summary), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""A client process that reads one file in ranges, driven over stdin and stdout (the whole-path
benchmark starts several).

`python -m benchfs.clients.range_reader --registry DIR --config FILE --path /f --file-size B
--range-size R` connects, writes its file (untimed), prints `{"ready": true}`, then obeys one
command per stdin line and answers with one JSON line each:

- `read SECONDS`: read the file in R-byte ranges, cycling, until SECONDS have passed; answer
  `{"bytes", "reads", "seconds"}`. With R = 16 chunks and `client.max_inflight=16`, each reader
  keeps 16 chunk reads in flight.
- `quit` (or end of input): exit.

Errors are answered as `{"error": "..."}` and end the process with status 1.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from benchfs import Client, File
from benchfs.clients.lines import Answer, Obey, serve
from benchfs.config import resolve_config_text
from benchfs.stdio import keep_every_byte
from benchfs.units import parse_size

FILL = 0xA5


def write_file(client: Client, path: str, size: int, piece: int) -> None:
    data = bytes([FILL]) * piece
    with client.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC) as f:
        for offset in range(0, size, piece):
            n = min(piece, size - offset)
            written = f.pwrite(memoryview(data)[:n], offset)
            if written != n:
                raise OSError(f"short write of {path} at {offset}: {written} of {n} bytes")


def read_for(file: File, size: int, piece: int, seconds: float) -> dict[str, Any]:
    path = file.name
    buf = bytearray(piece)
    offsets = list(range(0, size - piece + 1, piece)) or [0]
    total = reads = 0
    start = time.perf_counter()
    deadline = start + seconds
    while True:
        for offset in offsets:
            got = file.preadinto(buf, offset)
            if got <= 0:
                raise OSError(f"read of {path} at {offset} returned {got} bytes")
            total += got
            reads += 1
            if time.perf_counter() >= deadline:
                return {"bytes": total, "reads": reads, "seconds": time.perf_counter() - start}


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchfs.clients.range_reader", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--registry", required=True)
    parser.add_argument("--config", required=True, help="effective configuration file")
    parser.add_argument("--path", required=True, help="BenchFS file this reader owns")
    parser.add_argument("--file-size", required=True, type=parse_size)
    parser.add_argument("--range-size", required=True, type=parse_size, help="bytes per read")
    return parser.parse_args(argv)


@contextmanager
def session(args: argparse.Namespace) -> Iterator[Obey]:
    with Client(args.registry, config=resolve_config_text(args.config)) as client:
        write_file(client, args.path, args.file_size, args.range_size)
        file = client.open(args.path)

        def obey(words: list[str]) -> Answer:
            if words[0] != "read" or len(words) != 2:
                raise ValueError(f"unknown command {' '.join(words)!r}")
            return read_for(file, args.file_size, args.range_size, float(words[1]))

        yield obey


def main(argv: Sequence[str] | None = None) -> int:
    keep_every_byte()
    args = parse_args(argv)
    return serve(lambda: session(args))


if __name__ == "__main__":
    sys.exit(main())

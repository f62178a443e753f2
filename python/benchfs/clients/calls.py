"""A BenchFS client process that makes timed calls (bandwidth, round trips, load), driven over
stdin and stdout; the RPC benchmark and the diagnose network probe start it.

`python -m benchfs.clients.calls --registry DIR --config FILE --name NAME --call-size B`
connects, writes its two files untimed (`/<NAME>.dat` of B bytes for the bandwidth and load
commands, `/<NAME>-4k.dat` of 4 KiB for the round trips; `--no-prepare` skips this), prints
`{"ready": true}`, then obeys one command per stdin line and answers with one JSON line each:

- `bw write|read SECONDS`: write (or read) the whole B-byte file in one call, again and again,
  until SECONDS have passed; a call of B bytes is B / chunk_size chunk requests, issued
  concurrently up to the client's windows. Answer `{"bytes", "calls", "seconds"}`.
- `rtt null|null-rust|write|read COUNT SECONDS`: COUNT calls (or fewer if SECONDS run out),
  each timed alone with `time.perf_counter_ns`, after a short untimed warm-up. `null` is
  `stat` (one round trip to the metadata owner, no payload and no disk), `null-rust` the same
  stats timed in Rust (`_core.Client.time_stats`: no interpreter per call), `write` and `read`
  move 4 KiB at offset 0 (one chunk request). Answer `{"count", "p50_us", "p99_us",
  "mean_us", "min_us"}`.
- `load write|read SECONDS`: like `bw`, but a failed call is counted (`errors`, with the first
  message in `first_error`) instead of ending the process, and the load ends with a flush of
  writes still behind (`client.write_behind`); the answer also has the per-call latency
  (`call_p50_us`, `call_p99_us`) and this client's per-server counters (`servers`: requests,
  retries, timeouts, failures).
- `quit` (or end of input): exit.

Errors other than those of `load` are answered as `{"error": "..."}` and end the process with
status 1.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np

from benchfs import Client, File
from benchfs.clients.lines import Obey, serve
from benchfs.config import resolve_config_text
from benchfs.stdio import keep_every_byte
from benchfs.units import parse_size

FILL = 0x5A
SMALL = 4096
WARMUP_CALLS = 2000
"""Untimed calls before a round-trip measurement: the first few thousand ran up to 3x slower."""


def percentiles_us(samples_ns: Sequence[int]) -> dict[str, float]:
    """p50, p99, mean and min of nanosecond samples, in µs (linear interpolation)."""
    data = np.asarray(samples_ns, dtype=np.float64) / 1000.0
    p50, p99 = np.percentile(data, [50, 99])
    return {
        "p50_us": float(p50),
        "p99_us": float(p99),
        "mean_us": float(data.mean()),
        "min_us": float(data.min()),
    }


class Driver:
    """One client and its two files."""

    def __init__(self, client: Client, name: str, call_size: int) -> None:
        self.client = client
        self.path = f"/{name}.dat"
        self.small_path = f"/{name}-4k.dat"
        self.data = memoryview(bytes([FILL]) * call_size)
        self.buf = bytearray(call_size)
        self.small = memoryview(bytes([FILL]) * SMALL)
        self.small_buf = bytearray(SMALL)

    def prepare(self) -> None:
        """Write both files and publish their sizes."""
        self.write_call()
        self._check(self.small_file.pwrite(self.small, 0), SMALL, "write")
        self.file.fsync()
        self.small_file.fsync()

    @functools.cached_property
    def file(self) -> File:
        return self.client.open(self.path, os.O_RDWR | os.O_CREAT)

    @functools.cached_property
    def small_file(self) -> File:
        return self.client.open(self.small_path, os.O_RDWR | os.O_CREAT)

    def _check(self, got: int, want: int, what: str) -> None:
        if got != want:
            raise OSError(f"short {what}: {got} of {want} bytes")

    def write_call(self) -> int:
        n = self.file.pwrite(self.data, 0)
        self._check(n, len(self.data), f"write of {self.path}")
        return n

    def read_call(self) -> int:
        n = self.file.preadinto(self.buf, 0)
        self._check(n, len(self.buf), f"read of {self.path}")
        return n

    def call(self, op: str) -> Callable[[], int]:
        if op == "write":
            return self.write_call
        if op == "read":
            return self.read_call
        raise ValueError(f"unknown direction {op!r} (write or read)")

    def bandwidth(self, op: str, seconds: float) -> dict[str, Any]:
        call = self.call(op)
        total = calls = 0
        start = time.perf_counter()
        deadline = start + seconds
        while True:
            total += call()
            calls += 1
            if time.perf_counter() >= deadline:
                return {"bytes": total, "calls": calls, "seconds": time.perf_counter() - start}

    def round_trip(self, op: str, count: int, seconds: float) -> dict[str, Any]:
        client, path, small = self.client, self.small_path, self.small_file
        if op == "null-rust":  # the same stats, timed in Rust: no interpreter per call
            for _ in range(WARMUP_CALLS):
                client.stat(path)
            samples = client._core.time_stats(path, count, seconds)
            return {"count": len(samples), **percentiles_us(samples)}
        if op == "null":

            def once() -> None:
                client.stat(path)

        elif op == "write":
            data = self.small

            def once() -> None:
                small.pwrite(data, 0)

        elif op == "read":
            buf = self.small_buf

            def once() -> None:
                small.preadinto(buf, 0)

        else:
            raise ValueError(f"unknown round trip {op!r} (null, write or read)")
        for _ in range(WARMUP_CALLS):
            once()
        clock = time.perf_counter_ns
        deadline = clock() + int(seconds * 1e9)
        samples: list[int] = []
        append = samples.append
        for _ in range(count):
            t0 = clock()
            once()
            t1 = clock()
            append(t1 - t0)
            if t1 >= deadline:
                break
        return {"count": len(samples), **percentiles_us(samples)}

    def load(self, op: str, seconds: float) -> dict[str, Any]:
        call = self.call(op)
        total = calls = errors = 0
        first_error: str | None = None
        samples: list[int] = []
        start = time.perf_counter()
        deadline = start + seconds
        while time.perf_counter() < deadline:
            t0 = time.perf_counter_ns()
            try:
                total += call()
                calls += 1
            except OSError as e:  # TimeoutError, ConnectionError, ... are OSErrors
                errors += 1
                first_error = first_error or f"{type(e).__name__}: {e}"
            samples.append(time.perf_counter_ns() - t0)
        try:
            # Writes still behind (client.write_behind) are answered within the measured
            # time, so what is counted reached the servers.
            self.file.flush()
        except OSError as e:
            errors += 1
            first_error = first_error or f"{type(e).__name__}: {e}"
        answer: dict[str, Any] = {
            "bytes": total,
            "calls": calls,
            "seconds": time.perf_counter() - start,
            "errors": errors,
            "first_error": first_error,
            "servers": self.client.server_stats(),
        }
        if samples:
            lat = percentiles_us(samples)
            answer["call_p50_us"] = lat["p50_us"]
            answer["call_p99_us"] = lat["p99_us"]
        return answer

    def obey(self, words: list[str]) -> dict[str, Any]:
        if words[0] == "bw" and len(words) == 3:
            return self.bandwidth(words[1], float(words[2]))
        if words[0] == "rtt" and len(words) == 4:
            return self.round_trip(words[1], int(words[2]), float(words[3]))
        if words[0] == "load" and len(words) == 3:
            return self.load(words[1], float(words[2]))
        raise ValueError(f"unknown command {' '.join(words)!r}")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchfs.clients.calls", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--registry", required=True)
    parser.add_argument("--config", required=True, help="effective configuration file")
    parser.add_argument("--name", required=True, help="names this client's files")
    parser.add_argument("--call-size", required=True, type=parse_size, help="bytes per call")
    parser.add_argument(
        "--no-prepare",
        dest="prepare",
        action="store_false",
        help="do not write the files at start (write loads need none)",
    )
    return parser.parse_args(argv)


@contextmanager
def session(args: argparse.Namespace) -> Iterator[Obey]:
    with Client(args.registry, config=resolve_config_text(args.config)) as client:
        driver = Driver(client, args.name, args.call_size)
        if args.prepare:
            driver.prepare()
        yield driver.obey


def main(argv: Sequence[str] | None = None) -> int:
    keep_every_byte()
    args = parse_args(argv)
    return serve(lambda: session(args))


if __name__ == "__main__":
    sys.exit(main())

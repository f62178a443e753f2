"""A test-only writer of telemetry (.tel, format versions 1 and 2) and trace (.trace) files.

It follows docs/telemetry.md byte for byte with `struct`, independently of the loader, so the
analysis tests can plant known answers (a slow node, a bimodal distribution, an imbalance,
client retries) in files of the documented format. The Rust core writes the same formats
(tests/test_telemetry_client.py loads its files from real runs).
"""

from __future__ import annotations

import json
import struct
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

OPS = ["write", "read", "fsync", "meta"]
NO_OP = 255
NO_TARGET = 0xFFFF
BUCKET_NONE, BUCKET_COUNT, BUCKET_SUM, BUCKET_MIN, BUCKET_MAX = (
    0xFFFF,
    0xFFFE,
    0xFFFD,
    0xFFFC,
    0xFFFB,
)

# (id, name, kind, per_op, per_target, unit): the tables of docs/telemetry.md.
SERVER_METRICS = [
    (1, "ops", "counter", True, False, "ops"),
    (2, "bytes", "counter", True, False, "bytes"),
    (3, "errors", "counter", True, False, "ops"),
    (4, "pool_waits", "counter", False, False, "waits"),
    (5, "handle_hits", "counter", False, False, "lookups"),
    (6, "handle_misses", "counter", False, False, "lookups"),
    (7, "rejected_busy", "counter", False, False, "requests"),
    (8, "malformed", "counter", False, False, "requests"),
    (9, "queue_depth", "gauge", False, False, "requests"),
    (10, "in_service", "gauge", False, False, "requests"),
    (11, "buffers_free", "gauge", False, False, "buffers"),
    (12, "refused_auth", "counter", False, False, "requests"),
    (16, "inflight_at_submit", "histogram", False, False, "ops"),
    (17, "submit_batch", "histogram", False, False, "sqes"),
    (18, "queue_wait_ns", "histogram", True, False, "ns"),
    (19, "device_ns", "histogram", True, False, "ns"),
    (20, "total_ns", "histogram", True, False, "ns"),
]
CLIENT_METRICS = [
    (1, "requests", "counter", True, True, "requests"),
    (2, "bytes", "counter", True, True, "bytes"),
    (3, "retries", "counter", True, True, "requests"),
    (4, "timeouts", "counter", True, True, "requests"),
    (5, "errors", "counter", True, True, "requests"),
    (6, "busy", "counter", True, True, "requests"),
    (7, "inflight", "gauge", False, False, "requests"),
    (16, "rpc_ns", "histogram", True, True, "ns"),
    (17, "call_ns", "histogram", True, False, "ns"),
    (18, "inflight_at_send", "histogram", False, False, "requests"),
    (19, "window_wait_ns", "histogram", True, False, "ns"),
]


def bucket(v: int) -> int:
    """docs/telemetry.md: v if v < 4 else 4 * (e - 1) + ((v >> (e - 2)) & 3), e = floor(log2 v)."""
    if v < 4:
        return v
    e = v.bit_length() - 1
    return 4 * (e - 1) + ((v >> (e - 2)) & 3)


@dataclass
class Hist:
    buckets: Counter[int] = field(default_factory=Counter)
    count: int = 0
    total: int = 0
    vmin: int = 0
    vmax: int = 0

    def add(self, values: Iterable[int] | np.ndarray) -> None:
        arr = np.asarray(list(values) if not isinstance(values, np.ndarray) else values)
        if arr.size == 0:
            return
        uniq, counts = np.unique(arr.astype(np.uint64), return_counts=True)
        for v, n in zip(uniq.tolist(), counts.tolist(), strict=True):
            self.buckets[bucket(int(v))] += n
        lo, hi = int(uniq[0]), int(uniq[-1])
        self.vmin = lo if self.count == 0 else min(self.vmin, lo)
        self.vmax = max(self.vmax, hi)
        self.count += int(arr.size)
        self.total += int(arr.astype(np.uint64).sum())


class TelWriter:
    """Writes one telemetry file: a header, then `snapshot()` appends the current state."""

    def __init__(
        self,
        path: Path,
        source: str = "server",
        ident: int = 0,
        node: str = "node-0",
        worker: int = 0,
        version: int = 2,
        targets: Sequence[int] = (),
    ) -> None:
        self.path, self.source, self.ident, self.node = path, source, ident, node
        self.worker, self.version, self.targets = worker, version, list(targets)
        self.metrics = SERVER_METRICS if source == "server" else CLIENT_METRICS
        self.by_name = {m[1]: m for m in self.metrics}
        self.values: dict[tuple[int, int, int], int] = {}
        self.hists: dict[tuple[int, int, int], Hist] = {}
        self.seq = 0
        path.write_bytes(self._header())

    def _header(self) -> bytes:
        fields = [["t_ns", "u64"], ["value", "u64"], ["id", "u32"], ["seq", "u32"]]
        fields += [["worker", "u16"], ["metric", "u8"], ["op", "u8"], ["bucket", "u16"]]
        fields.append(["target" if self.version >= 2 else "reserved", "u16"])
        header: dict[str, Any] = {
            "format": "benchfs-telemetry",
            "version": self.version,
            "source": self.source,
            "id": self.ident,
            "worker": self.worker,
            "node": self.node,
            "pid": 4242,
            "created_unix_ns": 1_700_000_000_000_000_000,
            "byte_order": "little",
            "record_size": 32,
            "record_fields": fields,
            "ops": OPS,
            "no_op": NO_OP,
            "end_metric": 0,
            "histogram": {"scheme": "log-linear", "sub_bucket_bits": 2, "buckets": 252},
            "special_buckets": {
                "none": 65535,
                "count": 65534,
                "sum": 65533,
                "min": 65532,
                "max": 65531,
            },
            "metrics": [
                {"id": i, "name": n, "kind": k, "per_op": po, "unit": u}
                | ({"per_target": pt} if self.version >= 2 else {})
                for i, n, k, po, pt, u in self.metrics
            ],
        }
        if self.version >= 2:
            header["no_target"] = NO_TARGET
        if self.source == "client":
            header["targets"] = self.targets
        text = json.dumps(header).encode()
        text += b" " * ((-(16 + len(text))) % 32)
        return b"BFSTELEM" + struct.pack("<II", self.version, len(text)) + text

    def _key(self, name: str, op: str | None, target: int | None) -> tuple[int, int, int]:
        mid, _, _, per_op, per_target, _ = self.by_name[name]
        assert per_op == (op is not None), name
        assert per_target == (target is not None), name
        return (
            mid,
            NO_OP if op is None else OPS.index(op),
            NO_TARGET if target is None else target,
        )

    def add(self, name: str, value: int, op: str | None = None, target: int | None = None) -> None:
        key = self._key(name, op, target)
        self.values[key] = self.values.get(key, 0) + int(value)

    def set(self, name: str, value: int, op: str | None = None, target: int | None = None) -> None:
        self.values[self._key(name, op, target)] = int(value)

    def record(
        self,
        name: str,
        values: Iterable[int] | np.ndarray,
        op: str | None = None,
        target: int | None = None,
    ) -> None:
        self.hists.setdefault(self._key(name, op, target), Hist()).add(values)

    def _active(self, op: int, target: int) -> bool:
        """Client per-target series are written once the pair has sent a request."""
        return self.values.get((1, op, target), 0) > 0

    def snapshot(self, t_ns: int) -> None:
        recs: list[tuple[int, int, int, int, int]] = []  # metric, op, bucket, value, target
        ops_range = range(len(OPS))
        for mid, _, kind, per_op, per_target, _ in self.metrics:
            if kind == "histogram":
                continue
            for op in ops_range if per_op else [NO_OP]:
                for target in self.targets if per_target else [NO_TARGET]:
                    if per_target and not self._active(op, target):
                        continue
                    recs.append(
                        (mid, op, BUCKET_NONE, self.values.get((mid, op, target), 0), target)
                    )
        for mid, _, kind, per_op, per_target, _ in self.metrics:
            if kind != "histogram":
                continue
            for op in ops_range if per_op else [NO_OP]:
                for target in self.targets if per_target else [NO_TARGET]:
                    if per_target and not self._active(op, target):
                        continue
                    h = self.hists.get((mid, op, target), Hist())
                    recs.append((mid, op, BUCKET_COUNT, h.count, target))
                    recs.append((mid, op, BUCKET_SUM, h.total, target))
                    recs.append((mid, op, BUCKET_MIN, h.vmin, target))
                    recs.append((mid, op, BUCKET_MAX, h.vmax, target))
                    for b in sorted(h.buckets):
                        recs.append((mid, op, b, h.buckets[b], target))
        out = bytearray()
        for mid, op, b, value, target in recs:
            out += self._record(t_ns, value, mid, op, b, target)
        out += self._record(t_ns, len(recs), 0, NO_OP, BUCKET_NONE, NO_TARGET)
        with self.path.open("ab") as f:
            f.write(bytes(out))
        self.seq += 1

    def _record(self, t_ns: int, value: int, metric: int, op: int, b: int, target: int) -> bytes:
        last = target if self.version >= 2 else 0
        return struct.pack(
            "<QQIIHBBHH", t_ns, value, self.ident, self.seq, self.worker, metric, op, b, last
        )


def trace_header(server: int, worker: int = 0, node: str = "node-0") -> bytes:
    header = {
        "format": "benchfs-trace",
        "version": 1,
        "source": "server",
        "id": server,
        "worker": worker,
        "node": node,
        "pid": 4242,
        "created_unix_ns": 1_700_000_000_000_000_000,
        "byte_order": "little",
        "record_size": 72,
        "record_fields": [
            ["t_ns", "u64"],
            ["queue_ns", "u64"],
            ["device_ns", "u64"],
            ["total_ns", "u64"],
            ["file_lo", "u64"],
            ["file_hi", "u64"],
            ["chunk", "u64"],
            ["bytes", "u64"],
            ["server", "u32"],
            ["worker", "u16"],
            ["op", "u8"],
            ["flags", "u8"],
        ],
        "ops": OPS,
        "ring_records": 65536,
    }
    text = json.dumps(header).encode()
    text += b" " * ((-(16 + len(text))) % 8)
    return b"BFSTRACE" + struct.pack("<II", 1, len(text)) + text


def trace_record(
    t_ns: int,
    op: str,
    total_ns: int,
    *,
    server: int = 0,
    worker: int = 0,
    queue_ns: int = 0,
    device_ns: int | None = None,
    file_id: int = 1,
    chunk: int = 0,
    nbytes: int = 4096,
    error: bool = False,
) -> bytes:
    device = total_ns - queue_ns if device_ns is None else device_ns
    return struct.pack(
        "<QQQQQQQQIHBB",
        t_ns,
        queue_ns,
        device,
        total_ns,
        file_id & (2**64 - 1),
        file_id >> 64,
        chunk,
        nbytes,
        server,
        worker,
        OPS.index(op),
        1 if error else 0,
    )

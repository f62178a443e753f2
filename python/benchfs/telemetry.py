"""Load BenchFS telemetry files into pandas (the format is documented in docs/telemetry.md).

Every server worker appends snapshots of its cumulative counters and histograms to one file,
a fixed-record little-endian binary with a JSON header. `load` maps each file with one
`np.frombuffer` and builds the DataFrames with array operations only: the cost is per file,
never per record in Python.

    >>> tel = load("results/20250102T030405Z-local-3fa9c1")
    >>> tel.counters.query("metric == 'bytes' and op == 'write'")
    >>> tel.quantile("total_ns", "read", 0.99)          # ns, whole run, all servers
    >>> tel.rates().query("metric == 'ops'")              # per-interval deltas and rates

A snapshot that is still being written (or torn by a crash) at the end of a file is skipped;
any other damage, a wrong format version or a file that is not telemetry at all raises
`TelemetryFormatError` naming the file.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from numpy.typing import ArrayLike

from benchfs.errors import ParseError
from benchfs.results import TELEMETRY_PATTERN, TRACE_PATTERN, RunDir

__all__ = [
    "BUCKETS",
    "FORMAT_VERSION",
    "FORMAT_VERSIONS",
    "NO_TARGET",
    "RECORD_DTYPE",
    "RECORD_DTYPE_V2",
    "TRACE_DTYPE",
    "Telemetry",
    "TelemetryFollower",
    "TelemetryFormatError",
    "bucket_bounds",
    "bucket_quantile",
    "histogram_quantile",
    "load",
    "load_names",
    "load_trace",
]

MAGIC = b"BFSTELEM"
FORMAT_VERSION = 2
"""The newest format version this loader reads (and the one client telemetry needs)."""
FORMAT_VERSIONS = (1, 2)
"""Every version this loader reads: 1 (servers only) and 2 (adds `target` and clients)."""
PREAMBLE_SIZE = 16
RECORD_SIZE = 32
RECORD_DTYPE = np.dtype(
    [
        ("t_ns", "<u8"),
        ("value", "<u8"),
        ("id", "<u4"),
        ("seq", "<u4"),
        ("worker", "<u2"),
        ("metric", "u1"),
        ("op", "u1"),
        ("bucket", "<u2"),
        ("reserved", "<u2"),
    ]
)
"""One record of a version 1 file, as in docs/telemetry.md."""
RECORD_DTYPE_V2 = np.dtype(
    [
        ("t_ns", "<u8"),
        ("value", "<u8"),
        ("id", "<u4"),
        ("seq", "<u4"),
        ("worker", "<u2"),
        ("metric", "u1"),
        ("op", "u1"),
        ("bucket", "<u2"),
        ("target", "<u2"),
    ]
)
"""One record of a version 2 file: version 1's `reserved` field became `target`."""
assert RECORD_DTYPE.itemsize == RECORD_DTYPE_V2.itemsize == RECORD_SIZE
NO_TARGET = 0xFFFF
"""`target` of a version 2 record whose metric is not per target server."""

SUB_BUCKET_BITS = 2
BUCKETS = (65 - SUB_BUCKET_BITS) * (1 << SUB_BUCKET_BITS)
END_METRIC = 0
NO_OP = 0xFF
BUCKET_NONE = 0xFFFF
# Histogram statistics: the record's bucket field, and the suffix of their counter name.
_STATS = ((0xFFFE, "count", "counter"), (0xFFFD, "sum", "counter"))
_STATS += ((0xFFFC, "min", "gauge"), (0xFFFB, "max", "gauge"))
_LOWEST_SPECIAL = 0xFFFB
SOURCES = ("server", "client")
"""Sources this loader reads; `client` needs format version 2."""
SOURCES_V1 = ("server",)

KEYS = ["source", "server", "worker", "node"]
"""Columns that name the writer of a row (one worker of one server)."""
CLIENT_KEYS = ["source", "client", "worker", "node"]
"""Columns that name the writer of a client row (one Client object of one client process)."""

TRACE_MAGIC = b"BFSTRACE"
TRACE_VERSION = 1
TRACE_RECORD_SIZE = 72
TRACE_DTYPE = np.dtype(
    [
        ("t_ns", "<u8"),
        ("queue_ns", "<u8"),
        ("device_ns", "<u8"),
        ("total_ns", "<u8"),
        ("file_lo", "<u8"),
        ("file_hi", "<u8"),
        ("chunk", "<u8"),
        ("bytes", "<u8"),
        ("server", "<u4"),
        ("worker", "<u2"),
        ("op", "u1"),
        ("flags", "u1"),
    ]
)
"""One per-operation trace record (docs/telemetry.md, "Per-operation traces")."""
assert TRACE_DTYPE.itemsize == TRACE_RECORD_SIZE
TRACE_FLAG_ERROR = 1


class TelemetryFormatError(ParseError):
    """A file is not BenchFS telemetry, has another format version, or is damaged."""


def bucket_bounds(index: np.ndarray | Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """Smallest and largest value (inclusive, uint64) of histogram buckets `index`.

    Buckets 0-7 hold one value each; bucket i >= 4 spans
    [2^e + s * 2^(e-2), 2^e + (s+1) * 2^(e-2) - 1] with e = i // 4 + 1, s = i % 4.
    """
    i = np.asarray(index, dtype=np.uint64)
    sub = np.uint64(1 << SUB_BUCKET_BITS)
    bits = np.uint64(SUB_BUCKET_BITS)
    small = i < sub
    e = np.where(small, bits, i // sub + bits - np.uint64(1)).astype(np.uint64)
    one = np.uint64(1)
    lo = np.left_shift(one, e) + np.left_shift(i % sub, e - bits)
    hi = lo + (np.left_shift(one, e - bits) - one)
    return np.where(small, i, lo), np.where(small, i, hi)


_BUCKET_LO, _BUCKET_HI = bucket_bounds(np.arange(BUCKETS))


@dataclass
class _File:
    path: Path
    header: dict[str, Any]
    records: np.ndarray  # of complete snapshots, end markers removed
    snapshots: int
    torn_bytes: int
    version: int = 1


def _max_snapshot_records(header: dict[str, Any]) -> int:
    """Records of the largest snapshot the header's metrics allow (the longest torn tail)."""
    total = 1  # the end marker
    targets = max(1, len(header.get("targets") or []))
    for m in header["metrics"]:
        series = len(header["ops"]) if m["per_op"] else 1
        series *= targets if m.get("per_target") else 1
        total += series * ((4 + BUCKETS) if m["kind"] == "histogram" else 1)
    return total


def _check_header(path: Path, header: Any, version: int) -> dict[str, Any]:
    def bad(why: str) -> TelemetryFormatError:
        return TelemetryFormatError(f"{path}: malformed telemetry header: {why}")

    if not isinstance(header, dict):
        raise bad("not a JSON object")
    if header.get("format") != "benchfs-telemetry" or header.get("version") != version:
        raise bad(f"format/version {header.get('format')!r}/{header.get('version')!r}")
    if header.get("record_size") != RECORD_SIZE or header.get("byte_order") != "little":
        raise bad("record_size must be 32 and byte_order little")
    hist = header.get("histogram") or {}
    if hist.get("sub_bucket_bits") != SUB_BUCKET_BITS or hist.get("buckets") != BUCKETS:
        raise bad(f"histogram scheme {hist!r}, expected {SUB_BUCKET_BITS} sub-bucket bits")
    sources = SOURCES_V1 if version == 1 else SOURCES
    if header.get("source") not in sources:
        raise TelemetryFormatError(
            f"{path}: telemetry source {header.get('source')!r} is not supported in format "
            f"version {version} (reads {', '.join(sources)})"
        )
    if version >= 2 and header["source"] == "client":
        targets = header.get("targets")
        if not isinstance(targets, list) or not all(
            isinstance(t, int) and 0 <= t < NO_TARGET for t in targets
        ):
            raise bad("a client header needs 'targets', the list of server ids it talks to")
    for key, kind in (("id", int), ("worker", int), ("node", str), ("ops", list)):
        if not isinstance(header.get(key), kind):
            raise bad(f"{key!r} missing or not {kind.__name__}")
    metrics = header.get("metrics")
    if not isinstance(metrics, list) or not metrics:
        raise bad("no metrics table")
    for m in metrics:
        if (
            not isinstance(m, dict)
            or not isinstance(m.get("id"), int)
            or not 1 <= m["id"] <= 255
            or not isinstance(m.get("name"), str)
            or m.get("kind") not in ("counter", "gauge", "histogram")
            or not isinstance(m.get("per_op"), bool)
            or not isinstance(m.get("per_target", False), bool)
            or (version == 1 and m.get("per_target", False))
        ):
            raise bad(f"bad metric entry {m!r}")
    return header


def _read(path: Path) -> _File:
    try:
        data = path.read_bytes()
    except IsADirectoryError as e:
        raise TelemetryFormatError(f"{path}: a directory, not a telemetry file") from e
    if len(data) < PREAMBLE_SIZE or data[:8] != MAGIC:
        raise TelemetryFormatError(f"{path}: not a BenchFS telemetry file (bad magic)")
    version, header_len = struct.unpack_from("<II", data, 8)
    if version not in FORMAT_VERSIONS:
        raise TelemetryFormatError(
            f"{path}: telemetry format version {version}; this version of benchfs reads "
            f"versions {', '.join(map(str, FORMAT_VERSIONS))}"
        )
    start = PREAMBLE_SIZE + header_len
    if start > len(data) or start % RECORD_SIZE:
        raise TelemetryFormatError(f"{path}: header length {header_len} does not fit the file")
    try:
        header = json.loads(data[PREAMBLE_SIZE:start])
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise TelemetryFormatError(f"{path}: malformed telemetry header: {e}") from e
    header = _check_header(path, header, version)

    records = np.frombuffer(
        data,
        dtype=RECORD_DTYPE if version == 1 else RECORD_DTYPE_V2,
        count=(len(data) - start) // RECORD_SIZE,
        offset=start,
    )
    ends = np.flatnonzero(records["metric"] == END_METRIC)
    complete = int(ends[-1]) + 1 if ends.size else 0
    torn = len(data) - start - complete * RECORD_SIZE
    if torn > _max_snapshot_records(header) * RECORD_SIZE:
        raise TelemetryFormatError(
            f"{path}: {torn} bytes after the last complete snapshot, more than one snapshot "
            "can hold: the file is damaged"
        )
    records = records[:complete]
    if ends.size:
        # Each end marker's value is the number of records since the previous marker.
        sizes = np.diff(ends, prepend=-1) - 1
        wrong = np.flatnonzero(records["value"][ends] != sizes.astype(np.uint64))
        if wrong.size:
            k = int(ends[wrong[0]])
            raise TelemetryFormatError(
                f"{path}: snapshot {int(records['seq'][k])} (record {k}) ends after "
                f"{int(sizes[wrong[0]])} records but says {int(records['value'][k])}: "
                "the file is damaged"
            )
    body = records[records["metric"] != END_METRIC]
    mismatch = (body["id"] != header["id"]) | (body["worker"] != header["worker"])
    if mismatch.any():
        k = int(np.flatnonzero(mismatch)[0])
        raise TelemetryFormatError(
            f"{path}: record {k} names id {int(body['id'][k])} worker {int(body['worker'][k])}"
            f", the header id {header['id']} worker {header['worker']}: the file is damaged"
        )
    return _File(path, header, body, int(ends.size), torn, version)


class _Categories:
    """Grows a category list and hands out codes (per file, not per record)."""

    def __init__(self, initial: Iterable[str] = ()) -> None:
        self.names: list[str] = []
        self.codes: dict[str, int] = {}
        for name in initial:
            self.code(name)

    def code(self, name: str) -> int:
        if name not in self.codes:
            self.codes[name] = len(self.names)
            self.names.append(name)
        return self.codes[name]

    def categorical(self, codes: np.ndarray) -> pd.Categorical:
        return pd.Categorical.from_codes(codes, categories=self.names)


def _times(ns: np.ndarray) -> pd.DatetimeIndex:
    """ns since the epoch as UTC times (a view and a no-op localisation: no per-value work)."""
    return pd.DatetimeIndex(ns.astype(np.int64, copy=False).view("M8[ns]")).tz_localize("UTC")


def _targets(records: np.ndarray) -> np.ndarray:
    """The records' `target` field (version 2), or NO_TARGET for every version 1 record."""
    if "target" in (records.dtype.names or ()):
        return records["target"]
    return np.full(len(records), NO_TARGET, dtype=np.uint16)


def _build(
    files: list[_File], id_column: str = "server", with_target: bool = False
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The counters and histograms frames of `files` (vectorised: Python loops per file).

    `id_column` names the writer's id column ("server" or "client"); `with_target` adds the
    `target` column (the server id of per-target series, -1 for the others).
    """
    sources, nodes = _Categories(), _Categories()
    ops = _Categories(["write", "read", "fsync", "meta", ""])
    counter_names, hist_names = _Categories(), _Categories()
    kinds = _Categories(["counter", "gauge"])
    cols_c: dict[str, list[np.ndarray]] = {
        k: [] for k in ("t", "metric", "op", "kind", "value", "target")
    }
    cols_h: dict[str, list[np.ndarray]] = {
        k: [] for k in ("t", "metric", "op", "bucket", "count", "target")
    }
    # Per file: (source, server, worker, node) codes, and its row counts in each frame.
    owners: list[tuple[int, int, int, int]] = []
    n_c: list[int] = []
    n_h: list[int] = []
    for f in files:
        h = f.header
        # Lookup tables for this file's header: metric id x statistic -> name code, etc.
        counter_lut = np.full((256, 5), -1, dtype=np.int32)
        kind_lut = np.full((256, 5), -1, dtype=np.int32)
        hist_lut = np.full(256, -1, dtype=np.int32)
        per_op = np.zeros(256, dtype=bool)
        per_target = np.zeros(256, dtype=bool)
        for m in h["metrics"]:
            per_op[m["id"]] = m["per_op"]
            per_target[m["id"]] = m.get("per_target", False)
            if m["kind"] == "histogram":
                hist_lut[m["id"]] = hist_names.code(m["name"])
                for stat, (_, suffix, kind) in enumerate(_STATS, start=1):
                    counter_lut[m["id"], stat] = counter_names.code(f"{m['name']}.{suffix}")
                    kind_lut[m["id"], stat] = kinds.code(kind)
            else:
                counter_lut[m["id"], 0] = counter_names.code(m["name"])
                kind_lut[m["id"], 0] = kinds.code(m["kind"])
        op_lut = np.full(256, -1, dtype=np.int32)
        for index, name in enumerate(h["ops"][:NO_OP]):
            op_lut[index] = ops.code(str(name))
        op_lut[NO_OP] = ops.code("")

        is_bucket = f.records["bucket"] < BUCKETS
        rc, rh = f.records[~is_bucket], f.records[is_bucket]
        # Counter, gauge and histogram-statistic records: bucket 0xFFFF - stat.
        stat = BUCKET_NONE - rc["bucket"].astype(np.int32)
        stat_ok = stat <= len(_STATS)
        stat = np.where(stat_ok, stat, 0)
        name_c = np.where(stat_ok, counter_lut[rc["metric"], stat], -1)
        op_c = op_lut[rc["op"]]
        name_h = hist_lut[rh["metric"]]
        op_h = op_lut[rh["op"]]
        for rows, names, op_codes in ((rc, name_c, op_c), (rh, name_h, op_h)):
            with_op = rows["op"] != NO_OP
            targeted = _targets(rows) != NO_TARGET
            valid = (names >= 0) & (op_codes >= 0) & (with_op == per_op[rows["metric"]])
            valid &= targeted == per_target[rows["metric"]]
            if not valid.all():
                k = int(np.flatnonzero(~valid)[0])
                raise TelemetryFormatError(
                    f"{f.path}: a record (metric {int(rows['metric'][k])}, op "
                    f"{int(rows['op'][k])}, bucket {int(rows['bucket'][k])}, target "
                    f"{int(_targets(rows)[k])}, snapshot "
                    f"{int(rows['seq'][k])}) does not fit the header's metrics: the file is "
                    "damaged"
                )
        owners.append((sources.code(h["source"]), h["id"], h["worker"], nodes.code(h["node"])))
        n_c.append(len(rc))
        n_h.append(len(rh))
        cols_c["t"].append(rc["t_ns"])
        cols_c["metric"].append(name_c)
        cols_c["op"].append(op_c)
        cols_c["kind"].append(kind_lut[rc["metric"], stat])
        cols_c["value"].append(rc["value"])
        cols_c["target"].append(_targets(rc))
        cols_h["t"].append(rh["t_ns"])
        cols_h["metric"].append(name_h)
        cols_h["op"].append(op_h)
        cols_h["bucket"].append(rh["bucket"])
        cols_h["count"].append(rh["value"])
        cols_h["target"].append(_targets(rh))

    def cat(parts: list[np.ndarray], dtype: Any) -> np.ndarray:
        if not parts:
            return np.zeros(0, dtype=dtype)
        return np.concatenate(parts).astype(dtype, copy=False)

    owner = np.array(owners, dtype=np.int64).reshape(-1, 4)

    def frame(cols: dict[str, list[np.ndarray]], counts: list[int], names: _Categories) -> Any:
        per_row = np.repeat(owner, counts, axis=0)
        columns = {
            "t": _times(cat(cols["t"], np.uint64)),
            "source": sources.categorical(per_row[:, 0]),
            id_column: per_row[:, 1].copy(),
            "worker": per_row[:, 2].copy(),
            "node": nodes.categorical(per_row[:, 3]),
            "metric": names.categorical(cat(cols["metric"], np.int32)),
            "op": ops.categorical(cat(cols["op"], np.int32)),
        }
        if with_target:
            target = cat(cols["target"], np.int64)
            columns["target"] = np.where(target == NO_TARGET, -1, target)
        return columns

    counters = pd.DataFrame(
        {
            **frame(cols_c, n_c, counter_names),
            "kind": kinds.categorical(cat(cols_c["kind"], np.int32)),
            "value": cat(cols_c["value"], np.uint64).astype(np.int64),
        }
    )
    index = cat(cols_h["bucket"], np.int64)
    histograms = pd.DataFrame(
        {
            **frame(cols_h, n_h, hist_names),
            "bucket": index,
            "bucket_lo": _BUCKET_LO[index],
            "bucket_hi": _BUCKET_HI[index],
            "count": cat(cols_h["count"], np.uint64).astype(np.int64),
        }
    )
    return counters, histograms


def bucket_quantile(
    lo: ArrayLike,
    hi: ArrayLike,
    counts: ArrayLike,
    q: float,
    vmin: int | None = None,
    vmax: int | None = None,
) -> int:
    """The one quantile rule of BenchFS (the Rust `Histogram::quantile`), for buckets given by
    their inclusive bounds `lo`..`hi` (ascending) and counts: the midpoint of the bucket holding
    rank ceil(q * n), clamped to [vmin, vmax]; the exact `vmin`/`vmax` at the extreme ranks when
    they are known (a cumulative histogram has them; a window between two snapshots does not).
    0 if the counts are all zero."""
    counts = np.asarray(counts, dtype=np.int64)
    n = int(counts.sum())
    if n == 0:
        return 0
    q = 0.5 if q != q else min(max(q, 0.0), 1.0)
    rank = min(max(int(np.ceil(q * n)), 1), n)
    if rank == 1 and vmin is not None:
        return vmin
    if rank == n and vmax is not None:
        return vmax
    i = int(np.searchsorted(np.cumsum(counts), rank))
    b_lo, b_hi = int(np.asarray(lo)[i]), int(np.asarray(hi)[i])
    mid = b_lo + (b_hi - b_lo) // 2
    return min(max(mid, vmin if vmin is not None else mid), vmax if vmax is not None else mid)


def _empty_like(frame: pd.DataFrame, id_column: str) -> pd.DataFrame:
    """An empty frame with `frame`'s columns, its writer id column renamed and `target` added."""
    columns = {(id_column if c == "server" else c): frame[c].iloc[:0] for c in frame.columns}
    out = pd.DataFrame(columns)
    out.insert(out.columns.get_loc("op") + 1, "target", np.zeros(0, dtype=np.int64))
    return out


def histogram_quantile(
    buckets: np.ndarray, counts: np.ndarray, q: float, vmin: int, vmax: int
) -> int:
    """Quantile `q` of merged bucket counts (bucket indexes ascending), by the Rust rule:
    the exact `vmin`/`vmax` at the extreme ranks, else the midpoint of the bucket holding rank
    ceil(q * n), clamped to [vmin, vmax]. 0 if the counts are all zero."""
    index = np.asarray(buckets)
    return bucket_quantile(_BUCKET_LO[index], _BUCKET_HI[index], counts, q, vmin, vmax)


@dataclass(frozen=True)
class Telemetry:
    """Telemetry of one run (or any set of telemetry files), as pandas DataFrames.

    `counters`: one row per counter, gauge and histogram statistic per server snapshot,
    columns t (UTC), source, server, worker, node, metric, op ("" for metrics without one),
    kind ("counter": cumulative; "gauge": value at t), value. Histogram statistics appear as
    `<histogram>.count`, `.sum` (counters) and `.min`, `.max` (gauges, cumulative extremes).

    `histograms`: one row per non-empty bucket per histogram per server snapshot, cumulative,
    columns t, source, server, worker, node, metric, op, bucket, bucket_lo, bucket_hi
    (inclusive, uint64), count.

    `client_counters`, `client_histograms`: the same for client telemetry (format version 2),
    with `client` (the client's id) instead of `server` and a `target` column after `op`: the
    server id a per-target series belongs to, -1 for the others. Empty when no client wrote
    telemetry (`has_clients` is then False).

    `files`: one row per file: path, source, server (the writer's id: a server id, or a
    client id for client files), worker, node, pid, snapshots, torn_bytes (a snapshot being
    written or torn at the end, skipped), created (UTC), version.
    """

    counters: pd.DataFrame
    histograms: pd.DataFrame
    files: pd.DataFrame
    client_counters: pd.DataFrame | None = None
    client_histograms: pd.DataFrame | None = None
    _cache: dict[Any, pd.DataFrame] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        if self.client_counters is None:
            object.__setattr__(self, "client_counters", _empty_like(self.counters, "client"))
        if self.client_histograms is None:
            object.__setattr__(self, "client_histograms", _empty_like(self.histograms, "client"))

    @property
    def has_clients(self) -> bool:
        """True if any client wrote telemetry (format version 2, `source = "client"`)."""
        return len(self.client_counters) > 0  # type: ignore[arg-type]

    def _frames(self, source: str) -> tuple[pd.DataFrame, pd.DataFrame, list[str], list[str]]:
        """Counters, histograms, writer keys and series keys (beyond metric and op) of `source`."""
        if source == "server":
            return self.counters, self.histograms, KEYS, []
        if source == "client":
            assert self.client_counters is not None and self.client_histograms is not None
            return self.client_counters, self.client_histograms, CLIENT_KEYS, ["target"]
        raise ValueError(f"unknown telemetry source {source!r} (have: {', '.join(SOURCES)})")

    def rates(self, source: str = "server") -> pd.DataFrame:
        """Per-interval deltas of the counters (gauges and min/max left out).

        Columns t, source, server (client and target for `source="client"`), worker, node,
        metric, op, delta, dt (seconds since the writer's previous snapshot; NaN for its
        first, whose delta is the value since the writer started), rate (delta / dt). A
        counter that went down (a restarted server) starts again from its value.
        """
        counters, _, keys_w, extra = self._frames(source)
        c = counters[counters["kind"] == "counter"]
        t = pd.DatetimeIndex(c["t"]).asi8
        keys = [
            c["source"].cat.codes.to_numpy(),
            c[keys_w[1]].to_numpy(),
            c["worker"].to_numpy(),
            c["metric"].cat.codes.to_numpy(),
            c["op"].cat.codes.to_numpy(),
            *(c[col].to_numpy() for col in extra),
        ]
        order = np.lexsort([t, *reversed(keys)])
        c = c.iloc[order]
        t = t[order]
        value = c["value"].to_numpy()
        new = np.zeros(len(c), dtype=bool)
        new[:1] = True
        for key in keys:
            k = key[order]
            new[1:] |= k[1:] != k[:-1]
        prev_v = np.concatenate(([0], value[:-1]))
        prev_t = np.concatenate(([0], t[:-1]))
        delta = np.where(new | (value < prev_v), value, value - prev_v)
        dt = np.where(new, np.nan, (t - prev_t) / 1e9)
        with np.errstate(divide="ignore", invalid="ignore"):
            rate = delta / dt
        out = c[["t", *keys_w, "metric", "op", *extra]].reset_index(drop=True)
        out["delta"] = delta
        out["dt"] = dt
        out["rate"] = rate
        return out

    def _last_times(self, source: str = "server") -> pd.DataFrame:
        """The time of each writer's last snapshot."""
        counters, _, keys, _ = self._frames(source)
        return counters.groupby(keys, observed=True, as_index=False)["t"].max()

    def _latest(self, frame: int, source: str) -> pd.DataFrame:
        """Rows of frame 0 (counters) or 1 (histograms) from each writer's last snapshot,
        computed once per source and shared."""
        key = ("latest", frame, source)
        if key not in self._cache:
            frames = self._frames(source)
            self._cache[key] = frames[frame].merge(
                self._last_times(source), on=[*frames[2], "t"], how="inner"
            )
        return self._cache[key]

    def latest_counters(self, source: str = "server") -> pd.DataFrame:
        """The rows of `counters` from each writer's last snapshot (its final values).

        Computed once per source and shared: treat the frame as read-only.
        """
        return self._latest(0, source)

    def latest_histograms(self, source: str = "server") -> pd.DataFrame:
        """The rows of `histograms` from each writer's last snapshot (the whole run).

        Computed once per source and shared: treat the frame as read-only.
        """
        return self._latest(1, source)

    def quantile(
        self,
        metric: str,
        op: str | None = None,
        q: float = 0.5,
        by: str | Sequence[str] | None = None,
        source: str = "server",
    ) -> int | pd.Series:
        """Quantile `q` of histogram `metric` (for `op`) over the whole run.

        Merges the last snapshot of every writer (or of each group `by`, e.g. "server",
        "node", or "target" for client telemetry) and computes as the Rust
        `Histogram::quantile` does: the exact minimum or maximum at the extreme ranks, else the
        midpoint of the bucket holding rank ceil(q * count), within 12.5% of the true value.
        0 for an empty histogram. `source="client"` reads client telemetry.
        """
        _, histograms, keys, extra = self._frames(source)
        hists = histograms["metric"].cat.categories
        if metric not in hists:
            raise ValueError(f"no histogram {metric!r} (have: {', '.join(map(str, hists))})")
        op_name = op or ""
        h = self.latest_histograms(source)
        h = h[(h["metric"] == metric) & (h["op"] == op_name)]
        c = self.latest_counters(source)
        c = c[(c["op"] == op_name) & c["metric"].isin([f"{metric}.min", f"{metric}.max"])]
        c = c.assign(metric=c["metric"].astype(str))
        groups = [by] if isinstance(by, str) else list(by or [])
        series_keys = [*keys, *extra]
        if not groups:
            return self._merged_quantile(h, c, q, series_keys)
        out_keys: list[tuple[Any, ...]] = []
        values: list[int] = []
        for key, hg in h.groupby(groups, observed=True):
            key = key if isinstance(key, tuple) else (key,)
            cg = c
            for col, value in zip(groups, key, strict=True):
                cg = cg[cg[col] == value]
            out_keys.append(key)
            values.append(self._merged_quantile(hg, cg, q, series_keys))
        if len(groups) == 1:
            index = pd.Index([k[0] for k in out_keys], name=groups[0])
        else:
            index = pd.MultiIndex.from_tuples(out_keys, names=groups)
        return pd.Series(values, index=index, dtype=np.int64, name=f"{metric} q{q:g}")

    @staticmethod
    def _merged_quantile(
        h: pd.DataFrame, c: pd.DataFrame, q: float, series_keys: list[str] = KEYS
    ) -> int:
        merged = h.groupby("bucket")["count"].sum().sort_index()
        counts = merged.to_numpy()
        if counts.sum() == 0:
            return 0
        nonempty = c[c["metric"].str.endswith(".max") & (c["value"] > 0)]
        vmax = int(nonempty["value"].max()) if len(nonempty) else 0
        # A writer whose histogram is empty reports min 0; only non-empty writers count.
        writers = h.groupby(series_keys, observed=True).size().reset_index()[series_keys]
        mins = c[c["metric"].str.endswith(".min")].merge(writers, on=series_keys)
        vmin = int(mins["value"].min()) if len(mins) else 0
        return histogram_quantile(merged.index.to_numpy(), counts, q, vmin, vmax)


def _files_frame(files: list[_File]) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "path": [str(f.path) for f in files],
            "source": [f.header["source"] for f in files],
            "server": np.array([f.header["id"] for f in files], dtype=np.int64),
            "worker": np.array([f.header["worker"] for f in files], dtype=np.int64),
            "node": [f.header["node"] for f in files],
            "pid": [f.header.get("pid") for f in files],
            "snapshots": np.array([f.snapshots for f in files], dtype=np.int64),
            "torn_bytes": np.array([f.torn_bytes for f in files], dtype=np.int64),
            "created": _times(
                np.array([int(f.header.get("created_unix_ns", 0)) for f in files], np.uint64)
            ),
            "version": np.array([f.version for f in files], dtype=np.int64),
        }
    )


def telemetry_paths(path: str | os.PathLike[str]) -> list[Path]:
    """The telemetry files at `path`: a results directory, a telemetry directory, or a file."""
    p = Path(path)
    if p.is_file():
        return [p]
    if not p.is_dir():
        raise FileNotFoundError(f"{p}: no such telemetry file or directory")
    found = sorted(p.glob(TELEMETRY_PATTERN))
    if not found:
        found = RunDir(p).telemetry_files()
    if not found:
        raise FileNotFoundError(
            f"no telemetry files ({TELEMETRY_PATTERN}) in {p} or {RunDir(p).telemetry_dir}"
        )
    return found


def load(path: str | os.PathLike[str]) -> Telemetry:
    """Load the telemetry at `path` (a results directory, its telemetry directory, or a file).

    Raises FileNotFoundError if there is none, TelemetryFormatError (a ValueError) naming
    the file for a file that is not BenchFS telemetry, has another format version, or is
    damaged anywhere but in its last snapshot.
    """
    files = [_read(p) for p in telemetry_paths(path)]
    files.sort(
        key=lambda f: (
            f.header["source"],
            f.header["id"],
            f.header["worker"],
            f.header.get("created_unix_ns", 0),
            str(f.path),
        )
    )
    servers = [f for f in files if f.header["source"] == "server"]
    clients = [f for f in files if f.header["source"] == "client"]
    counters, histograms = _build(servers)
    client_counters, client_histograms = _build(clients, "client", with_target=True)
    return Telemetry(counters, histograms, _files_frame(files), client_counters, client_histograms)


# ---------------------------------------------------------------------------------------------
# Per-operation traces


@dataclass(frozen=True)
class TraceFile:
    """One trace file's header and what was found at its end."""

    path: Path
    header: dict[str, Any]
    records: int
    torn_bytes: int


def _trace_header(path: Path, data: bytes) -> tuple[dict[str, Any], int]:
    """The JSON header of a trace file and the offset of its first record."""
    if len(data) < PREAMBLE_SIZE or data[:8] != TRACE_MAGIC:
        raise TelemetryFormatError(f"{path}: not a BenchFS trace file (bad magic)")
    version, header_len = struct.unpack_from("<II", data, 8)
    if version != TRACE_VERSION:
        raise TelemetryFormatError(
            f"{path}: trace format version {version}; this version of benchfs reads version "
            f"{TRACE_VERSION}"
        )
    start = PREAMBLE_SIZE + header_len
    if len(data) < start or start % 8:
        raise TelemetryFormatError(f"{path}: header length {header_len} does not fit the file")
    try:
        header = json.loads(data[PREAMBLE_SIZE:start])
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise TelemetryFormatError(f"{path}: malformed trace header: {e}") from e
    if (
        not isinstance(header, dict)
        or header.get("format") != "benchfs-trace"
        or header.get("version") != version
        or header.get("record_size") != TRACE_RECORD_SIZE
        or header.get("byte_order") != "little"
        or header.get("source") != "server"
        or not isinstance(header.get("id"), int)
        or not isinstance(header.get("worker"), int)
        or not isinstance(header.get("node"), str)
        or not isinstance(header.get("ops"), list)
    ):
        raise TelemetryFormatError(f"{path}: malformed trace header: {header!r:.200}")
    return header, start


def _read_traces(paths: list[Path]) -> tuple[list[TraceFile], np.ndarray, list[int]]:
    """Every trace file's records in one array (read straight into it: one copy from disk)."""
    layout: list[tuple[Path, dict[str, Any], int, int, int]] = []
    total = 0
    for p in paths:
        size = p.stat().st_size
        with p.open("rb") as f:
            head = f.read(PREAMBLE_SIZE)
            length = struct.unpack_from("<I", head, 12)[0] if len(head) == PREAMBLE_SIZE else 0
            head += f.read(length)
        header, start = _trace_header(p, head)
        count = (size - start) // TRACE_RECORD_SIZE
        layout.append((p, header, start, count, size - start - count * TRACE_RECORD_SIZE))
        total += count
    rec = np.empty(total, dtype=TRACE_DTYPE)
    raw = rec.view(np.uint8).reshape(-1)
    infos: list[TraceFile] = []
    counts: list[int] = []
    at = 0
    for p, header, start, count, torn in layout:
        nbytes = count * TRACE_RECORD_SIZE
        with p.open("rb") as f:
            f.seek(start)
            got = f.readinto(memoryview(raw[at * TRACE_RECORD_SIZE :][:nbytes]))
        if got != nbytes:
            raise TelemetryFormatError(f"{p}: the file shrank while it was read")
        part = rec[at : at + count]
        wrong = (part["server"] != header["id"]) | (part["worker"] != header["worker"])
        wrong |= part["op"] >= len(header["ops"])
        if wrong.any():
            k = int(np.flatnonzero(wrong)[0])
            raise TelemetryFormatError(
                f"{p}: trace record {k} (server {int(part['server'][k])}, worker "
                f"{int(part['worker'][k])}, op {int(part['op'][k])}) does not fit the header "
                f"(id {header['id']}, worker {header['worker']}, {len(header['ops'])} ops): "
                "the file is damaged"
            )
        infos.append(TraceFile(p, header, count, torn))
        counts.append(count)
        at += count
    return infos, rec, counts


def trace_paths(path: str | os.PathLike[str]) -> list[Path]:
    """The trace files at `path` (a results directory, a telemetry directory, or a file)."""
    p = Path(path)
    if p.is_file():
        return [p]
    if not p.is_dir():
        raise FileNotFoundError(f"{p}: no such trace file or directory")
    found = sorted(p.glob(TRACE_PATTERN))
    return found or RunDir(p).trace_files()


def load_trace(path: str | os.PathLike[str]) -> pd.DataFrame | None:
    """The per-operation trace records at `path` as one DataFrame, or None if there are none.

    Columns: t (arrival at the server, UTC), server (uint32), worker (uint16), node
    (categorical), op (categorical), file_hi, file_lo (the 128-bit file id), chunk, bytes,
    queue_ns, device_ns, total_ns (uint64), error (bool). `df.attrs["files"]` lists the files
    with their record counts and torn tails. The records of every file are read straight into
    one numpy array (no Python loop per record).
    """
    paths = trace_paths(path)
    if not paths:
        return None
    infos, rec, counts = _read_traces(paths)
    nodes = _Categories()
    ops = _Categories(["write", "read", "fsync", "meta"])
    node_of_file = np.array([nodes.code(i.header["node"]) for i in infos], dtype=np.int32)
    node_codes = np.repeat(node_of_file, counts)
    op_codes = np.empty(len(rec), dtype=np.int32)
    at = 0
    for info, n in zip(infos, counts, strict=True):
        lut = np.array([ops.code(str(name)) for name in info.header["ops"]], dtype=np.int32)
        op_codes[at : at + n] = lut[rec["op"][at : at + n]]
        at += n
    df = pd.DataFrame(
        {
            "t": _times(rec["t_ns"]),
            "server": rec["server"],
            "worker": rec["worker"],
            "node": nodes.categorical(node_codes),
            "op": ops.categorical(op_codes),
            "file_hi": rec["file_hi"],
            "file_lo": rec["file_lo"],
            "chunk": rec["chunk"],
            "bytes": rec["bytes"],
            "queue_ns": rec["queue_ns"],
            "device_ns": rec["device_ns"],
            "total_ns": rec["total_ns"],
            "error": (rec["flags"] & TRACE_FLAG_ERROR) != 0,
        },
        copy=False,
    )
    df.attrs["files"] = [
        {
            "path": str(i.path),
            "server": i.header["id"],
            "worker": i.header["worker"],
            "node": i.header["node"],
            "records": i.records,
            "torn_bytes": i.torn_bytes,
        }
        for i in infos
    ]
    return df


def load_names(path: str | os.PathLike[str]) -> pd.DataFrame:
    """The paths of the traced files (`server-*.names`, written beside the traces): which path
    each file id had, as the metadata servers saw it created, stat'ed or renamed.

    Columns: t (when noted, UTC), file_hi, file_lo (uint64, as in `load_trace`), path; one
    row per (file, path), the first noted. A line cut short by a crash is skipped; an empty
    frame when there are none.
    """
    p = Path(path)
    rows: list[tuple[int, int, str]] = []
    for names in sorted(p.glob("server-*.names")) if p.is_dir() else [p]:
        try:
            lines = names.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            continue
        for line in lines[1:]:  # the first is the header
            try:
                entry = json.loads(line)
                rows.append((int(entry["t_ns"]), int(entry["file"], 16), str(entry["path"])))
            except (ValueError, KeyError, TypeError):
                continue  # torn by a crash
    frame = pd.DataFrame(
        {
            "t": pd.to_datetime([r[0] for r in rows], unit="ns", utc=True),
            "file_hi": np.array([r[1] >> 64 for r in rows], dtype=np.uint64),
            "file_lo": np.array([r[1] & (2**64 - 1) for r in rows], dtype=np.uint64),
            "path": [r[2] for r in rows],
        }
    )
    frame = frame.sort_values("t", kind="stable").drop_duplicates(["file_hi", "file_lo", "path"])
    return frame.reset_index(drop=True)


class TelemetryFollower:
    """Bytes the servers have moved so far, read incrementally from their telemetry files.

    For live progress during a run: each `poll` reads only what the servers appended since the
    last one (so a long run costs the same per poll as a short one) and sums, over every
    server worker's latest complete snapshot, the `bytes` counter of `write` and `read`.
    Files that are not (yet) readable server telemetry are skipped, never an error.
    """

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        self._files: dict[Path, _Followed] = {}

    def poll(self) -> dict[str, int]:
        """{"write": bytes, "read": bytes} summed over every server worker so far."""
        for path in self.directory.glob(TELEMETRY_PATTERN):
            if path not in self._files:
                followed = _Followed.open(path)
                if followed is None:
                    continue
                self._files[path] = followed
        totals = {"write": 0, "read": 0}
        for followed in self._files.values():
            followed.advance()
            for op, value in followed.latest.items():
                totals[op] += value
        return totals


@dataclass
class _Followed:
    """One server telemetry file being followed: where its next snapshot starts."""

    path: Path
    offset: int
    metric: int
    ops: dict[int, str]
    latest: dict[str, int]

    @classmethod
    def open(cls, path: Path) -> _Followed | None:
        try:
            with open(path, "rb") as f:
                preamble = f.read(PREAMBLE_SIZE)
                if len(preamble) < PREAMBLE_SIZE or preamble[:8] != MAGIC:
                    return None
                version, header_len = struct.unpack_from("<II", preamble, 8)
                header = json.loads(f.read(header_len))
            header = _check_header(path, header, version)
        except (OSError, ValueError, TelemetryFormatError):
            return None  # being created, or not server telemetry: look again next poll
        if header["source"] != "server":
            return None
        metric = next((m["id"] for m in header["metrics"] if m["name"] == "bytes"), None)
        if metric is None:
            return None
        ops = {i: op for i, op in enumerate(header["ops"]) if op in ("write", "read")}
        latest = dict.fromkeys(ops.values(), 0)
        return cls(path, PREAMBLE_SIZE + header_len, metric, ops, latest)

    def advance(self) -> None:
        """Read the complete snapshots appended since the last call; keep the last one's bytes."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except OSError:
            return
        usable = len(data) - len(data) % RECORD_SIZE
        records = np.frombuffer(data, dtype=RECORD_DTYPE, count=usable // RECORD_SIZE)
        ends = np.flatnonzero(records["metric"] == END_METRIC)
        if not ends.size:
            return
        complete = records[: int(ends[-1])]
        # Counters are cumulative and records in time order: the last one per op wins.
        chosen = complete[(complete["metric"] == self.metric) & (complete["bucket"] == BUCKET_NONE)]
        for op_index, value in zip(chosen["op"], chosen["value"], strict=True):
            op = self.ops.get(int(op_index))
            if op is not None:
                self.latest[op] = int(value)
        self.offset += (int(ends[-1]) + 1) * RECORD_SIZE

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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from benchfs.results import TELEMETRY_PATTERN, RunDir

__all__ = [
    "BUCKETS",
    "FORMAT_VERSION",
    "RECORD_DTYPE",
    "Telemetry",
    "TelemetryFormatError",
    "bucket_bounds",
    "load",
]

MAGIC = b"BFSTELEM"
FORMAT_VERSION = 1
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
"""One record, as in docs/telemetry.md."""
assert RECORD_DTYPE.itemsize == RECORD_SIZE

SUB_BUCKET_BITS = 2
BUCKETS = (65 - SUB_BUCKET_BITS) * (1 << SUB_BUCKET_BITS)
END_METRIC = 0
NO_OP = 0xFF
BUCKET_NONE = 0xFFFF
# Histogram statistics: the record's bucket field, and the suffix of their counter name.
_STATS = ((0xFFFE, "count", "counter"), (0xFFFD, "sum", "counter"))
_STATS += ((0xFFFC, "min", "gauge"), (0xFFFB, "max", "gauge"))
_LOWEST_SPECIAL = 0xFFFB
SOURCES = ("server",)
"""Sources this loader reads (issue 9 adds clients)."""

KEYS = ["source", "server", "worker", "node"]
"""Columns that name the writer of a row (one worker of one server)."""


class TelemetryFormatError(ValueError):
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


def _max_snapshot_records(header: dict[str, Any]) -> int:
    """Records of the largest snapshot the header's metrics allow (the longest torn tail)."""
    total = 1  # the end marker
    for m in header["metrics"]:
        series = len(header["ops"]) if m["per_op"] else 1
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
    if header.get("source") not in SOURCES:
        raise TelemetryFormatError(
            f"{path}: telemetry source {header.get('source')!r} is not supported by this "
            f"version of benchfs (reads {', '.join(SOURCES)})"
        )
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
    if version != FORMAT_VERSION:
        raise TelemetryFormatError(
            f"{path}: telemetry format version {version}; this version of benchfs reads "
            f"version {FORMAT_VERSION}"
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
        data, dtype=RECORD_DTYPE, count=(len(data) - start) // RECORD_SIZE, offset=start
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
    return _File(path, header, body, int(ends.size), torn)


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
    return pd.to_datetime(ns.astype(np.int64), unit="ns", utc=True)


def _build(files: list[_File]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The counters and histograms frames of `files` (vectorised: Python loops per file)."""
    sources, nodes = _Categories(), _Categories()
    ops = _Categories(["write", "read", "fsync", "extent", ""])
    counter_names, hist_names = _Categories(), _Categories()
    kinds = _Categories(["counter", "gauge"])
    cols_c: dict[str, list[np.ndarray]] = {k: [] for k in ("t", "metric", "op", "kind", "value")}
    cols_h: dict[str, list[np.ndarray]] = {k: [] for k in ("t", "metric", "op", "bucket", "count")}
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
        for m in h["metrics"]:
            per_op[m["id"]] = m["per_op"]
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
            valid = (names >= 0) & (op_codes >= 0) & (with_op == per_op[rows["metric"]])
            if not valid.all():
                k = int(np.flatnonzero(~valid)[0])
                raise TelemetryFormatError(
                    f"{f.path}: a record (metric {int(rows['metric'][k])}, op "
                    f"{int(rows['op'][k])}, bucket {int(rows['bucket'][k])}, snapshot "
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
        cols_h["t"].append(rh["t_ns"])
        cols_h["metric"].append(name_h)
        cols_h["op"].append(op_h)
        cols_h["bucket"].append(rh["bucket"])
        cols_h["count"].append(rh["value"])

    def cat(parts: list[np.ndarray], dtype: Any) -> np.ndarray:
        if not parts:
            return np.zeros(0, dtype=dtype)
        return np.concatenate(parts).astype(dtype, copy=False)

    owner = np.array(owners, dtype=np.int64).reshape(-1, 4)

    def frame(cols: dict[str, list[np.ndarray]], counts: list[int], names: _Categories) -> Any:
        per_row = np.repeat(owner, counts, axis=0)
        return {
            "t": _times(cat(cols["t"], np.uint64)),
            "source": sources.categorical(per_row[:, 0]),
            "server": per_row[:, 1].copy(),
            "worker": per_row[:, 2].copy(),
            "node": nodes.categorical(per_row[:, 3]),
            "metric": names.categorical(cat(cols["metric"], np.int32)),
            "op": ops.categorical(cat(cols["op"], np.int32)),
        }

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


def _quantile(buckets: np.ndarray, counts: np.ndarray, q: float, vmin: int, vmax: int) -> int:
    """The Rust `Histogram::quantile`, for merged bucket counts (buckets sorted ascending)."""
    n = int(counts.sum())
    if n == 0:
        return 0
    q = 0.5 if q != q else min(max(q, 0.0), 1.0)
    rank = min(max(int(np.ceil(q * n)), 1), n)
    if rank == 1:
        return vmin
    if rank == n:
        return vmax
    i = int(np.searchsorted(np.cumsum(counts), rank))
    lo, hi = int(_BUCKET_LO[buckets[i]]), int(_BUCKET_HI[buckets[i]])
    return min(max(lo + (hi - lo) // 2, vmin), vmax)


@dataclass(frozen=True)
class Telemetry:
    """Telemetry of one run (or any set of telemetry files), as pandas DataFrames.

    `counters`: one row per counter, gauge and histogram statistic per snapshot, columns
    t (UTC), source, server, worker, node, metric, op ("" for metrics without one), kind
    ("counter": cumulative; "gauge": value at t), value. Histogram statistics appear as
    `<histogram>.count`, `.sum` (counters) and `.min`, `.max` (gauges, cumulative extremes).

    `histograms`: one row per non-empty bucket per histogram per snapshot, cumulative, columns
    t, source, server, worker, node, metric, op, bucket, bucket_lo, bucket_hi (inclusive,
    uint64), count.

    `files`: one row per file: path, source, server, worker, node, pid, snapshots,
    torn_bytes (a snapshot being written or torn at the end, skipped), created (UTC).
    """

    counters: pd.DataFrame
    histograms: pd.DataFrame
    files: pd.DataFrame

    def rates(self) -> pd.DataFrame:
        """Per-interval deltas of the counters (gauges and min/max left out).

        Columns t, source, server, worker, node, metric, op, delta, dt (seconds since the
        writer's previous snapshot; NaN for its first, whose delta is the value since the
        writer started), rate (delta / dt). A counter that went down (a restarted server)
        starts again from its value.
        """
        c = self.counters[self.counters["kind"] == "counter"]
        t = pd.DatetimeIndex(c["t"]).asi8
        keys = [
            c["source"].cat.codes.to_numpy(),
            c["server"].to_numpy(),
            c["worker"].to_numpy(),
            c["metric"].cat.codes.to_numpy(),
            c["op"].cat.codes.to_numpy(),
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
        out = c[["t", *KEYS, "metric", "op"]].reset_index(drop=True)
        out["delta"] = delta
        out["dt"] = dt
        out["rate"] = rate
        return out

    def _last_times(self) -> pd.DataFrame:
        """The time of each writer's last snapshot."""
        return self.counters.groupby(KEYS, observed=True, as_index=False)["t"].max()

    def latest_counters(self) -> pd.DataFrame:
        """The rows of `counters` from each writer's last snapshot (its final values)."""
        return self.counters.merge(self._last_times(), on=[*KEYS, "t"], how="inner")

    def latest_histograms(self) -> pd.DataFrame:
        """The rows of `histograms` from each writer's last snapshot (the whole run)."""
        return self.histograms.merge(self._last_times(), on=[*KEYS, "t"], how="inner")

    def quantile(
        self,
        metric: str,
        op: str | None = None,
        q: float = 0.5,
        by: str | Sequence[str] | None = None,
    ) -> int | pd.Series:
        """Quantile `q` of histogram `metric` (for `op`) over the whole run.

        Merges the last snapshot of every writer (or of each group `by`, e.g. "server" or
        "node") and computes as the Rust `Histogram::quantile` does: the exact minimum or
        maximum at the extreme ranks, else the midpoint of the bucket holding rank
        ceil(q * count), within 12.5% of the true value. 0 for an empty histogram.
        """
        hists = self.histograms["metric"].cat.categories
        if metric not in hists:
            raise ValueError(f"no histogram {metric!r} (have: {', '.join(map(str, hists))})")
        op_name = op or ""
        h = self.latest_histograms()
        h = h[(h["metric"] == metric) & (h["op"] == op_name)]
        c = self.latest_counters()
        c = c[(c["op"] == op_name) & c["metric"].isin([f"{metric}.min", f"{metric}.max"])]
        c = c.assign(metric=c["metric"].astype(str))
        groups = [by] if isinstance(by, str) else list(by or [])
        if not groups:
            return self._merged_quantile(h, c, q)
        keys: list[tuple[Any, ...]] = []
        values: list[int] = []
        for key, hg in h.groupby(groups, observed=True):
            key = key if isinstance(key, tuple) else (key,)
            cg = c
            for col, value in zip(groups, key, strict=True):
                cg = cg[cg[col] == value]
            keys.append(key)
            values.append(self._merged_quantile(hg, cg, q))
        if len(groups) == 1:
            index = pd.Index([k[0] for k in keys], name=groups[0])
        else:
            index = pd.MultiIndex.from_tuples(keys, names=groups)
        return pd.Series(values, index=index, dtype=np.int64, name=f"{metric} q{q:g}")

    @staticmethod
    def _merged_quantile(h: pd.DataFrame, c: pd.DataFrame, q: float) -> int:
        merged = h.groupby("bucket")["count"].sum().sort_index()
        counts = merged.to_numpy()
        if counts.sum() == 0:
            return 0
        nonempty = c[c["metric"].str.endswith(".max") & (c["value"] > 0)]
        vmax = int(nonempty["value"].max()) if len(nonempty) else 0
        # A writer whose histogram is empty reports min 0; only non-empty writers count.
        writers = h.groupby(KEYS, observed=True).size().reset_index()[KEYS]
        mins = c[c["metric"].str.endswith(".min")].merge(writers, on=KEYS)
        vmin = int(mins["value"].min()) if len(mins) else 0
        return _quantile(merged.index.to_numpy(), counts, q, vmin, vmax)


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
    counters, histograms = _build(files)
    return Telemetry(counters, histograms, _files_frame(files))

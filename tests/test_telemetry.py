"""Telemetry: written by real servers and loaded by `benchfs.telemetry`; the loader's edge cases
on files crafted here from docs/telemetry.md alone (so the document is checked too)."""

from __future__ import annotations

import json
import os
import re
import struct
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from benchfs import Client
from benchfs.bench import telemetry_view
from benchfs.bench.stats import Bucket
from benchfs.results import create_run_dir
from benchfs.telemetry import (
    BUCKETS,
    Telemetry,
    TelemetryFormatError,
    bucket_bounds,
    bucket_quantile,
    load,
)
from benchfs.units import KIB, MIB
from conftest import data_for

DOC = Path(__file__).resolve().parent.parent / "docs" / "telemetry.md"
OPS = ["write", "read", "fsync", "meta"]


def doc_metrics() -> list[dict[str, Any]]:
    """The server metric table of docs/telemetry.md, as header entries."""
    text = DOC.read_text()
    section = text.split("## Metrics (source `server`)", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(
        r"^\| (\d+) \| `([a-z_]+)` \| (counter|gauge|histogram) \| ?(yes|) \|",
        section,
        re.M,
    )
    assert len(rows) >= 16
    return [
        {"id": int(i), "name": n, "kind": k, "per_op": p == "yes", "unit": ""}
        for i, n, k, p in rows
    ]


# ---------------------------------------------------------------------------------------------
# A real cluster writes telemetry


@pytest.mark.timeout(120)
def test_servers_write_telemetry_that_loads(inproc_cluster, tmp_path: Path) -> None:
    run_dir = create_run_dir(tmp_path / "results", "test")
    cluster = inproc_cluster(
        2, f"telemetry.dir={run_dir.telemetry_dir}", "telemetry.interval_ms=100"
    )
    nodes = {0: "test-0", 1: "test-1"}
    size_a, size_b = 1 * MIB + 123, 300 * KIB + 7
    with Client(str(cluster.registry), config=cluster.config) as client:
        with (
            client.open("/a.dat", os.O_RDWR | os.O_CREAT) as a,
            client.open("/b.dat", os.O_RDWR | os.O_CREAT) as b,
        ):
            assert a.pwrite(data_for(1, 0, size_a), 0) == size_a
            assert b.pwrite(data_for(2, 5000, size_b), 5000) == size_b
        time.sleep(0.35)  # a few periodic snapshots in between
        with client.open("/a.dat") as a, client.open("/b.dat") as b:
            assert a.pread(size_a, 0) == data_for(1, 0, size_a)
            assert b.pread(size_b, 5000) == data_for(2, 5000, size_b)
        written, read = size_a + size_b, size_a + size_b
    stopped_at = pd.Timestamp(time.time_ns(), unit="ns", tz="UTC")
    cluster.stop()

    tel = load(run_dir.path)
    # The same data through each kind of path.
    assert len(load(run_dir.telemetry_dir).counters) == len(tel.counters)
    # The test's client wrote its own file (format version 2) beside the servers'.
    servers_files = [p for p in run_dir.telemetry_files() if p.name.startswith("server-")]
    one = load(servers_files[0])
    assert set(one.counters["server"]) == {one.files["server"].iloc[0]}
    assert tel.has_clients and set(tel.files["source"]) == {"server", "client"}

    # Every server wrote, and every row names its server, worker and node.
    files = tel.files[tel.files["source"] == "server"]
    assert set(files["server"]) == {0, 1}
    assert (files["torn_bytes"] == 0).all()
    assert (files["snapshots"] >= 2).all(), files
    for frame in (tel.counters, tel.histograms):
        assert frame["node"].notna().all() and frame["server"].notna().all()
        assert (frame["node"].astype(str) == frame["server"].map(nodes)).all()
        assert (frame["source"] == "server").all()
    assert set(tel.counters["worker"]) == {0}

    # The writer's header agrees with the documented metric table.
    header = json.loads(_header_bytes(Path(files["path"].iloc[0])))
    documented = {(m["id"], m["name"], m["kind"], m["per_op"]) for m in doc_metrics()}
    assert {(m["id"], m["name"], m["kind"], m["per_op"]) for m in header["metrics"]} == documented
    assert header["ops"] == OPS

    # The final snapshot was taken at shutdown, after all the I/O.
    last_t = tel.counters.groupby("server")["t"].max()
    assert (last_t >= stopped_at).all(), (last_t, stopped_at)

    last = tel.latest_counters()
    total = last.groupby(["metric", "op"], observed=True)["value"].sum()
    assert total[("bytes", "write")] == written
    assert total[("bytes", "read")] == read
    assert total[("ops", "write")] >= 17 + 5  # at least one operation per chunk touched
    assert total[("ops", "read")] >= 17 + 5
    assert total[("ops", "meta")] >= 4  # at least the two creations and the two reopenings
    for metric in ("errors", "malformed", "rejected_busy"):
        assert total[metric].sum() == 0, metric
    # The chunk store counts its own handle lookups; the snapshot takes them (one per data op).
    lookups = total["handle_hits"].sum() + total["handle_misses"].sum()
    assert lookups >= total[("ops", "write")] + total[("ops", "read")], lookups

    # Histogram counts equal the op counts, per server and op, in the statistics and buckets.
    per = last.set_index(["server", "metric", "op"])["value"]
    buckets = tel.latest_histograms().groupby(["server", "metric", "op"], observed=True)["count"]
    bucket_sums = buckets.sum()
    for server in (0, 1):
        for op in OPS:
            ops = per[(server, "ops", op)]
            for h in ("queue_wait_ns", "device_ns", "total_ns"):
                assert per[(server, f"{h}.count", op)] == ops, (server, h, op)
                assert bucket_sums.get((server, h, op), 0) == ops, (server, h, op)
        depth = per[(server, "inflight_at_submit.count", "")]
        assert depth >= 1 and per[(server, "inflight_at_submit.min", "")] >= 1
        assert bucket_sums[(server, "inflight_at_submit", "")] == depth
        assert per[(server, "submit_batch.count", "")] >= 1
        # Every SQE counted in a batch was counted once at its depth.
        assert per[(server, "submit_batch.sum", "")] >= depth

    # Per-interval deltas add up to the final values.
    rates = tel.rates()
    summed = rates.groupby(["metric", "op"], observed=True)["delta"].sum()
    assert summed[("bytes", "write")] == written
    assert (rates["delta"] >= 0).all()
    assert tel.quantile("total_ns", "write", 0.5) > 0
    assert tel.quantile("total_ns", "read", 1.0) >= tel.quantile("total_ns", "read", 0.5)


def _header_bytes(path: Path) -> bytes:
    data = path.read_bytes()
    (length,) = struct.unpack_from("<I", data, 12)
    return data[16 : 16 + length]


# ---------------------------------------------------------------------------------------------
# Files crafted from the document

RECORD = struct.Struct("<QQIIHBBHH")
assert RECORD.size == 32
NO_OP, NONE, COUNT, SUM, MIN, MAX = 255, 0xFFFF, 0xFFFE, 0xFFFD, 0xFFFC, 0xFFFB


def header_bytes(version: int = 1, **changes: Any) -> bytes:
    header = {
        "format": "benchfs-telemetry",
        "version": version,
        "source": "server",
        "id": 7,
        "worker": 1,
        "node": "node-x",
        "pid": 1,
        "created_unix_ns": 0,
        "byte_order": "little",
        "record_size": 32,
        "ops": OPS,
        "histogram": {"scheme": "log-linear", "sub_bucket_bits": 2, "buckets": 252},
        "metrics": doc_metrics(),
        **changes,
    }
    text = json.dumps(header).encode()
    text += b" " * ((-(16 + len(text))) % 32)
    return b"BFSTELEM" + struct.pack("<II", version, len(text)) + text


def snapshot(seq: int, t_ns: int, values: dict[tuple[int, int, int], int], ident: int = 7) -> bytes:
    """One snapshot: `values` maps (metric, op, bucket) to value, then the end record."""
    body = b"".join(
        RECORD.pack(t_ns, v, ident, seq, 1, m, op, b, 0) for (m, op, b), v in values.items()
    )
    return body + RECORD.pack(t_ns, len(values), ident, seq, 1, 0, NO_OP, NONE, 0)


def histogram_records(metric: int, op: int, values: list[int]) -> dict[tuple[int, int, int], int]:
    """Records of a histogram holding `values` (buckets computed with the documented formula)."""

    def bucket(v: int) -> int:
        if v < 4:
            return v
        e = v.bit_length() - 1
        return 4 * (e - 1) + ((v >> (e - 2)) & 3)

    out = {
        (metric, op, COUNT): len(values),
        (metric, op, SUM): sum(values),
        (metric, op, MIN): min(values, default=0),
        (metric, op, MAX): max(values, default=0),
    }
    for v in sorted(values):
        out[(metric, op, bucket(v))] = out.get((metric, op, bucket(v)), 0) + 1
    return out


def counters_snapshot(ops_read: int, latencies: list[int]) -> dict[tuple[int, int, int], int]:
    values = {(m, op, NONE): 0 for m in (1, 2, 3) for op in range(4)}
    values |= {(m, NO_OP, NONE): 0 for m in range(4, 12)}
    values[(1, 1, NONE)] = ops_read
    values[(2, 1, NONE)] = 4096 * ops_read
    values[(11, NO_OP, NONE)] = 5
    values |= histogram_records(16, NO_OP, [1] * 5 + [2] * 3 + [3] * 2)
    values |= histogram_records(20, 1, latencies)
    return values


T0 = 1_700_000_000_000_000_000
S = 1_000_000_000


def good_file(path: Path) -> tuple[bytes, list[bytes]]:
    snaps = [
        snapshot(0, T0, counters_snapshot(2, [1000, 3000])),
        snapshot(1, T0 + S, counters_snapshot(5, [1000, 3000, 1000, 7, 2_000_000])),
        snapshot(2, T0 + 3 * S, counters_snapshot(9, [1000] * 9)),
    ]
    head = header_bytes()
    path.write_bytes(head + b"".join(snaps))
    return head, snaps


def test_crafted_file_loads(tmp_path: Path) -> None:
    path = tmp_path / "server-7-w1.tel"
    good_file(path)
    tel = load(path)
    assert list(tel.files["snapshots"]) == [3]
    c = tel.counters
    assert list(c.columns) == [
        "t",
        "source",
        "server",
        "worker",
        "node",
        "metric",
        "op",
        "kind",
        "value",
    ]
    assert set(c["server"]) == {7} and set(c["worker"]) == {1} and set(c["node"]) == {"node-x"}
    assert str(c["t"].dtype) == "datetime64[ns, UTC]"
    reads = c[(c["metric"] == "ops") & (c["op"] == "read")]
    assert list(reads["value"]) == [2, 5, 9]
    assert reads["t"].iloc[0] == pd.Timestamp(T0, unit="ns", tz="UTC")
    assert set(c[c["metric"] == "buffers_free"]["op"]) == {""}
    assert set(c[c["metric"] == "buffers_free"]["kind"]) == {"gauge"}
    assert set(c[c["metric"] == "total_ns.sum"]["kind"]) == {"counter"}
    assert set(c[c["metric"] == "total_ns.max"]["kind"]) == {"gauge"}

    h = tel.histograms
    assert list(h.columns) == [
        "t",
        "source",
        "server",
        "worker",
        "node",
        "metric",
        "op",
        "bucket",
        "bucket_lo",
        "bucket_hi",
        "count",
    ]
    depth = h[(h["metric"] == "inflight_at_submit") & (h["t"] == h["t"].max())]
    assert list(zip(depth["bucket_lo"], depth["count"], strict=True)) == [(1, 5), (2, 3), (3, 2)]
    lat = tel.latest_histograms()
    lat = lat[lat["metric"] == "total_ns"]
    assert list(lat["count"]) == [9]
    (lo,) = lat["bucket_lo"]
    (hi,) = lat["bucket_hi"]
    assert lo <= 1000 <= hi and (lo, hi) == (896, 1023)

    r = tel.rates()
    reads = r[(r["metric"] == "ops") & (r["op"] == "read")]
    assert list(reads["delta"]) == [2, 3, 4]
    assert np.isnan(reads["dt"].iloc[0]) and list(reads["dt"].iloc[1:]) == [1.0, 2.0]
    assert list(reads["rate"].iloc[1:]) == [3.0, 2.0]
    assert set(r["metric"]) >= {"ops", "total_ns.count", "total_ns.sum"}
    assert "buffers_free" not in set(r["metric"]) and "total_ns.max" not in set(r["metric"])


def test_quantiles_follow_the_documented_rule(tmp_path: Path) -> None:
    path = tmp_path / "server-7-w1.tel"
    values = [7, 1000, 1000, 3000, 2_000_000]
    path.write_bytes(header_bytes() + snapshot(0, T0, counters_snapshot(5, values)))
    tel = load(path)
    # depth: 1 x5, 2 x3, 3 x2 (exact buckets)
    assert [tel.quantile("inflight_at_submit", None, q) for q in (0, 0.5, 0.6, 0.8, 0.81, 1)] == [
        1,
        1,
        2,
        2,
        3,
        3,
    ]
    # latency: rank 1 -> exact min; rank n -> exact max; else the bucket midpoint
    assert tel.quantile("total_ns", "read", 0.0) == 7
    assert tel.quantile("total_ns", "read", 1.0) == 2_000_000
    assert tel.quantile("total_ns", "read", 0.5) == 896 + (1023 - 896) // 2
    assert tel.quantile("total_ns", "write", 0.5) == 0  # empty
    per_server = tel.quantile("total_ns", "read", 0.5, by="server")
    assert per_server.to_dict() == {7: 959}
    with pytest.raises(ValueError, match="no histogram 'nope'"):
        tel.quantile("nope")


def test_one_quantile_rule_for_windows_and_whole_runs() -> None:
    """The benchmarks' windows and the analysis use one rule: the midpoint of the bucket holding
    rank ceil(q * n); a window has no exact extremes, so its extreme ranks take midpoints too."""
    lo, hi, counts = [896, 1024, 2048], [1023, 1279, 2559], [2, 1, 1]
    assert bucket_quantile(lo, hi, counts, 0.5) == 959
    assert bucket_quantile(lo, hi, counts, 0.75) == 1151
    assert bucket_quantile(lo, hi, counts, 1.0) == 2303
    assert bucket_quantile(lo, hi, counts, 0.0) == 959
    assert bucket_quantile(lo, hi, counts, 1.0, vmin=900, vmax=2100) == 2100
    assert bucket_quantile(lo, hi, counts, 0.0, vmin=900, vmax=2100) == 900
    assert bucket_quantile(lo, hi, [0, 0, 0], 0.5) == 0
    window = [Bucket(a, b, n) for a, b, n in zip(lo, hi, counts, strict=True)]
    assert telemetry_view._quantile_us(window[::-1], 0.75) == pytest.approx(1.151)


def test_bucket_bounds_match_the_document() -> None:
    lo, hi = bucket_bounds(np.arange(BUCKETS))
    assert BUCKETS == 252
    assert list(lo[:8]) == list(range(8)) and list(hi[:8]) == list(range(8))
    assert lo[0] == 0 and hi[-1] == 2**64 - 1
    assert all(int(lo[i]) == int(hi[i - 1]) + 1 for i in range(1, BUCKETS))
    for i in range(4, BUCKETS):
        e, s = i // 4 + 1, i % 4
        assert int(lo[i]) == 2**e + s * 2 ** (e - 2)
        assert int(hi[i]) == 2**e + (s + 1) * 2 ** (e - 2) - 1
        assert int(hi[i]) - int(lo[i]) + 1 <= max(1, int(lo[i]) // 4)


def test_torn_tail_is_skipped(tmp_path: Path) -> None:
    path = tmp_path / "server-7-w1.tel"
    head, snaps = good_file(path)
    whole = head + b"".join(snaps)
    last = len(snaps[-1])
    for cut in (1, 31, 32, 33, 5 * 32 + 3, last - 1):
        path.write_bytes(whole[: len(whole) - cut])
        tel = load(path)
        assert list(tel.files["snapshots"]) == [2], cut
        assert list(tel.files["torn_bytes"]) == [last - cut]
        assert tel.counters["t"].max() == pd.Timestamp(T0 + S, unit="ns", tz="UTC")
    # Only a header (a server that has not written a snapshot yet): empty, not an error.
    path.write_bytes(head)
    tel = load(path)
    assert tel.counters.empty and tel.histograms.empty
    assert list(tel.files["snapshots"]) == [0]
    assert tel.rates().empty and tel.latest_histograms().empty
    # A file that grows while it is read: each load sees the complete snapshots.
    path.write_bytes(head + snaps[0] + snaps[1][:100])
    assert list(load(path).files["snapshots"]) == [1]
    with open(path, "ab") as f:
        f.write(snaps[1][100:] + snaps[2])
    assert list(load(path).files["snapshots"]) == [3]


@pytest.mark.parametrize(
    ("damage", "needle"),
    [
        (lambda head, body: b"NOTTELEM" + head[8:] + body, "bad magic"),
        (lambda head, body: b"BFS", "bad magic"),
        (lambda head, body: head[:8] + struct.pack("<I", 3) + head[12:] + body, "version 3"),
        (lambda head, body: header_bytes(version=3) + body, "version 3"),
        (lambda head, body: head[:12] + struct.pack("<I", 10**6) + head[16:], "header length"),
        (lambda head, body: head[:16] + b"x" + head[17:] + body, "malformed telemetry header"),
        (lambda head, body: header_bytes(record_size=24) + body, "record_size"),
        (lambda head, body: header_bytes(source="client") + body, "source 'client'"),
        (lambda head, body: header_bytes(histogram={"sub_bucket_bits": 3}) + body, "histogram"),
        (lambda head, body: head + body + bytes(range(256)) * 1000, "damaged"),
    ],
)
def test_bad_files_are_clear_errors(tmp_path: Path, damage: Any, needle: str) -> None:
    path = tmp_path / "server-7-w1.tel"
    head, snaps = good_file(path)
    path.write_bytes(damage(head, b"".join(snaps)))
    with pytest.raises(TelemetryFormatError, match=needle) as info:
        load(path)
    assert str(path) in str(info.value)


def test_damaged_records_are_clear_errors(tmp_path: Path) -> None:
    path = tmp_path / "server-7-w1.tel"
    head = header_bytes()
    good = counters_snapshot(1, [5])
    cases = [
        ({**good, (99, NO_OP, NONE): 1}, "metric 99"),  # not in the header's table
        ({**good, (1, NO_OP, NONE): 1}, "metric 1, op 255"),  # per-op metric without op
        ({**good, (4, 2, NONE): 1}, "metric 4, op 2"),  # op on a metric without ops
        ({**good, (1, 9, NONE): 1}, "metric 1, op 9"),  # no op 9
        ({**good, (20, 1, 300): 1}, "bucket 300"),  # no bucket 300
        ({**good, (2, 1, COUNT): 1}, "bucket 65534"),  # a statistic of a counter
    ]
    for values, needle in cases:
        path.write_bytes(head + snapshot(0, T0, values))
        with pytest.raises(TelemetryFormatError, match=re.escape(needle)):
            load(path)
    # An end record whose count is wrong.
    body = snapshot(0, T0, good)
    wrong_end = body[:-32] + RECORD.pack(T0, len(good) + 1, 7, 0, 1, 0, NO_OP, NONE, 0)
    path.write_bytes(head + wrong_end + snapshot(1, T0 + S, good))
    with pytest.raises(TelemetryFormatError, match="damaged"):
        load(path)
    # A record that names another server than the header.
    path.write_bytes(head + snapshot(0, T0, good, ident=8))
    with pytest.raises(TelemetryFormatError, match="id 8"):
        load(path)


def test_load_finds_files_and_says_when_there_are_none(tmp_path: Path) -> None:
    run_dir = create_run_dir(tmp_path, "test")
    with pytest.raises(FileNotFoundError, match="no telemetry files"):
        load(run_dir.path)
    with pytest.raises(FileNotFoundError, match="nope"):
        load(tmp_path / "nope")
    good_file(run_dir.telemetry_dir / "server-7-w1.tel")
    # A restarted server: a second file for the same server and worker, counters from zero.
    path2 = run_dir.telemetry_dir / "server-7-w1.1.tel"
    path2.write_bytes(
        header_bytes(created_unix_ns=T0 + 10 * S)
        + snapshot(0, T0 + 10 * S, counters_snapshot(1, [5]))
        + snapshot(1, T0 + 11 * S, counters_snapshot(4, [5, 6, 7, 8]))
    )
    # Another server on another node.
    other = run_dir.telemetry_dir / "server-2-w0.tel"
    other.write_bytes(
        header_bytes(id=2, worker=0, node="node-y")
        + RECORD.pack(T0, 0, 2, 0, 0, 0, NO_OP, NONE, 0)  # an empty snapshot
    )
    # Not telemetry: ignored by name.
    (run_dir.telemetry_dir / "notes.txt").write_text("hello")
    for where in (run_dir.path, run_dir.telemetry_dir):
        tel = load(where)
        assert isinstance(tel, Telemetry)
        assert sorted(tel.files["path"]) == sorted(str(p) for p in run_dir.telemetry_files())
        assert list(tel.files["server"]) == [2, 7, 7]
        assert list(tel.files["snapshots"]) == [1, 3, 2]
    r = tel.rates()
    reads = r[(r["metric"] == "ops") & (r["op"] == "read")]
    assert list(reads["delta"]) == [2, 3, 4, 1, 3]  # the restart starts again from its value
    assert reads["delta"].sum() == 9 + 4


def test_documented_example_runs(tmp_path: Path) -> None:
    run_dir = create_run_dir(tmp_path, "test")
    good_file(run_dir.telemetry_dir / "server-7-w1.tel")
    code = re.search(r"```python\n(.*?)```", DOC.read_text(), re.S)
    assert code is not None
    source = code.group(1).replace("results/20250102T030405Z-local-3fa9c1", str(run_dir.path))
    namespace: dict[str, Any] = {}
    exec(compile(source, str(DOC), "exec"), namespace)
    assert namespace["mean_depth"] == pytest.approx((5 * 1 + 3 * 2 + 2 * 3) / 10)
    assert namespace["share_depth1"] == pytest.approx(0.5)

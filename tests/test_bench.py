"""`benchfs-bench storage`: fio parsing, the interleaved schedule, medians, and end to end."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from benchfs import _core, telemetry
from benchfs.bench import storage
from benchfs.bench.chunkstore import (
    CASES,
    CHUNK_SIZE,
    Case,
    CaseResult,
    CaseSizes,
    Measurement,
    StorageBench,
    parse_engine_result,
)
from benchfs.bench.stats import (
    Bucket,
    histogram_mean,
    histogram_share,
    interleave,
    median,
    ratio,
)
from benchfs.bench.storage import plan_sizes, targets
from benchfs.bench.telemetry_view import Window, load_snapshots, window
from benchfs.bench.wholepath import Load, depth_summary
from benchfs.errors import BenchError, ProbeError
from benchfs.probes.fio import FioError, fio_command, parse_fio_json, run_fio
from benchfs.probes.system import cpu_seconds
from benchfs.units import KIB, MIB
from conftest import rendered

needs_fio = pytest.mark.skipif(shutil.which("fio") is None, reason="fio is not installed")

CASE_NAMES = [
    "seqwrite-1m-qd1",
    "seqwrite-1m-qd32",
    "seqwrite-4m-qd1",
    "seqwrite-4m-qd32",
    "seqread-1m-qd1",
    "seqread-1m-qd32",
    "seqread-4m-qd1",
    "seqread-4m-qd32",
    "randread-4k-qd1",
    "randread-4k-qd32",
]


def bench_command() -> list[str]:
    """The installed `benchfs-bench` console script (next to this Python, else the module)."""
    beside = Path(sys.executable).parent / "benchfs-bench"
    return [str(beside)] if beside.exists() else [sys.executable, "-m", "benchfs.cli.bench"]


def fio_doc(section: dict[str, Any], direction: str = "read", **job: Any) -> str:
    """A minimal fio JSON document with one job whose `direction` is `section`."""
    empty = {"io_bytes": 0, "bw_bytes": 0, "runtime": 0}
    body = {"jobname": "x", "error": 0, "read": empty, "write": empty, **job}
    body[direction] = section
    return json.dumps({"fio version": "fio-test", "jobs": [body]})


MODERN = {
    "io_bytes": 8 * MIB,
    "io_kbytes": 8 * 1024,
    "bw_bytes": 100 * MIB,
    "bw": 100 * 1024,
    "runtime": 80,
    "total_ios": 2048,
    "clat_ns": {"percentile": {"1.000000": 1000, "50.000000": 20_000, "99.000000": 90_000}},
}


# fio output: real runs, other versions' shapes, and malformed input


@needs_fio
@pytest.mark.parametrize(
    ("pattern", "block", "depth"),
    [("seqwrite", MIB, 4), ("seqread", MIB, 1), ("randread", 4096, 8)],
)
def test_parse_real_fio_output(tmp_path: Path, pattern: str, block: int, depth: int) -> None:
    target = tmp_path / "fio.dat"
    if pattern != "seqwrite":
        run_fio(fio_command("fio", str(target), "seqwrite", MIB, 4, 4 * MIB, True), "write")
    argv = fio_command("fio", str(target), pattern, block, depth, 4 * MIB, direct=True)
    assert "--ioengine=io_uring" in argv and f"--iodepth={depth}" in argv
    text = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    direction = "write" if pattern == "seqwrite" else "read"
    result = parse_fio_json(text, "test", direction)
    assert result.bytes == 4 * MIB
    assert result.ops == 4 * MIB // block
    assert result.mib_s > 0
    assert 0 < result.p50_us <= result.p99_us
    assert result.version and result.version.startswith("fio-")
    # The direction defaults to the one that moved bytes, and run_fio agrees with the parse.
    assert parse_fio_json(text, "test").bytes == 4 * MIB
    again = run_fio(argv, direction)
    assert again.bytes == 4 * MIB and again.mib_s > 0


def test_parse_modern_shape() -> None:
    result = parse_fio_json(fio_doc(MODERN), "doc")
    assert (result.mib_s, result.p50_us, result.p99_us) == (100.0, 20.0, 90.0)
    assert (result.bytes, result.ops, result.seconds) == (8 * MIB, 2048, 0.08)


def test_parse_older_shapes() -> None:
    # fio 2.x: io_bytes in KiB, bandwidth only in KiB/s, latency in µs under "clat".
    old = {
        "io_bytes": 8 * 1024,
        "bw": 51200,
        "runtime": 160,
        "clat": {"percentile": {"50.00": 30, "99.00": 120}},
    }
    result = parse_fio_json(fio_doc(old), "old")
    assert (result.bytes, result.mib_s, result.p50_us, result.p99_us) == (8 * MIB, 50, 30, 120)
    # An intermediate spelling: clat_us.
    mid = {**MODERN, "clat_us": {"percentile": {"50.0": 7, "99.0": 9}}}
    del mid["clat_ns"]
    assert parse_fio_json(fio_doc(mid), "mid").p99_us == 9


def test_parse_skips_warning_lines_before_the_json() -> None:
    text = "fio: io_uring: some warning {not json}\nnote: another\n" + fio_doc(MODERN)
    assert parse_fio_json(text, "warned").mib_s == 100


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", "no JSON object"),
        ("fio: something went wrong\n", "no JSON object"),
        ('{"jobs": [{"read": ', "malformed fio JSON output"),
        ('{"fio version": "x"}', "no jobs"),
        (fio_doc(MODERN, error=5), "failed with error 5"),
        (fio_doc({**MODERN, "bw_bytes": "fast"}), "jobs[0].read.bw_bytes"),
        (fio_doc({k: v for k, v in MODERN.items() if k != "clat_ns"}), "no completion latency"),
        (fio_doc({**MODERN, "clat_ns": {"mean": 1.0}}), "no percentile table"),
        (fio_doc({**MODERN, "clat_ns": {"percentile": {"50.000000": 1}}}), "lacks 99%"),
        (fio_doc({**MODERN, "io_bytes": 0}), "moved no bytes"),
    ],
)
def test_malformed_fio_output_names_its_source(text: str, expected: str) -> None:
    with pytest.raises(FioError) as e:
        parse_fio_json(text, "/results/fio-case.json")
    assert "/results/fio-case.json" in e.value.message
    assert expected in e.value.message
    assert e.value.code == "EIO"


def test_missing_direction_is_an_error() -> None:
    doc = json.dumps({"jobs": [{"jobname": "x", "error": 0, "read": MODERN}]})
    with pytest.raises(FioError, match="no 'write' section"):
        parse_fio_json(doc, "src", "write")


@needs_fio
def test_failing_fio_command_is_named(tmp_path: Path) -> None:
    argv = fio_command("fio", str(tmp_path / "f.dat"), "seqread", MIB, 1, 4 * MIB, True)
    argv.append("--no-such-option=1")
    with pytest.raises(FioError) as e:
        run_fio(argv, "read")
    assert "--no-such-option=1" in e.value.message and "exited with status" in e.value.message


def test_fio_command_rejects_unknown_pattern() -> None:
    with pytest.raises(ValueError, match="unknown pattern"):
        fio_command("fio", "/x", "randwrite", 4096, 1, MIB, True)


# The schedule, medians and summaries


def test_cases_have_the_issue_names() -> None:
    assert [c.name for c in CASES] == CASE_NAMES
    by_name = {c.name: c for c in CASES}
    assert by_name["seqwrite-4m-qd32"] == Case("seqwrite-4m-qd32", "seqwrite", 4 * MIB, 32)
    assert by_name["randread-4k-qd1"] == Case("randread-4k-qd1", "randread", 4 * KIB, 1)
    assert [c.reads for c in CASES] == [False] * 4 + [True] * 6


def test_interleave_alternates_which_tool_goes_first() -> None:
    steps = interleave(["a", "b"], 3)
    assert [(s.repeat, s.case, s.tool) for s in steps] == [
        (0, "a", "benchfs"),
        (0, "a", "fio"),
        (0, "b", "benchfs"),
        (0, "b", "fio"),
        (1, "a", "fio"),
        (1, "a", "benchfs"),
        (1, "b", "fio"),
        (1, "b", "benchfs"),
        (2, "a", "benchfs"),
        (2, "a", "fio"),
        (2, "b", "benchfs"),
        (2, "b", "fio"),
    ]
    assert [s.tool for s in interleave(["x"], 2, tools=("on", "off"))] == ["on", "off", "off", "on"]
    with pytest.raises(ValueError, match="at least 1"):
        interleave(["a"], 0)


def test_median_and_ratio() -> None:
    assert median([3, 1, 2]) == 2
    assert median([4, 1, 3, 2]) == 2.5
    assert median([7]) == 7
    with pytest.raises(ValueError):
        median([])
    assert ratio(50, 100) == 0.5
    assert ratio(1, 0) is None
    assert ratio(1, math.nan) is None


def test_histogram_statistics() -> None:
    depths = [Bucket(1, 1, 2), Bucket(2, 2, 1), Bucket(3, 3, 1), Bucket(0, 0, 0)]
    assert histogram_mean(depths) == pytest.approx(7 / 4)
    assert histogram_share(depths, 1, 1) == 0.5
    wide = [Bucket(100, 199, 10), Bucket(200, 299, 10)]
    assert histogram_mean(wide) == pytest.approx(199.5)
    with pytest.raises(ValueError, match="empty"):
        histogram_mean([Bucket(1, 1, 0)])


def m(mib_s: float, p50: float = 10, p99: float = 20, **extra: float) -> Measurement:
    return Measurement(mib_s, p50, p99, MIB, 0.1, 1, dict(extra))


def test_case_summary_reports_medians_and_their_ratio() -> None:
    result = CaseResult(CASES[1], 64 * MIB)
    result.runs["benchfs"] = [
        m(90, 10, 50, mean_inflight=30),
        m(100, 12, 40, mean_inflight=31),
        m(95, 11, 60, mean_inflight=29),
    ]
    result.runs["fio"] = [m(200, 9, 30), m(100, 8, 20), m(190, 7, 25)]
    s = result.summary()
    assert s["name"] == "seqwrite-1m-qd32"
    assert (s["benchfs_mib_s"], s["fio_mib_s"]) == (95, 190)
    assert s["ratio"] == 0.5
    assert (s["p50_us"], s["fio_p50_us"], s["p99_us"], s["fio_p99_us"]) == (11, 8, 50, 25)
    assert s["benchfs_mean_inflight"] == 30
    assert [r["mib_s"] for r in s["raw"]["fio"]] == [200, 100, 190]
    json.dumps(s)


def test_engine_result_is_validated() -> None:
    good = {
        "bytes": MIB,
        "seconds": 0.5,
        "mib_s": 2.0,
        "ops": 256,
        "p50_us": 100,
        "p99_us": 300,
        "mean_inflight": 1.0,
        "share_depth1": 1.0,
    }
    got = parse_engine_result(good)
    assert (got.mib_s, got.ops, got.extra["share_depth1"]) == (2.0, 256, 1.0)
    with pytest.raises(BenchError, match="lacks p99_us"):
        parse_engine_result({k: v for k, v in good.items() if k != "p99_us"})
    with pytest.raises(BenchError, match="not a dict"):
        parse_engine_result([1, 2])


def test_sizes_scale_down_to_fit_with_a_message() -> None:
    notes: list[str] = []
    sizes, file_size = plan_sizes(CaseSizes(1 << 30, 256 * MIB), 256 * MIB, 2 << 30, notes.append)
    assert sizes.disk_need() + 8 * file_size + 256 * MIB <= 2 << 30
    assert sizes.seq % CHUNK_SIZE == 0 and sizes.rand % CHUNK_SIZE == 0
    assert len(notes) == 1 and "scaled down" in notes[0]
    notes.clear()
    assert plan_sizes(CaseSizes(32 * MIB, 8 * MIB), 32 * MIB, 100 << 30, notes.append) == (
        CaseSizes(32 * MIB, 8 * MIB),
        32 * MIB,
    )
    assert notes == []
    with pytest.raises(BenchError) as e:
        plan_sizes(CaseSizes(32 * MIB, 8 * MIB), 32 * MIB, 100 * MIB, notes.append)
    assert e.value.code == "ENOSPC"


@needs_fio
def test_storage_bench_interleaves_and_prepares(tmp_path: Path, monkeypatch) -> None:
    """The schedule with real fio and a stand-in engine: datasets first, fresh write targets."""
    calls: list[tuple[Any, ...]] = []

    def fake_engine(data_dir: str, pattern: str, bs: int, qd: int, total: int, *rest: Any) -> dict:
        calls.append((Path(data_dir).name, pattern, bs, qd, total, *rest))
        assert Path(data_dir).is_dir()
        if pattern == "seqwrite":
            assert list(Path(data_dir).iterdir()) == [], "write targets start empty"
            (Path(data_dir) / "chunk").write_bytes(b"x")
        return {
            "bytes": total,
            "seconds": 0.01,
            "mib_s": total / MIB / 0.01,
            "ops": total // bs,
            "p50_us": 5.0,
            "p99_us": 9.0,
            "mean_inflight": float(qd),
            "share_depth1": 0.0,
        }

    monkeypatch.setattr(_core, "bench_storage", fake_engine, raising=False)
    work = tmp_path / "work"
    work.mkdir()
    bench = StorageBench(work, CaseSizes(8 * MIB, 4 * MIB), repeats=1, direct=True)
    results = bench.run()
    assert [r.case.name for r in results] == CASE_NAMES
    # Two untimed dataset writes (one per dataset size), then the 10 cases.
    assert [c[:2] for c in calls[:2]] == [("read-4MiB", "seqwrite"), ("read-8MiB", "seqwrite")]
    assert len(calls) == 2 + 10
    assert all(c[5:] == (CHUNK_SIZE, True, True, "chunkfile") for c in calls)
    by_case = {r.case.name: r for r in results}
    rand = [c for c in calls[2:] if c[1] == "randread"]
    assert {c[0] for c in rand} == {"read-4MiB"} and {c[4] for c in rand} == {4 * MIB}
    for result in results:
        assert len(result.runs["benchfs"]) == len(result.runs["fio"]) == 1
        fio = result.runs["fio"][0]
        assert fio.bytes == result.size and fio.mib_s > 0 and fio.p99_us >= fio.p50_us > 0
    assert by_case["randread-4k-qd32"].runs["fio"][0].ops == 1024
    summary = by_case["seqread-1m-qd1"].summary()
    assert summary["ratio"] == pytest.approx(summary["benchfs_mib_s"] / summary["fio_mib_s"])
    assert not (work / "fio" / "write.dat").exists()


def test_cpu_seconds_of_this_process_grows() -> None:
    import os

    before = cpu_seconds(os.getpid())
    deadline = time.process_time() + 0.05
    while time.process_time() < deadline:
        pass
    assert cpu_seconds(os.getpid()) > before
    with pytest.raises(ProbeError, match="process"):
        cpu_seconds(2**22 + 12345)


# Telemetry files as servers write them (docs/telemetry.md), for the depth window.

HISTOGRAMS = {
    "inflight_at_submit": (16, False),
    "queue_wait_ns": (18, True),
    "device_ns": (19, True),
    "total_ns": (20, True),
}
OPS = ["write", "read", "fsync", "meta"]


def bucket_index(v: int) -> int:
    if v < 4:
        return v
    e = v.bit_length() - 1
    return (e - 1) * 4 + ((v >> (e - 2)) & 3)


def telemetry_header() -> bytes:
    header = {
        "format": "benchfs-telemetry",
        "version": 1,
        "source": "server",
        "id": 0,
        "worker": 0,
        "node": "test",
        "byte_order": "little",
        "record_size": 32,
        "ops": OPS,
        "histogram": {"scheme": "log-linear", "sub_bucket_bits": 2, "buckets": 252},
        "metrics": [
            {"id": i, "name": n, "kind": "histogram", "per_op": p, "unit": "x"}
            for n, (i, p) in HISTOGRAMS.items()
        ],
    }
    text = json.dumps(header).encode()
    text += b" " * (-(16 + len(text)) % 32)
    return b"BFSTELEM" + np.array([1, len(text)], "<u4").tobytes() + text


def telemetry_snapshot(seq: int, t_ns: int, values: dict[str, list[int]]) -> bytes:
    """One snapshot of cumulative histograms: `values` are every value recorded so far."""
    rows = []
    for name, (metric, per_op) in HISTOGRAMS.items():
        recorded = values.get(name, [])
        op = OPS.index("read") if per_op else 0xFF
        stats = {0xFFFE: len(recorded), 0xFFFD: sum(recorded)}
        stats |= {0xFFFC: min(recorded, default=0), 0xFFFB: max(recorded, default=0)}
        rows += [(metric, op, bucket, value) for bucket, value in stats.items()]
        counts: dict[int, int] = {}
        for v in recorded:
            counts[bucket_index(v)] = counts.get(bucket_index(v), 0) + 1
        rows += [(metric, op, bucket, n) for bucket, n in sorted(counts.items())]
    rows.append((0, 0xFF, 0xFFFF, len(rows)))
    out = np.zeros(len(rows), dtype=telemetry.RECORD_DTYPE)
    for k, (metric, op, bucket, value) in enumerate(rows):
        out[k] = (t_ns, value, 0, seq, 0, metric, op, bucket, 0)
    return out.tobytes()


def test_depth_window_from_two_snapshots(tmp_path: Path) -> None:
    path = tmp_path / "server-0-w0.tel"
    # Before the load: the untimed writes left 100 submits at depth 1 (and no reads).
    before = {"inflight_at_submit": [1] * 100}
    path.write_bytes(telemetry_header() + telemetry_snapshot(0, 1_000_000_000, before))
    first = load_snapshots(tmp_path, after=0.5, timeout_s=1)
    # The load: 100 reads, 10 submitted at depth 1 and 90 at depth 16.
    after = {
        "inflight_at_submit": [1] * 110 + [16] * 90,
        "queue_wait_ns": [100_000] * 100,
        "device_ns": [800_000] * 100,
        "total_ns": [1_000_000] * 99 + [5_000_000],
    }
    with path.open("ab") as f:
        f.write(telemetry_snapshot(1, 3_000_000_000, after))
    with pytest.raises(BenchError) as e:
        load_snapshots(tmp_path, after=4.0, timeout_s=0.3)
    assert e.value.code == "ETIMEDOUT"
    win = window(first, load_snapshots(tmp_path, after=2.0, timeout_s=1))
    assert win.mean_inflight == pytest.approx((10 + 90 * 16) / 100)
    assert win.share_depth1 == pytest.approx(0.1)
    assert win.device_ops == 100
    assert win.device_mean_us == pytest.approx(800)
    # Bucket quantiles are within a bucket's width (25%) of the values.
    assert win.total_p50_us == pytest.approx(1000, rel=0.125)
    assert win.total_p99_us == pytest.approx(1000, rel=0.125)
    assert win.device_p50_us == pytest.approx(800, rel=0.125)
    assert win.queue_wait_mean_us == pytest.approx(100)
    assert win.total_mean_us == pytest.approx(1040)


def test_missing_telemetry_times_out_clearly(tmp_path: Path) -> None:
    with pytest.raises(BenchError) as e:
        load_snapshots(tmp_path, after=0, timeout_s=0.2)
    assert e.value.code == "ETIMEDOUT" and str(tmp_path) in e.value.message


def test_depth_summary_spells_out_littles_law() -> None:
    win = Window(
        mean_inflight=16.0,
        share_depth1=0.02,
        device_ops=40_000,
        device_mean_us=800.0,
        device_p50_us=790.0,
        total_p50_us=1000.0,
        total_p99_us=3000.0,
        total_mean_us=1100.0,
        queue_wait_mean_us=200.0,
    )
    load = Load(40 * 2**30 // 1000, 2500, 40_000, 2.0, 1.0, 0.0, 2.0)
    depth = depth_summary(win, load)
    assert (depth["mean_inflight"], depth["share_depth1"]) == (16.0, 0.02)
    assert (depth["p50_us"], depth["p99_us"]) == (1000.0, 3000.0)
    # 40,000 reads in 2 s = 20,000/s, one per 50 µs; 16 in flight -> 800 µs at the device.
    assert depth["device_ops_per_s"] == pytest.approx(20_000)
    assert depth["predicted_device_us"] == pytest.approx(800)
    assert "16.0 x 50.0 µs = 800 µs" in depth["explanation"]
    assert "80%" in depth["explanation"]
    assert (
        "1,100 µs = waiting before submission 200 µs + device 800 µs + other 100 µs"
        in (depth["explanation"])
    )
    assert load.cpu_us_per_op == pytest.approx(25.0)


def test_targets_are_checked() -> None:
    report = {
        "cases": [
            {"name": "seqread-1m-qd32", "ratio": 0.97, "p50_us": 1, "fio_p50_us": 1},
            {"name": "seqwrite-4m-qd32", "ratio": 0.5, "p50_us": 1, "fio_p50_us": 1},
            {"name": "randread-4k-qd1", "ratio": 1.0, "p50_us": 105, "fio_p50_us": 100},
        ],
        "depth": {"mean_inflight": 20.0},
        "idle_cpu_pct": 0.1,
        "telemetry_overhead_pct": 3.0,
    }
    met = {t["target"]: t["met"] for t in targets(report)}
    assert met == {
        "seqread-1m-qd32 ratio >= 0.95": True,
        "seqwrite-4m-qd32 ratio >= 0.95": False,
        "randread-4k-qd1 p50 <= 1.1 x fio's": True,
        "whole-path mean in-flight depth >= 16": True,
        "idle server < 1% of one core": True,
        "telemetry overhead < 2%": False,
    }


# The command line


def test_bad_size_is_a_clear_error(tmp_path: Path) -> None:
    out = subprocess.run(
        [*bench_command(), "storage", "--dir", str(tmp_path), "--size", "5M", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 1
    assert "EINVAL" in out.stderr and "multiple of 4 MiB" in out.stderr
    assert out.stdout == ""


def positive(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value > 0


@needs_fio
@pytest.mark.timeout(120)
def test_storage_quick_json_end_to_end(tmp_path: Path) -> None:
    start = time.monotonic()
    out = subprocess.run(
        [*bench_command(), "storage", "--quick", "--json", "--dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=90,
    )
    elapsed = time.monotonic() - start
    assert out.returncode == 0, out.stderr
    assert elapsed < 60, f"--quick took {elapsed:.0f} s"
    report = json.loads(out.stdout)
    assert [c["name"] for c in report["cases"]] == CASE_NAMES
    assert "target whole-path mean in-flight depth" in rendered(storage.render, report)
    for case in report["cases"]:
        for key in (
            "benchfs_mib_s",
            "fio_mib_s",
            "ratio",
            "p50_us",
            "fio_p50_us",
            "p99_us",
            "fio_p99_us",
        ):
            assert positive(case[key]), (case["name"], key, case[key])
    depth = report["depth"]
    for key in ("mean_inflight", "share_depth1", "p50_us", "p99_us"):
        assert isinstance(depth[key], float) and math.isfinite(depth[key]), key
    assert depth["mean_inflight"] >= 1 and depth["p99_us"] >= depth["p50_us"] > 0
    assert 0 <= depth["share_depth1"] <= 1
    assert isinstance(depth["explanation"], str) and "Little's law" in depth["explanation"]
    # Idle CPU may round to zero ticks in 2 s; the overhead is a signed difference.
    assert report["idle_cpu_pct"] >= 0
    assert math.isfinite(report["telemetry_overhead_pct"])
    assert report["io_mode"] == "direct" and report["repeats"] == 1 and report["quick"] is True
    assert report["page_cache_dropped"] in (True, False)
    # The scratch directory is removed and nothing it started is left running.
    assert list(tmp_path.iterdir()) == []
    assert processes_mentioning(str(tmp_path)) == []


def processes_mentioning(text: str) -> list[int]:
    """PIDs whose command line contains `text` (daemons and readers name their directories)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline:
            found.append(int(entry.name))
    return found

"""Client telemetry and per-operation traces, written by the Rust core on a real cluster.

The client files (`client-<pid>-w<n>.tel`, format version 2) and the servers' trace files
(`server-<id>-w<worker>.trace`) are loaded with `benchfs.telemetry` unchanged; the expected
figures come from the chunking of what the test did, never from the files themselves.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest

from benchfs import Client
from benchfs.analysis.tables import STAGES
from benchfs.telemetry import load, load_trace
from conftest import benchfs_run_command, config_text, data_for

CHUNK = 65536  # conftest.TEST_OVERRIDES
# (path, [(offset, length) of each write call]): unaligned, multi-chunk and single-byte writes.
WRITES = {
    "/a.dat": [(0, 5 * CHUNK + 1000)],
    "/b.dat": [(100, 2 * CHUNK), (3 * CHUNK - 10, 20)],
}


def chunk_pieces(offset: int, length: int) -> list[tuple[int, int]]:
    """(chunk, bytes) of every chunk request a range becomes (the client's chunking)."""
    pieces = []
    end = offset + length
    while offset < end:
        chunk = offset // CHUNK
        n = min(end, (chunk + 1) * CHUNK) - offset
        pieces.append((chunk, n))
        offset += n
    return pieces


def file_id(hex_id: str) -> tuple[int, int]:
    """(file_hi, file_lo) of a 32-hex-digit file id."""
    v = int(hex_id, 16)
    return v >> 64, v & (2**64 - 1)


def own_client_file(tel: Path) -> Path:
    """The one client telemetry file this test process wrote into `tel`."""
    (path,) = tel.glob(f"client-{os.getpid()}-w*.tel")
    return path


def test_client_files_and_traces_from_a_real_run(daemon_cluster, tmp_path: Path) -> None:
    tel = tmp_path / "telemetry"
    # Writes answered before they return: every request is this client's (a write-behind
    # thread's client would write a file of its own).
    overrides = (
        f"telemetry.dir={tel}",
        "telemetry.trace=true",
        "telemetry.interval_ms=100",
        "client.write_behind=0",
    )
    cluster = daemon_cluster(2, *overrides)
    config = config_text("cluster.expected_servers=2", *overrides)
    # Expected data requests per (op, target server) and bytes, from the chunking.
    requests: Counter[tuple[str, int]] = Counter()
    moved: Counter[tuple[str, int]] = Counter()
    expected_trace: Counter[tuple[str, int, int, int, int, int]] = Counter()
    with Client(cluster.registry_dir, config=config) as client:
        for path, writes in WRITES.items():
            with client.open(path, os.O_RDWR | os.O_CREAT) as f:
                for offset, length in writes:
                    assert f.pwrite(data_for(7, offset, length), offset) == length
        sizes = {}
        for path, writes in WRITES.items():
            size = max(o + n for o, n in writes)
            sizes[path] = size
            with client.open(path) as f:
                data = f.pread(size, 0)
            assert len(data) == size
        # Where each chunk lives, asked after the I/O (locate's stat is a metadata request).
        ids = {path: file_id(client.stat(path).id) for path in WRITES}
        for path, writes in WRITES.items():
            hi, lo = ids[path]
            ranges = [("write", o, n) for o, n in writes] + [("read", 0, sizes[path])]
            for op, offset, length in ranges:
                for chunk, n in chunk_pieces(offset, length):
                    server = client.locate(path, chunk * CHUNK)
                    requests[(op, server)] += 1
                    moved[(op, server)] += n
                    expected_trace[(op, server, hi, lo, chunk, n)] += 1
    cluster.stop(grace_s=5.0)
    assert {server for _, server in requests} == {0, 1}, "the files must span both servers"

    # The client's file: version 2, loaded by benchfs.telemetry, per-target counts exact.
    path = own_client_file(tel)
    t = load(tel)
    assert t.has_clients
    files = t.files.set_index("path")
    assert files.loc[str(path), "version"] == 2 and files.loc[str(path), "source"] == "client"
    assert files.loc[str(path), "server"] == os.getpid()  # a client file's id is its pid
    c = t.latest_counters("client")
    c = c[c["client"] == os.getpid()]

    def value(metric: str, op: str, target: int) -> int:
        rows = c[(c["metric"] == metric) & (c["op"] == op) & (c["target"] == target)]
        return int(rows["value"].sum())

    for (op, server), n in requests.items():
        assert value("requests", op, server) == n, (op, server)
        assert value("rpc_ns.count", op, server) == n, (op, server)
        assert value("bytes", op, server) == moved[(op, server)], (op, server)
        for metric in ("retries", "timeouts", "errors", "busy"):
            assert value(metric, op, server) == 0, (metric, op, server)
    # Metadata requests (create, stat, size reports, locate) went to their owners.
    assert sum(value("requests", "meta", s) for s in (0, 1)) >= 2 * len(WRITES)
    calls = c[(c["metric"] == "call_ns.count")].set_index("op")["value"]
    assert calls["write"] == sum(len(w) for w in WRITES.values())
    assert calls["read"] == len(WRITES)

    # Every data call split into the stages of its critical request: they add up to the call,
    # exactly, and the server's share (carried by its replies, in whole µs) is at most what the
    # servers' traces hold for all the op's requests.
    def total(metric: str, op: str) -> int:
        return int(c[(c["metric"] == metric) & (c["op"] == op)]["value"].sum())

    for op in ("write", "read"):
        assert total("call_other_ns.count", op) == calls[op], op
        assert sum(total(f"{m}.sum", op) for m in STAGES.values()) == total("call_ns.sum", op)
        at_server = total("call_queue_ns.sum", op) + total("call_service_ns.sum", op)
        traced = load_trace(tel)
        assert traced is not None
        assert 0 < at_server <= int(traced[traced["op"] == op]["total_ns"].sum()), op
    sends = int(c.loc[c["metric"] == "inflight_at_send.count", "value"].sum())
    assert sends == int(c.loc[c["metric"] == "requests", "value"].sum())
    assert int(c.loc[c["metric"] == "inflight", "value"].iloc[0]) == 0  # all answered
    assert t.quantile("rpc_ns", "write", 0.5, by="target", source="client").gt(0).all()

    # The servers' traces: one record per chunk operation, with its file, chunk and bytes.
    trace = load_trace(tel)
    assert trace is not None
    data = trace[trace["op"].isin(["write", "read"])]
    got = Counter(
        zip(
            data["op"].astype(str),
            data["server"].astype(int),
            data["file_hi"].astype(int),
            data["file_lo"].astype(int),
            data["chunk"].astype(int),
            data["bytes"].astype(int),
            strict=True,
        )
    )
    assert got == expected_trace
    assert not data["error"].any()
    assert (data["total_ns"] >= data["queue_ns"] + data["device_ns"]).all()
    assert (data["device_ns"] > 0).all()
    # Trace times are arrivals at the server during this test.
    assert data["t"].min() > pd.Timestamp(files["created"].min()) - pd.Timedelta(seconds=1)
    # Every operation a server counted is in its trace (the ring never filled).
    s = t.latest_counters()
    assert s.loc[s["metric"] == "trace_dropped", "value"].sum() == 0
    ops = s[s["metric"] == "ops"].groupby("server")["value"].sum()
    assert trace.groupby("server").size().reindex(ops.index).tolist() == ops.tolist()


def test_a_full_ring_counts_its_drops(inproc_cluster, tmp_path: Path) -> None:
    tel = tmp_path / "telemetry"
    overrides = (
        f"telemetry.dir={tel}",
        "telemetry.trace=true",
        "telemetry.trace_records=3",
        "telemetry.interval_ms=60000",  # only the final snapshot flushes the ring
    )
    cluster = inproc_cluster(1, *overrides)
    with Client(cluster.registry, config=cluster.config) as client:
        with client.open("/full.dat", "w") as f:
            f.write(data_for(3, 0, 8 * CHUNK))
    cluster.stop()
    trace = load_trace(tel)
    assert trace is not None and len(trace) == 3
    s = load(tel).latest_counters()
    ops = int(s.loc[s["metric"] == "ops", "value"].sum())
    dropped = int(s.loc[s["metric"] == "trace_dropped", "value"].sum())
    assert ops >= 8 and dropped == ops - 3
    assert trace.attrs["files"][0]["records"] == 3


def test_trace_settings_are_validated(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="trace_records"):
        config_text("telemetry.trace_records=0")
    with pytest.raises(ValueError, match="trace_records"):
        config_text(f"telemetry.trace_records={(1 << 24) + 1}")
    with pytest.raises(ValueError, match=r"telemetry.trace needs telemetry.enabled"):
        config_text("telemetry.trace=true", "telemetry.enabled=false")


def test_benchfs_analyze_shows_rpc_by_target_from_real_client_files(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BENCHFS_")}
    env["BENCHFS_RUN_KERNEL_TRACE"] = "false"
    run = subprocess.run(
        [
            *benchfs_run_command(), "launch", "--servers", "2", "--clients", "2",
            "--file-size", "2M", "--transfer-size", "256K",
            "--set", f"layout.chunk_size={CHUNK}", "--set", "telemetry.trace=true",
            "--results-root", str(tmp_path), "--json",
        ],
        capture_output=True, text=True, timeout=180, env=env, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    results = next(p for p in tmp_path.iterdir() if p.is_dir())
    clients = sorted((results / "telemetry").glob("client-*-w0.tel"))
    assert len(clients) == 2  # one per MPI rank
    analyze = Path(sys.executable).parent / "benchfs-analyze"
    done = subprocess.run(
        [str(analyze), str(results), "--json"],
        capture_output=True, text=True, timeout=120, env=env, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout)
    rpc = {row["target"]: row for row in report["tables"]["rpc_by_target"]}
    assert sorted(rpc) == [0, 1]
    # 2 ranks write and read 2 MiB each in 64 KiB chunks: 128 data requests, plus metadata.
    data_requests = 2 * 2 * (2 << 20) // CHUNK
    assert sum(r["requests"] for r in rpc.values()) >= data_requests
    assert all(r["retries"] == 0 and r["p50_ms"] > 0 for r in rpc.values())
    text = subprocess.run(
        [str(analyze), str(results)],
        capture_output=True, text=True, timeout=120, env=env, check=False,
    ).stdout  # fmt: skip
    assert "RPC by target" in text and "client telemetry yes" in text

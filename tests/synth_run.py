"""Synthetic results directories with planted answers, their telemetry written by the core's
own writers (`tel_writer`)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from benchfs.config import resolve_config_text
from benchfs.units import MIB
from tel_writer import TelWriter, TraceRecord, trace_record, write_trace

T0 = 1_800_000_000_000_000_000
"""The synthetic runs' start (ns since the epoch); snapshot k is taken at T0 + (k + 1) s."""
SECOND = 1_000_000_000
MS = 1_000_000


def iso(t_ns: int) -> str:
    return (
        datetime.fromtimestamp(t_ns / 1e9, UTC)
        .isoformat(timespec="milliseconds")
        .replace("+00:00", "Z")
    )


def ms(value: float, n: int) -> np.ndarray:
    """n operations of `value` ms each, in ns."""
    return np.full(n, int(value * MS), dtype=np.int64)


@dataclass
class ServerSpec:
    """What one server saw: op times per snapshot (lists) or over the run (split evenly)."""

    node: str
    write_ns: np.ndarray | list[np.ndarray]
    read_ns: np.ndarray | list[np.ndarray]
    depth: np.ndarray | None = None
    batch: np.ndarray | None = None
    write_bytes: int = MIB
    read_bytes: int = MIB
    fsyncs: int = 0
    pool_waits: int = 0
    handle_misses: int = 0
    queue_share: float = 0.1
    write_chunks: np.ndarray | None = None
    """Chunk index of each write (traces); default: all distinct."""


@dataclass
class ClientSpec:
    """One client's requests per target: (requests, retries, timeouts, rpc time ns per request)."""

    ident: int
    node: str
    targets: dict[int, tuple[int, int, int, np.ndarray]] = field(default_factory=dict)


def _split(values: np.ndarray | list[np.ndarray], parts: int) -> list[np.ndarray]:
    if isinstance(values, list):
        assert len(values) == parts
        return values
    return np.array_split(np.asarray(values), parts)


QUIET_TCP = {
    "Tcp.OutSegs": 200_000,
    "Tcp.RetransSegs": 12,
    "TcpExt.TCPTimeouts": 0,
    "TcpExt.TCPLostRetransmit": 0,
    "TcpExt.TCPRcvQDrop": 0,
    "TcpExt.PruneCalled": 0,
    "TcpExt.TCPOFODrop": 0,
    "TcpExt.TCPMemoryPressures": 0,
    "TcpExt.TCPMemoryPressuresChrono": 0,
}
"""The TCP counters of a node over a quiet run (`network/<node>.json`'s delta)."""


def make_run(
    root: Path,
    servers: dict[int, ServerSpec],
    snapshots: int = 4,
    clients: list[ClientSpec] | None = None,
    trace: bool = False,
    iostat: dict[str, str] | None = None,
    overrides: tuple[str, ...] = (),
    workload: dict | None = None,
    name: str = "20270115T080000Z-local-abcdef",
    kernel: dict[str, list[str]] | None = None,
    manifest_extra: dict | None = None,
    network: dict[str, dict[str, int]] | None = None,
) -> Path:
    """A results directory with manifest.json, config.toml and telemetry of `servers`; every
    server's node gets `network/<node>.json` with the TCP counters `network` gives it (a quiet
    network's by default: no timeout, a few retransmissions)."""
    run = root / name
    tel = run / "telemetry"
    tel.mkdir(parents=True)
    (run / "network").mkdir()
    for node in sorted({s.node for s in servers.values()}):
        counted = {**QUIET_TCP, **(network or {}).get(node, {})}
        record = {"node": node, "host": node, "netns": None, "before": dict.fromkeys(counted, 0),
                  "after": counted, "delta": counted}  # fmt: skip
        (run / "network" / f"{node}.json").write_text(json.dumps(record))
    (run / "config.toml").write_text(
        resolve_config_text(None, ["telemetry.interval_ms=1000", *overrides])
    )
    end = T0 + (snapshots + 1) * SECOND
    manifest = {
        "schema_version": 2,
        "mode": "local",
        "started": iso(T0),
        "finished": iso(end),
        "membership": [{"id": i, "node": s.node} for i, s in servers.items()],
        "workload": workload or {"ranks": 2, "write_mib_s": 100.0, "read_mib_s": 90.0},
        "outcome": {"status": "ok", "code": None, "message": None, "exit_code": 0},
        **(manifest_extra or {}),
    }
    (run / "manifest.json").write_text(json.dumps(manifest))
    for sid, spec in servers.items():
        w = TelWriter(tel / f"server-{sid}-w0.tel", "server", sid, spec.node)
        writes, reads = _split(spec.write_ns, snapshots), _split(spec.read_ns, snapshots)
        n_total = sum(len(x) for x in writes) + sum(len(x) for x in reads)
        depth = _split(spec.depth if spec.depth is not None else np.full(n_total, 4), snapshots)
        batch = _split(
            spec.batch if spec.batch is not None else np.full(n_total // 4, 4), snapshots
        )
        records: list[TraceRecord] | None = [] if trace else None
        chunk_no = 0
        for k in range(snapshots):
            t_snap = T0 + (k + 1) * SECOND
            for op, vals, nbytes in (
                ("write", writes[k], spec.write_bytes),
                ("read", reads[k], spec.read_bytes),
            ):
                vals = np.asarray(vals, dtype=np.int64)
                w.add("ops", len(vals), op)
                w.add("bytes", len(vals) * nbytes, op)
                queue = (vals * spec.queue_share).astype(np.int64)
                w.record("total_ns", vals, op)
                w.record("queue_wait_ns", queue, op)
                w.record("device_ns", vals - queue, op)
                if records is not None:
                    starts = t_snap - SECOND + np.linspace(0, SECOND - 1, max(len(vals), 1))
                    for j, (v, q) in enumerate(zip(vals, queue, strict=True)):
                        chunk = chunk_no
                        if op == "write" and spec.write_chunks is not None:
                            chunk = int(spec.write_chunks[chunk_no % len(spec.write_chunks)])
                        records.append(
                            trace_record(
                                int(starts[j]),
                                op,
                                int(v),
                                server=sid,
                                queue_ns=int(q),
                                file_id=(7 << 64) + sid,
                                chunk=chunk,
                                nbytes=nbytes,
                            )
                        )
                        chunk_no += 1
            ops_now = len(writes[k]) + len(reads[k])
            w.add("handle_hits", ops_now - min(spec.handle_misses, ops_now))
            w.add("handle_misses", min(spec.handle_misses, ops_now))
            w.add("pool_waits", spec.pool_waits // snapshots)
            if spec.fsyncs:
                n = spec.fsyncs // snapshots
                w.add("ops", n, "fsync")
                w.record("total_ns", ms(1, n), "fsync")
                w.record("queue_wait_ns", ms(0.01, n), "fsync")
                w.record("device_ns", ms(0.99, n), "fsync")
            w.record("inflight_at_submit", depth[k])
            w.record("submit_batch", batch[k])
            w.set("buffers_free", 0 if spec.pool_waits else 32)
            w.snapshot(t_snap)
        if records is not None:
            write_trace(tel, sid, records, node=spec.node)
    for c in clients or []:
        w = TelWriter(
            tel / f"client-{c.ident}-w0.tel", "client", c.ident, c.node, targets=sorted(servers)
        )
        for k in range(snapshots):
            for target, (requests, retries, timeouts, rpc) in c.targets.items():
                share = np.array_split(np.asarray(rpc), snapshots)[k]
                w.add("requests", requests // snapshots, "read", target)
                w.add("retries", retries // snapshots, "read", target)
                w.add("timeouts", timeouts // snapshots, "read", target)
                w.add("bytes", (requests // snapshots) * MIB, "read", target)
                w.record("rpc_ns", share, "read", target)
            w.record("call_ns", ms(2, 10), "read")
            w.record("inflight_at_send", np.full(10, 8))
            w.set("inflight", 3)
            w.snapshot(T0 + (k + 1) * SECOND)
    if iostat:
        (run / "iostat").mkdir()
        for node, text in iostat.items():
            (run / "iostat" / f"{node}.json").write_text(text)
    if kernel:
        (run / "kernel").mkdir()
        for host, lines in kernel.items():
            (run / "kernel" / f"{host}.jsonl").write_text("\n".join(lines) + "\n")
    return run


def kernel_lines(
    reads: dict[str, dict[int, int]], seconds: int = 4, queued: int = 1, runnable_s: float = 0.1
) -> list[str]:
    """A host's kernel trace as `benchfs-diagnose trace` writes it: per device, reads whose
    latency buckets (lowest us -> count per second) are given, over `seconds` intervals (their
    whole time in the block layer `queued` times longer), a server's folded stacks and the
    scheduler's totals (`runnable_s` waiting for a core, 2 s on CPU)."""
    numbers = {name: str((259 << 20) | i) for i, name in enumerate(reads)}
    out = [json.dumps({"source": "host", "host": "h", "cpus": 2})]

    def block(record: dict) -> None:
        out.append(json.dumps({"source": "block", "record": record}))

    for k in range(seconds):
        block({"type": "printf", "data": json.dumps({"tick": str(T0 / 1e9 + k + 1)}) + "\n"})
        hists = {
            f"{numbers[name]},R,1": [
                {"min": lo, "max": 2 * lo - 1, "count": c} for lo, c in sorted(per.items())
            ]
            for name, per in reads.items()
        }
        block({"type": "hist", "data": {"@device": hists}})
        whole = {
            key: [{**b, "min": b["min"] * queued, "max": b["min"] * queued * 2 - 1} for b in v]
            for key, v in hists.items()
        }
        block({"type": "hist", "data": {"@block": whole}})
    block({"type": "devices", "data": {v: k for k, v in numbers.items()}})
    block({"type": "tracer", "data": {"startup_cpu_s": 0.3, "cpu_s": 0.01, "wall_s": 4.0}})
    sched = {
        "@cpu": {"benchfs-s0-w0": 2 * 10**9},
        "@runq": {"benchfs-s0-w0": int(runnable_s * 1e9)},
    }
    out.append(json.dumps({"source": "sched", "record": {"type": "map", "data": sched}}))
    for stack in ("benchfs-s0-w0-4242;main;serve;io_uring_enter_[k] 40", "benchfsd-4242;main 2"):
        out.append(json.dumps({"source": "perf", "folded": stack}))
    return out


def iostat_json(node: str, samples: list[dict[str, dict[str, float]]], start_ns: int) -> str:
    """iostat -x -y -t -o JSON output (ISO timestamps) with one sample per second."""
    stats = []
    for k, devices in enumerate(samples):
        t = datetime.fromtimestamp(start_ns / 1e9 + k, UTC).strftime("%Y-%m-%dT%H:%M:%S+0000")
        disks = [
            {
                "disk_device": dev,
                "r/s": 0.0,
                "w/s": 0.0,
                "rkB/s": 0.0,
                "wkB/s": 0.0,
                "r_await": 0.0,
                "w_await": 0.0,
                "aqu-sz": 0.0,
                "rareq-sz": 0.0,
                "wareq-sz": 0.0,
                "util": 0.0,
            }
            | values
            for dev, values in devices.items()
        ]
        stats.append({"timestamp": t, "avg-cpu": {"user": 1.0}, "disk": disks})
    doc = {"sysstat": {"hosts": [{"nodename": node, "statistics": stats}]}}
    return json.dumps(doc, indent=1)

"""The kernel's view of a run (`kernel/<host>.jsonl`, `benchfs-diagnose trace`) as tables:
block I/O latency per device (distribution, slow modes, per-second heat map), time on and off
CPU per program by reason, and CPU profiles per process (top frames; the report draws their
flame graphs).

Devices are named per host (`host:device`): nodes of one host that share a device share one
histogram, as they share the device.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from benchfs import latencymodes
from benchfs.peers import Thresholds
from benchfs.probes import blocklat, kerneltrace, perf, sched
from benchfs.probes.kerneltrace import HostTraceData

__all__ = [
    "BLOCK_COLUMNS",
    "HEATMAP_COLUMNS",
    "NO_KERNEL",
    "SCHED_COLUMNS",
    "TOP_FRAMES_COLUMNS",
    "FlameGraph",
    "block_heatmap",
    "block_latency",
    "flame_graphs",
    "load_kernel",
    "sched_time",
    "servers",
    "top_frames",
]

NO_KERNEL = "no kernel trace in this run (kernel/<host>.jsonl; run.kernel_trace)"
BLOCK_COLUMNS = [
    "host",
    "device",
    "op",
    "ios",
    "mean_us",
    "block_mean_us",
    "p50_us",
    "p99_us",
    "max_us",
    "mode_share",
    "mode_lo_us",
    "mode_hi_us",
    "peer_share",
    "odd",
]
HEATMAP_COLUMNS = ["host", "device", "op", "t", "bucket_lo_us", "bucket_hi_us", "count"]
SCHED_COLUMNS = ["host", "comm", *sched.REASONS, "total_s", "cpus"]
TOP_FRAMES_COLUMNS = ["host", "server", "pid", "function", "self", "self_share", "total_share"]


def load_kernel(directory: Path) -> tuple[dict[str, HostTraceData], list[str]]:
    """Every host's trace in `directory`, and notes: missing traces, tracers that could not
    run (their one line each). A damaged file raises ValueError naming it."""
    if not directory.is_dir():
        return {}, [NO_KERNEL]
    out: dict[str, HostTraceData] = {}
    notes: list[str] = []
    for path in sorted(directory.glob("*.jsonl")):
        data = kerneltrace.read_host_trace(path)
        out[path.stem] = data
        notes.extend(f"{path.stem}: {n}" for n in dict.fromkeys(data.notes))
    if not out:
        notes.append(NO_KERNEL)
    return out, notes


def _quantile(h: blocklat.Histogram, q: float) -> float:
    """The q-quantile, interpolated inside its log2 bucket (geometrically)."""
    total = h.total
    if not total:
        return math.nan
    target = q * total
    seen = 0
    for lo, hi, count in h.buckets():
        if count and seen + count >= target:
            frac = (target - seen) / count
            lo_f = max(lo, 1)
            return lo_f * ((hi + 1) / lo_f) ** frac
        seen += count
    return float(h.buckets()[-1][1])


def _merged(
    traces: Mapping[str, HostTraceData], op: str, measure: str = "device"
) -> dict[tuple[str, str], blocklat.Histogram]:
    out = {}
    for host, data in traces.items():
        for device, h in blocklat.merge(data.block, measure=measure, op=op).items():
            out[(host, device)] = h
    return out


def block_latency(traces: Mapping[str, HostTraceData], th: Thresholds) -> pd.DataFrame:
    """Per host, device and direction over the run: I/Os, mean and quantiles (estimated in
    log2 buckets) of issue to complete, the mean of the whole time in the block layer
    (queueing included; NaN before Linux 6.5), the slow mode if any and whether its peers
    (every other device of the run with as many I/Os) lack it (`benchfs.latencymodes`)."""
    rows: list[dict[str, Any]] = []
    for op in ("read", "write"):
        hists = _merged(traces, op)
        whole = _merged(traces, op, "block")
        findings = {f.key: f for f in latencymodes.find_modes(hists, {}, th)}
        for key, h in sorted(hists.items()):
            f = findings.get(key)
            nonzero = [hi for _, hi, c in h.buckets() if c]
            rows.append(
                {
                    "host": key[0],
                    "device": key[1],
                    "op": op,
                    "ios": h.total,
                    "mean_us": h.mean_us(),
                    "block_mean_us": whole[key].mean_us() if key in whole else math.nan,
                    "p50_us": _quantile(h, 0.5),
                    "p99_us": _quantile(h, 0.99),
                    "max_us": float(nonzero[-1]) if nonzero else math.nan,
                    "mode_share": f.mode.share if f else math.nan,
                    "mode_lo_us": f.mode.lo_us if f else math.nan,
                    "mode_hi_us": f.mode.hi_us if f else math.nan,
                    "peer_share": f.peer_share if f and f.peer_share is not None else math.nan,
                    "odd": bool(f and f.odd),
                }
            )
    return pd.DataFrame(rows, columns=BLOCK_COLUMNS)


def block_heatmap(traces: Mapping[str, HostTraceData]) -> pd.DataFrame:
    """Per host, device, direction and second: the I/Os in each latency bucket (long form,
    for a heat map of latency over time)."""
    rows = []
    for host, data in traces.items():
        for s in data.block:
            if s.measure != "device" or s.op == "other":
                continue
            for lo, hi, count in s.buckets:
                rows.append((host, s.device, s.op, s.time, lo, hi, count))
    frame = pd.DataFrame(rows, columns=HEATMAP_COLUMNS)
    if frame.empty:
        return frame
    keys = ["host", "device", "op", "t", "bucket_lo_us", "bucket_hi_us"]
    frame = frame.groupby(keys, as_index=False)["count"].sum()
    frame["t"] = pd.to_datetime(frame["t"], unit="s", utc=True).dt.round("ms")
    return frame


def sched_time(traces: Mapping[str, HostTraceData], top: int = 12) -> pd.DataFrame:
    """Per host, the programs with the most time on CPU (BenchFS servers always), their
    seconds by reason, and the host's CPU count."""
    rows = []
    for host, data in traces.items():
        ranked = sorted(data.sched, key=lambda r: -r.seconds["on CPU"])
        chosen = ranked[:top] + [r for r in ranked[top:] if r.comm.startswith("benchfsd")]
        for r in chosen:
            rows.append(
                {"host": host, "comm": r.comm, **r.seconds, "total_s": r.total, "cpus": data.cpus}
            )
    return pd.DataFrame(rows, columns=SCHED_COLUMNS)


SERVER_THREAD = re.compile(r"^(benchfsd|benchfs-s(\d+)-w\d+|benchfs-server-(\d+))$")
"""The names of a BenchFS server's threads: the daemon, its workers (`benchfs-s<id>-w<n>`), an
in-process server (`benchfs-server-<id>`)."""


def server_id(folded: perf.Folded, manifest: Mapping[str, Any] | None) -> int | bool | None:
    """The server id of a profiled process: from the manifest's record of its pid, else from
    its worker threads' names; None for a server whose id is unknown; False for a process
    that is no server."""
    for p in (manifest or {}).get("processes", []):
        if p.get("role") == "benchfsd" and p.get("pid") == folded.pid:
            return p.get("server_id")
    found = [SERVER_THREAD.match(t) for t in folded.threads]
    if not any(found):
        return False
    ids = {m.group(2) or m.group(3) for m in found if m and (m.group(2) or m.group(3))}
    return int(ids.pop()) if len(ids) == 1 else None


def servers(
    traces: Mapping[str, HostTraceData], manifest: Mapping[str, Any] | None
) -> list[tuple[str, int | None, perf.Folded]]:
    """(host, server id or None, folded stacks) of every profiled BenchFS server process."""
    out = []
    for host, data in traces.items():
        for folded in data.profiles.values():
            sid = server_id(folded, manifest)
            if sid is not False:
                out.append((host, None if sid is None else int(sid), folded))
    return sorted(out, key=lambda x: (x[1] is None, x[1] or 0, x[0], x[2].pid))


def top_frames(
    traces: Mapping[str, HostTraceData], manifest: Mapping[str, Any] | None, n: int = 15
) -> pd.DataFrame:
    """Per BenchFS server process, the functions with the most samples on CPU themselves,
    with their share of the process's samples and the share of samples with the function
    anywhere in the stack."""
    rows = []
    for host, sid, folded in servers(traces, manifest):
        total = folded.samples
        for function, own, anywhere in folded.top_frames(n):
            rows.append(
                {
                    "host": host,
                    "server": sid,
                    "pid": folded.pid,
                    "function": function,
                    "self": own,
                    "self_share": own / total if total else math.nan,
                    "total_share": anywhere / total if total else math.nan,
                }
            )
    return pd.DataFrame(rows, columns=TOP_FRAMES_COLUMNS)


@dataclass(frozen=True)
class FlameGraph:
    """One process's CPU profile drawn as a flame graph (SVG text, inferno)."""

    name: str
    """A file name: `<host>-server-<id>.svg`, or `<host>-<comm>-<pid>.svg`."""
    title: str
    svg: str


def flame_graphs(
    traces: Mapping[str, HostTraceData], manifest: Mapping[str, Any] | None
) -> list[FlameGraph]:
    """A flame graph per BenchFS server profiled, in server order; each stack starts with the
    thread's name."""
    from benchfs import _core

    out = []
    for host, sid, folded in servers(traces, manifest):
        who = f"server {sid}" if sid is not None else f"benchfsd pid {folded.pid}"
        name = f"{host}-server-{sid}.svg" if sid is not None else f"{host}-{folded.pid}.svg"
        seconds = folded.samples / perf.HZ
        title = f"{who} on {host}: CPU"
        subtitle = (
            f"{folded.samples:,} samples at {perf.HZ} Hz (~{seconds:.1f} s on CPU); "
            "stacks unwound with DWARF"
        )
        svg = _core.flame_graph_svg("\n".join(folded.lines()), title, subtitle)
        out.append(FlameGraph(name, title, svg))
    return out

"""`benchfs-bench scale`: how connection, membership and the data path hold as nodes and ranks
grow.

Each point is one `benchfs-run launch` of the rw workload (write, cross-read, verify every
byte) on nodes that are apart (network namespaces on a bridge, as `benchfs-run nodes
--netns`): a server on every node and RANKS client ranks per node, every transfer two requests
to two servers (2 MiB transfers over 1 MiB chunks, the shape the original BenchFS collapsed
under). What a point reports comes from the run's own records: the ranks' timelines (process
start, MPI ready, `Client()` called, connected, first byte), the client telemetry (requests,
retries, timeouts, hellos sent again, connect time) and the servers' gauges (RSS, connections,
descriptors). Every process of every node shares this machine's cores: `procs_per_core` says
by how much, so that nobody reads a figure from a 2-core machine as a cluster's.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pandas as pd
from rich.console import Console

from benchfs.analysis.tables import STAGES, op_time_stages
from benchfs.bench.render import fmt, print_lines_and_targets, report_table
from benchfs.bench.telemetry_view import op_window
from benchfs.errors import BenchError, ParseError
from benchfs.nodes import Node, write_nodes
from benchfs.simnodes import apart_nodes
from benchfs.telemetry import Telemetry, load
from benchfs.units import MIB

TELEMETRY_INTERVAL_MS = 250
"""Snapshots 4 times a second, so that each second of a phase has its own throughput."""
STEADY_TARGET = 0.5
"""The worst 1 s window of a phase at least this fraction of its best (in runs of 30 s+)."""
ATTRIBUTED_TARGET = 0.8
"""The share of the p50 data call that named stages account for, at the largest point."""
READY_TARGET_S = 10.0
"""From the last rank's `Client()` call to every rank connected and its first transfer answered,
at 512 ranks (the issue's)."""


@dataclass(frozen=True)
class Point:
    nodes: int
    ranks_per_node: int
    file_size: int | None = None
    """Bytes per rank at this point (None: the settings'). Each rank holds its file's pattern
    and a read buffer in memory: 512 ranks of 16 MiB do not fit in 24 GiB."""

    @property
    def ranks(self) -> int:
        return self.nodes * self.ranks_per_node


@dataclass(frozen=True)
class ScaleSettings:
    points: tuple[Point, ...] = (
        *(Point(n, 8) for n in (2, 4, 8, 16, 32)),
        Point(32, 16, 4 * MIB),
    )
    file_size: int = 16 * MIB
    transfer_size: int = 2 * MIB
    chunk_size: int = 1 * MIB
    timeout_s: float = 900.0
    overrides: tuple[str, ...] = ()
    """`section.key=value` settings for every point's run (as `benchfs-run launch --set`)."""

    @classmethod
    def quick(cls, overrides: tuple[str, ...] = ()) -> ScaleSettings:
        return cls(points=(Point(8, 8),), file_size=2 * MIB, timeout_s=120.0, overrides=overrides)


def _nodes(apart: Any, count: int, scratch: Path) -> list[Node]:
    """The first `count` nodes apart, as a nodes file lists them."""
    nodes = []
    for i in range(1, count + 1):
        name = f"n{i}"
        directory = scratch / name
        directory.mkdir(parents=True, exist_ok=True)
        namespace = apart.nodes[name].namespace
        env = [f"{k}={v}" for k, v in apart.rank_env(name).items() if k != "BENCHFS_NETNS"]
        nodes.append(Node(name, namespace, str(directory), prefix=("env", *env), netns=namespace))
    return nodes


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def _ranks(run: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted((run / "workload").glob("rank-*.json"))]


def _timeline(ranks: list[dict[str, Any]]) -> dict[str, Any]:
    """Start-up and connection times from the ranks' records (Unix times on one host). A client
    connects to a server on its first request there (unless `cluster.connect_at_start`), so a
    rank is ready when its first transfer is answered. `ready_all_s` is BenchFS's part of the
    way there: every `Client()` returned after the last call (`connect_all_s`), then the write
    phase's start to every rank's first transfer answered (`first_byte_max_s`); between them,
    the pattern's generation and the MPI barrier are the workload's and MPI's (`barrier_s`:
    Open MPI's ranks poll in a barrier, which hundreds of ranks on 2 cores make long)."""
    starts = [r["timeline"]["process_start"] for r in ranks if r.get("timeline")]
    starts = [s for s in starts if s is not None]
    connects = [r["connect"] for r in ranks if r.get("connect")]
    # A rank that failed early has no write (None) and a shorter timeline.
    first: list[float] = [
        f for r in ranks if (f := (r.get("write") or {}).get("first_s")) is not None
    ]
    out: dict[str, Any] = {"connected_ranks": len(connects)}
    if connects:
        last_call = max(c["start"] for c in connects)
        out["startup_s"] = last_call - min(starts) if starts else None
        out["connect_all_s"] = max(c["end"] for c in connects) - last_call
        durations = [c["end"] - c["start"] for c in connects]
        out["connect_rank_p50_s"] = _median(durations)
        out["connect_rank_max_s"] = max(durations)
    if first:
        out["first_byte_p50_s"] = _median(first)
        out["first_byte_max_s"] = max(first)
    phases = [r["timeline"]["write"][0] for r in ranks if "write" in r.get("timeline", {})]
    if connects and phases:
        out["barrier_s"] = max(phases) - max(c["end"] for c in connects)
    if connects and len(first) == len(ranks):
        out["ready_all_s"] = out["connect_all_s"] + out["first_byte_max_s"]
    return out


def _telemetry(t: Telemetry) -> dict[str, Any]:
    """Client counters summed over ranks, server gauges per server."""
    out: dict[str, Any] = {}
    if t.has_clients:
        c = t.latest_counters("client")
        total = c.groupby("metric", observed=True)["value"].sum()
        for metric in ("requests", "retries", "timeouts", "errors", "busy", "hello_resends"):
            out[metric] = int(total.get(metric, 0))
        connect = c[c["metric"] == "connect_ns.max"]["value"]
        out["connect_ns_max"] = int(connect.max()) if len(connect) else None
    s = t.counters[t.counters["source"] == "server"]
    per_server: dict[str, list[float]] = {}
    for metric in ("connections", "descriptors", "rss_bytes"):
        rows = s[s["metric"] == metric]
        if not len(rows):
            continue
        by_snapshot = rows.groupby(["server", "t"], observed=True)["value"].sum()
        per_server[f"{metric}_max"] = by_snapshot.groupby(level=0).max().tolist()
        if metric == "rss_bytes":
            per_server["rss_bytes_min"] = by_snapshot.groupby(level=0).min().tolist()
    if per_server.get("connections_max"):
        out["connections_per_server"] = max(per_server["connections_max"])
        # Out of ranks x servers, were every rank to greet every server.
        out["connections_total"] = sum(per_server["connections_max"])
    if per_server.get("descriptors_max"):
        out["descriptors_per_server"] = max(per_server["descriptors_max"])
    if per_server.get("rss_bytes_max"):
        out["server_rss_mib"] = max(per_server["rss_bytes_max"]) / MIB
        grown = [
            (hi - lo) / conns
            for hi, lo, conns in zip(
                per_server["rss_bytes_max"],
                per_server["rss_bytes_min"],
                per_server.get("connections_max", []),
                strict=False,
            )
            if conns
        ]
        out["server_bytes_per_connection"] = _median(grown)
    return out


def run_point(
    root: Path, apart: Any, point: Point, settings: ScaleSettings, env: dict[str, str]
) -> dict[str, Any]:
    """One launch at `point`; its figures (or its failure) as a dict."""
    work = root / f"{point.nodes}x{point.ranks_per_node}"
    work.mkdir()
    nodes_file = work / "nodes.toml"
    write_nodes(nodes_file, _nodes(apart, point.nodes, work / "scratch"))
    argv = [
        sys.executable, "-m", "benchfs.cli.run", "launch",
        "--nodes-file", str(nodes_file),
        "--clients-per-node", str(point.ranks_per_node),
        "--file-size", str(point.file_size or settings.file_size),
        "--transfer-size", str(settings.transfer_size),
        "--set", f"layout.chunk_size={settings.chunk_size}",
        "--set", f"telemetry.interval_ms={TELEMETRY_INTERVAL_MS}",
        *(a for o in settings.overrides for a in ("--set", o)),
        "--timeout", str(settings.timeout_s),
        "--results-root", str(work / "results"),
        "--no-analysis", "--json",
    ]  # fmt: skip
    # Hundreds of ranks can exhaust memory: the kernel is to kill one of the run's processes (a
    # failed point, reported), not this one (which would leave the nodes behind, unreported).
    lower = ["sh", "-c", 'echo 500 > /proc/self/oom_score_adj && exec "$@"', "sh"]
    t0 = time.perf_counter()
    done = subprocess.run([*lower, *argv], capture_output=True, text=True, env=env, check=False)
    wall = time.perf_counter() - t0
    procs = point.nodes + point.ranks
    out: dict[str, Any] = {
        **asdict(point),
        "file_size": point.file_size or settings.file_size,
        "file_mib": (point.file_size or settings.file_size) / MIB,
        "ranks": point.ranks,
        "procs_per_core": procs / (os.cpu_count() or 1),
        "wall_s": wall,
        "exit_status": done.returncode,
    }
    runs = sorted((work / "results").glob("*/manifest.json"))
    if not runs:
        out["outcome"] = "failed"
        out["error"] = (done.stderr.strip().splitlines() or ["no results directory"])[-1]
        return out
    run = runs[-1].parent
    manifest = json.loads(runs[-1].read_text())
    out["outcome"] = manifest["outcome"]["status"]
    out["error"] = manifest["outcome"].get("message")
    timings = manifest.get("timings_s", {})
    out["membership_s"] = timings.get("start_servers", 0.0) + timings.get("wait_servers", 0.0)
    summary_path = run / "workload" / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    out["write_mib_s"] = summary.get("write_mib_s")
    out["read_mib_s"] = summary.get("read_mib_s")
    out["verified"] = bool(summary.get("verified"))
    out["failed_ranks"] = len({e.get("rank") for e in summary.get("errors", [])})
    ranks = _ranks(run)
    out.update(_timeline(ranks))
    try:
        tel = load(run / "telemetry")
    except (OSError, ParseError) as e:  # a point without telemetry still reports the rest
        out["telemetry_error"] = str(e)
        return out
    out.update(_telemetry(tel))
    out.update(_costs(tel, ranks))
    out.update(_steadiness(tel, ranks))
    out.update(_stages(tel))
    return out


def _stages(tel: Telemetry) -> dict[str, Any]:
    """The p50 of each data call split into named stages (`op_time_stages`), per phase."""
    out: dict[str, Any] = {}
    for row in op_time_stages(tel).to_dict("records"):
        out[f"{row['op']}_stages_ms"] = {
            k: row[k] for k in ("call_p50_ms", *STAGES, "unattributed_ms")
        }
        out[f"{row['op']}_attributed_share"] = row["attributed_share"]
        out[f"{row['op']}_mean_shares"] = {
            k: row[f"mean_{k.replace(' ', '_')}_share"] for k in STAGES
        }
    return out


def _server_spans(
    tel: Telemetry, metric: str, start: float, end: float
) -> list[tuple[float, float]]:
    """Per server: (CPU seconds, growth of `metric` summed over workers) between its last
    snapshot at or before `start` and its first at or after `end` (servers without both are
    left out)."""
    s = tel.counters[tel.counters["source"] == "server"]
    s = s[s["metric"].isin(["cpu_ns", metric])]
    spans = []
    for _, rows in s.groupby("server", observed=True):
        per_t = rows.pivot_table(index="t", columns="metric", values="value", aggfunc="sum")
        ns = pd.DatetimeIndex(per_t.index).asi8
        before, after = per_t[ns <= int(start * 1e9)], per_t[ns >= int(end * 1e9)]
        if len(before) and len(after) and "cpu_ns" in per_t:
            a, b = before.iloc[-1], after.iloc[0]
            spans.append(((b["cpu_ns"] - a["cpu_ns"]) / 1e9, b.get(metric, 0) - a.get(metric, 0)))
    return spans


def _costs(tel: Telemetry, ranks: list[dict[str, Any]]) -> dict[str, Any]:
    """What connecting cost: per client (CPU, descriptors) from the ranks' records, per server
    connection (CPU across the connection storm, from the servers' gauges); and what a request
    cost a server (CPU across the write and read phases over the requests served)."""
    connects = [r["connect"] for r in ranks if r.get("connect")]
    out: dict[str, Any] = {
        "client_connect_cpu_s": _median([c["cpu_s"] for c in connects if "cpu_s" in c]),
        "client_descriptors": _median([c["descriptors"] for c in connects if "descriptors" in c]),
    }
    if connects:
        storm = _server_spans(
            tel, "connections", min(c["start"] for c in connects), max(c["end"] for c in connects)
        )
        out["server_cpu_ms_per_connection"] = _median(
            [cpu * 1e3 / opened for cpu, opened in storm if opened > 0]
        )
    spans = [
        r["timeline"][p] for r in ranks for p in ("write", "read") if p in (r.get("timeline") or {})
    ]
    if spans:
        work = _server_spans(tel, "ops", min(a for a, _ in spans), max(b for _, b in spans))
        out["server_cpu_us_per_request"] = _median(
            [cpu * 1e6 / ops for cpu, ops in work if ops > 0]
        )
    return out


def _steadiness(tel: Telemetry, ranks: list[dict[str, Any]]) -> dict[str, Any]:
    """Per phase: its length, the seconds in which every rank was in it (from the last rank's
    start to the first rank's end: the load is whole, no rank has finished), and the worst of
    those seconds' server throughput over the best (None when there is no such second). The
    server throughput of each second is listed (`None`: a second no snapshot covered)."""
    out: dict[str, Any] = {}
    for phase in ("write", "read"):
        spans = [r["timeline"][phase] for r in ranks if phase in (r.get("timeline") or {})]
        if not spans:
            continue
        out[f"{phase}_s"] = max(s[1] for s in spans) - min(s[0] for s in spans)
        start, end = max(s[0] for s in spans), min(s[1] for s in spans)
        out[f"{phase}_all_ranks_s"] = max(end - start, 0.0)
        measured = [_second(tel, start + k, phase) for k in range(max(int(end - start), 0))]
        out[f"{phase}_windows_mib_s"] = measured
        windows = [w for w in measured if w is not None]
        best = max(windows, default=0.0)
        out[f"{phase}_steady_share"] = min(windows) / best if best > 0 else None
    return out


def _second(tel: Telemetry, start: float, op: str) -> float | None:
    """The servers' MiB/s for `op` in the second from `start`: 0 when none completed, None when
    a server wrote no snapshot in it (a starved server: the second is not measured)."""
    try:
        return op_window(tel, start, start + 1.0, op, enclose=False).mib_s
    except BenchError as e:
        if f"no {op} operations" in str(e):
            return 0.0
        if "no snapshots around" in str(e):
            return None
        raise


def run_scale(
    root: Path,
    settings: ScaleSettings,
    progress: Callable[[str], None] = lambda _: None,
) -> dict[str, Any]:
    env = dict(os.environ)
    env.pop("BENCHFS_CONFIG", None)
    points = []
    with apart_nodes(max(p.nodes for p in settings.points)) as apart:
        for point in settings.points:
            progress(f"{point.nodes} nodes x {point.ranks_per_node} ranks ({point.ranks} ranks)")
            result = run_point(root, apart, point, settings, env)
            points.append(result)
            if result["outcome"] != "ok":
                progress(f"  {result['outcome']}: {result.get('error')}")
    largest = max(settings.points, key=lambda p: p.ranks)
    at_largest = next(p for p in points if p["ranks"] == largest.ranks)
    ready = at_largest.get("ready_all_s")
    steady = [
        p[f"{phase}_steady_share"]
        for p in points
        for phase in ("write", "read")
        if (p.get(f"{phase}_all_ranks_s") or 0) >= 30 and p.get(f"{phase}_steady_share") is not None
    ]
    return {
        "settings": {
            "file_size": settings.file_size,
            "transfer_size": settings.transfer_size,
            "chunk_size": settings.chunk_size,
        },
        "cores": os.cpu_count(),
        "points": points,
        "targets": [
            {
                "target": "every point completes and verifies, 0 failed ranks, 0 timeouts",
                "met": all(
                    p["outcome"] == "ok" and p.get("verified") and not p.get("timeouts")
                    for p in points
                ),
            },
            {
                "target": "retries under 1% of requests",
                "met": all(
                    p.get("requests") and (p.get("retries") or 0) < 0.01 * p["requests"]
                    for p in points
                ),
            },
            {
                "target": f"30 s+ of all ranks in a phase: worst 1 s >= {STEADY_TARGET:g}x best",
                "met": None if not steady else all(v >= STEADY_TARGET for v in steady),
            },
            {
                "target": f"every rank connected, first transfer answered <= {READY_TARGET_S:g} s "
                f"after the last Client() call ({largest.ranks} ranks)",
                "met": None if ready is None else ready <= READY_TARGET_S,
            },
            {
                "target": f"p50 write and read call >= {ATTRIBUTED_TARGET:.0%} in named stages "
                f"({largest.ranks} ranks)",
                "met": None
                if any(at_largest.get(f"{op}_attributed_share") is None for op in ("write", "read"))
                else all(
                    at_largest[f"{op}_attributed_share"] >= ATTRIBUTED_TARGET
                    for op in ("write", "read")
                ),
            },
        ],
    }


def plot(report: dict[str, Any], path: Path) -> None:
    """Connection times and bandwidth against ranks, one line per ranks-per-node."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for rpn in sorted({p["ranks_per_node"] for p in report["points"]}):
        pts = sorted(
            (p for p in report["points"] if p["ranks_per_node"] == rpn), key=lambda p: p["ranks"]
        )
        x = [p["ranks"] for p in pts]
        for key, label in (("ready_all_s", "all ready"), ("startup_s", "start-up")):
            left.plot(x, [p.get(key) for p in pts], marker="o", label=f"{label}, {rpn}/node")
        for key, label in (("write_mib_s", "write"), ("read_mib_s", "read")):
            right.plot(x, [p.get(key) for p in pts], marker="o", label=f"{label}, {rpn}/node")
    left.set(xlabel="ranks", ylabel="seconds", yscale="log", title="start-up and connection")
    right.set(xlabel="ranks", ylabel="MiB/s", title="bandwidth (every byte verified)")
    ranks = sorted({p["ranks"] for p in report["points"]})
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.set_xticks(ranks, [str(r) for r in ranks])
        ax.minorticks_off()
        ax.legend(fontsize="small")
        ax.grid(alpha=0.3)
    fig.suptitle(f"benchfs-bench scale ({report['cores']} cores shared by every node)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


COLUMNS = (
    ("nodes", "nodes", 0),
    ("ranks", "ranks", 0),
    ("procs_per_core", "procs/core", 0),
    ("file_mib", "MiB/rank", 0),
    ("outcome", "outcome", None),
    ("membership_s", "members s", 1),
    ("startup_s", "start-up s", 1),
    ("connect_all_s", "Client() s", 2),
    ("barrier_s", "barrier s", 1),
    ("ready_all_s", "ready s", 2),
    ("first_byte_p50_s", "1st byte s", 3),
    ("write_mib_s", "write MiB/s", 0),
    ("read_mib_s", "read MiB/s", 0),
    ("write_steady_share", "worst/best 1 s", 2),
    ("write_attributed_share", "write p50 in stages", 2),
    ("read_attributed_share", "read p50 in stages", 2),
    ("retries", "retries", 0),
    ("timeouts", "timeouts", 0),
    ("hello_resends", "hellos again", 0),
    ("server_rss_mib", "server RSS MiB", 0),
    ("connections_per_server", "conns/server", 0),
    ("connections_total", "conns", 0),
    ("descriptors_per_server", "fds/server", 0),
    ("server_bytes_per_connection", "bytes/conn", 0),
    ("server_cpu_ms_per_connection", "server CPU ms/conn", 2),
    ("server_cpu_us_per_request", "server CPU µs/req", 0),
    ("client_connect_cpu_s", "client CPU s", 3),
)


def render(console: Console, report: dict[str, Any]) -> None:
    s = report["settings"]
    table = report_table(
        f"benchfs-bench scale: rw in "
        f"{s['transfer_size'] // MIB} MiB transfers over {s['chunk_size'] // MIB} MiB chunks, "
        f"a server on every node, {report['cores']} cores shared by all",
        [label for _, label, _ in COLUMNS[1:]],
    )
    for p in report["points"]:
        cells = [
            str(p.get(key)) if digits is None else fmt(p.get(key), digits)
            for key, _, digits in COLUMNS
        ]
        table.add_row(*cells)
    console.print(table)
    failed = [p for p in report["points"] if p["outcome"] != "ok"]
    print_lines_and_targets(
        console,
        [(f"{p['nodes']}x{p['ranks_per_node']}", str(p.get("error"))) for p in failed],
        report["targets"],
    )


def check_root() -> None:
    if os.geteuid() != 0:
        raise BenchError("EPERM", "benchfs-bench scale needs root (nodes in network namespaces)")

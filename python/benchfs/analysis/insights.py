"""Coded insights, like Drishti's: an id, a trigger with thresholds, the evidence, a recommendation.

Each check reads the standard tables of a run (`Tables`) and the `[insights]` thresholds, and
returns an `Insight` that either fired (with its evidence), stayed silent, or could not be
evaluated (what the run lacked is then the `reason`). docs/analysis.md lists them all.
"""

from __future__ import annotations

import math
import shlex
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from benchfs.analysis.limits import Inputs, Limit, shared_limits
from benchfs.analysis.run import NO_CLIENT_TELEMETRY, NO_IOSTAT, LoadedRun
from benchfs.analysis.thresholds import Thresholds
from benchfs.slownodes import slow_node_names

__all__ = ["CATALOG", "Insight", "Tables", "evaluate"]


@dataclass
class Tables:
    """The standard tables of one run (what `benchfs.analysis.compute_tables` returns)."""

    io_depth: pd.DataFrame
    op_time: pd.DataFrame
    device_time: pd.DataFrame
    per_node: pd.DataFrame
    timeseries: pd.DataFrame
    bandwidth: pd.DataFrame
    slow_nodes: pd.DataFrame
    placement: pd.DataFrame
    placement_summary: dict[str, Any]
    rpc_by_target: pd.DataFrame
    rpc_timeseries: pd.DataFrame
    iostat_devices: pd.DataFrame
    op_stages: pd.DataFrame
    block_latency: pd.DataFrame
    """Kernel block I/O latency per host, device and direction (`analysis.kernel`)."""
    block_heatmap: pd.DataFrame
    sched_time: pd.DataFrame
    top_frames: pd.DataFrame

    def frames(self) -> dict[str, pd.DataFrame]:
        """Every table by its CSV name."""
        return {
            "io_depth": self.io_depth,
            "op_time_distribution": self.op_time,
            "device_time_distribution": self.device_time,
            "per_node": self.per_node,
            "timeseries": self.timeseries,
            "bandwidth": self.bandwidth,
            "slow_nodes": self.slow_nodes,
            "placement": self.placement,
            "rpc_by_target": self.rpc_by_target,
            "rpc_timeseries": self.rpc_timeseries,
            "iostat_devices": self.iostat_devices,
            "op_time_stages": self.op_stages,
            "block_latency": self.block_latency,
            "block_heatmap": self.block_heatmap,
            "sched_time": self.sched_time,
            "top_frames": self.top_frames,
        }


@dataclass
class Insight:
    """One coded insight's verdict on one run."""

    id: str
    title: str
    severity: str
    fired: bool
    evaluated: bool
    trigger: str
    evidence: list[str] = field(default_factory=list)
    recommendation: str = ""
    reason: str = ""
    """Why it was not evaluated (evaluated is False)."""
    data: dict[str, Any] = field(default_factory=dict)
    drishti: list[str] = field(default_factory=list)
    """The Drishti codes an application-side insight answers to (`appinsights`)."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


Check = Callable[[LoadedRun, Tables, Thresholds], Insight]


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _ms(x: float) -> str:
    if x is None or not math.isfinite(x):
        return "-"
    return f"{x:.3g} ms" if x < 1000 else f"{x / 1000:.3g} s"


def _counter(run: LoadedRun, name: str, op: str | None = None, by: str | None = None) -> Any:
    tel = run.telemetry
    if tel is None:
        return 0 if by is None else pd.Series(dtype="int64")
    c = tel.latest_counters()
    c = c[c["metric"] == name]
    if op is not None:
        c = c[c["op"] == op]
    if by is None:
        return int(c["value"].sum())
    return c.groupby(by, observed=True)["value"].sum()


def _mean(run: LoadedRun, metric: str) -> float:
    """Exact mean (ns) of a per-op histogram over reads and writes."""
    total = sum(_counter(run, f"{metric}.sum", op) for op in ("read", "write"))
    n = sum(_counter(run, f"{metric}.count", op) for op in ("read", "write"))
    return total / n if n else math.nan


def _new(ident: str, title: str, severity: str, trigger: str, recommendation: str) -> Insight:
    return Insight(ident, title, severity, False, True, trigger, recommendation=recommendation)


def _skip(insight: Insight, reason: str) -> Insight:
    insight.evaluated = False
    insight.reason = reason
    return insight


def depth_starvation(run: LoadedRun, t: Tables, th: Thresholds) -> Insight:
    i = _new(
        "BFS-001",
        "Device depth starvation",
        "high",
        f"share of data submissions at device depth 1 >= {_pct(th.depth1_share)} while requests "
        f"waited >= {th.starvation_queue_ratio:g} x the mean device time to be submitted "
        f"(>= {th.min_ops} submissions)",
        "The device was fed one request at a time although requests were waiting: raise "
        "server.max_in_service and storage.buffer_count so more of them reach the device at "
        "once, and check the clients' windows (client.max_inflight, "
        "client.max_inflight_per_server). On a production cluster, 98.8% depth-1 submits "
        "with 700+ requests pending held reads to ~200 MiB/s per node against 5,500 MiB/s "
        "for fio at depth 32.",
    )
    d = t.io_depth
    if d.empty:
        return _skip(i, "no inflight_at_submit telemetry")
    row = d[d["node"] == "all"].iloc[0]
    if row["submits"] < th.min_ops:
        return _skip(i, f"only {int(row['submits'])} submissions (< min_ops {th.min_ops})")
    queue, device = _mean(run, "queue_wait_ns"), _mean(run, "device_ns")
    i.data = {
        "share_depth1": float(row["share_depth1"]),
        "mean_depth": float(row["mean"]),
        "queue_wait_ms": queue / 1e6,
        "device_ms": device / 1e6,
    }
    waited = (
        math.isfinite(queue)
        and math.isfinite(device)
        and (queue >= th.starvation_queue_ratio * device)
    )
    if row["share_depth1"] >= th.depth1_share and waited:
        i.fired = True
        nodes = d[(d["node"] != "all") & (d["share_depth1"] >= th.depth1_share)]
        i.evidence = [
            f"{_pct(row['share_depth1'])} of {int(row['submits']):,} submissions found the device "
            f"at depth 1 (mean depth {row['mean']:.2f}, max {int(row['max'])})",
            f"requests waited {_ms(queue / 1e6)} on average in the server's admission queue "
            f"and for buffers before reaching the storage engine, the device took "
            f"{_ms(device / 1e6)}",
            f"nodes at or above the threshold: {', '.join(map(str, nodes['node'])) or '-'}",
        ]
    return i


def batching(run: LoadedRun, t: Tables, th: Thresholds) -> Insight:
    i = _new(
        "BFS-002",
        "Submit batching inefficiency",
        "medium",
        f"mean SQEs per io_uring_enter <= {th.batch_mean_max:g} while the mean device depth "
        f"was >= {th.batch_depth_min:g}",
        "One io_uring_enter per SQE under load costs a system call per I/O: let the event loop "
        "gather a turn's SQEs (more requests in service per turn). Never gather them on a "
        "timer: a 10 ms timer once raised depth 4.6x and made the median I/O 31x slower "
        "(studies/iodepth).",
    )
    d = t.io_depth
    if d.empty:
        return _skip(i, "no submit_batch telemetry")
    row = d[d["node"] == "all"].iloc[0]
    if row["submits"] < th.min_ops:
        return _skip(i, f"only {int(row['submits'])} submissions (< min_ops {th.min_ops})")
    i.data = {"mean_batch": float(row["mean_batch"]), "mean_depth": float(row["mean"])}
    if row["mean_batch"] <= th.batch_mean_max and row["mean"] >= th.batch_depth_min:
        i.fired = True
        i.evidence = [
            f"{row['mean_batch']:.2f} SQEs per io_uring_enter on average "
            f"({_pct(row['share_batch1'])} of the enters carried one SQE) while the device "
            f"held {row['mean']:.1f} operations on average"
        ]
    return i


def slow_node(run: LoadedRun, t: Tables, th: Thresholds) -> Insight:
    i = _new(
        "BFS-003",
        "Slow node",
        "high",
        "the judgment of the run (the slow_nodes table, under the [diagnose] thresholds, "
        "the same as benchfs-diagnose judge): a node's mean read or write time stands out "
        "from its peers (robust z and at least min_worse above them), and it was slower in at "
        "least persist_share of its intervals since its onset, or overwhelmingly slower",
        "Look at the named node's devices during the run (iostat r_await per member device, "
        "nvme smart-log, /proc/mdstat); benchfs-diagnose judge on this run names the device "
        "and the kind and writes the exclusion list benchfs-run consumes. On a production "
        "cluster, 3 nodes held over 90% of the delay, different nodes in different runs: judge "
        "every run, not once.",
    )
    j = t.slow_nodes
    judged = j[~j["how"].fillna("").str.startswith("not judged")] if not j.empty else j
    if judged.empty or judged["node"].nunique() < 2:
        return _skip(i, "fewer than 2 nodes with enough data operations (diagnose.min_ops)")
    slow = j[j["slow"]]
    stood_out = j[j["outlier"] & ~j["slow"]]
    i.data = {"nodes": slow_node_names(j)}
    if slow.empty:
        for row in stood_out.itertuples():
            i.evidence.append(f"{row.node} stood out on {row.op}s: {row.evidence}; {row.how}")
        return i
    i.fired = True
    for op, rows in slow.groupby("op", sort=False):
        names = ", ".join(rows["node"])
        i.evidence.append(
            f"{names}: {_pct(float(rows['delay_share'].sum()))} of the run's excess {op} time "
            "(ops x mean beyond the nodes' median mean)"
        )
    for row in slow.itertuples():
        i.evidence.append(
            f"{row.node} ({row.op}, {row.ops:,} ops): {row.evidence}; {row.how}; slow: "
            f"{row.grounds}"
        )
    return i


def device_asymmetry(run: LoadedRun, t: Tables, th: Thresholds) -> Insight:
    i = _new(
        "BFS-004",
        "Member-device asymmetry",
        "high",
        f"on one node, a member device's mean await (iostat, read or write) >= "
        f"{th.device_await_ratio:g} x its fastest sibling's and >= {th.device_await_min_ms:g} ms",
        "One member of the node's array is much slower than its siblings, and the array (md0) "
        "waits for its slowest member: check that device (nvme smart-log, firmware, "
        "temperature, PCIe link) and exclude the node until it is fixed (benchfs-diagnose). "
        "One production node had nvme1n1 at 25-427 ms beside nvme0n1 at 0.7 ms under the same md0.",
    )
    d = t.iostat_devices
    if run.iostat is None:
        return _skip(i, NO_IOSTAT)
    d = d[d["member"]] if not d.empty else d
    found = []
    for node, g in d.groupby("node") if not d.empty else []:
        for kind in ("r_await_mean", "w_await_mean"):
            v = g[["device", kind]].dropna()
            if len(v) < 2:
                continue
            slow, fast = v.loc[v[kind].idxmax()], v.loc[v[kind].idxmin()]
            ratio = slow[kind] / fast[kind] if fast[kind] > 0 else math.inf
            if ratio >= th.device_await_ratio and slow[kind] >= th.device_await_min_ms:
                found.append((node, kind.split("_")[0], slow, fast, ratio))
    if found:
        i.fired = True
        i.data = {"devices": [f"{n}:{s['device']}" for n, _, s, _, _ in found]}
        for node, kind, slow, fast, ratio in found:
            k = f"{kind}_await_mean"
            i.evidence.append(
                f"{node}: {slow['device']} {kind}_await {slow[k]:.2f} ms vs {fast['device']} "
                f"{fast[k]:.2f} ms ({ratio:.0f}x)"
            )
    return i


def placement_imbalance(run: LoadedRun, t: Tables, th: Thresholds) -> Insight:
    i = _new(
        "BFS-005",
        "Placement imbalance",
        "high",
        f"bytes written to the busiest server >= {th.placement_max_mean:g} x the mean over the "
        "run's servers, or a member server received nothing (also checked on client requests "
        "per target)",
        "Check that every client used the whole membership (manifest membership; "
        "cluster.expected_servers) and how files map to servers: one production system sent "
        "all 736 clients' first chunks to 2 of 16 servers (a linear path hash with a modulo), and "
        "clients that started with 8 of 16 servers loaded only those.",
    )
    s = t.placement_summary
    if s.get("servers", 0) < 2 or t.placement["write_bytes"].sum() == 0:
        return _skip(i, "fewer than 2 servers, or nothing was written")
    i.data = {k: v for k, v in s.items() if isinstance(v, int | float | list)}
    ratio = s["write_bytes_max_over_mean"]
    req = s.get("client_requests_max_over_mean", math.nan)
    unused = s["unused_servers"]
    if (
        ratio >= th.placement_max_mean
        or unused
        or (math.isfinite(req) and req >= th.placement_max_mean)
    ):
        i.fired = True
        top = t.placement.sort_values("write_bytes", ascending=False).iloc[0]
        i.evidence.append(
            f"bytes written: max/mean {ratio:.2f}, CV {s['write_bytes_cv']:.2f} over "
            f"{s['servers']} servers; the busiest, server {int(top['server'])} "
            f"({top['node']}), holds {_pct(top['bytes_share'])}"
        )
        if unused:
            i.evidence.append(f"servers that received no writes: {unused}")
        if math.isfinite(req):
            i.evidence.append(f"client requests per target: max/mean {req:.2f}")
    return i


def retry_storm(run: LoadedRun, t: Tables, th: Thresholds) -> Insight:
    i = _new(
        "BFS-006",
        "Retry storm",
        "high",
        f"client retries per request >= {_pct(th.retry_rate)}, or any request timed out",
        "Retries add load to servers that are already late: find why requests time out "
        "(a slow node, BFS-003; buffer-pool waits, BFS-007), keep overload as backpressure "
        "(server.max_queued refuses with EAGAIN instead of letting requests age into "
        "timeouts) and lower client.max_inflight if the servers cannot keep up. One production "
        "run had 34.55% retries with 30 s timeouts and 48 MiB/s.",
    )
    if not run.has_clients:
        return _skip(i, NO_CLIENT_TELEMETRY)
    r = t.rpc_by_target
    requests, retries, timeouts = (int(r[c].sum()) for c in ("requests", "retries", "timeouts"))
    rate = retries / requests if requests else 0.0
    i.data = {"requests": requests, "retries": retries, "timeouts": timeouts, "retry_rate": rate}
    if requests and (rate >= th.retry_rate or timeouts > 0):
        i.fired = True
        worst = r.sort_values("retries", ascending=False).head(3)
        i.evidence = [
            f"{retries:,} retries and {timeouts:,} timeouts over {requests:,} requests "
            f"({_pct(rate)})",
            "most retried targets: "
            + ", ".join(f"server {int(w.target)} ({int(w.retries)})" for w in worst.itertuples()),
        ]
        busy = _counter(run, "rejected_busy")
        if busy:
            i.evidence.append(f"servers refused {busy:,} requests as busy (EAGAIN)")
    return i


def pool_exhaustion(run: LoadedRun, t: Tables, th: Thresholds) -> Insight:
    i = _new(
        "BFS-007",
        "Buffer-pool exhaustion",
        "medium",
        f"on a node, requests that waited for a free buffer >= {_pct(th.pool_wait_share)} of "
        f"data operations (>= {th.min_ops} ops)",
        "Requests queued for I/O buffers: raise storage.buffer_count (memory per worker = "
        "buffer_count x layout.chunk_size) or lower the clients' windows. Bounded waiting is "
        "backpressure working as designed; in one production run an exhausted pool turned "
        "into 30 s timeouts and retry cascades.",
    )
    ops = _counter(run, "ops", "read", by="node").add(
        _counter(run, "ops", "write", by="node"), fill_value=0
    )
    if run.telemetry is None or ops.empty or ops.max() < th.min_ops:
        most = int(ops.max()) if not ops.empty else 0
        return _skip(i, f"no node with >= min_ops {th.min_ops} data operations (most: {most})")
    waits = _counter(run, "pool_waits", by="node").reindex(ops.index, fill_value=0)
    share = (waits / ops)[ops >= th.min_ops]
    hit = share[share >= th.pool_wait_share]
    i.data = {"nodes": [str(n) for n in hit.index], "pool_waits": int(waits.sum())}
    if not hit.empty:
        i.fired = True
        c = run.telemetry.counters
        for node, value in hit.items():
            free = c[(c["metric"] == "buffers_free") & (c["node"] == node)]
            empty = int((free["value"] == 0).sum())
            i.evidence.append(
                f"{node}: {int(waits[node]):,} buffer waits for {int(ops[node]):,} data "
                f"operations ({_pct(value)}); {empty} of {len(free)} snapshots found no free "
                "buffer"
            )
        queue = _mean(run, "queue_wait_ns")
        i.evidence.append(f"requests waited {_ms(queue / 1e6)} on average before submission")
    return i


def read_write_asymmetry(run: LoadedRun, t: Tables, th: Thresholds) -> Insight:
    i = _new(
        "BFS-008",
        "Read/write asymmetry",
        "medium",
        f"a node's mean read time >= {th.read_write_ratio:g} x its mean write time, or its "
        f"read/write ratio >= {th.read_write_ratio:g} x the other nodes' median ratio, or the "
        f"workload wrote >= {th.read_write_ratio:g} x faster than it read",
        "Reads and writes take different paths: compare the node's device read latency "
        "(iostat r_await per member device) with its peers, and the read policy "
        "(storage.direct_read, the handle cache). Slow production nodes read 25-83x slower than "
        "they wrote while their writes were normal; the cause was the node, not the software.",
    )
    p = t.per_node
    half = max(1, th.min_ops // 2)
    ok = p[(p["read_ops"] >= half) & (p["write_ops"] >= half)] if not p.empty else p
    w = ((run.manifest or {}).get("workload") or {}) if run.manifest else {}
    wbw, rbw = w.get("write_mib_s"), w.get("read_mib_s")
    if ok.empty and not (wbw and rbw):
        return _skip(i, "no node with enough reads and writes, and no workload bandwidths")
    lim = th.read_write_ratio
    found = []
    for row in ok.itertuples():
        others = ok.loc[ok["node"] != row.node, "read_write_ratio"].median()
        relative = row.read_write_ratio / others if others and others > 0 else math.nan
        if row.read_write_ratio >= lim or (math.isfinite(relative) and relative >= lim):
            found.append((row, relative))
    bw_ratio = wbw / rbw if wbw and rbw else math.nan
    i.data = {"nodes": [str(r.node) for r, _ in found], "write_over_read_bw": bw_ratio}
    shared = [x for x in _limits(run, t) if x.binding and x.kind != "the network"]
    if shared and 2 * len(found) >= len(ok) > 1:
        # Most nodes alike, sharing a resource that was the limit: per-node advice cannot
        # apply (BFS-012 names what they share).
        i.data["shared"] = [x.kind for x in shared]
        i.evidence.append(
            f"{len(found)} of {len(ok)} nodes read slower than they wrote alike; they share "
            f"{', '.join(x.kind for x in shared)}: no per-node cause (BFS-012)"
        )
        return i
    for row, relative in found:
        i.fired = True
        versus = f", {relative:.1f}x the other nodes' ratio" if math.isfinite(relative) else ""
        i.evidence.append(
            f"{row.node}: read {_ms(row.read_mean_ms)} vs write {_ms(row.write_mean_ms)} per op "
            f"({row.read_write_ratio:.2f}x{versus})"
        )
    if math.isfinite(bw_ratio) and bw_ratio >= lim:
        i.fired = True
        i.evidence.append(f"workload: write {wbw:.1f} MiB/s vs read {rbw:.1f} MiB/s")
    return i


def small_write_amplification(run: LoadedRun, t: Tables, th: Thresholds) -> Insight:
    i = _new(
        "BFS-009",
        "Small-write amplification (fsync after small writes)",
        "medium",
        f"on a node, fsyncs per write >= {th.fsync_per_write:g} with writes of <= "
        f"{th.small_write_bytes:,} bytes on average (>= {th.min_ops} writes)",
        "Every fsync makes the device write whole blocks and journal commits for a few bytes "
        "(128-byte writes each followed by fsync become 4 KiB device writes plus journal traffic). "
        "Write in larger transfers and fsync once when the data must be durable: a BenchFS "
        "fsync covers every chunk written since the last one.",
    )
    writes = _counter(run, "ops", "write", by="node")
    if writes.empty or writes.max() < th.min_ops:
        most = int(writes.max()) if not writes.empty else 0
        return _skip(i, f"no node with >= min_ops {th.min_ops} writes (most: {most})")
    fsyncs = _counter(run, "ops", "fsync", by="node").reindex(writes.index, fill_value=0)
    nbytes = _counter(run, "bytes", "write", by="node").reindex(writes.index, fill_value=0)
    frame = pd.DataFrame({"writes": writes, "fsyncs": fsyncs, "bytes": nbytes})
    frame = frame[frame["writes"] >= th.min_ops]
    frame["per_write"] = frame["fsyncs"] / frame["writes"]
    frame["size"] = frame["bytes"] / frame["writes"]
    hit = frame[
        (frame["per_write"] >= th.fsync_per_write) & (frame["size"] <= th.small_write_bytes)
    ]
    i.data = {
        "nodes": [str(n) for n in hit.index],
        "fsync_per_write": float(frame["fsyncs"].sum() / frame["writes"].sum()),
    }
    if not hit.empty:
        i.fired = True
        for node, row in hit.iterrows():
            i.evidence.append(
                f"{node}: {int(row['fsyncs']):,} fsyncs for {int(row['writes']):,} writes "
                f"({row['per_write']:.2f} per write) of {row['size']:,.0f} bytes on average"
            )
        d = t.iostat_devices
        if not d.empty:
            members = d[d["member"] & d["node"].isin(list(map(str, hit.index)))]
            written_kb = (members["wkB_s"] * members["samples"]).sum()
            app_kb = float(hit["bytes"].sum()) / 1024
            if app_kb > 0 and written_kb > 0:
                i.evidence.append(
                    f"their devices wrote {written_kb / app_kb:.1f}x the bytes the servers were "
                    "given (iostat wkB/s over the run)"
                )
    return i


def _metadata_workload(run: LoadedRun) -> bool:
    """Whether the run's workload was mdtest: the built-in one, or a command running mdtest."""
    w = ((run.manifest or {}).get("workload") or {}) if run.manifest else {}
    if w.get("workload") == "mdtest":
        return True
    argv = shlex.split(w.get("command") or "") if w.get("workload") == "command" else []
    return bool(argv) and Path(argv[0]).name == "mdtest"


def handle_thrash(run: LoadedRun, t: Tables, th: Thresholds) -> Insight:
    i = _new(
        "BFS-010",
        "Handle-cache thrash",
        "low",
        f"on a node, handle-cache misses >= {_pct(th.handle_miss_share)} of chunk-file lookups "
        f"(>= {th.min_ops} lookups)",
        "Nearly every operation opened its chunk file: raise storage.handle_cache, or use "
        'storage.layout = "packed" (few large files). With millions of chunk files the cache '
        "misses on nearly every lookup.",
    )
    if _metadata_workload(run):
        return _skip(
            i,
            "a metadata workload (mdtest) opens each file's one chunk about once per phase: "
            "its misses are first opens, which no cache size avoids",
        )
    hits = _counter(run, "handle_hits", by="node")
    misses = _counter(run, "handle_misses", by="node").reindex(hits.index, fill_value=0)
    lookups = hits + misses
    if lookups.empty or lookups.max() < th.min_ops:
        most = int(lookups.max()) if not lookups.empty else 0
        return _skip(i, f"no node with >= min_ops {th.min_ops} handle lookups (most: {most})")
    share = (misses / lookups)[lookups >= th.min_ops]
    hit = share[share >= th.handle_miss_share]
    i.data = {
        "nodes": [str(n) for n in hit.index],
        "miss_share": float(misses.sum() / lookups.sum()),
    }
    if not hit.empty:
        i.fired = True
        for node, value in hit.items():
            i.evidence.append(
                f"{node}: {int(misses[node]):,} misses in {int(lookups[node]):,} lookups "
                f"({_pct(value)})"
            )
    return i


def _kernel_missing(run: LoadedRun) -> str:
    """Why the run has no kernel trace: the tracers' own line, or that none was taken."""
    from benchfs.analysis.kernel import NO_KERNEL

    return next((n for n in run.notes if "unavailable" in n), NO_KERNEL)


def device_latency_mode(run: LoadedRun, t: Tables, th: Thresholds) -> Insight:
    i = _new(
        "BFS-011",
        "A device's latency has a slow mode its peers lack",
        "high",
        "the kernel's block latency histogram of a device has a second mode (diagnose.mode_gap "
        "times slower than its main one) holding diagnose.mode_min_share more of its I/Os than "
        "its peers hold there",
        "A minority of the device's I/Os are slow while the rest are fast: averages (iostat's "
        "r_await, fio's bandwidth) hide it, and every parallel step waits for its slowest I/O. "
        "Check the device's health (smartctl, nvme error-log), its firmware and its slot; "
        "exclude the node (benchfs-diagnose screen names it too) or replace the device.",
    )
    b = t.block_latency
    if not run.kernel:
        return _skip(i, _kernel_missing(run))
    if b.empty:
        return _skip(i, "the kernel trace holds no block I/O")
    odd = b[b["odd"]]
    i.data = {"devices": [f"{r.host}:{r.device}" for r in odd.itertuples()]}
    for r in odd.itertuples():
        i.fired = True
        i.evidence.append(
            f"{r.host}:{r.device} {r.op}s: {r.mode_share:.1%} of {int(r.ios):,} I/Os at "
            f"{r.mode_lo_us / 1000:g}-{(r.mode_hi_us + 1) / 1000:g} ms, its peers "
            f"{r.peer_share:.1%} there; mean {r.mean_us / 1000:.3g} ms, median "
            f"{r.p50_us / 1000:.3g} ms"
        )
    return i


def _limits(run: LoadedRun, t: Tables) -> list[Limit]:
    """The run's shared limits (`analysis.limits`), found once per run."""
    if "shared_limits" not in run.cache:
        inputs = Inputs(t.block_latency, t.iostat_devices, t.sched_time, t.io_depth, t.op_stages)
        run.cache["shared_limits"] = shared_limits(run, inputs)
    found: list[Limit] = run.cache["shared_limits"]
    return found


def _slow_alike(t: Tables, th: Thresholds) -> list[str]:
    """What says the nodes were slow together: an op's median time over slow_op_ms, or half
    the nodes (or more) reading read_write_ratio times slower than they wrote."""
    out = []
    for row in t.op_time.itertuples():
        if row.op in ("read", "write") and row.p50_ms >= th.slow_op_ms:
            out.append(f"the servers' median {row.op} took {_ms(row.p50_ms)} over {int(row.ops):,}")
    p = t.per_node
    if not p.empty:
        asym = p[p["read_write_ratio"] >= th.read_write_ratio]
        if len(p) > 1 and 2 * len(asym) >= len(p):
            out.append(
                f"{len(asym)} of {len(p)} nodes read >= {th.read_write_ratio:g}x slower than "
                "they wrote, alike"
            )
    return out


def shared_limit(run: LoadedRun, t: Tables, th: Thresholds) -> Insight:
    i = _new(
        "BFS-012",
        "The nodes share one limit",
        "high",
        "the nodes were slow alike (an op's median >= slow_op_ms, or half the nodes reading "
        "read_write_ratio x slower than they wrote) with no node judged slow on its own "
        "(BFS-003), and a resource they share was the limit: one device and its queue, the "
        "CPU (processes per core), the network, or depth 1 at the servers while many ranks "
        "wait (analysis.limits)",
        "When every node is slow alike, comparing nodes finds nothing: fix what they share "
        "(the evidence names it and what to do).",
    )
    nodes = len((run.manifest or {}).get("nodes", [])) or len(t.per_node)
    if nodes < 2:
        return _skip(i, "one node: nothing is shared between nodes")
    slow = t.slow_nodes
    judged_slow = sorted(set(slow.loc[slow["slow"], "node"])) if not slow.empty else []
    found = _limits(run, t)
    i.data = {
        "limits": [
            {"kind": x.kind, "binding": x.binding, "own": x.own, "evidence": x.evidence}
            for x in found
        ],
        "slow_nodes": judged_slow,
    }
    if not found and not run.kernel:
        return _skip(i, _kernel_missing(run))
    binding = [x for x in found if x.binding]
    symptoms = _slow_alike(t, th)
    i.data["symptoms"] = symptoms
    if judged_slow or not binding or not symptoms:
        return i
    i.fired = True
    i.evidence.extend(symptoms)
    for x in binding:
        i.evidence.append(f"{x.kind}: {x.evidence}")
    what = " ".join(f"{x.kind[:1].upper()}{x.kind[1:]}: {x.recommendation}." for x in binding)
    i.recommendation = f"{what} {i.recommendation}"
    return i


def tcp_backoff(run: LoadedRun, t: Tables, th: Thresholds) -> Insight:
    i = _new(
        "BFS-013",
        "TCP retransmission timeouts",
        "high",
        "a node's TCP retransmission timer expired >= tcp_timeouts times during the run "
        "(network/<node>.json)",
        "Each expiry doubles the wait before TCP tries a lost segment again (0.2 s, then "
        "seconds, then tens of seconds): a request behind it waits that long, and past "
        "client.request_timeout_s it times out (BFS-006). Find why segments were lost: "
        "dropped on arrival for lack of room (TCPRcvQDrop, pruned queues) while the host's TCP "
        "memory was under pressure (TCPMemoryPressures: raise net.ipv4.tcp_mem, or lower the "
        "bytes in flight, client.max_inflight and client.read_ahead; nodes simulated in "
        "network namespaces share one host's budget, which benchfs-run nodes --netns raises), "
        "or lost on a link (check its errors and drops).",
    )
    net = run.network
    if net is None or net.empty:
        return _skip(i, "no TCP counters in this run (network/<node>.json)")
    if th.tcp_timeouts <= 0:
        return _skip(i, "insights.tcp_timeouts = 0 turns it off")
    col = "TcpExt.TCPTimeouts"
    if col not in net.columns:
        return _skip(i, "the nodes' TCP counters lack TCPTimeouts")
    # Nodes that share a network stack (one host, no namespace of their own) share counters.
    stacks = net.drop_duplicates(["host", "netns"]).fillna(0)
    hit = stacks[stacks[col] >= th.tcp_timeouts].sort_values(col, ascending=False)
    i.data = {
        "nodes": {
            r["node"]: {k: int(r[k]) for k in stacks.columns if "." in k} for _, r in hit.iterrows()
        }
    }
    if hit.empty:
        return i
    i.fired = True

    def total(name: str) -> int:
        return int(stacks[name].sum()) if name in stacks.columns else 0

    i.evidence.append(
        f"{len(hit)} of {len(stacks)} nodes: {total(col):,} retransmission timeouts, "
        f"{total('TcpExt.TCPLostRetransmit'):,} retransmissions lost again, "
        f"{total('Tcp.RetransSegs'):,} of {total('Tcp.OutSegs'):,} segments sent again"
    )
    drops = total("TcpExt.TCPRcvQDrop") + total("TcpExt.TCPOFODrop")
    pressure = total("TcpExt.TCPMemoryPressures")
    if drops or pressure:
        i.evidence.append(
            f"segments dropped on arrival for lack of room: {drops:,} "
            f"(receive queues pruned {total('TcpExt.PruneCalled'):,} times); the host's TCP "
            f"memory under pressure {pressure:,} times, "
            f"{total('TcpExt.TCPMemoryPressuresChrono') / 1000:.1f} s in all"
        )
    worst = ", ".join(f"{r['node']} ({int(r[col]):,})" for _, r in hit.head(5).iterrows())
    i.evidence.append(f"most timeouts: {worst}")
    return i


CATALOG: tuple[Check, ...] = (
    depth_starvation,
    batching,
    slow_node,
    device_asymmetry,
    placement_imbalance,
    retry_storm,
    pool_exhaustion,
    read_write_asymmetry,
    small_write_amplification,
    handle_thrash,
    device_latency_mode,
    shared_limit,
    tcp_backoff,
)
"""Every insight, in id order."""


def evaluate(run: LoadedRun, tables: Tables, thresholds: Thresholds) -> list[Insight]:
    """Every insight's verdict on the run, in id order."""
    return [check(run, tables, thresholds) for check in CATALOG]

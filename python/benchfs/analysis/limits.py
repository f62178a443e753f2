"""What the nodes of a run share, and which shared resource limited them all alike.

When every node is slow the same way, no per-node comparison can find the cause: nodes on one
host share its device and its queue, its cores, its network stack. This module names what
they share and whether it was the limit, from the kernel's trace (`analysis.kernel`), iostat
and BenchFS's own telemetry:

- one device and its queue: two or more nodes with servers on one host, and one device of
  that host carrying `DEVICE_SHARE` of its block I/O; the limit when iostat saw it busy
  (`BUSY_UTIL`) or its requests waited in the block layer `QUEUE_RATIO` times their device
  time;
- the CPU: the processes (servers and ranks) of a host per core, and the share of their
  ready time spent waiting for a core (`runnable`, scheduler tracepoints); the limit at
  `RUNNABLE_SHARE` or more;
- depth 1 at the servers: most submissions found the device idle (`DEPTH1_SHARE`) while there
  were at least `RANKS_PER_SERVER` ranks per server: BenchFS's own, unless the CPU was the
  limit (servers waiting for a core run too rarely to gather requests);
- the network: the transport holding `TRANSPORT_SHARE` of a call's median time (client
  telemetry).

`shared_limits` returns every limit found, binding or not, with its evidence; BFS-012 fires on
the binding ones and BFS-008 gives no per-node advice where they apply.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from benchfs.analysis.run import LoadedRun

__all__ = ["HostShare", "Inputs", "Limit", "hosts_of", "shared_limits"]

DEVICE_SHARE = 0.8
BUSY_UTIL = 80.0
QUEUE_RATIO = 2.0
RUNNABLE_SHARE = 0.25
DEPTH1_SHARE = 0.5
RANKS_PER_SERVER = 4
TRANSPORT_SHARE = 0.5


@dataclass
class HostShare:
    """The nodes of one host and what runs there."""

    host: str
    nodes: list[str] = field(default_factory=list)
    servers: int = 0
    ranks: int = 0
    cpus: int | None = None


@dataclass(frozen=True)
class Limit:
    """One shared resource: what it is, whether it was the limit, the evidence, what to do, and
    whether it is BenchFS's own to fix."""

    kind: str
    binding: bool
    evidence: str
    recommendation: str
    own: bool = False


def hosts_of(run: LoadedRun) -> dict[str, HostShare]:
    """The run's hosts and the nodes on each: the kernel tracers' record of the nodes each
    traced, else the manifest's nodes (nodes in network namespaces share this host)."""
    m = run.manifest or {}
    host_of: dict[str, str] = {}
    for p in m.get("processes", []):
        if p.get("role") == "kernel_trace":
            for n in p.get("nodes") or [p.get("node")]:
                host_of[str(n)] = str(p.get("host"))
    out: dict[str, HostShare] = {}
    for n in m.get("nodes", []):
        name = str(n.get("name"))
        local = n.get("netns") or m.get("mode") == "local"
        host = host_of.get(name) or ("localhost" if local else str(n.get("host") or name))
        share = out.setdefault(host, HostShare(host))
        share.nodes.append(name)
        share.servers += len(n.get("servers") or [])
        share.ranks += len(n.get("ranks") or [])
    for host, data in run.kernel.items():
        if host in out:
            out[host].cpus = data.cpus
    return out


@dataclass(frozen=True)
class Inputs:
    """The tables the judgment reads (`benchfs.analysis.Tables` holds them)."""

    block_latency: pd.DataFrame
    iostat_devices: pd.DataFrame
    sched_time: pd.DataFrame
    io_depth: pd.DataFrame
    op_stages: pd.DataFrame


def _device_limits(t: Inputs, hosts: dict[str, HostShare]) -> list[Limit]:
    b = t.block_latency
    out: list[Limit] = []
    if b.empty:
        return out
    for host, share in hosts.items():
        mine = b[b["host"] == host]
        if share.servers < 2 or len(share.nodes) < 2 or mine.empty:
            continue
        per = mine.groupby("device")["ios"].sum().sort_values(ascending=False)
        total = float(per.sum())
        if not total:
            continue
        device, ios = str(per.index[0]), float(per.iloc[0])
        if ios / total < DEVICE_SHARE:
            continue
        rows = mine[mine["device"] == device]
        util = math.nan
        io = t.iostat_devices
        if not io.empty:
            util = float(io[io["device"] == device]["util_mean"].max())
        dev_us = _weighted(rows, "mean_us")
        block_us = _weighted(rows, "block_mean_us")
        queued = block_us / dev_us if dev_us and math.isfinite(block_us) else math.nan
        binding = (math.isfinite(util) and util >= BUSY_UTIL) or (
            math.isfinite(queued) and queued >= QUEUE_RATIO
        )
        parts = [
            f"{len(share.nodes)} nodes on {host} ({share.servers} servers) share one device, "
            f"{device}: {ios / total:.0%} of the host's {int(total):,} block I/Os",
            f"its I/Os took {dev_us / 1000:.3g} ms at the device"
            + (
                f" and {block_us / 1000:.3g} ms in the block layer ({queued:.1f}x: queued)"
                if math.isfinite(queued)
                else ""
            ),
        ]
        if math.isfinite(util):
            parts.append(f"iostat: {util:.0f}% busy")
        out.append(
            Limit(
                "one device and its queue",
                binding,
                "; ".join(parts),
                f"the nodes' data shares {device}: give each node a device of its own "
                "(scratch on distinct disks), or compare against fio on that one device with "
                "all the nodes' load, not per node",
            )
        )
    return out


def _weighted(rows: Any, column: str) -> float:
    ios = rows["ios"].astype(float)
    values = rows[column].astype(float)
    ok = values.notna() & (ios > 0)
    return float((values[ok] * ios[ok]).sum() / ios[ok].sum()) if ok.any() else math.nan


def _cpu_limits(t: Inputs, hosts: dict[str, HostShare]) -> list[Limit]:
    s = t.sched_time
    out: list[Limit] = []
    if s.empty:
        return out
    for host, share in hosts.items():
        mine = s[s["host"] == host]
        if mine.empty:
            continue
        on, runnable = float(mine["on CPU"].sum()), float(mine["runnable"].sum())
        if on + runnable <= 0:
            continue
        waiting = runnable / (on + runnable)
        cpus = share.cpus or int(mine["cpus"].max())
        processes = share.servers + share.ranks
        per_core = processes / cpus if cpus else math.nan
        binding = waiting >= RUNNABLE_SHARE
        out.append(
            Limit(
                "the CPU",
                binding,
                f"{processes} processes ({share.servers} servers, {share.ranks} ranks) on "
                f"{host}'s {cpus} cores ({per_core:.1f} per core); its programs waited for a "
                f"core {waiting:.0%} of the time they were ready to run ({runnable:.1f} s "
                f"runnable, {on:.1f} s on CPU)",
                "fewer processes per core (--clients-per-node, --servers-per-node), or pin "
                "them (--pin-cpus); a node's figures then measure its cores, not its devices",
            )
        )
    return out


def _depth_limit(run: LoadedRun, t: Inputs, hosts: dict[str, HostShare]) -> list[Limit]:
    d = t.io_depth
    if d.empty:
        return []
    row = d[d["node"] == "all"].iloc[0]
    servers = sum(h.servers for h in hosts.values()) or len(run.servers())
    ranks = sum(h.ranks for h in hosts.values())
    if not servers or not ranks:
        return []
    share = float(row["share_depth1"])
    many = ranks >= RANKS_PER_SERVER * servers
    return [
        Limit(
            "depth 1 at the servers",
            share >= DEPTH1_SHARE and many,
            f"{share:.0%} of {int(row['submits']):,} submissions found the device at depth 1 "
            f"(mean {float(row['mean']):.2f}) while {ranks} ranks used {servers} servers "
            f"({ranks / servers:.1f} per server)",
            "BenchFS's own: the servers fed their devices one request at a time although many "
            "ranks were waiting (BFS-001 has the queue figures)",
            own=True,
        )
    ]


def _network_limit(t: Inputs) -> list[Limit]:
    st = t.op_stages
    if st.empty or "transport" not in st.columns:
        return []
    out = []
    for row in st.itertuples():
        call = float(row.call_p50_ms)
        transport = float(row.transport)
        if not call or not math.isfinite(transport):
            continue
        share = transport / call
        out.append(
            Limit(
                "the network",
                share >= TRANSPORT_SHARE,
                f"{row.op}s: the transport took {transport:.3g} ms of a {call:.3g} ms median call "
                f"({share:.0%})",
                "check the links and the transport (network.transports; benchfs-bench rpc)",
            )
        )
    return out


def shared_limits(run: LoadedRun, t: Inputs) -> list[Limit]:
    """Every shared resource of the run found, the binding ones first."""
    hosts = hosts_of(run)
    cpu = _cpu_limits(t, hosts)
    depth = _depth_limit(run, t, hosts)
    if any(x.binding for x in cpu):
        # Servers that wait for a core run too rarely to gather requests: their depth 1 is
        # the CPU's doing, not theirs.
        depth = [
            Limit(
                x.kind,
                x.binding,
                x.evidence + "; with the CPU the limit, the servers ran too rarely to gather "
                "requests",
                "follows from the CPU: fewer processes per core first",
            )
            for x in depth
        ]
    found = [*_device_limits(t, hosts), *cpu, *depth, *_network_limit(t)]
    return sorted(found, key=lambda x: not x.binding)

"""A screen: every probe on every node at once, then the judgment, into a screen directory.

Locally (simulated nodes on this host) each node's probes run in a thread of their own, every
command under the node's prefix; under MPI (`mpiexec -n N ... benchfs-diagnose screen --mpi`,
one rank per node) each rank probes its node and rank 0 judges. Per node, in order: the
health and triage snapshots, then the fio probes (seqwrite, seqread, workload, rand4k) with
iostat capturing the node's devices throughout; then, one pair at a time, the network probe.
"""

from __future__ import annotations

import contextlib
import csv
import io
import math
import os
import shutil
import statistics
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchfs import schemas
from benchfs.diagnose import fio as fioprobe
from benchfs.diagnose import history, modes
from benchfs.diagnose.judge import (
    KIND_ABOVE,
    KIND_DEVICE,
    KIND_FULL,
    KIND_HEALTH,
    KIND_MD,
    KIND_NETWORK,
    KIND_PROBE,
    KIND_UNCLEAR,
    Flag,
    Thresholds,
    decide,
)
from benchfs.diagnose.network import PairResult, measure_pairs, pairs_of
from benchfs.errors import BenchfsError, DiagnoseError, ParseError
from benchfs.nodes import Exclusion, Node, write_exclusions, write_nodes
from benchfs.peers import MetricSpec, Outlier, common_scale, outliers
from benchfs.probes import blocklat, iolimits, iostat, mdraid, smart, triage
from benchfs.probes.fio import FioResult
from benchfs.results import ScreenDir, create_screen_dir, read_json, write_json_atomic
from benchfs.units import MIB

__all__ = [
    "NodeProbe",
    "ScreenSettings",
    "judge_screen",
    "probe_node",
    "run_screen",
    "write_screen",
]

FULL_SCRATCH_PCT = 95.0
IOSTAT_TAIL_S = 1.2
FAMILY = {
    "fio_seqwrite_mib_s": "sequential write",
    "fio_seqread_mib_s": "sequential read",
    "fio_workload_mib_s": "many-files read throughput",
    "fio_workload_p50_ms": "many-files read latency",
    "fio_workload_p99_ms": "many-files read latency",
    "fio_rand4k_p50_us": "4 KiB read latency",
    "dev_qd1_r_await_ms": "device service time",
    "dev_r_await_abs": "device latency under load",
    "member_asymmetry": "twin devices",
    "network_pair": "network",
    "io_limit": "I/O limit",
}
"""The kind of evidence each flag is: flags of one family count once toward exclusion."""
STATE_FLAGS = frozenset({"md", "health", "scratch_full", "probe_failed", "network_failed"})
"""Flags about a node's state rather than a measurement: a second probe does not re-judge them."""
SPECS = {
    "fio_seqwrite_mib_s": MetricSpec("fio_seqwrite_mib_s", "sequential write", "MiB/s", False),
    "fio_seqread_mib_s": MetricSpec("fio_seqread_mib_s", "sequential read", "MiB/s", False),
    "fio_workload_mib_s": MetricSpec("fio_workload_mib_s", "many-files read", "MiB/s", False),
    "fio_workload_p50_ms": MetricSpec("fio_workload_p50_ms", "many-files read p50", "ms", True),
    "fio_workload_p99_ms": MetricSpec("fio_workload_p99_ms", "many-files read p99", "ms", True),
    "fio_rand4k_p50_us": MetricSpec("fio_rand4k_p50_us", "4 KiB read p50", "us", True),
}
"""Application-side metrics (fio), judged across nodes."""
DEVICE_SPEC_NAME = "dev_qd1_r_await_ms"
PAIR_SPECS = (
    MetricSpec("mib_s", "pair bandwidth", "MiB/s", False),
    MetricSpec("rtt_p50_us", "pair 4 KiB write round trip p50", "us", True),
)


@dataclass(frozen=True)
class ScreenSettings:
    """How long and how big the probes are (full, or --quick)."""

    workload_seconds: float
    short_seconds: float
    sizes: fioprobe.ProbeSizes
    network: bool
    network_seconds: float
    budget_s: float

    @staticmethod
    def from_thresholds(
        th: Thresholds, quick: bool, network: bool = True, seconds: float | None = None
    ) -> ScreenSettings:
        workload = (
            seconds if seconds is not None else (th.quick_seconds if quick else th.workload_seconds)
        )
        return ScreenSettings(
            workload_seconds=workload,
            short_seconds=max(2.0, workload / 4) if quick else max(2.0, min(15.0, workload / 4)),
            sizes=fioprobe.ProbeSizes.quick() if quick else fioprobe.ProbeSizes.full(th.probe_size),
            network=network,
            network_seconds=1.0 if quick else 3.0,
            budget_s=th.budget_s,
        )


@dataclass
class NodeProbe:
    """Everything measured on one node (picklable, so MPI ranks can send it to rank 0)."""

    node: Node
    fio: dict[str, dict[str, float]] = field(default_factory=dict)
    devices: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Per device, iostat over the workload probe (DeviceStats.to_json): latency under load."""
    devices_qd1: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Per device, iostat over the rand4k probe: the device's service time, 1 in flight."""
    members: list[str] = field(default_factory=list)
    """Devices compared as twins (md/dm members, or the nodes file's devices)."""
    md: list[dict[str, Any]] = field(default_factory=list)
    health: list[dict[str, Any]] = field(default_factory=list)
    triage: dict[str, Any] = field(default_factory=dict)
    io_limits: list[iolimits.IoLimit] = field(default_factory=list)
    """I/O limits (cgroup blkio / io.max) on the node's devices for processes of its prefix."""
    errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    watched: list[str] = field(default_factory=list)
    """The devices iostat and the kernel tracer watched."""
    windows: dict[str, tuple[float, float]] = field(default_factory=dict)
    """Per fio probe, its measured window (wall clock, seconds since the epoch)."""
    latency: dict[str, dict[str, list[list[int]]]] = field(default_factory=dict)
    """Per judged probe window, per device, its read latency histogram from the kernel
    (`modes.summarize_windows`); empty when kernel tracing was unavailable."""


def block_device_of(path: str) -> str | None:
    """The whole-disk name (e.g. nvme0n1, md0, loop3) holding `path`, if it is a block device."""
    st = os.stat(path)
    sysfs = Path(f"/sys/dev/block/{os.major(st.st_dev)}:{os.minor(st.st_dev)}")
    try:
        real = sysfs.resolve(strict=True)
    except OSError:
        return None
    return real.parent.name if (real / "partition").exists() else real.name


def watched_devices(node: Node) -> tuple[list[str], list[str]]:
    """(devices iostat watches, devices compared as twins) for `node`."""
    if node.devices:
        devices = list(node.devices)
    else:
        dev = block_device_of(node.scratch)
        devices = [dev] if dev else []
    members: list[str] = []
    for d in devices:
        below = mdraid.member_devices(d)
        members.extend(below)
    watched = list(dict.fromkeys([*devices, *members]))
    twins = members if len(members) >= 2 else (devices if len(devices) >= 2 else [])
    return watched, twins


def _run(argv: list[str], deadline: float, what: str) -> subprocess.CompletedProcess[str]:
    remaining = deadline - time.monotonic()
    if remaining <= 1:
        raise DiagnoseError("ETIMEDOUT", f"{what}: the screen's time budget is spent")
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=remaining, check=False)
    except subprocess.TimeoutExpired as e:
        raise DiagnoseError("ETIMEDOUT", f"{what}: still running when the budget ran out") from e
    if out.returncode != 0:
        detail = (out.stderr or out.stdout).strip()[-500:]
        raise DiagnoseError("EIO", f"{what}: `{' '.join(argv)}` exited {out.returncode}: {detail}")
    return out


def _fio_metrics(probe: str, r: FioResult) -> dict[str, float]:
    iops = r.ops / r.seconds if r.seconds > 0 else 0.0
    return {
        "mib_s": r.mib_s,
        "iops": iops,
        "p50_us": r.p50_us,
        "p99_us": r.p99_us,
        "seconds": r.seconds,
    }


def probe_node(
    node: Node, screen: ScreenDir, settings: ScreenSettings, deadline: float
) -> NodeProbe:
    """Run every per-node probe on `node` under its prefix; failures are recorded, not raised."""
    probe = NodeProbe(node)
    raw = screen.raw_dir / node.name
    raw.mkdir(parents=True, exist_ok=True)
    watched, probe.members = watched_devices(node)
    probe.watched = watched
    try:
        probe.md = [a.to_json() for a in mdraid.read_md_arrays()]
    except ParseError as e:
        probe.errors.append(f"md: {e}")
    for device in watched:
        if device.startswith(("loop", "zram", "ram")):
            continue
        try:
            health, _command, out = smart.probe_health(device, node.command_prefix)
        except (ParseError, OSError, subprocess.TimeoutExpired) as e:
            probe.errors.append(f"health of {device}: {e}")
            continue
        (raw / f"health-{device}.json").write_text(out)
        if health is not None:
            probe.health.append(health.to_json())
    probe.triage, problems = triage.run_triage(node.scratch, node.command_prefix, raw)
    probe.notes.extend(f"triage: {p}" for p in problems)
    try:
        probe.io_limits = iolimits.io_limits(node.command_prefix, watched)
    except (OSError, subprocess.TimeoutExpired) as e:
        probe.notes.append(f"I/O limits not read: {e}")

    work = Path(node.scratch) / fioprobe.WORK_DIR
    work.mkdir(parents=True, exist_ok=True)
    if fioprobe.scratch_free(node.scratch) < settings.sizes.need():
        probe.errors.append(
            f"{node.scratch} has less than the {settings.sizes.need() >> 20} MiB the probes need"
            + (
                ""
                if settings.sizes == fioprobe.ProbeSizes.quick()
                else " (diagnose.probe_size sets it: --set diagnose.probe_size=2G)"
            )
        )
        return probe
    files = fioprobe.prepare_tree(work, settings.sizes)
    cap = (
        iostat.Capture(raw / "iostat.json", watched, 1.0, node.command_prefix) if watched else None
    )
    windows = probe.windows
    try:
        for name in fioprobe.PROBES:
            seconds = settings.workload_seconds if name == "workload" else settings.short_seconds
            job = raw / f"fio-{name}.fio"
            job.write_text(fioprobe.job_file(name, work, seconds, settings.sizes, files))
            out = raw / f"fio-{name}.json"
            try:
                # fio lays out missing files before its runtime starts; the window for iostat
                # is the last `seconds` of the probe.
                _run(
                    node.command(fioprobe.fio_argv(job, out)),
                    deadline,
                    f"fio {name} on {node.name}",
                )
                end = time.time()
                windows[name] = (end - seconds, end)
                probe.fio[name] = _fio_metrics(name, fioprobe.result_of(out, name))
            except (BenchfsError, OSError) as e:  # fio's own (BenchError) or the probe's
                probe.errors.append(f"fio {name}: {getattr(e, 'message', e)}")
    finally:
        if cap is not None:
            time.sleep(IOSTAT_TAIL_S)  # iostat reports the last interval at its end
            cap.stop()
        shutil.rmtree(work, ignore_errors=True)
    if cap is not None:
        try:
            samples = cap.samples()
        except ParseError as e:
            probe.errors.append(f"iostat: {e}")
            samples = []
        for name, attr in (("workload", "devices"), ("rand4k", "devices_qd1")):
            window = windows.get(name)
            if window is not None:
                # An interval ending in the first second after the probe still belongs to it.
                stats = iostat.summarize(samples, window[0], window[1] + 1.0, watched)
                setattr(probe, attr, {d: s.to_json() for d, s in stats.items()})
        if samples and not probe.devices:
            probe.notes.append("iostat saw no interval within the workload probe")
    return probe


def node_metrics(p: NodeProbe, th: Thresholds) -> dict[str, Any]:
    """The flat row of screen.csv for one node (None where a probe gave nothing)."""
    m: dict[str, Any] = {}
    f = p.fio
    m["fio_seqwrite_mib_s"] = f.get("seqwrite", {}).get("mib_s")
    m["fio_seqread_mib_s"] = f.get("seqread", {}).get("mib_s")
    m["fio_workload_mib_s"] = f.get("workload", {}).get("mib_s")
    w = f.get("workload")
    m["fio_workload_p50_ms"] = w["p50_us"] / 1000 if w else None
    m["fio_workload_p99_ms"] = w["p99_us"] / 1000 if w else None
    m["fio_rand4k_p50_us"] = f.get("rand4k", {}).get("p50_us")
    m["fio_rand4k_iops"] = f.get("rand4k", {}).get("iops")
    active = {d: s for d, s in p.devices.items() if s["r_s"] > 0}
    if active:
        worst = max(active, key=lambda d: active[d]["r_await"])
        m["dev_worst"] = worst
        m["dev_r_await_ms"] = active[worst]["r_await"]
        m["dev_r_await_max_ms"] = active[worst]["r_await_max"]
        m["dev_aqu_sz"] = active[worst]["aqu_sz"]
        m["dev_util_pct"] = active[worst]["util"]
        m["dev_r_s"] = active[worst]["r_s"]
        m["dev_rkB_s"] = active[worst]["rkB_s"]
    else:
        for key in ("dev_worst", "dev_r_await_ms", "dev_r_await_max_ms", "dev_aqu_sz"):
            m[key] = None
        m.update(dev_util_pct=None, dev_r_s=None, dev_rkB_s=None)
    qd1 = {d: s for d, s in p.devices_qd1.items() if s["r_s"] > 0}
    if qd1:
        worst = max(qd1, key=lambda d: qd1[d]["r_await"])
        m["dev_qd1_worst"] = worst
        m["dev_qd1_r_await_ms"] = qd1[worst]["r_await"]
    else:
        m["dev_qd1_worst"] = m["dev_qd1_r_await_ms"] = None
    twins = _twin_asymmetry(p)
    m["dev_member_ratio"] = twins.ratio if twins else None
    t = p.triage
    for key in (
        "load1",
        "blocked",
        "iowait_pct",
        "cpu_iowait_max_pct",
        "mem_available_mib",
        "fs_type",
        "fs_use_pct",
        "kernel_errors",
        "d_state_tasks",
    ):
        m[f"triage_{key}"] = t.get(key)
    m["md_busy"] = ",".join(a["name"] for a in p.md if a.get("busy")) or None
    m["io_limits"] = "; ".join(x.describe() for x in p.io_limits) or None
    m["health_warnings"] = sum(len(h.get("warnings", [])) for h in p.health)
    return m


SCREEN_SCHEMA_VERSION = 1
"""Version of screen.json's layout (benchfs/schemas/screen.schema.json)."""


@dataclass
class ScreenResult:
    nodes: list[dict[str, Any]]
    excluded: list[Exclusion]
    pairs: list[dict[str, Any]]
    thresholds: Thresholds
    tracing: str | None = None
    """Why kernel tracing did not run (one line), or None when it ran."""

    def to_json(self) -> dict[str, Any]:
        return {
            "schema_version": SCREEN_SCHEMA_VERSION,
            "nodes": self.nodes,
            "excluded": [e.to_json() for e in self.excluded],
            "pairs": self.pairs,
            "thresholds": self.thresholds.to_dict(),
            "tracing": self.tracing or "block latency traced",
        }


@dataclass(frozen=True)
class TwinAsymmetry:
    ratio: float
    slow: str
    slow_ms: float
    fast: str
    fast_ms: float
    phase: str


def _twin_asymmetry(p: NodeProbe) -> TwinAsymmetry | None:
    """The slowest twin against the fastest, at one read in flight when that was measured.

    At one read in flight the twins' service times compare directly: a slow member shows its
    full slowness there (a 20 ms member against a sub-millisecond twin). Under the many-files
    load a slow member holds up its stripes, so its healthy twin queues too and the ratio
    understates it (5-8x measured), while healthy twins on a loaded machine can differ as much
    by queueing alone (4.35 against 0.60 ms, 7.3x, on a healthy node here): the loaded phase
    decides only when the other was not measured.
    """
    found = {}
    for phase, stats in (("under load", p.devices), ("at 1 in flight", p.devices_qd1)):
        active = [(stats[d]["r_await"], d) for d in p.members if stats.get(d, {}).get("r_s", 0) > 0]
        if len(active) >= 2:
            (fast_ms, fast), (slow_ms, slow) = min(active), max(active)
            ratio = slow_ms / max(fast_ms, 1e-3)
            found[phase] = TwinAsymmetry(ratio, slow, slow_ms, fast, fast_ms, phase)
    return found.get("at 1 in flight") or found.get("under load")


def _device_flags(p: NodeProbe, m: Mapping[str, Any], th: Thresholds) -> list[Flag]:
    flags = []
    twins = _twin_asymmetry(p)
    if twins and twins.ratio >= th.member_ratio and twins.slow_ms >= th.r_await_floor_ms:
        flags.append(
            Flag(
                "member_asymmetry",
                KIND_DEVICE,
                f"member {twins.slow} r_await {twins.slow_ms:.3g} ms vs its twin {twins.fast} "
                f"{twins.fast_ms:.3g} ms {twins.phase} "
                f"({twins.ratio:.1f}x >= {th.member_ratio:g}x)",
                common_scale(twins.ratio, th),
                worse=twins.ratio,
                family=FAMILY["member_asymmetry"],
            )
        )
    for array in p.md:
        if array.get("busy") or array.get("degraded") or array.get("failed"):
            what = f"{array['name']} {array['action']}"
            if array.get("progress_pct") is not None:
                what += f" {array['progress_pct']:g}%"
            if array.get("degraded"):
                what += " (degraded)"
            flags.append(Flag("md", KIND_MD, what, math.inf))
    for h in p.health:
        for warning in h.get("warnings", []):
            flags.append(Flag("health", KIND_HEALTH, f"{h['device']}: {warning}", math.inf))
    use = m.get("triage_fs_use_pct")
    if use is not None and use >= FULL_SCRATCH_PCT:
        # The job cannot write there: wrong in itself.
        flags.append(Flag("scratch_full", KIND_FULL, f"{p.node.scratch} {use:g}% full", math.inf))
    for error in p.errors:
        # A failed probe says nothing about the node's speed: reported, never grounds.
        flags.append(Flag("probe_failed", KIND_PROBE, error, 1.0, excludable=False))
    return flags


def _latency_floors(
    metrics: Mapping[str, Mapping[str, Any]],
    flags: dict[str, list[Flag]],
    notes: dict[str, list[str]],
    th: Thresholds,
) -> None:
    """The absolute device latency rule (r_await_ms) as a floor, judged against the peers.

    Under the many-files load an r_await is queueing as much as service time, and the load
    queues alike on every node of a busy machine (16.4 ms at 529 MiB/s on a healthy virtual
    disk; three healthy nodes at 18.7-20.7 ms under load 25): above the floor it counts only
    when the node also stands group_ratio above its peers' median. At one read in flight
    there is no queue: above the floor it counts when it is min_worse above the peers. A
    latency over the floor that does not count is a note, not a flag: the node is not
    suspect for what every node does."""
    for n, m in metrics.items():
        for key, where, margin, name in (
            ("dev_r_await_ms", "under the many-files load", th.group_ratio, "dev_worst"),
            ("dev_qd1_r_await_ms", "at 1 in flight", 1.0 + th.min_worse, "dev_qd1_worst"),
        ):
            value = m.get(key)
            if value is None or value < th.r_await_ms:
                continue
            peers = [v[key] for k, v in metrics.items() if k != n and v.get(key) is not None]
            median = statistics.median(peers) if peers else None
            worse = value / max(median, 1e-3) if median is not None else 1.0
            evidence = f"{m[name]} r_await {value:.3g} ms >= {th.r_await_ms:g} ms {where}"
            if key == "dev_r_await_ms":
                evidence += f" (aqu-sz {m['dev_aqu_sz']:.3g}, %util {m['dev_util_pct']:.3g})"
            counts = median is not None and worse >= margin
            if median is not None:
                evidence += f"; peers' median {median:.3g} ms ({worse:.1f}x)"
            if not counts:
                notes[n].append(f"{evidence}: the peers are as slow, so it is not this node's")
                # The other load may still set the node apart (no queue at 1 in flight).
                continue
            flags[n].append(
                Flag(
                    "dev_r_await_abs",
                    KIND_DEVICE,
                    evidence,
                    common_scale(worse, th),
                    worse=worse,
                    family="device service time" if "qd1" in key else FAMILY["dev_r_await_abs"],
                )
            )
            break


def peer_groups(probes: Sequence[NodeProbe]) -> dict[str, list[str]]:
    """Nodes by kind: file system type and number of devices (btrfs over two devices is not
    compared with ext4 over one)."""
    groups: dict[str, list[str]] = {}
    for p in probes:
        fs = p.triage.get("fs_type") or "unknown file system"
        devices = len(p.members) or len(p.node.devices) or 1
        key = f"{fs}, {devices} device{'s' if devices > 1 else ''}"
        groups.setdefault(key, []).append(p.node.name)
    return groups


def _judge_group(
    names: Sequence[str],
    all_metrics: Mapping[str, Mapping[str, Any]],
    flags: dict[str, list[Flag]],
    notes: dict[str, list[str]],
    th: Thresholds,
) -> None:
    """The relative rules among `names`, nodes of one kind."""
    metrics = {n: all_metrics[n] for n in names}
    _latency_floors(metrics, flags, notes, th)
    for spec in SPECS.values():
        for o in outliers({n: metrics[n][spec.name] for n in names}, spec, th):
            flags[o.key].append(
                Flag(
                    spec.name,
                    "",
                    o.evidence(),
                    o.severity(th),
                    worse=o.worse,
                    family=FAMILY[spec.name],
                )
            )
    # The device's service time (1 in flight) is compared across nodes; its latency under the
    # many-files load includes queueing, which varies with the load itself, so it is judged
    # by the absolute threshold and against the node's own twin devices only.
    spec = MetricSpec(DEVICE_SPEC_NAME, "device r_await at 1 in flight", "ms", True)
    spec = MetricSpec(spec.name, spec.label, spec.unit, True, th.r_await_floor_ms)
    for o in outliers({n: metrics[n][DEVICE_SPEC_NAME] for n in names}, spec, th):
        ev = f"{metrics[o.key]['dev_qd1_worst']}: {o.evidence()}"
        flags[o.key].append(
            Flag(
                DEVICE_SPEC_NAME,
                KIND_DEVICE,
                ev,
                o.severity(th),
                worse=o.worse,
                family=FAMILY[DEVICE_SPEC_NAME],
            )
        )


def _kinds(
    names: Sequence[str],
    metrics: Mapping[str, Mapping[str, Any]],
    flags: dict[str, list[Flag]],
    by_name: Mapping[str, NodeProbe],
    th: Thresholds,
) -> None:
    """The kind of the application-side flags: the device, above it, or unclear."""
    for n in names:
        # Only device evidence that counts makes the application's slowness the device's.
        device_slow = any(f.kind == KIND_DEVICE and f.excludable for f in flags[n])
        m = metrics[n]
        for f in flags[n]:
            if f.kind:
                continue
            app_ms, dev_ms = m.get("fio_workload_p50_ms"), m.get("dev_r_await_ms")
            limits = [x.describe() for x in by_name[n].io_limits]
            if device_slow:
                f.kind = KIND_DEVICE
            elif limits:
                f.kind = KIND_ABOVE
                if dev_ms is not None:
                    f.evidence += (
                        f"; the device is not slow: {m.get('dev_worst')} r_await {dev_ms:.3g} ms"
                    )
                f.evidence += f"; the probes run under a limit: {'; '.join(limits)}"
            elif (
                app_ms is not None
                and dev_ms is not None
                and app_ms >= th.above_device_ratio * max(dev_ms, 1e-3)
            ):
                f.kind = KIND_ABOVE
                f.evidence += (
                    f"; the device is not slow: {m.get('dev_worst')} r_await {dev_ms:.3g} ms, "
                    f"%util {m.get('dev_util_pct') or 0:.3g}, while fio's p50 is "
                    f"{app_ms:.3g} ms ({app_ms / max(dev_ms, 1e-3):.0f}x)"
                )
            else:
                f.kind = KIND_UNCLEAR


LIMITED = {"read": "fio_seqread_mib_s", "write": "fio_seqwrite_mib_s"}
"""The measured rate a bandwidth limit of each direction caps."""


def _limit_flags(
    p: NodeProbe,
    metrics: Mapping[str, Mapping[str, Any]],
    flags: Sequence[Flag],
    th: Thresholds,
) -> list[Flag]:
    """A bandwidth limit on the node's device below what its peers delivered in that direction
    binds: evidence independent of the measurement (the configuration), so it agrees with a
    slow measurement of that direction, never stands alone (it is added only beside one)."""
    out = []
    measured = {f.name for f in flags if f.excludable}
    for limit in p.io_limits:
        key = LIMITED.get(limit.direction)
        if limit.unit != "bytes/s" or key is None or key not in measured:
            continue
        peers = [m[key] for n, m in metrics.items() if n != p.node.name and m.get(key)]
        if not peers:
            continue
        median = statistics.median(peers)
        worse = median * MIB / max(limit.value, 1)
        if worse < 1.0 + th.min_worse:
            continue
        out.append(
            Flag(
                "io_limit",
                KIND_ABOVE,
                f"{limit.describe()}, below its peers' median {limit.direction} of "
                f"{median:.0f} MiB/s ({worse:.1f}x): the limit binds",
                common_scale(worse, th),
                worse=worse,
                family=FAMILY["io_limit"],
            )
        )
    return out


def judge_screen(
    probes: Sequence[NodeProbe],
    pairs: Sequence[PairResult],
    th: Thresholds,
    repeated: Mapping[str, set[str]] | None = None,
    pairs_again: Mapping[str, PairResult] | None = None,
    tracing: str | None = None,
) -> ScreenResult:
    """Metrics, flags, verdicts and exclusions of a screen (pure: no probing). With
    `repeated` (per node, the measured flags a second probe of every node at once raised), a
    measured flag stands only if it repeated; one that did not is dropped with a note. With
    `pairs_again` (slow pairs measured once more, by key), a slow pair stands only if its
    repeat is as slow against the other pairs."""
    names = [p.node.name for p in probes]
    metrics = {p.node.name: node_metrics(p, th) for p in probes}
    flags: dict[str, list[Flag]] = {n: [] for n in names}
    by_name = {p.node.name: p for p in probes}
    for n in names:
        flags[n].extend(_device_flags(by_name[n], metrics[n], th))
    # Like with like: the relative rules compare nodes of one kind (file system and number
    # of devices); a node with no peer of its kind is reported, not judged against others.
    groups = peer_groups(probes)
    # Two of a kind among more nodes: a difference between the two does not say which one is
    # slow (measured: a healthy twin-device node flagged on its p99 against a slow-member
    # twin); the two-node rule is for screens of two nodes only.
    peer_notes: dict[str, list[str]] = {n: [] for n in names}
    for kind, members in groups.items():
        if len(members) < len(probes) and len(members) <= 2:
            what = "no peer" if len(members) == 1 else "one peer"
            for n in members:
                peer_notes[n].append(
                    f"{what} of its kind ({kind}): its figures are reported, not compared"
                )
        else:
            _judge_group(members, metrics, flags, peer_notes, th)
    latency_flags, found_modes = modes.mode_flags(_latencies(probes), groups, th)
    for n, fs in latency_flags.items():
        flags[n].extend(_with_iostat(f, metrics[n]) for f in fs)
    _kinds(names, metrics, flags, by_name, th)
    dropped: dict[str, list[str]] = {n: [] for n in names}
    if repeated is not None:
        for n in names:
            again = repeated.get(n, set())
            keep = [f for f in flags[n] if f.name in STATE_FLAGS or f.name in again]
            dropped[n] = [
                f"{f.evidence}: not seen again on a second probe, so not held against the node"
                for f in flags[n]
                if f not in keep
            ]
            flags[n] = keep
    for n in names:
        flags[n].extend(_limit_flags(by_name[n], metrics, flags[n], th))
    pair_rows = _pair_flags(pairs, {p.node.name: p.node for p in probes}, flags, th, pairs_again)
    verdicts, excluded = decide(flags, th, confirmed=repeated is not None)
    nodes = []
    for n in names:
        p = by_name[n]
        nodes.append(
            {
                "host": p.node.host,
                "name": n,
                "metrics": metrics[n],
                "flags": [f.to_json() for f in flags[n]],
                "verdict": verdicts[n].to_json(),
                "devices": p.devices,
                "members": p.members,
                "md": p.md,
                "health": p.health,
                "triage": p.triage,
                "notes": [*p.notes, *peer_notes[n], *dropped[n]],
                "latency": {"histograms": p.latency, "modes": found_modes.get(n, [])},
            }
        )
    exclusions = [Exclusion(by_name[n].node.host, tuple(verdicts[n].reasons)) for n in excluded]
    return ScreenResult(nodes, exclusions, pair_rows, th, tracing)


def _latencies(probes: Sequence[NodeProbe]) -> list[modes.Latency]:
    return [
        modes.Latency(p.node.name, p.node.host, device, probe, blocklat.Histogram.from_json(h))
        for p in probes
        for probe, per_device in p.latency.items()
        for device, h in per_device.items()
    ]


def _with_iostat(f: Flag, m: Mapping[str, Any]) -> Flag:
    """The averages beside the distribution: what iostat alone said of the device."""
    r_await = m.get("dev_qd1_r_await_ms")
    if r_await is not None:
        f.evidence += f"; iostat's mean r_await at 1 in flight: {r_await:.3g} ms"
    return f


def shares_one_stack(a: Node, b: Node) -> bool:
    """Two nodes on one host under one command prefix talk through one network stack (the
    loopback): their pair says nothing about a link."""
    return a.host == b.host and a.prefix == b.prefix


def _judged_pairs(pairs: Sequence[PairResult], nodes: Mapping[str, Node]) -> list[PairResult]:
    """The pairs that were measured and say something about a link (not one network stack)."""
    return [
        p
        for p in pairs
        if p.error is None and not shares_one_stack(nodes[p.server], nodes[p.client])
    ]


def _pair_outliers(measured: Sequence[PairResult], th: Thresholds) -> dict[str, list[Outlier]]:
    """Per pair key, the metrics on which the pair is worse than the other pairs."""
    out: dict[str, list[Outlier]] = {}
    for spec in PAIR_SPECS:
        values = {p.key: getattr(p, spec.name) for p in measured}
        for o in outliers(values, spec, th):
            out.setdefault(o.key, []).append(o)
    return out


def slow_pairs(
    pairs: Sequence[PairResult], nodes: Sequence[Node], th: Thresholds
) -> list[tuple[Node, Node]]:
    """The pairs to measure again before they count: those worse than the other pairs."""
    by_name = {n.name: n for n in nodes}
    slow = _pair_outliers(_judged_pairs(pairs, by_name), th)
    return [(by_name[p.server], by_name[p.client]) for p in pairs if p.key in slow]


def _pair_flags(
    pairs: Sequence[PairResult],
    nodes: Mapping[str, Node],
    flags: dict[str, list[Flag]],
    th: Thresholds,
    again: Mapping[str, PairResult] | None = None,
) -> list[dict[str, Any]]:
    names = list(nodes)
    rows = [p.to_json() for p in pairs]
    measured = _judged_pairs(pairs, nodes)
    judged = {p.key for p in measured}
    for row, p in zip(rows, pairs, strict=True):
        if p.error is None and p.key not in judged:
            row["note"] = "one host, one network stack: measured, not judged"
    slow = _pair_outliers(measured, th)
    # A pair slow once may have met a busy moment of one end: it counts only if its repeat,
    # put among the other pairs' figures, is as slow.
    for key in list(slow):
        repeat = (again or {}).get(key)
        if repeat is None or repeat.error is not None:
            continue
        swapped = [repeat if p.key == key else p for p in measured]
        still = _pair_outliers(swapped, th).get(key)
        row = next(r for r in rows if r["pair"] == key)
        row["again"] = repeat.to_json()
        if still:
            slow[key] = still
        else:
            row["note"] = (
                "slow once ("
                + "; ".join(o.evidence() for o in slow.pop(key))
                + "), not when measured again: a busy moment, not the link"
            )
    for row in rows:
        row["flags"] = [o.evidence() for o in slow.get(row["pair"], [])]
    of_node: dict[str, list[PairResult]] = {n: [] for n in names}
    for p in measured:
        of_node[p.server].append(p)
        of_node[p.client].append(p)
    for n in names:
        mine = of_node[n]
        bad = [p for p in mine if p.key in slow]
        if not bad:
            continue
        # Compared against both ends' other pairs: a node all of whose (two or more) pairs
        # are slow has the slow link or a busy network stack; one slow pair between two nodes
        # whose other pairs are normal is the link between them, not grounds to exclude
        # either end.
        whole = len(mine) >= 2 and len(bad) == len(mine)
        for p in bad:
            other = p.client if p.server == n else p.server
            where = (
                f"every pair of {n} is slow: {n}'s network"
                if whole
                else f"the other pairs of {n} are normal"
                + (
                    f" and so are {other}'s: the link {p.key}, not either node"
                    if all(q.key not in slow for q in of_node[other] if q.key != p.key)
                    else f", {other}'s are slow too: {other}'s network"
                )
            )
            worst = max(slow[p.key], key=lambda o: o.worse)
            flags[n].append(
                Flag(
                    "network_pair",
                    KIND_NETWORK,
                    f"pair {p.key}: "
                    + "; ".join(o.evidence() for o in slow[p.key])
                    + ("; repeated" if again and p.key in again else "")
                    + f"; {where}",
                    max(o.severity(th) for o in slow[p.key]),
                    excludable=whole,
                    worse=worst.worse,
                    family=FAMILY["network_pair"],
                )
            )
    for p in pairs:
        if p.error is not None:
            for n in (p.server, p.client):
                flags[n].append(
                    Flag("network_failed", KIND_NETWORK, f"pair {p.key}: {p.error}", 1.0, False)
                )
    return rows


CSV_FIRST = ["host", "name", "verdict", "kind", "flags"]


def screen_csv(result: Mapping[str, Any]) -> str:
    """screen.csv text: one row per node, metrics then flags."""
    nodes = result["nodes"]
    metric_keys: list[str] = []
    for n in nodes:
        for k in n["metrics"]:
            if k not in metric_keys:
                metric_keys.append(k)
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow([*CSV_FIRST, *metric_keys, "reasons"])
    for n in nodes:
        v = n["verdict"]
        row = [
            n["host"],
            n["name"],
            v["status"],
            v["kind"] or "",
            ";".join(f["flag"] for f in n["flags"]),
        ]
        for k in metric_keys:
            x = n["metrics"].get(k)
            row.append("" if x is None else (f"{x:.6g}" if isinstance(x, float) else x))
        row.append(" | ".join(v["reasons"]))
        w.writerow(row)
    return buf.getvalue()


def write_screen(screen: ScreenDir, result: ScreenResult) -> None:
    """screen.json, screen.csv, the exclusion files, and a line of the results root's
    diagnosis history."""
    doc = result.to_json()
    write_json_atomic(screen.screen_json, doc)
    screen.screen_csv.write_text(screen_csv(doc))
    write_exclusions(screen.path, result.excluded)
    history.append(screen.path.parent, "screen", str(screen.path), history.screen_nodes(doc))


def load_screen(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A screen's JSON, from its directory or its screen.json; ValueError names the file."""
    p = Path(path)
    file = ScreenDir(p).screen_json if p.is_dir() else p
    if not file.exists():
        raise FileNotFoundError(f"no screen at {p} (expected {file})")
    doc = read_json(file)
    schemas.check(doc, schemas.SCREEN, file)
    return doc


def run_screen(
    nodes: Sequence[Node],
    config_text: str,
    th: Thresholds,
    settings: ScreenSettings,
    root: str | os.PathLike[str],
    progress: Callable[[str], None] = lambda _: None,
) -> tuple[ScreenDir, ScreenResult]:
    """Probe every node of `nodes` on this host at once, judge, write the screen directory."""
    screen = create_screen_dir(root)
    write_nodes(screen.nodes_path, nodes)
    screen.config_path.write_text(config_text)
    began = time.monotonic()
    deadline = began + settings.budget_s
    progress(f"probing {len(nodes)} nodes at once into {screen.path}")
    probes, tracing = _probe_round(nodes, screen, settings, deadline)
    if tracing is not None:
        progress(tracing)
    repeated = _probe_again(nodes, probes, screen, settings, th, began, deadline, progress)
    pairs: list[PairResult] = []
    if settings.network and len(nodes) >= 2:
        progress("measuring the network between node pairs")
        screen.network_dir.mkdir(parents=True, exist_ok=True)
        pairs = measure_pairs(
            pairs_of(nodes),
            screen.network_dir,
            config_text,
            settings.network_seconds,
            deadline,
            True,
        )
    again: dict[str, PairResult] = {}
    suspects = slow_pairs(pairs, nodes, th)
    if suspects:
        progress(f"measuring {len(suspects)} slow pair(s) again to confirm")
        again = {
            p.key: p
            for p in measure_pairs(
                suspects, screen.network_dir / "again", config_text, settings.network_seconds,
                deadline, True,
            )
        }  # fmt: skip
    result = judge_screen(probes, pairs, th, repeated, again, tracing)
    write_screen(screen, result)
    return screen, result


def start_tracer(raw_dir: Path) -> tuple[blocklat.Capture | None, str | None]:
    """The host's block latency tracer, started into `raw_dir`, or why it cannot run. It is
    not waited for: it compiles and attaches (a second or two) while the sequential probes
    run, long before the judged windows (`latency_of` says if it never attached)."""
    why = blocklat.unavailable()
    if why is not None:
        return None, why
    try:
        return blocklat.Capture(raw_dir / "blocklat.json"), None
    except OSError as e:
        return None, f"kernel tracing unavailable: {e}"


def latency_of(
    probes: Sequence[NodeProbe], tracer: blocklat.Capture | None, path: Path | None = None
) -> str | None:
    """Each probe's read latency histograms per judged window, from the stopped tracer's
    capture (or the capture at `path`); a line when it cannot be read."""
    capture = path or (tracer.path if tracer is not None else None)
    if capture is None:
        return None
    try:
        if b'"attached_probes"' not in capture.read_bytes()[:4096]:
            why = tracer.messages() if tracer is not None else "no message"
            return f"kernel tracing failed: bpftrace did not attach: {why}"
        samples, _ = blocklat.read_capture(capture)
    except OSError as e:
        return f"kernel tracing failed: {capture}: {e.strerror}"
    except ParseError as e:
        return f"kernel tracing failed: {e}"
    for p in probes:
        p.latency = modes.summarize_windows(samples, p.windows, p.watched)
    return None


def _probe_round(
    nodes: Sequence[Node], screen: ScreenDir, settings: ScreenSettings, deadline: float
) -> tuple[list[NodeProbe], str | None]:
    """Every node probed at once, with one block latency tracer for this host whatever the
    number of nodes on it; the probes, and why tracing did not run (None when it did)."""
    tracer, why = start_tracer(screen.raw_dir)
    try:
        with ThreadPoolExecutor(max_workers=len(nodes)) as pool:
            futures = [pool.submit(probe_node, n, screen, settings, deadline) for n in nodes]
            if tracer is not None:
                # Attaching overlaps the probes; waited for here only to time its cost.
                with contextlib.suppress(ParseError):
                    tracer.wait_attached()
            probes = [f.result() for f in futures]
    finally:
        if tracer is not None:
            tracer.stop()
    return probes, why or latency_of(probes, tracer)


def _measured(result: ScreenResult) -> dict[str, set[str]]:
    """Per node, the measured flags (not states) a judgment raised."""
    return {
        n["name"]: {f["flag"] for f in n["flags"] if f["flag"] not in STATE_FLAGS}
        for n in result.nodes
    }


def _second_probe_for(
    probes: Sequence[NodeProbe], th: Thresholds, began: float, deadline: float
) -> dict[str, set[str]] | None:
    """A measurement that would exclude a node, or that found no cause, is as likely a busy
    moment of a shared machine as a slow node, so it must repeat: every node is probed once
    more, all at once, so that the suspects run side by side with healthy references. The
    first judgment's measured flags when that is due; None when not (no suspect, or less
    budget left than the first probe took: every flag then stands)."""
    first = judge_screen(probes, [], th)
    suspects = [
        n
        for n in first.nodes
        if n["verdict"]["status"] == "excluded"
        or any(f["kind"] == KIND_UNCLEAR for f in n["flags"])
    ]
    now = time.monotonic()
    return _measured(first) if suspects and deadline - now >= now - began else None


def _repeated(
    first: Mapping[str, set[str]], second: Sequence[NodeProbe], th: Thresholds
) -> dict[str, set[str]]:
    """What the second probe flagged; a node whose second probe failed keeps its first
    flags."""
    repeated = _measured(judge_screen(second, [], th))
    for p in second:
        if p.errors:
            repeated[p.node.name] = set(first.get(p.node.name, set()))
    return repeated


def _probe_again(
    nodes: Sequence[Node],
    probes: Sequence[NodeProbe],
    screen: ScreenDir,
    settings: ScreenSettings,
    th: Thresholds,
    began: float,
    deadline: float,
    progress: Callable[[str], None],
) -> dict[str, set[str]] | None:
    """Every node probed once more, at once as before, into `confirm/`, when the first probe
    raised a flag without a cause (`_second_probe_for`); what repeated, or None."""
    first = _second_probe_for(probes, th, began, deadline)
    if first is None:
        return None
    flagged = sorted(n for n, names in first.items() if names)
    progress(f"probing every node again to confirm: {', '.join(flagged)} flagged")
    second, _ = _probe_round(nodes, ScreenDir(screen.path / "confirm"), settings, deadline)
    return _repeated(first, second, th)


def run_screen_mpi(
    nodes: Sequence[Node],
    config_text: str,
    th: Thresholds,
    settings: ScreenSettings,
    root: str | os.PathLike[str],
) -> tuple[ScreenDir, ScreenResult] | None:
    """One MPI rank per node: each probes its own node, rank 0 judges and writes (and returns
    the result; other ranks return None). Rank r takes the node named by BENCHFS_NODE_NAME,
    else the node whose host is this host's name, else nodes[r]. The network probe is not run
    in this mode (it runs in local screens only; see docs/diagnose.md)."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    if size != len(nodes):
        raise DiagnoseError("EINVAL", f"{size} MPI ranks for {len(nodes)} nodes: use one per node")
    screen = None
    if rank == 0:
        screen = create_screen_dir(root)
        write_nodes(screen.nodes_path, nodes)
        screen.config_path.write_text(config_text)
    path = comm.bcast(None if screen is None else str(screen.path), root=0)
    screen = ScreenDir(Path(path))
    wanted = os.environ.get("BENCHFS_NODE_NAME")
    host = os.uname().nodename
    mine = next((n for n in nodes if n.name == wanted), None)
    if mine is None:
        on_host = [n for n in nodes if n.host == host]
        mine = on_host[0] if len(on_host) == 1 else nodes[rank]
    began = time.monotonic()
    deadline = began + settings.budget_s
    # One tracer per host: the lowest rank of each host traces while its ranks probe.
    host_comm = comm.Split_type(MPI.COMM_TYPE_SHARED)

    def probe_traced(where: ScreenDir) -> tuple[NodeProbe, str | None]:
        raw = where.raw_dir / f"host-{mine.name}"
        tracer, why = start_tracer(raw) if host_comm.Get_rank() == 0 else (None, None)
        if tracer is not None:
            with contextlib.suppress(ParseError):
                tracer.wait_attached()
        path = host_comm.bcast(None if tracer is None else str(tracer.path), root=0)
        why = host_comm.bcast(why, root=0)
        host_comm.Barrier()
        try:
            probe = probe_node(mine, where, settings, deadline)
        finally:
            host_comm.Barrier()
            if tracer is not None:
                tracer.stop()
            host_comm.Barrier()
        return probe, why or (latency_of([probe], None, Path(path)) if path else None)

    mine_probe, tracing = probe_traced(screen)
    probes = comm.gather(mine_probe, root=0)
    reasons = comm.gather(tracing, root=0)
    # A flag without a cause must repeat: rank 0 decides, every rank probes its node again.
    first = _second_probe_for(probes, th, began, deadline) if probes is not None else None
    first = comm.bcast(first, root=0)
    repeated = None
    if first is not None:
        second = comm.gather(probe_traced(ScreenDir(screen.path / "confirm"))[0], root=0)
        repeated = _repeated(first, second, th) if second is not None else None
    if rank != 0:
        return None
    assert probes is not None and reasons is not None
    result = judge_screen(probes, [], th, repeated, tracing=next((r for r in reasons if r), None))
    write_screen(screen, result)
    return screen, result

"""`benchfs-bench diagnose`: the screen's accuracy, measured on simulated nodes.

N simulated nodes on this host (benchfs.simnodes: each its own loop device with ext4 over a
delaying FUSE file system) are screened again and again (quick screens, the default
thresholds). Before each trial one node at random may be made slow, with the trial's kind and
severity drawn from a generator seeded with a recorded seed:

- a slow device: every read and write of the node's device delayed by 2-20 ms;
- slow above the device: a blkio throttle of the node's reads and writes at 25-50% of the
  bandwidth that node delivered in a calibration screen;
- a bimodal device: 3-25% of the device's I/Os (of 128 KiB or less) delayed by 20 ms, the
  rest untouched; named only from the kernel's latency histograms (the screen's judgment
  without them, iostat's averages and fio, is reported beside: `iostat_only`);
- nothing (a quarter of the trials).

`kinds` chooses among the three kinds (all by default). Ground truth: a node is slow if and
only if something was planted on it. Background load
(`stress-ng --cpu 2 --io 1`, on the one host all nodes share) runs throughout: noise, never a
reason to exclude. The report gives precision and recall of the exclusions, the rate of
healthy nodes excluded, whether the kind and the device were named, and the time a screen
took, overall and per severity range; targets: recall 100%, no healthy node excluded, kind
and device right in every detected case.
"""

from __future__ import annotations

import math
import os
import random
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from rich.console import Console

from benchfs import Client
from benchfs.bench.render import fmt, print_lines_and_targets, report_table
from benchfs.cluster import LocalCluster
from benchfs.config import load_config, resolve_config_text, section
from benchfs.diagnose import modes
from benchfs.diagnose.inrun import judge_run
from benchfs.diagnose.judge import KIND_ABOVE, KIND_DEVICE, Flag, decide
from benchfs.diagnose.screen import ScreenSettings, run_screen
from benchfs.errors import BenchError
from benchfs.nodes import Node
from benchfs.probes import blocklat, iostat
from benchfs.results import create_run_dir
from benchfs.simnodes import Disk, Sim, background_load, build_delayfs, node, requirements
from benchfs.simnodes import simulation as sim_context
from benchfs.units import MIB

LOAD = ["stress-ng", "--cpu", "2", "--io", "1"]
DELAY_RANGES = ((2.0, 5.0), (5.0, 10.0), (10.0, 20.0))
"""Device delays (ms per I/O) drawn uniformly from 2-20 ms, reported in these ranges."""
THROTTLE_RANGES = ((0.25, 0.375), (0.375, 0.5))
"""Throttles (share of the node's measured bandwidth) from 25-50%, reported in these ranges."""
BIMODAL_RANGES = ((0.03, 0.06), (0.06, 0.12), (0.12, 0.25))
"""Shares of a bimodal device's I/Os delayed, drawn uniformly from 3-25%, in these ranges."""
BIMODAL_DELAY_MS = 20.0
MODE_SHARE_TOLERANCE = 0.05
"""The share a named mode holds must be within 5 points of the share planted."""
KINDS = ("device", "throttle", "bimodal")
RANGES = {"device": DELAY_RANGES, "throttle": THROTTLE_RANGES, "bimodal": BIMODAL_RANGES}
EXPECTED_KIND = {"device": KIND_DEVICE, "throttle": KIND_ABOVE, "bimodal": KIND_DEVICE}


@dataclass(frozen=True)
class DiagnoseSettings:
    nodes: int = 4
    trials: int = 20
    clean_share: float = 0.25
    seconds: float | None = None
    """The screens' workload probe seconds (None: the configuration's quick_seconds)."""
    load: bool = True
    seed: int | None = None
    disk_mib: int = 512
    inrun_trials: int = 8
    """In-run trials: a cluster on the nodes reads while a node may slow at a random moment."""
    inrun_seconds: float = 8.0
    kinds: tuple[str, ...] = KINDS
    """The kinds planted in the screen trials, in turn (the in-run trials plant device and
    throttle)."""

    @classmethod
    def quick(cls) -> DiagnoseSettings:
        return cls(
            nodes=3,
            trials=2,
            clean_share=0.5,
            seconds=2.0,
            load=False,
            disk_mib=256,
            inrun_trials=0,
        )


@dataclass(frozen=True)
class Plan:
    """What one trial plants: nothing, or a kind on a node with a severity."""

    node: str | None
    kind: str | None  # "device", "throttle", "bimodal" or None
    severity: float | None
    """ms per I/O, the share of the node's bandwidth left, or the share of I/Os delayed."""


def plan_trials(settings: DiagnoseSettings, names: list[str], rng: random.Random) -> list[Plan]:
    """`trials` plans, round(clean_share x trials) of them clean, the rest alternating device
    and throttle, each on a random node; severities cycle through the kind's ranges (so every
    range is tried, mild ones included) and are uniform within the range; then shuffled."""
    clean = round(settings.clean_share * settings.trials)
    plans = [Plan(None, None, None)] * clean
    kinds = settings.kinds
    for i in range(settings.trials - clean):
        kind = kinds[i % len(kinds)]
        ranges = RANGES[kind]
        lo, hi = ranges[(i // len(kinds)) % len(ranges)]
        digits = 1 if kind == "device" else 3
        plans.append(Plan(rng.choice(names), kind, round(rng.uniform(lo, hi), digits)))
    rng.shuffle(plans)
    return plans


def severity_range(plan: Plan) -> str:
    if plan.kind is None or plan.severity is None:
        return "clean"
    ranges = RANGES[plan.kind]
    lo, hi = next(r for r in ranges if plan.severity < r[1] or r == ranges[-1])
    if plan.kind == "device":
        return f"device {lo:g}-{hi:g} ms"
    return f"{plan.kind} {lo:.0%}-{hi:.0%}"


class SimCluster:
    """The simulated nodes the trials screen, built once."""

    def __init__(self, sim: Sim, settings: DiagnoseSettings) -> None:
        self.sim = sim
        self.names = [f"n{i + 1}" for i in range(settings.nodes)]
        self.disks: dict[str, Disk] = {n: sim.disk(n, settings.disk_mib * MIB) for n in self.names}
        self.scratch = {n: sim.mount([self.disks[n]], n) for n in self.names}
        self.bandwidth: dict[str, tuple[float, float]] = {}
        """Per node, (read, write) MiB/s of the calibration screen."""

    def nodes(self, plan: Plan, trial: int) -> list[Node]:
        out = []
        for n in self.names:
            prefix = None
            if plan.kind == "throttle" and plan.node == n and plan.severity is not None:
                read, write = self.bandwidth[n]
                prefix = self.sim.throttled_prefix(
                    f"t{trial}-{n}",
                    self.disks[n],
                    int(read * plan.severity * MIB),
                    int(write * plan.severity * MIB),
                )
            out.append(node(n, self.scratch[n], [self.disks[n]], prefix))
        return out


@contextmanager
def _planted(cluster: SimCluster, plan: Plan) -> Iterator[None]:
    if plan.kind == "device" and plan.node is not None and plan.severity is not None:
        cluster.disks[plan.node].fs.set_delay(plan.severity, plan.severity)
    if plan.kind == "bimodal" and plan.node is not None and plan.severity is not None:
        fs = cluster.disks[plan.node].fs
        fs.set_delay(BIMODAL_DELAY_MS, BIMODAL_DELAY_MS, plan.severity)
    try:
        yield
    finally:
        for d in cluster.disks.values():
            d.fs.set_delay(0.0, 0.0)


def score_trial(plan: Plan, result: dict[str, Any], disks: dict[str, Disk]) -> dict[str, Any]:
    """One trial against its ground truth."""
    by_name = {n["name"]: n for n in result["nodes"]}
    excluded = sorted(n for n, doc in by_name.items() if doc["verdict"]["status"] == "excluded")
    flagged = sorted(n for n, doc in by_name.items() if doc["verdict"]["status"] != "ok")
    out: dict[str, Any] = {
        **asdict(plan),
        "range": severity_range(plan),
        "excluded": excluded,
        "flagged": flagged,
        "healthy_excluded": [n for n in excluded if n != plan.node],
        "flags": {
            n: sorted({f["flag"] for f in doc["flags"]})
            for n, doc in by_name.items()
            if doc["flags"]
        },
        "detected": plan.node is not None and plan.node in excluded,
        "kind_right": None,
        "device_right": None,
        "named_kind": None,
        "mode_share": None,
        "mode_named": None,
        "mode_flagged_healthy": [
            n
            for n, doc in by_name.items()
            if n != plan.node and any(f["flag"] == "dev_latency_mode" for f in doc["flags"])
        ],
        "iostat_only": None,
    }
    if plan.node is not None:
        out["iostat_only"] = iostat_only(by_name[plan.node])
    if plan.kind == "bimodal" and plan.node is not None and plan.severity is not None:
        named = [m for m in by_name[plan.node]["latency"]["modes"] if m.get("flagged")]
        out["mode_share"] = named[0]["share"] if named else None
        out["mode_window"] = named[0]["probe"] if named else None
        out["mode_named"] = bool(named) and (
            abs(named[0]["share"] - plan.severity) <= MODE_SHARE_TOLERANCE
            and named[0]["device"] == disks[plan.node].name
        )
    if out["detected"]:
        doc = by_name[plan.node]
        out["named_kind"] = doc["verdict"]["kind"]
        out["kind_right"] = doc["verdict"]["kind"] == EXPECTED_KIND[plan.kind or ""]
        device = disks[plan.node or ""].name
        out["device_right"] = any(device in r for r in doc["verdict"]["reasons"])
    return out


def iostat_only(node: dict[str, Any]) -> str:
    """The node's verdict without the kernel's latency distributions: its other flags
    decided alone (the screen's judgment as it was before kernel tracing)."""
    flags = [
        Flag(
            f["flag"],
            f.get("kind", ""),
            f.get("evidence", ""),
            math.inf if f.get("severity", 1.0) is None else f.get("severity", 1.0),
            f.get("excludable", True),
            math.inf if f.get("worse", 1.0) is None else f.get("worse", 1.0),
            f.get("family", ""),
        )
        for f in node["flags"]
        if f.get("family") != modes.FAMILY
    ]
    th = section(load_config(None), "diagnose")
    # The node alone against an exclusion cap that cannot bind: its own grounds decide.
    verdicts, _ = decide({"node": flags, "a": [], "b": [], "c": []}, th)
    return verdicts["node"].status


def tracer_cost(screen: Path) -> float | None:
    """The block tracer's own CPU over its wall time in a screen, in % of one core."""
    capture = screen / "raw" / "blocklat.json"
    if not capture.exists():
        return None
    _, extra = blocklat.read_capture(capture)
    cost = extra.get("tracer") or {}
    if cost.get("cpu_s") is None or not cost.get("wall_s"):
        return None
    return 100.0 * cost["cpu_s"] / cost["wall_s"]


INRUN_FILES = 6
INRUN_FILE_BYTES = 8 * MIB


def inrun_trial(
    cluster: SimCluster,
    plan: Plan,
    trial: int,
    settings: DiagnoseSettings,
    th: Any,
    rng: random.Random,
    work: Path,
) -> dict[str, Any]:
    """A cluster of one server per node (each in a blkio cgroup of its own) reads 6 files of
    8 MiB over and over for `inrun_seconds`; at a random moment 2-4 s in, `plan` is planted
    (a device delay, or a throttle written into the server's cgroup at the planned share of
    the rate each node served so far: the run's own bandwidth, which a throttle calibrated on
    the device's would not reach); then
    `benchfs-diagnose judge` judges the run from its telemetry and iostat captures."""
    run = create_run_dir(work / "runs", "local")
    run.diagnose_dir.mkdir()
    config = run.path / "config.toml"
    config.write_text(
        resolve_config_text(
            None,
            [
                f"cluster.expected_servers={len(cluster.names)}",
                "layout.chunk_size=1048576",
                "storage.direct_read=true",
                "storage.durability=memory",
                f"telemetry.dir={run.telemetry_dir}",
                "telemetry.interval_ms=250",
            ],
        )
    )
    groups = {n: cluster.sim.blkio_group(f"r{trial}-{n}") for n in cluster.names}
    servers = LocalCluster(run.registry_dir, config_path=config)
    captures = [
        iostat.Capture(run.iostat_capture(n), [cluster.disks[n].name]) for n in cluster.names
    ]
    planted_at: float | None = None
    try:
        for i, n in enumerate(cluster.names):
            data = cluster.scratch[n] / f"run{trial}"
            servers.start(i, data, run.servers_dir / f"server-{i}.log", n, groups[n].prefix())
        servers.wait_ready(30)
        with Client(str(run.registry_dir), config=config.read_text()) as client:
            payload = bytes(range(256)) * (INRUN_FILE_BYTES // 256)
            files = [
                client.open(f"/f{k}", os.O_RDWR | os.O_CREAT | os.O_TRUNC)
                for k in range(INRUN_FILES)
            ]
            for f in files:
                f.pwrite(payload, 0)
                f.fsync()
            start = time.monotonic()
            plant_after = rng.uniform(2.0, 4.0)
            moved = 0
            while time.monotonic() - start < settings.inrun_seconds:
                elapsed = time.monotonic() - start
                if planted_at is None and elapsed >= plant_after:
                    planted_at = time.time()
                    _plant(cluster, plan, groups, moved / elapsed / len(cluster.names))
                for f in files:
                    if f.pread(INRUN_FILE_BYTES, 0) != payload:
                        raise BenchError("EIO", f"in-run trial {trial}: a read did not verify")
                    moved += INRUN_FILE_BYTES
            for f in files:
                f.close()
    finally:
        for c in captures:
            c.stop()
        servers.stop(grace_s=10)
        _unplant(cluster, groups)
        for n in cluster.names:
            shutil.rmtree(cluster.scratch[n] / f"run{trial}", ignore_errors=True)
    doc = judge_run(run.path, th)
    out = score_inrun(plan, doc, planted_at, cluster.disks)
    out["analysis_agrees"] = analysis_agrees(run.path, doc)
    return out


def analysis_agrees(run: Path, doc: dict[str, Any]) -> bool:
    """Whether benchfs-analyze's BFS-003 names the same slow nodes as the judge, for the same
    run: the two commands share one judgment (`benchfs.slownodes`)."""
    from benchfs.analysis import analyze

    insight = next(i for i in analyze(run).insights if i.id == "BFS-003")
    return [str(n) for n in (insight.data or {}).get("nodes", [])] == doc["slow"]


def _plant(
    cluster: SimCluster, plan: Plan, groups: dict[str, Any], node_bytes_per_s: float
) -> None:
    if plan.node is None or plan.severity is None:
        return
    disk = cluster.disks[plan.node]
    if plan.kind == "device":
        disk.fs.set_delay(plan.severity, plan.severity)
    else:
        limit = max(int(node_bytes_per_s * plan.severity), 1 << 20)
        groups[plan.node].limit(disk, limit, limit)


def _unplant(cluster: SimCluster, groups: dict[str, Any]) -> None:
    for n, d in cluster.disks.items():
        d.fs.set_delay(0.0, 0.0)
        groups[n].limit(d, 0, 0)


def score_inrun(
    plan: Plan, doc: dict[str, Any], planted_at: float | None, disks: dict[str, Disk]
) -> dict[str, Any]:
    """An in-run judgment against what was planted, and when: `slow` are the nodes judged
    slow (the exclusion list), `flagged` all that stood out."""
    slow = list(doc["slow"])
    out: dict[str, Any] = {
        **asdict(plan),
        "range": severity_range(plan),
        "slow": slow,
        "flagged": list(doc["flagged"]),
        "healthy_slow": [n for n in slow if n != plan.node],
        "healthy_flagged": [n for n in doc["flagged"] if n != plan.node],
        "detected": plan.node is not None and plan.node in slow,
        "kind_right": None,
        "device_right": None,
        "onset_error_s": None,
    }
    if out["detected"]:
        entry = next(e for e in doc["nodes"] if e["node"] == plan.node)
        out["kind_right"] = entry.get("kind") == EXPECTED_KIND[plan.kind or ""]
        out["device_right"] = (entry.get("device") or {}).get("device") == disks[
            plan.node or ""
        ].name
        onsets = [f["onset_utc"] for f in entry["flags"] if f.get("onset_utc")]
        if onsets and planted_at is not None:
            first = min(datetime.fromisoformat(x).timestamp() for x in onsets)
            out["onset_error_s"] = round(first - planted_at, 2)
    return out


def summarize_inrun(trials: list[dict[str, Any]]) -> dict[str, Any]:
    planted = [t for t in trials if t["node"] is not None]
    detected = [t for t in planted if t["detected"]]
    errors = [abs(t["onset_error_s"]) for t in detected if t["onset_error_s"] is not None]
    return {
        "trials": len(trials),
        "planted": len(planted),
        "detected": len(detected),
        "healthy_slow": sum(len(t["healthy_slow"]) for t in trials),
        "healthy_flagged": sum(len(t["healthy_flagged"]) for t in trials),
        "kind_right": sum(1 for t in detected if t["kind_right"]),
        "device_right": sum(1 for t in detected if t["device_right"]),
        "onsets": len(errors),
        "onset_error_max_s": max(errors) if errors else None,
        "analysis_agrees": sum(1 for t in trials if t.get("analysis_agrees")),
    }


def summarize(trials: list[dict[str, Any]], nodes: int) -> dict[str, Any]:
    """Precision, recall, false exclusions, kind and device accuracy over `trials`."""
    planted = [t for t in trials if t["node"] is not None]
    detected = [t for t in planted if t["detected"]]
    exclusions = sum(len(t["excluded"]) for t in trials)
    false = sum(len(t["healthy_excluded"]) for t in trials)
    healthy_screenings = sum(nodes - (1 if t["node"] else 0) for t in trials)
    return {
        "trials": len(trials),
        "planted": len(planted),
        "detected": len(detected),
        "recall": len(detected) / len(planted) if planted else None,
        "precision": (exclusions - false) / exclusions if exclusions else None,
        "healthy_excluded": false,
        "false_exclusion_rate": false / healthy_screenings if healthy_screenings else None,
        "kind_right": sum(1 for t in detected if t["kind_right"]),
        "device_right": sum(1 for t in detected if t["device_right"]),
        "flagged_healthy": sum(len([n for n in t["flagged"] if n != t["node"]]) for t in trials),
        "median_screen_s": sorted(t["screen_s"] for t in trials)[len(trials) // 2]
        if trials
        else None,
        "bimodal": sum(1 for t in planted if t["kind"] == "bimodal"),
        "mode_named": sum(1 for t in planted if t.get("mode_named")),
        "mode_flagged_healthy": sum(len(t.get("mode_flagged_healthy", [])) for t in trials),
        "iostat_only_excluded": sum(
            1 for t in planted if t["kind"] == "bimodal" and t.get("iostat_only") == "excluded"
        ),
        "iostat_only_flagged": sum(
            1 for t in planted if t["kind"] == "bimodal" and t.get("iostat_only") != "ok"
        ),
        "tracer_cpu_pct_max": max(
            (t["tracer_cpu_pct"] for t in trials if t.get("tracer_cpu_pct") is not None),
            default=None,
        ),
    }


def run_diagnose(
    work: Path, settings: DiagnoseSettings, progress: Callable[[str], None]
) -> dict[str, Any]:
    """Build the nodes, calibrate, run every trial, and report."""
    missing = requirements()
    if settings.load and shutil.which(LOAD[0]) is None:
        missing.append(f"{LOAD[0]} (apt-get install stress-ng)")
    if missing:
        raise BenchError("ENOTSUP", f"the simulated nodes need {', '.join(missing)}")
    seed = settings.seed if settings.seed is not None else random.SystemRandom().randrange(2**32)
    rng = random.Random(seed)
    th = section(load_config(None), "diagnose")
    config_text = resolve_config_text()
    screen = ScreenSettings.from_thresholds(th, quick=True, network=False, seconds=settings.seconds)
    results = work / "screens"
    trials: list[dict[str, Any]] = []
    with ExitStack() as stack:
        delayfs = build_delayfs(Path(stack.enter_context(tempfile.TemporaryDirectory())))
        sim = stack.enter_context(sim_context(work / "sim", delayfs))
        if settings.load:
            stack.enter_context(background_load(LOAD))
        cluster = SimCluster(sim, settings)
        if settings.trials:
            # The screen trials' throttles are shares of each node's calibrated bandwidth (the
            # in-run trials take the run's own rate).
            progress(f"{settings.nodes} nodes built; calibration screen (seed {seed})")
            _, calib = run_screen(cluster.nodes(Plan(None, None, None), 0), config_text, th,
                                  screen, results)  # fmt: skip
            for n in calib.nodes:
                m = n["metrics"]
                cluster.bandwidth[n["name"]] = (
                    m.get("fio_seqread_mib_s") or 100.0,
                    m.get("fio_seqwrite_mib_s") or 100.0,
                )
        for i, plan in enumerate(plan_trials(settings, cluster.names, rng), start=1):
            what = "nothing" if plan.node is None else f"{plan.kind} {plan.severity} on {plan.node}"
            progress(f"trial {i}/{settings.trials}: {what}")
            with _planted(cluster, plan):
                began = time.monotonic()
                where, result = run_screen(cluster.nodes(plan, i), config_text, th, screen, results)
                seconds = time.monotonic() - began
            t = score_trial(plan, result.to_json(), cluster.disks)
            t["screen_s"] = seconds
            t["trial"] = i
            t["tracing"] = result.tracing or "on"
            t["tracer_cpu_pct"] = tracer_cost(where.path)
            trials.append(t)
            progress(
                f"  excluded {t['excluded'] or 'none'}"
                + (f"; kind {t['named_kind']}" if t["detected"] else "")
                + (f"; mode share {t['mode_share']}" if plan.kind == "bimodal" else "")
                + (f"; without the distributions: {t['iostat_only']}" if plan.node else "")
            )
        inrun: list[dict[str, Any]] = []
        plans = plan_trials(
            DiagnoseSettings(
                trials=settings.inrun_trials,
                clean_share=settings.clean_share,
                kinds=("device", "throttle"),
            ),
            cluster.names,
            rng,
        )
        for i, plan in enumerate(plans, start=1):
            what = "nothing" if plan.node is None else f"{plan.kind} {plan.severity} on {plan.node}"
            progress(f"in-run trial {i}/{settings.inrun_trials}: {what}, planted mid-run")
            t = inrun_trial(cluster, plan, i, settings, th, rng, work)
            t["trial"] = i
            inrun.append(t)
            progress(
                f"  slow {t['slow'] or 'none'} (stood out: {t['flagged'] or 'none'}); onset "
                f"error {t['onset_error_s']} s"
            )
    ranges: dict[str, list[dict[str, Any]]] = {}
    for t in trials:
        ranges.setdefault(t["range"], []).append(t)
    summary = summarize(trials, settings.nodes)
    inrun_summary = summarize_inrun(inrun)
    targets = [
        {"target": "recall 100%", "met": summary["recall"] in (None, 1.0)},
        {"target": "no healthy node excluded", "met": summary["healthy_excluded"] == 0},
        {
            "target": "kind and device right in every detected case",
            "met": summary["kind_right"] == summary["detected"] == summary["device_right"],
        },
    ]
    if summary["bimodal"]:
        targets.append(
            {
                "target": "every bimodal device named, its mode's share within 5 points of "
                "what was planted",
                "met": summary["mode_named"] == summary["bimodal"],
            }
        )
    if any(t.get("tracer_cpu_pct") is not None for t in trials):
        targets.append(
            {
                "target": "no healthy device flagged for a latency mode; the tracer at most 2% "
                "of a core",
                "met": summary["mode_flagged_healthy"] == 0
                and (summary["tracer_cpu_pct_max"] or 0.0) <= 2.0,
            }
        )
    if inrun:
        targets.append(
            {
                "target": "in-run: every planted node judged slow, no healthy one, onset "
                "within 2 s, benchfs-analyze agreeing",
                "met": inrun_summary["detected"] == inrun_summary["planted"]
                and inrun_summary["healthy_slow"] == 0
                and inrun_summary["analysis_agrees"] == inrun_summary["trials"]
                and inrun_summary["onsets"] == inrun_summary["detected"]
                and (inrun_summary["onset_error_max_s"] or 0.0) <= 2.0,
            }
        )
    return {
        "case": "diagnose",
        "seed": seed,
        "settings": asdict(settings),
        "screen_seconds": screen.workload_seconds,
        "thresholds": th.to_dict(),
        "summary": summary,
        "ranges": {k: summarize(v, settings.nodes) for k, v in sorted(ranges.items())},
        "trials": trials,
        "inrun": {"summary": inrun_summary, "trials": inrun},
        "targets": targets,
    }


def keep_trials(work: Path, keep: Path) -> None:
    """The trials' screen and run directories (not the nodes' images), copied into `keep`."""
    for name in ("screens", "runs"):
        if (work / name).is_dir():
            shutil.copytree(work / name, keep / name, dirs_exist_ok=True, symlinks=True)


def render(console: Console, report: dict[str, Any]) -> None:
    s = report["settings"]
    table = report_table(
        f"benchfs-bench diagnose: {report['summary']['trials']} quick screens of {s['nodes']} "
        f"simulated nodes (seed {report['seed']}, load {'on' if s['load'] else 'off'})",
        ["trials", "detected", "healthy excluded", "healthy flagged", "kind right", "device right"],
    )

    def row(label: str, x: dict[str, Any]) -> None:
        det = f"{x['detected']}/{x['planted']}" if x["planted"] else "-"
        table.add_row(
            label,
            str(x["trials"]),
            det,
            str(x["healthy_excluded"]),
            str(x["flagged_healthy"]),
            f"{x['kind_right']}/{x['detected']}" if x["detected"] else "-",
            f"{x['device_right']}/{x['detected']}" if x["detected"] else "-",
        )

    for name, x in report["ranges"].items():
        row(name, x)
    row("all", report["summary"])
    console.print(table)
    x = report["summary"]

    def pct(v: float | None) -> str:
        return "-" if v is None else f"{v:.0%}"

    lines = [
        ("recall", pct(x["recall"])),
        ("precision", pct(x["precision"])),
        ("false exclusions", f"{pct(x['false_exclusion_rate'])} of healthy-node screenings"),
        ("screen time", f"median {fmt(x['median_screen_s'], 1)} s"),
    ]
    if x["bimodal"]:
        lines.append(
            (
                "bimodal devices",
                f"{x['mode_named']}/{x['bimodal']} named with the mode's share within 5 points; "
                f"without the distributions {x['iostat_only_excluded']}/{x['bimodal']} excluded, "
                f"{x['iostat_only_flagged']}/{x['bimodal']} flagged; healthy devices flagged for "
                f"a mode: {x['mode_flagged_healthy']}",
            )
        )
    if x["tracer_cpu_pct_max"] is not None:
        lines.append(("block tracer", f"at most {x['tracer_cpu_pct_max']:.2f}% of a core"))
    else:
        reasons = {t.get("tracing") for t in report["trials"]} - {"on", None}
        lines.append(("block tracer", "; ".join(sorted(reasons)) or "not run"))
    r = report["inrun"]["summary"]
    if r["trials"]:
        lines.append(
            (
                "in-run",
                f"{r['detected']}/{r['planted']} planted nodes judged slow, "
                f"{r['healthy_slow']} healthy (and {r['healthy_flagged']} stood out), kind "
                f"{r['kind_right']}/{r['detected']}, device {r['device_right']}/{r['detected']}, "
                f"onset error at most {fmt(r['onset_error_max_s'], 1)} s ({r['onsets']} onsets); "
                f"benchfs-analyze agreed in {r['analysis_agrees']}/{r['trials']}",
            )
        )
    print_lines_and_targets(console, lines, report["targets"])

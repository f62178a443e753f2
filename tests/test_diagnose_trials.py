"""Real slow-node trials: simulated nodes made of loop devices, FUSE delays, blkio cgroups and
network namespaces (tests/diagnose_sim.py), screened with benchfs-diagnose."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from benchfs import Client
from benchfs.analysis import analyze
from benchfs.cluster import LocalCluster
from benchfs.config import load_config, resolve_config_text, section
from benchfs.diagnose.inrun import judge_run
from benchfs.diagnose.screen import ScreenSettings, load_screen, run_screen
from benchfs.mpi import MpiLauncher
from benchfs.nodes import Node, read_exclusions, write_nodes
from benchfs.probes import iostat
from benchfs.results import create_run_dir
from diagnose_sim import MIB, Sim, delayfs_or_skip, node, simulation

# Run alone, after the parallel part of make test-python:
# loop devices, blkio throttling and tc shaping, judged by speed under load.
pytestmark = pytest.mark.serial


QUICK_SECONDS = "3"
SLOW_MS = 20.0


@pytest.fixture(scope="module")
def delayfs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return delayfs_or_skip(tmp_path_factory.mktemp("delayfs"))


@pytest.fixture
def sim(tmp_path: Path, delayfs: Path) -> Iterator[Sim]:
    with simulation(tmp_path / "sim", delayfs) as s:
        yield s


def diagnose(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "benchfs.cli.diagnose", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def by_name(doc: dict) -> dict[str, dict]:
    return {n["name"]: n for n in doc["nodes"]}


def test_screen_finds_slow_device_and_slow_link(sim: Sim, tmp_path: Path) -> None:
    """Three nodes in network namespaces, each with its own scratch on its own loop device;
    n3's device takes 20 ms per read, and the link between n1 and n2 is shaped. The screen
    (CLI, --quick) excludes n3 as a slow device and flags the n1-n2 pair, nothing else."""
    names = ["n1", "n2", "n3"]
    disks = {n: sim.disk(n) for n in names}
    scratch = {n: sim.mount([disks[n]], n) for n in names}
    net = sim.network(names)
    sim.shape_pair(net["n1"], net["n2"], "100mbit")
    nodes = [node(n, scratch[n], [disks[n]], net[n].prefix()) for n in names]
    nodes_file = tmp_path / "nodes.toml"
    write_nodes(nodes_file, nodes)
    disks["n3"].fs.set_delay(SLOW_MS)
    out = diagnose(
        "screen", "--nodes", str(nodes_file), "--quick", "--seconds", QUICK_SECONDS,
        "--results-root", str(tmp_path / "results"), "--json",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    nodes_by = by_name(doc)
    slow = nodes_by["n3"]
    assert slow["verdict"]["status"] == "excluded", slow
    assert slow["verdict"]["kind"] == "slow device"
    assert slow["metrics"]["dev_r_await_ms"] >= SLOW_MS * 0.8
    assert slow["metrics"]["dev_worst"] == disks["n3"].name
    assert any(f["flag"] == "dev_r_await_abs" for f in slow["flags"]), slow
    assert doc["excluded"] == [{"host": "host-n3", "reasons": slow["verdict"]["reasons"]}]
    for n in ("n1", "n2"):
        flags = nodes_by[n]["flags"]
        assert [f["flag"] for f in flags] == ["network_pair"], flags
        assert (
            "pair n1<->n2" in flags[0]["evidence"] and nodes_by[n]["verdict"]["status"] == "flagged"
        )
    pairs = {p["pair"]: p for p in doc["pairs"]}
    assert pairs["n1<->n2"]["flags"] and not pairs["n1<->n3"]["flags"]
    assert pairs["n1<->n3"]["mib_s"] > 3 * pairs["n1<->n2"]["mib_s"]
    screen = Path(doc["screen_dir"])
    assert read_exclusions(screen / "excluded.txt")[0].host == "host-n3"
    assert (screen / "raw" / "n3" / "fio-workload.json").exists()
    assert (screen / "raw" / "n3" / "iostat.json").exists()
    assert (screen / "raw" / "network" / "n1--n2" / "client.log").exists()
    csv_lines = (screen / "screen.csv").read_text().splitlines()
    assert len(csv_lines) == 4 and csv_lines[3].startswith("host-n3,n3,excluded,slow device")
    shown = diagnose("show", str(screen), "--csv")
    assert shown.returncode == 0 and shown.stdout == (screen / "screen.csv").read_text()
    table = diagnose("show", str(screen))
    assert table.returncode == 0 and "excluded" in table.stdout and "n1<->n2" in table.stdout
    # Off a terminal (a pipe here) nothing is cut to fit 80 columns.
    assert "…" not in table.stdout and flags[0]["evidence"] in table.stdout


def test_screen_slow_above_the_device_and_member_asymmetry(sim: Sim, tmp_path: Path) -> None:
    """Five nodes on btrfs: a and b on one device, c on twin devices (RAID0), d on twins one of
    which takes 20 ms per read, e throttled by the blkio cgroup. d is a slow device (the
    member against its twin), e slow above the device (its own r_await stays low)."""
    disks = {n: [sim.disk(n)] for n in ("a", "b", "e")}
    disks["c"] = [sim.disk("c0"), sim.disk("c1")]
    disks["d"] = [sim.disk("d0"), sim.disk("d1")]
    scratch = {n: sim.mount(d, n, btrfs=True) for n, d in disks.items()}
    prefix = sim.throttled_prefix("e", disks["e"][0], 40 * MIB)
    nodes = [node(n, scratch[n], disks[n], prefix if n == "e" else None) for n in "abcde"]
    disks["d"][1].fs.set_delay(SLOW_MS)
    # Five nodes loading two CPUs queue up to ~30 ms in their (healthy) loop devices under
    # the many-files load, so the absolute r_await rule is set above that here.
    overrides = ["diagnose.max_exclude_share=0.4", "diagnose.r_await_ms=100"]
    th = section(load_config(None, overrides), "diagnose")
    settings = ScreenSettings.from_thresholds(
        th, quick=True, network=False, seconds=float(QUICK_SECONDS)
    )
    screen, _ = run_screen(nodes, resolve_config_text(), th, settings, tmp_path / "results")
    doc = load_screen(screen.path)
    nodes_by = by_name(doc)
    d, e = nodes_by["d"], nodes_by["e"]
    assert d["verdict"]["kind"] == "slow device", d
    member = [f for f in d["flags"] if f["flag"] == "member_asymmetry"]
    assert member and f"member {disks['d'][1].name}" in member[0]["evidence"], d
    assert e["verdict"]["kind"] == "slow above the device", e
    assert e["metrics"]["dev_r_await_ms"] < SLOW_MS / 2
    assert any("the device is not slow" in f["evidence"] for f in e["flags"])
    for ok in "abc":
        if nodes_by[ok]["verdict"]["status"] != "ok":  # its flags whole (a repr cuts them)
            pytest.fail(json.dumps({k: nodes_by[ok].get(k) for k in ("verdict", "flags")}))
    assert {x["host"] for x in doc["excluded"]} == {"host-d", "host-e"}
    # The healthy twins are not told apart: no member flag on c. (Its raw member ratio is
    # not asserted: with five nodes queueing on two CPUs one loop device's r_await spiked to
    # 7x its twin's in one run of three, a spike the screen rightly did not flag.)
    assert not any(f["flag"] == "member_asymmetry" for f in nodes_by["c"]["flags"]), nodes_by["c"]


def test_judge_a_run_whose_node_slowed_after_the_screen(sim: Sim, tmp_path: Path) -> None:
    """A pre-run screen passes a node, then its device slows during the run.
    `benchfs-diagnose judge` finds the node from the servers' telemetry, when it slowed, its
    device (from the run's iostat capture), its share of the delay, and that the screen had
    not flagged it."""
    names = ["n1", "n2", "n3"]
    disks = {n: sim.disk(n, 256 * MIB) for n in names}
    scratch = {n: sim.mount([disks[n]], n) for n in names}
    nodes = [node(n, scratch[n], [disks[n]]) for n in names]
    th = section(load_config(), "diagnose")
    settings = ScreenSettings.from_thresholds(th, quick=True, network=False, seconds=2.0)
    screen, _ = run_screen(nodes, resolve_config_text(), th, settings, tmp_path / "screens")
    # The node to slow is one the screen passed. (That a quick screen of healthy nodes flags
    # none of them is not asserted here: noise can still flag one; issue 26's harness measures
    # how often.)
    status = {n["name"]: n["verdict"]["status"] for n in load_screen(screen.path)["nodes"]}
    slow = next((n for n in reversed(names) if status[n] == "ok"), None)
    assert slow is not None, status

    run = create_run_dir(tmp_path / "results", "local")
    run.diagnose_dir.mkdir()
    run.prerun_screen.write_bytes(screen.screen_json.read_bytes())
    config = run.path / "config.toml"
    config.write_text(
        resolve_config_text(
            None,
            [
                "cluster.expected_servers=3",
                "layout.chunk_size=1048576",
                "storage.direct_read=true",
                # The judge is measured on data reads, as before metadata was persisted (the
                # metadata store's writeback shares these small loop devices with the setup's
                # fsyncs).
                "storage.durability=memory",
                f"telemetry.dir={run.telemetry_dir}",
                "telemetry.interval_ms=250",
            ],
        )
    )
    cluster = LocalCluster(run.registry_dir, config_path=config)
    captures = [iostat.Capture(run.iostat_capture(n), [disks[n].name]) for n in names]
    try:
        for i, n in enumerate(names):
            cluster.start(i, scratch[n] / "data", run.servers_dir / f"server-{i}.log", n)
        cluster.wait_ready(30)
        with Client(str(run.registry_dir), config=config.read_text()) as client:
            data = bytes(range(256)) * 4096 * 8  # 8 MiB
            files = [client.open(f"/f{k}", os.O_RDWR | os.O_CREAT | os.O_TRUNC) for k in range(6)]
            for f in files:
                assert f.pwrite(data, 0) == len(data)
                f.fsync()
            start = time.monotonic()
            slowed = False
            while time.monotonic() - start < 6.0:
                if not slowed and time.monotonic() - start > 2.5:
                    disks[slow].fs.set_delay(30.0)
                    slowed = True
                for f in files:
                    assert len(f.pread(len(data), 0)) == len(data)
            for f in files:
                f.close()
    finally:
        for c in captures:
            c.stop()
        cluster.stop(grace_s=10)
    assert cluster.leftover_pids() == []
    doc = judge_run(run.path, th)
    assert doc["slow"] == [slow], doc
    # One judgment of a run: benchfs-analyze's BFS-003 names the same node.
    (bfs003,) = [i for i in analyze(run.path).insights if i.id == "BFS-003"]
    assert bfs003.fired and bfs003.data["nodes"] == [slow], bfs003
    slowed = next(e for e in doc["nodes"] if e["node"] == slow)
    (finding,) = [f for f in slowed["flags"] if f["op"] == "read"]
    assert finding["onset_s"] is not None and "rose at" in finding["how"]
    assert slowed["read_delay_share"] > 0.8
    # Its device's read latency over the run (weighted by reads, so the fast first 2.5 s pull
    # it down from the injected 30 ms) stands far above the healthy nodes' devices.
    healthy = [e["device"]["r_await_ms"] for e in doc["nodes"] if e["node"] != slow]
    assert slowed["device"]["device"] == disks[slow].name
    assert slowed["device"]["r_await_ms"] > max(5.0, 3 * max(healthy)), (slowed["device"], healthy)
    assert slowed["kind"] == "slow device" and slowed["screen"] == "ok"
    assert doc["missed_by_screen"] == [slow]
    assert run.judge_csv.read_text().splitlines()[0].startswith("node,kind,screen")
    # The same exclusion files as a screen's, with the onset in wall-clock time.
    (excluded,) = read_exclusions(run.diagnose_dir)
    assert excluded.host == slow  # no nodes.toml in this run: the node's name
    assert f"rose at t={finding['onset_s']:.1f} s ({finding['onset_utc']})" in excluded.reasons[0]
    assert "of the run's excess read delay" in excluded.reasons[0]
    assert (run.diagnose_dir / "excluded.txt").read_text() == f"{slow}\n"
    out = diagnose("judge", str(run.path))
    assert (
        out.returncode == 0 and slow in out.stdout and f"missed by the screen: {slow}" in out.stdout
    )


@pytest.mark.long
def test_screen_random_slow_node_and_delay(sim: Sim, tmp_path: Path) -> None:
    """`make test-long`: four nodes, a random one slowed by a random delay, default-length
    quick probes; exactly that node is excluded as a slow device."""
    rng = random.Random()
    names = ["n1", "n2", "n3", "n4"]
    slow, delay = rng.choice(names), rng.choice([8.0, 15.0, 30.0, 60.0])
    disks = {n: sim.disk(n) for n in names}
    nodes = [node(n, sim.mount([disks[n]], n), [disks[n]]) for n in names]
    disks[slow].fs.set_delay(delay)
    th = section(load_config(), "diagnose")
    settings = ScreenSettings.from_thresholds(th, quick=True, network=False)
    _, result = run_screen(nodes, resolve_config_text(), th, settings, tmp_path / "results")
    assert [e.host for e in result.excluded] == [f"host-{slow}"], (slow, delay, result.to_json())
    doc = by_name(result.to_json())
    assert doc[slow]["verdict"]["kind"] == "slow device"
    assert all(doc[n]["verdict"]["status"] == "ok" for n in names if n != slow)


@pytest.mark.long
def test_screen_under_mpi_one_rank_per_node(tmp_path: Path) -> None:
    """`--mpi`: two ranks, each probes its node (plain directories here), rank 0 judges."""
    nodes_file = tmp_path / "nodes.toml"
    for n in ("a", "b"):
        (tmp_path / n).mkdir()
    write_nodes(nodes_file, [Node(n, f"host-{n}", str(tmp_path / n)) for n in ("a", "b")])
    launcher = MpiLauncher()
    argv = [sys.executable, "-m", "benchfs.cli.diagnose", "screen", "--mpi", "--no-network"]
    argv += ["--nodes", str(nodes_file), "--quick", "--seconds", "2", "--json"]
    argv += ["--results-root", str(tmp_path / "results")]
    out = subprocess.run(
        launcher.command(2, argv),
        capture_output=True,
        text=True,
        timeout=300,
        env=launcher.env(dict(os.environ)),
        check=False,
    )
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert sorted(n["name"] for n in doc["nodes"]) == ["a", "b"]
    for n in doc["nodes"]:
        assert n["metrics"]["fio_workload_mib_s"] > 0 and n["metrics"]["dev_r_await_ms"] is not None


@pytest.mark.timeout(120)
def test_bench_diagnose_quick_runs_a_planted_and_a_clean_trial(
    delayfs: Path, tmp_path: Path
) -> None:
    """`benchfs-bench diagnose --quick`: two trials (one planted, one clean) on simulated
    nodes, scored against what was planted. The shape is asserted, not the accuracy (the full
    run's figures are in docs/diagnose.md)."""
    out = subprocess.run(
        [sys.executable, "-m", "benchfs.cli.bench", "diagnose", "--quick", "--json",
         "--seed", "7", "--dir", str(tmp_path)],
        capture_output=True, text=True, timeout=110, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["seed"] == 7 and len(report["trials"]) == 2
    planted = [t for t in report["trials"] if t["node"] is not None]
    assert len(planted) == 1 and planted[0]["kind"] in ("device", "throttle")
    assert {t["range"] for t in report["trials"]} >= {"clean"}
    s = report["summary"]
    assert s["planted"] == 1 and s["trials"] == 2 and 0 <= s["detected"] <= 1
    expected = {
        "recall 100%",
        "no healthy node excluded",
        "kind and device right in every detected case",
    }
    if any(t["tracer_cpu_pct"] is not None for t in report["trials"]):
        expected.add(
            "no healthy device flagged for a latency mode; the tracer at most 2% of a core"
        )
    assert {t["target"] for t in report["targets"]} == expected
    assert list(tmp_path.iterdir()) == []  # nodes, images and screens removed


def test_trials_are_scored_against_what_was_planted() -> None:
    """Ground truth: a node is slow if and only if something was planted on it."""
    from benchfs.bench.diagnose import Plan, score_trial, severity_range, summarize

    class D:  # the planted disk's name is all the scoring reads
        name = "loop7"

    def node_doc(name: str, status: str, kind: str | None, reasons: list[str]) -> dict:
        verdict = {"status": status, "kind": kind, "reasons": reasons}
        return {"name": name, "verdict": verdict, "flags": [{"flag": "x"}] if reasons else []}

    planted = Plan("n2", "throttle", 0.3)
    result = {
        "nodes": [
            node_doc("n1", "excluded", "slow device", ["slow"]),
            node_doc("n2", "excluded", "slow above the device", ["limits loop7 reads"]),
            node_doc("n3", "flagged", "slow (cause unclear)", ["?"]),
        ]
    }
    t = score_trial(planted, result, {"n2": D()})  # type: ignore[dict-item]
    assert t["detected"] and t["kind_right"] and t["device_right"]
    assert t["healthy_excluded"] == ["n1"] and t["flagged"] == ["n1", "n2", "n3"]
    assert severity_range(planted) == "throttle 25%-38%"
    assert severity_range(Plan("n1", "device", 20.0)) == "device 10-20 ms"
    clean = score_trial(Plan(None, None, None), {"nodes": result["nodes"][2:]}, {})
    t["screen_s"] = clean["screen_s"] = 1.0
    s = summarize([t, clean], 3)
    assert s["recall"] == 1.0 and s["precision"] == 0.5 and s["healthy_excluded"] == 1
    assert s["false_exclusion_rate"] == 1 / 5  # 2 healthy in the planted trial, 3 in the clean


def test_inrun_trials_are_scored_on_node_kind_device_and_onset() -> None:
    from benchfs.bench.diagnose import Plan, score_inrun, summarize_inrun

    class D:
        name = "loop4"

    doc = {
        "slow": ["n2"],
        "flagged": ["n1", "n2"],
        "nodes": [
            {"node": "n1", "flags": [{"onset_utc": None}]},
            {
                "node": "n2",
                "kind": "slow device",
                "device": {"device": "loop4"},
                "flags": [{"onset_utc": "2026-11-25T10:00:03+00:00"}],
            },
        ],
    }
    planted_at = datetime(2026, 11, 25, 10, 0, 1, 500000, tzinfo=UTC).timestamp()
    t = score_inrun(Plan("n2", "device", 5.0), doc, planted_at, {"n2": D()})  # type: ignore[dict-item]
    assert t["detected"] and t["kind_right"] and t["device_right"]
    assert t["onset_error_s"] == 1.5 and t["healthy_slow"] == []
    assert t["healthy_flagged"] == ["n1"]  # stood out, not judged slow: not excluded
    clean = score_inrun(Plan(None, None, None), doc, None, {})
    assert clean["healthy_slow"] == ["n2"] and not clean["detected"]
    s = summarize_inrun([t, clean])
    assert (s["planted"], s["detected"], s["healthy_slow"], s["onset_error_max_s"]) == (
        1,
        1,
        1,
        1.5,
    )
    assert s["healthy_flagged"] == 3

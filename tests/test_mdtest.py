"""The built-in mdtest-like workload under mpiexec, on real `benchfsd` daemons."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from benchfs import Client
from benchfs.cluster import LocalCluster, child_env
from benchfs.mpi import MpiLauncher
from benchfs.parsers import parse_mdtest
from benchfs.results import read_json
from benchfs.workloads.mdtest import contents
from conftest import benchfs_run_command, run_bounded

RANKS = 3


def run_mdtest(cluster: LocalCluster | None, args: list[str], registry: Path | None = None):
    launcher = MpiLauncher()
    argv = [sys.executable, "-m", "benchfs.workloads.mdtest", *args]
    if cluster is not None:
        argv += ["--registry", str(cluster.registry_dir), "--config", str(cluster.config_path)]
    else:
        argv += ["--registry", str(registry)]
    return run_bounded(launcher.command(RANKS, argv), 60, env=launcher.env(child_env()))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("unique", [False, True])
def test_phases_rates_and_cleanup(daemon_cluster, tmp_path: Path, unique: bool) -> None:
    cluster = daemon_cluster(2)
    out = tmp_path / "out"
    args = ["-n", "20", "-w", "100", "-i", "2", "--out", str(out)] + (["-u"] if unique else [])
    proc = run_mdtest(cluster, args)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # mdtest 4.x's table, read by the parser that reads real mdtest's output.
    assert "SUMMARY rate (in ops/sec): (of 2 iterations)" in proc.stdout
    printed = {r.operation: r for r in parse_mdtest(proc.stdout, "built-in mdtest")}
    assert list(printed) == ["create", "stat", "read", "remove", "tree_create", "tree_remove"]
    summary = read_json(out / "summary.json")
    for row in summary["rows"]:
        assert row["iterations"] == 2 and row["ops_min_s"] <= row["ops_s"] <= row["ops_max_s"]
        assert printed[row["operation"]].ops_s == pytest.approx(row["ops_s"], abs=0.001)
    assert summary["verified"] is True and summary["errors"] == []
    assert summary["unique_dir"] is unique
    for phase in ("create", "stat", "read", "remove"):
        assert summary["rates"][phase] > 0
        assert len(summary["rate_samples"][phase]) == 2
    with Client(cluster.registry_dir, config=cluster.config_path.read_text()) as c:
        assert c.listdir("/mdtest") == []  # every file and directory was removed


def test_contents_name_rank_and_file() -> None:
    data = contents(2, 17, 100)
    assert len(data) == 100 and data.startswith(b"mdtest rank 2 file 17\n")
    assert contents(2, 17, 0) == b""


@pytest.mark.timeout(60)
def test_bad_options_exit_2(tmp_path: Path) -> None:
    for args, message in ((["-n", "0"], "-n"), (["-n", "x"], "-n"), (["-n", "1", "-d", "/"], "-d")):
        proc = run_mdtest(None, args, registry=tmp_path)
        assert proc.returncode == 2, proc.stderr
        assert "benchfs mdtest: error:" in proc.stderr and message in proc.stderr


@pytest.mark.timeout(180)
def test_benchfs_run_local_runs_mdtest(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            *benchfs_run_command(),
            *("launch", "--workload", "mdtest", "--mdtest-args", "-n 30 -u"),
            *("--results-root", str(tmp_path), "--json"),
        ],
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert report["workload"] == "mdtest" and report["verified"] is True
    manifest = read_json(Path(report["results_dir"]) / "manifest.json")
    assert manifest["workload"]["rates"]["create"] > 0
    assert manifest["workload"]["unique_dir"] is True
    # The rates reach the run's summary (--json rows) and its table.
    rows = {r["operation"]: r for r in report["rows"]}
    assert rows["create"]["ops_s"] == pytest.approx(manifest["workload"]["rates"]["create"])
    assert {"create", "stat", "read", "remove"} <= set(rows)


@pytest.mark.timeout(180)
def test_phases_one_at_a_time_and_a_stonewalled_creation(daemon_cluster, tmp_path: Path) -> None:
    """mdtest's phase flags as IO500 uses them: creation (-C) under a stonewall (-W) that
    stops it early, every rank then wearing out to the most files any rank made, the count
    recorded in the -x file; stat (-T), read (-E) and removal (-r) in later runs use it."""
    cluster = daemon_cluster(2)
    wall = tmp_path / "mdtest.stonewall"
    common = ["-u", "-w", "100", "-d", "/io", "-x", str(wall)]
    created = run_mdtest(cluster, ["-C", "-W", "1", "-n", "1000000", *common])
    assert created.returncode == 0, created.stdout + created.stderr
    count = int(wall.read_text())
    assert 0 < count < 1_000_000
    rows = {r.operation for r in parse_mdtest(created.stdout, "create")}
    assert rows == {"create", "tree_create"}
    with Client(cluster.registry_dir, config=cluster.config_path.read_text()) as c:
        per_rank = [len(c.listdir(f"/io/test-dir.0-0/mdtest_tree.{r}")) for r in range(RANKS)]
    assert per_rank == [count] * RANKS  # the wear-out evened the ranks out
    for flag, op in (("-T", "stat"), ("-E", "read"), ("-r", "remove")):
        proc = run_mdtest(cluster, [flag, "-n", "1", *common])  # -n is overruled by -x
        assert proc.returncode == 0, proc.stdout + proc.stderr
        ops = {r.operation for r in parse_mdtest(proc.stdout, op)}
        assert op in ops and "create" not in ops
    with Client(cluster.registry_dir, config=cluster.config_path.read_text()) as c:
        assert c.listdir("/io") == []
    bad = run_mdtest(cluster, ["-T", "-n", "1", "-x", str(tmp_path / "none")])
    assert bad.returncode == 1
    assert f"file count failed: UsageError: -x {tmp_path / 'none'}: no file count" in bad.stderr


@pytest.mark.timeout(180)
def test_mdtest_completes_through_the_kill_of_a_metadata_owner(tmp_path: Path) -> None:
    """Two copies of the metadata (`layout.replicas=2`): `benchfs-run` with the built-in
    mdtest (create, stat with its size checked, read with its bytes checked, remove; one
    directory per rank, four iterations) and server 3, which owns a quarter of the names,
    SIGKILLed in its middle. Every operation of every rank succeeds with the outcome the
    workload expects of it, and the run completes verified."""
    _mdtest_through_a_kill(tmp_path, 1.0)


@pytest.mark.long
@pytest.mark.timeout(180)
@pytest.mark.parametrize("round_", range(20))
def test_mdtest_through_a_kill_20_rounds(tmp_path: Path, round_: int) -> None:
    """`make test-long`: the same, the kill at a random moment of the workload's first 2 s."""
    _mdtest_through_a_kill(tmp_path, round(random.uniform(0.3, 2.0), 2))


def _mdtest_through_a_kill(tmp_path: Path, kill_after_s: float) -> None:
    print(f"server 3 killed {kill_after_s} s into the workload")
    result = subprocess.run(
        [
            *benchfs_run_command(),
            *("launch", "--servers=4", "--clients=4", "--workload=mdtest"),
            "--mdtest-args=-n 250 -u -i 4 -d /md",
            "--set=layout.replicas=2",
            "--set=client.request_timeout_s=2",
            f"--kill-server-after={kill_after_s}",
            f"--results-root={tmp_path / 'results'}",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=170,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["outcome"] == "ok" and report["verified"] is True, report
    run = Path(report["results_dir"])
    manifest = read_json(run / "manifest.json")
    events = [e["kind"] for e in manifest["events"]]
    assert events[:2] == ["fault-injection", "server-died"], events
    # The kill landed well before the workload ended: phases ran without server 3.
    assert manifest["timings_s"]["workload"] > kill_after_s + 1.0, manifest["timings_s"]
    output = (run / "workload" / "output.log").read_text()
    assert "server 3 declared lost" in output
    assert set(manifest["workload"]["rates"]) >= {"create", "stat", "read", "remove"}

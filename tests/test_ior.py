"""The built-in IOR-compatible workload under mpiexec, on real `benchfsd` daemons."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchfs import Client, _core
from benchfs.cluster import LocalCluster, child_env
from benchfs.errors import ParseError
from benchfs.mpi import MpiLauncher
from benchfs.parsers import parse_ior_json, parse_ior_text
from benchfs.results import read_json
from benchfs.units import KIB, MIB
from benchfs.workloads import ior
from conftest import benchfs_run_command, run_bounded

RANKS = 3


def run_ior(
    cluster: LocalCluster, args: list[str], out: Path | None = None, ranks: int = RANKS
) -> subprocess.CompletedProcess[str]:
    """The workload as `ranks` MPI processes; the whole process group dies on timeout."""
    launcher = MpiLauncher()
    argv = [sys.executable, "-m", "benchfs.workloads.ior", *args]
    argv += ["--registry", str(cluster.registry_dir), "--config", str(cluster.config_path)]
    if out is not None:
        argv += ["--out", str(out)]
    return run_bounded(launcher.command(ranks, argv), 60, env=launcher.env(child_env()))


def rows_by(rows: list, kind: str, op: str) -> list:
    return [r for r in rows if r.kind == kind and r.operation == op]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("layout", ["-F", "shared"])
def test_write_read_verify_round_trips_through_the_parsers(
    daemon_cluster, tmp_path: Path, layout: str
) -> None:
    cluster = daemon_cluster(2)
    out = tmp_path / "out"
    flags = ["-F"] if layout == "-F" else []
    args = ["-w", "-r", "-W", "-R", "-t", "64k", "-b", "256k", "-s", "3", "-e", *flags]
    args += ["--json", str(tmp_path / "ior.json")]
    proc = run_ior(cluster, args, out)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    try:
        text_rows = parse_ior_text(proc.stdout, "stdout")
    except ParseError as e:  # the whole output, to see what broke the line
        pytest.fail(f"{e}\n--- stdout ---\n{proc.stdout}\n--- stderr ---\n{proc.stderr}")
    json_rows = parse_ior_json((tmp_path / "ior.json").read_text(), "ior.json")
    for rows in (text_rows, json_rows):
        for op in ("write", "read"):
            (s,) = rows_by(rows, "summary", op)
            assert s.tasks == RANKS and s.segments == 3
            assert s.block_size == 256 * KIB and s.transfer_size == 64 * KIB
            assert s.file_per_proc is (layout == "-F")
            # IOR prints aggs(MiB) with one decimal.
            assert abs(s.bytes - RANKS * 3 * 256 * KIB) <= 0.06 * MIB
            assert s.bw_mib_s > 0
            (it,) = rows_by(rows, "iteration", op)
            assert it.iteration == 0 and it.block_size == 256 * KIB
    summary = read_json(out / "summary.json")
    assert summary["verified"] is True and summary["errors"] == []
    assert summary["bytes"] == RANKS * 3 * 256 * KIB
    assert summary["write_mib_s"] > 0 and summary["read_mib_s"] > 0
    assert {r["operation"] for r in summary["rows"]} == {"write", "read"}
    # Without -k the files are gone.
    with Client(cluster.registry_dir, config=cluster.config_path.read_text()) as c:
        assert [n for n in c.listdir("/") if n.startswith("testFile")] == []


@pytest.mark.timeout(120)
def test_keep_reorder_and_file_layout(daemon_cluster, tmp_path: Path) -> None:
    """-k keeps IOR-named files holding the pattern at IOR's offsets; -C reads a neighbour's."""
    cluster = daemon_cluster(2)
    block, xfer, segs = 128 * KIB, 32 * KIB, 2
    proc = run_ior(
        cluster, ["-w", "-k", "-t", "32k", "-b", "128k", "-s", "2", "-o", "/shared"], None
    )
    assert proc.returncode == 0, proc.stderr
    proc = run_ior(
        cluster, ["-w", "-k", "-F", "-t", "32k", "-b", "128k", "-s", "2", "-o", "/fpp"], None
    )
    assert proc.returncode == 0, proc.stderr
    config = cluster.config_path.read_text()
    with Client(cluster.registry_dir, config=config) as c:
        assert c.stat("/shared").st_size == RANKS * block * segs
        for r in range(RANKS):
            assert c.stat(f"/fpp.{r:08d}").st_size == block * segs
        # Shared: segment 1 of rank 2 at (1 * tasks + 2) * block; word = (rank+1)<<40 | off/8.
        off = (1 * RANKS + 2) * block + 8
        with c.open("/shared") as f:
            word = int.from_bytes(f.pread(8, off), "little")
        assert word == (3 << 40) | (off // 8)
        with c.open("/fpp.00000001") as f:
            word = int.from_bytes(f.pread(8, block + xfer), "little")
        assert word == (2 << 40) | ((block + xfer) // 8)
    for target in ("/shared", "/fpp"):
        flags = ["-F"] if target == "/fpp" else []
        proc = run_ior(
            cluster,
            ["-r", "-R", "-C", "-k", "-t", "32k", "-b", "128k", "-s", "2", "-o", target, *flags],
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "ordering inter file : constant task offset" in proc.stdout


@pytest.mark.timeout(120)
def test_planted_corruption_fails_the_read_check(daemon_cluster, tmp_path: Path) -> None:
    cluster = daemon_cluster(2)
    args = ["-t", "64k", "-b", "256k", "-F", "-k", "-o", "/c"]
    proc = run_ior(cluster, ["-w", *args])
    assert proc.returncode == 0, proc.stderr
    victim_off = 128 * KIB + 24
    with Client(cluster.registry_dir, config=cluster.config_path.read_text()) as c:
        with c.open("/c.00000002", "r+") as f:
            # Rank 0's word for that offset: right place, wrong writer.
            f.pwrite(((1 << 40) | (victim_off // 8)).to_bytes(8, "little"), victim_off)
    out = tmp_path / "out"
    proc = run_ior(cluster, ["-r", "-R", *args], out)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "rank 2" in proc.stderr
    assert f"word at offset {victim_off} differs" in proc.stderr
    assert f"expected data of rank 2 at offset {victim_off}" in proc.stderr
    assert f"found data of rank 0 at offset {victim_off}" in proc.stderr
    summary = read_json(out / "summary.json")
    assert summary["verified"] is False
    assert [(e["rank"], e["phase"]) for e in summary["errors"]] == [(2, "read")]
    # Without -R the same read passes: only the check sees the corruption.
    proc = run_ior(cluster, ["-r", *args])
    assert proc.returncode == 0, proc.stderr


@pytest.mark.timeout(120)
def test_stonewall_stops_early(daemon_cluster, tmp_path: Path) -> None:
    cluster = daemon_cluster(2)
    out = tmp_path / "out"
    # 3 x 4 GiB would take minutes; the 1 s stonewall stops each rank long before.
    proc = run_ior(
        cluster, ["-w", "-r", "-R", "-F", "-t", "64k", "-b", "4g", "-D", "1"], out, ranks=2
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "stonewalling pairs accessed" in proc.stdout
    (write,) = rows_by(parse_ior_text(proc.stdout, "stdout"), "summary", "write")
    summary = read_json(out / "summary.json")
    assert 0 < summary["bytes"] < 2 * 4 * (1 << 30)
    # The read after a stonewalled write reads (and verifies) what every rank wrote.
    assert 0 < summary["bytes_read"] <= summary["bytes"]
    assert write.seconds is not None and write.seconds < 20
    # The summary row carries the stonewall columns instead of NA.
    line = [x for x in proc.stdout.splitlines() if x.startswith("write ")][-1]
    assert len(line.split()) == 27 and "NA" not in line.split()


@pytest.mark.timeout(120)
def test_wear_out_and_status_file_carry_a_stonewalled_write_to_a_later_read(
    daemon_cluster, tmp_path: Path
) -> None:
    """IO500's ior-easy shape: a stonewalled write in one execution, every rank worn out to the
    most transfers any rank made and the count recorded; a later execution reads that many."""
    cluster = daemon_cluster(2)
    status = tmp_path / "ior.stonewall"
    common = ["-F", "-k", "-t", "64k", "-b", "4g", "-O", f"stoneWallingStatusFile={status}"]
    write = run_ior(
        cluster,
        ["-w", "-e", "-D", "1", "-O", "stoneWallingWearOut=1", *common],
        tmp_path / "write",
        ranks=2,
    )
    assert write.returncode == 0, write.stdout + write.stderr
    records = [read_json(tmp_path / "write" / f"rank-{r}.json") for r in range(2)]
    counts = [rec["phases"][0]["ops"] for rec in records]
    assert counts[0] == counts[1] > 0, counts
    assert int(status.read_text()) == counts[0]
    assert all(rec["phases"][0]["stonewalled"] for rec in records)
    assert all(rec["phases"][0]["stonewall_seconds"] >= 1.0 for rec in records)
    read = run_ior(cluster, ["-r", "-R", "-C", *common], tmp_path / "read", ranks=2)
    assert read.returncode == 0, read.stdout + read.stderr
    summary = read_json(tmp_path / "read" / "summary.json")
    assert summary["bytes_read"] == 2 * counts[0] * 64 * KIB and summary["verified"] is True
    with Client(cluster.registry_dir, config=cluster.config_path.read_text()) as c:
        assert c.stat("/testFile.00000001").st_size == counts[0] * 64 * KIB


@pytest.mark.timeout(120)
def test_iterations_and_json_stdout(daemon_cluster) -> None:
    cluster = daemon_cluster(2)
    proc = run_ior(
        cluster, ["-w", "-r", "-t", "64k", "-b", "128k", "-i", "2", "-O", "summaryFormat=JSON"]
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert len(doc["tests"][0]["Results"]) == 2
    rows = parse_ior_json(proc.stdout, "stdout")
    assert [r.iteration for r in rows_by(rows, "iteration", "write")] == [0, 1]
    (s,) = rows_by(rows, "summary", "write")
    assert s.bw_min_mib_s <= s.bw_mib_s <= s.bw_max_mib_s
    assert doc["summary"][0]["repetitions"] == 2


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-t", "64k", "-b", "100k"], "multiple of transfer size"),
        (["-t", "12"], "multiple of 8"),
        (["-t", "lots"], "-t"),
        (["-i", "0"], "iterations"),
        (["-Z"], "unrecognized arguments"),
        (["-O", "bogus=1"], "unsupported"),
        (["-W", "-r"], "-W"),
        (["-O", "stoneWallingWearOut=1"], "-D"),
        (["-w", "-k", "-O", "stoneWallingStatusFile=/tmp/x"], "stoneWallingWearOut=1"),
        (["-r", "-O", "stoneWallingStatusFile=/tmp/x"], "-k"),
    ],
)
def test_bad_options_exit_2_without_hanging(tmp_path: Path, args: list[str], message: str) -> None:
    launcher = MpiLauncher()
    argv = [sys.executable, "-m", "benchfs.workloads.ior", *args, "--registry", str(tmp_path)]
    proc = subprocess.run(
        launcher.command(2, argv),
        env=launcher.env(child_env()),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert message in proc.stderr
    assert "benchfs ior: error:" in proc.stderr


def test_offsets_and_options_without_mpi() -> None:
    opts = ior.parse_options(["-t", "1m", "-b", "4m", "-s", "2", "-F", "--registry", "/x"])
    assert opts.write and opts.read  # IOR's default when no phase is named
    assert ior.file_name(opts, 7) == "/testFile.00000007"
    assert opts.command_line.startswith("ior -t 1m")


def test_ior_phase_rejects_bad_geometry(inproc_cluster) -> None:
    cluster = inproc_cluster(1)
    with Client(cluster.registry, config=cluster.config) as c, c.open("/g", "w+") as f:
        with pytest.raises(ValueError, match="multiple of the transfer size"):
            _core.ior_phase(f._core, "write", 1, 100, 64, 1, True, 0)
        with pytest.raises(ValueError, match="direction"):
            _core.ior_phase(f._core, "sideways", 1, 128, 64, 1, True, 0)
        r = _core.ior_phase(f._core, "write", 2, 128, 64, 1, True, 0)
        assert (r["bytes"], r["ops"]) == (256, 4)
        r = _core.ior_phase(f._core, "read", 2, 128, 64, 1, True, 0, verify=True)
        assert r["mismatched_words"] == 0 and r["first_mismatch"] is None
        r = _core.ior_phase(f._core, "read", 2, 128, 64, 1, True, 0, verify=True, max_ops=1)
        assert r["ops"] == 1


@pytest.mark.timeout(180)
def test_benchfs_run_local_runs_the_ior_workload(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            *benchfs_run_command(),
            "launch",
            "--workload",
            "ior",
            "--ior-args",
            "-w -r -R -t 256k -b 2m -F",
            "--results-root",
            str(tmp_path),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=150,
        env={**os.environ, "BENCHFS_RESULTS": str(tmp_path)},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert report["workload"] == "ior" and report["verified"] is True
    assert report["write_mib_s"] > 0 and report["read_mib_s"] > 0
    summary_rows = [r for r in report["rows"] if r["kind"] == "summary"]
    assert {r["operation"] for r in summary_rows} == {"write", "read"}
    manifest = read_json(Path(report["results_dir"]) / "manifest.json")
    assert manifest["outcome"]["status"] == "ok"
    assert manifest["workload"]["rows"] == report["rows"]
    log = (Path(report["results_dir"]) / "workload" / "output.log").read_text()
    assert "Summary of all tests:" in log
    # A bad option is the workload's usage error, reported, with nothing left running.
    proc = subprocess.run(
        [*benchfs_run_command(), "launch", "--workload", "ior", "--ior-args", "-t 12"],
        capture_output=True,
        text=True,
        timeout=150,
        env={**os.environ, "BENCHFS_RESULTS": str(tmp_path)},
    )
    assert proc.returncode != 0
    assert "multiple of 8" in proc.stderr

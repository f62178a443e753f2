"""`benchfs-run sweep`: parameter files expanded and run with the local pipeline, indexed."""

from __future__ import annotations

import csv
import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from benchfs import schemas
from benchfs.results import read_json
from benchfs.sweep import SweepError, index_columns, load_params, parse_params
from conftest import alive, benchfs_run_command

JOBS = Path(__file__).resolve().parents[1] / "jobs" / "params"


def run_cli(args: list[str], timeout: float = 150) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        benchfs_run_command() + args,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=dict(os.environ),
    )


@pytest.mark.timeout(180)
def test_sweep_over_a_config_key_with_repetitions_and_its_report(tmp_path: Path) -> None:
    """Two chunk sizes, twice each: four runs, their index, the points aggregated (mean and
    spread of the two repetitions), and benchfs-analyze on the sweep directory."""
    params = tmp_path / "tiny.toml"
    params.write_text(
        'name = "tiny"\n'
        "repetitions = 2\n"
        "[sweep]\n"
        'layout.chunk_size = ["64K", "128K"]\n'
        "[set]\n"
        'run.transfer_size = "64K"\n'
        'run.file_size = "512K"\n'
        "run.servers = 2\n"
        "run.clients = 2\n"
        "cluster.connect_timeout_s = 10.0\n"
    )
    result = run_cli(["sweep", str(params), "--results-root", str(tmp_path / "res")])
    assert result.returncode == 0, result.stdout + result.stderr
    index = Path(re.search(r"^index\s+(\S+)$", result.stdout, re.M).group(1))  # type: ignore[union-attr]
    assert index.parent.parent == tmp_path / "res"
    assert (index.parent / "params.toml").read_text() == params.read_text()
    with open(index, newline="") as f:
        reader = csv.DictReader(f)
        assert tuple(reader.fieldnames or ()) == index_columns(["layout.chunk_size"])
        rows = list(reader)
    assert [(r["point"], r["repetition"], r["layout.chunk_size"]) for r in rows] == [
        ("0", "0", "65536"),
        ("0", "1", "65536"),
        ("1", "0", "131072"),
        ("1", "1", "131072"),
    ]
    for row in rows:
        assert row["outcome"] == "ok" and row["verified"] == "True"
        assert float(row["write_mib_s"]) > 0 and float(row["read_mib_s"]) > 0
        run_dir = Path(row["results_dir"])
        assert run_dir.is_dir() and run_dir.parent == index.parent
        manifest = read_json(run_dir / "manifest.json")
        assert manifest["outcome"]["status"] == "ok"
        assert manifest["workload"]["bytes"] == 2 * (512 << 10)
        # the point's chunk size reached the effective configuration of its run
        assert f"chunk_size = {row['layout.chunk_size']}" in (run_dir / "config.toml").read_text()
        assert alive([p["pid"] for p in manifest["processes"]]) == []
    # index.json holds the same rows, typed, and each point aggregated; it follows its schema
    doc = read_json(index.parent / "index.json")
    schemas.check(doc, schemas.SWEEP_INDEX, index.parent / "index.json")
    assert doc["name"] == "tiny" and doc["axes"] == ["layout.chunk_size"]
    assert "cluster.connect_timeout_s=10.0" in doc["set"]
    for point in doc["points"]:
        runs = [r for r in doc["rows"] if r["point"] == point["point"]]
        writes = [r["write_mib_s"] for r in runs]
        w = point["figures"]["write_mib_s"]
        assert (point["runs"], point["ok"], w["n"]) == (2, 2, 2)
        assert w["mean"] == pytest.approx(statistics.fmean(writes))
        assert w["std"] == pytest.approx(statistics.stdev(writes))
        assert (w["min"], w["max"]) == (min(writes), max(writes))
    with open(index.parent / "points.csv", newline="") as f:
        points = list(csv.DictReader(f))
    assert [p["layout.chunk_size"] for p in points] == ["65536", "131072"]
    assert float(points[0]["write_mib_s_mean"]) == pytest.approx(
        doc["points"][0]["figures"]["write_mib_s"]["mean"], rel=1e-5
    )
    # the printed table has one line per run
    assert len(re.findall(r"^\s*\d+\s+[01]\s+(64|128)KiB", result.stdout, re.M)) == 4
    # benchfs-analyze knows a sweep: the points with mean +- std, and the sweep report
    report = tmp_path / "sweep.html"
    analyzed = subprocess.run(
        [sys.executable, "-m", "benchfs.cli.analyze", str(index.parent), "--html", str(report)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert analyzed.returncode == 0, analyzed.stderr
    assert "2 points, 4 runs" in analyzed.stdout and "±" in analyzed.stdout
    page = report.read_text()
    assert "Against layout.chunk_size" in page and page.count("data:image/png;base64,") == 1
    as_json = subprocess.run(
        [sys.executable, "-m", "benchfs.cli.analyze", str(index.parent), "--json"],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    assert json.loads(as_json.stdout)["varied"] == ["layout.chunk_size"]
    refused = subprocess.run(
        [sys.executable, "-m", "benchfs.cli.analyze", str(index.parent), "--baseline",
         str(index.parent)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert refused.returncode == 1 and "is a sweep: --baseline is for one run" in refused.stderr


def test_shipped_parameter_files_are_valid() -> None:
    smoke = load_params(JOBS / "smoke.toml")
    assert len(smoke.points) * smoke.repetitions == 4 and smoke.notices == []
    example = load_params(JOBS / "example.toml")
    assert len(example.points) == 2 * 2 * 2 * 2 and example.repetitions == 3
    assert example.sets == ["run.file_size=256M", "client.max_inflight=32"]


def test_dry_run_lists_points_without_running(tmp_path: Path) -> None:
    result = run_cli(
        ["sweep", str(JOBS / "smoke.toml"), "--dry-run", "--results-root", str(tmp_path)]
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("planned") == 4
    assert list(tmp_path.iterdir()) == []


BASE = (
    'chunk_size = ["1M"]\ntransfer_size = ["1M"]\nfile_size = ["4M"]\n'
    "servers = [2]\nclients = [2]\n"
)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (BASE + "colour = 1\n", "p.toml: unknown key 'colour'"),
        (BASE.replace("servers = [2]", "servers = []"), "p.toml: servers is an empty list"),
        (BASE.replace('file_size = ["4M"]', 'file_size = ["lots"]'), "run.file_size = 'lots'"),
        (
            BASE.replace('transfer_size = ["1M"]', 'transfer_size = ["8M"]'),
            "transfer size 8MiB is larger than file size 4MiB",
        ),
        (BASE.replace("clients = [2]", "clients = [0]"), "run.clients must be at least 1"),
        (BASE.replace('chunk_size = ["1M"]', 'chunk_size = ["2G"]'), "between 1 byte and 1 GiB"),
        (BASE + "repetitions = 0\n", "repetitions must be an integer >= 1"),
        (BASE + "[set]\nlayout.chunk_size = [5]\n", "layout.chunk_size is swept twice"),
        (BASE.replace("servers = [2]", "servers = [2, 2]"), "servers repeats the value 2"),
        (BASE + 'block_size = ["4M"]\n', "give file_size or block_size (its earlier name)"),
        ("chunk_size = [", "malformed TOML"),
        ("[sweep]\nlayout.chunk_sise = [1]\n", "unknown key layout.chunk_sise"),
        ("[sweep]\ncolour = [1]\n", "sweep.colour is neither a configuration key"),
        ('[sweep]\nworkload = ["ior -q"]\n', "--ior-args: unrecognized arguments: -q"),
        ('[sweep]\nworkload = ["fio"]\n', "unknown workload 'fio'"),
        ('[sweep]\nworkload = ["rw", "rw"]\n', "repeats the value 'rw'"),
        ("name = 'x'\n", "nothing to sweep"),
    ],
)
def test_invalid_parameter_files_name_the_key(text: str, message: str) -> None:
    with pytest.raises(SweepError) as info:
        parse_params(text, "p.toml")
    assert message in str(info.value)


def test_earlier_parameter_files_still_load_with_a_notice() -> None:
    """Parameter files of the fixed five keys (and block_size, file_size's earlier name) run
    the same points as the same axes under [sweep]."""
    old = parse_params(BASE.replace("file_size", "block_size"), "p.toml")
    assert [p.values["run.file_size"] for p in old.points] == [4 << 20]
    new = parse_params(
        '[sweep]\nlayout.chunk_size = ["1M"]\nrun.transfer_size = ["1M"]\n'
        'run.file_size = ["4M"]\nrun.servers = [2]\nrun.clients = [2]\n',
        "p.toml",
    )
    assert old.points == new.points and old.axes == new.axes
    assert len(old.notices) == 1 and "write them under [sweep]" in old.notices[0]


def test_any_key_the_workload_and_its_arguments_are_axes() -> None:
    """Config keys (nested or quoted), a workload with its arguments, and a list under [set]
    are axes; the points are their product, the config values as resolved."""
    plan = parse_params(
        'repetitions = 3\n[sweep]\n"layout.chunk_size" = ["1M", "4M"]\n'
        'workload = ["rw", "ior -t 64k -b 1m"]\n[set]\nclient.max_inflight = [4, 8]\n'
        'run.file_size = "8M"\n',
        "p.toml",
    )
    assert plan.axes == ["layout.chunk_size", "workload", "client.max_inflight"]
    assert len(plan.points) == 8 and plan.sets == ["run.file_size=8M"]
    assert plan.points[3].values == {
        "layout.chunk_size": 1 << 20,
        "workload": "ior -t 64k -b 1m",
        "client.max_inflight": 8,
    }
    args = parse_params('[sweep]\nworkload_args = ["-t 64k -b 1m", "-t 1m -b 1m"]\n', "p.toml")
    assert [p.values["workload_args"] for p in args.points] == ["-t 64k -b 1m", "-t 1m -b 1m"]


def test_invalid_parameter_file_is_a_usage_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(BASE.replace("servers = [2]", "servers = []"))
    result = run_cli(["sweep", str(bad), "--results-root", str(tmp_path / "res")])
    assert result.returncode == 2
    assert "servers is an empty list" in result.stderr
    assert not (tmp_path / "res").exists()


def test_index_of_a_failed_point_follows_the_schema(tmp_path: Path) -> None:
    """A point that failed before measuring anything: nulls where nothing was measured, the
    code kept; both index files written."""
    from benchfs.sweep import _row, _write_index

    plan = parse_params(BASE, "p.toml")
    rows = [_row(plan.points[0], 0, "failed", "ETIMEDOUT", {}, str(tmp_path / "run"))]
    _write_index(tmp_path, plan, rows)
    doc = read_json(tmp_path / "index.json")
    schemas.check(doc, schemas.SWEEP_INDEX, tmp_path / "index.json")
    assert doc["rows"][0]["code"] == "ETIMEDOUT" and doc["rows"][0]["write_mib_s"] is None
    assert doc["points"] == [
        {"point": 0, "values": doc["rows"][0]["values"], "runs": 1, "ok": 0, "figures": {}}
    ]
    line = (tmp_path / "index.csv").read_text().splitlines()[1]
    assert ",failed,ETIMEDOUT,,,," in line
    doc["rows"][0]["outcome"] = "maybe"
    with pytest.raises(ValueError, match=r"index.json: not a sweep-index document: at \.rows\[0\]"):
        schemas.check(doc, schemas.SWEEP_INDEX, tmp_path / "index.json")


@pytest.mark.long
@pytest.mark.timeout(600)
def test_sweep_over_a_config_key_ior_arguments_and_three_repetitions(tmp_path: Path) -> None:
    """`make test-long`: chunk size x the built-in IOR's transfer size, 3 times each (12 runs);
    the sweep report plots each figure against both axes."""
    params = tmp_path / "ior.toml"
    params.write_text(
        "repetitions = 3\n[sweep]\n"
        'layout.chunk_size = ["64K", "128K"]\n'
        'workload_args = ["-t 64k -b 256k", "-t 128k -b 256k"]\n'
        "[set]\nrun.servers = 2\nrun.clients = 2\n"
    )
    result = run_cli(["sweep", str(params), "--results-root", str(tmp_path / "res")], 540)
    assert result.returncode == 0, result.stdout + result.stderr
    sweep_dir = next((tmp_path / "res").iterdir())
    doc = read_json(sweep_dir / "index.json")
    assert [p["figures"]["write_mib_s"]["n"] for p in doc["points"]] == [3, 3, 3, 3]
    assert {r["values"]["workload_args"] for r in doc["rows"]} == {"-t 64k -b 256k",
                                                                   "-t 128k -b 256k"}  # fmt: skip
    analyzed = subprocess.run(
        [sys.executable, "-m", "benchfs.cli.analyze", str(sweep_dir), "--save"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert analyzed.returncode == 0, analyzed.stderr
    page = (sweep_dir / "report.html").read_text()
    assert "Against layout.chunk_size" in page and "Against workload_args" in page

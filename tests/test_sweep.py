"""`benchfs-run sweep`: parameter files expanded and run with the local pipeline, indexed."""

from __future__ import annotations

import csv
import os
import re
import subprocess
from pathlib import Path

import pytest

from benchfs import schemas
from benchfs.results import read_json
from benchfs.sweep import INDEX_COLUMNS, SweepError, load_params, parse_params
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
def test_two_by_two_sweep_writes_its_index(tmp_path: Path) -> None:
    params = tmp_path / "tiny.toml"
    params.write_text(
        'name = "tiny"\n'
        'chunk_size = ["64K", "128K"]\n'
        'transfer_size = ["64K"]\n'
        'file_size = ["512K", "1M"]\n'
        "servers = [2]\n"
        "clients = [2]\n"
        "[set]\n"
        "cluster.connect_timeout_s = 10.0\n"
    )
    result = run_cli(["sweep", str(params), "--results-root", str(tmp_path / "res")])
    assert result.returncode == 0, result.stdout + result.stderr
    index = Path(re.search(r"^index\s+(\S+)$", result.stdout, re.M).group(1))  # type: ignore[union-attr]
    assert index.parent.parent == tmp_path / "res"
    assert (index.parent / "params.toml").read_text() == params.read_text()
    with open(index, newline="") as f:
        reader = csv.DictReader(f)
        assert tuple(reader.fieldnames or ()) == INDEX_COLUMNS
        rows = list(reader)
    assert len(rows) == 4
    assert [(r["chunk_size"], r["file_size"]) for r in rows] == [
        ("65536", "524288"),
        ("65536", "1048576"),
        ("131072", "524288"),
        ("131072", "1048576"),
    ]
    for row in rows:
        assert row["outcome"] == "ok" and row["verified"] == "True"
        assert float(row["write_mib_s"]) > 0 and float(row["read_mib_s"]) > 0
        run_dir = Path(row["results_dir"])
        assert run_dir.is_dir() and run_dir.parent == index.parent
        manifest = read_json(run_dir / "manifest.json")
        assert manifest["outcome"]["status"] == "ok"
        assert manifest["workload"]["bytes"] == 2 * int(row["file_size"])
        # the point's chunk size reached the effective configuration of its run
        assert f"chunk_size = {row['chunk_size']}" in (run_dir / "config.toml").read_text()
        assert alive([p["pid"] for p in manifest["processes"]]) == []
    # index.json holds the same rows, typed, and follows its schema
    doc = read_json(index.parent / "index.json")
    schemas.check(doc, schemas.SWEEP_INDEX, index.parent / "index.json")
    assert doc["name"] == "tiny" and doc["set"] == ["cluster.connect_timeout_s=10.0"]
    assert [(r["chunk_size"], r["verified"]) for r in doc["rows"]] == [
        (int(r["chunk_size"]), True) for r in rows
    ]
    assert all(r["code"] is None and r["write_mib_s"] > 0 for r in doc["rows"])
    # the printed table has one line per row
    assert len(re.findall(r"^\s*\d+\s+0\s+(64|128)KiB", result.stdout, re.M)) == 4


def test_shipped_parameter_files_are_valid() -> None:
    smoke = load_params(JOBS / "smoke.toml")
    assert len(smoke.points) * smoke.repetitions == 4
    example = load_params(JOBS / "example.toml")
    assert len(example.points) == 2 * 2 * 1 * 2 * 2 and example.repetitions == 3
    assert example.sets == ["client.max_inflight=32"]


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
        (BASE.replace('file_size = ["4M"]', 'file_size = ["lots"]'), "file_size: invalid size"),
        (
            BASE.replace('transfer_size = ["1M"]', 'transfer_size = ["8M"]'),
            "transfer_size 8MiB is larger than file_size 4MiB",
        ),
        (BASE.replace("clients = [2]", "clients = [0]"), "clients value 0 must be an integer >= 1"),
        (
            BASE.replace('chunk_size = ["1M"]', 'chunk_size = ["2G"]'),
            "chunk_size value '2G' exceeds 1GiB",
        ),
        (BASE.replace('chunk_size = ["1M"]', ""), "chunk_size is missing"),
        (BASE + "repetitions = 0\n", "repetitions must be an integer >= 1"),
        (BASE + "[set]\nlayout.chunk_size = 5\n", "sweep it with chunk_size"),
        (BASE.replace("servers = [2]", "servers = [2, 2]"), "servers repeats the value 2"),
        (BASE + 'block_size = ["4M"]\n', "give file_size or block_size (its earlier name)"),
        ("chunk_size = [", "malformed TOML"),
    ],
)
def test_invalid_parameter_files_name_the_key(text: str, message: str) -> None:
    with pytest.raises(SweepError) as info:
        parse_params(text, "p.toml")
    assert message in str(info.value)


def test_block_size_is_read_as_file_size() -> None:
    """Parameter files written before the rename still run, with the same points."""
    plan = parse_params(BASE.replace("file_size", "block_size"), "p.toml")
    assert [p.file_size for p in plan.points] == [4 << 20]
    assert plan.points == parse_params(BASE, "p.toml").points


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
    line = (tmp_path / "index.csv").read_text().splitlines()[1]
    assert ",failed,ETIMEDOUT,,,," in line
    doc["rows"][0]["outcome"] = "maybe"
    with pytest.raises(ValueError, match=r"index.json: not a sweep-index document: at \.rows\[0\]"):
        schemas.check(doc, schemas.SWEEP_INDEX, tmp_path / "index.json")

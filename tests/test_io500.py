"""IO500 on BenchFS: the score as IO500's calc_score computes it (hand-computed values), the
result lines in its format, and `benchfs-run --workload io500 --preset ci` end to end."""

from __future__ import annotations

import json
import re
import subprocess
import tomllib
from pathlib import Path

import pytest

from benchfs.workloads.io500 import PHASES, PhaseResult, calc_score, result_line, score_line
from conftest import benchfs_run_command

ORDER = [name for name, _ in PHASES]


def test_the_score_is_io500s_calc_score() -> None:
    """BW: geometric mean of the four ior phases in GiB/s; MD: of the seven mdtest phases and
    find in kIOPS; phases scoring 0 are left out (IO500's `if(t <= 0) continue`); the score is
    the square root of BW x MD."""
    bw = {"ior-easy-write": 1.0, "ior-hard-write": 4.0, "ior-easy-read": 2.0, "ior-hard-read": 8.0}
    md = {name: 10.0 for name, group in PHASES if group == "md"}
    md["find"] = 0.0  # left out
    md["mdtest-hard-read"] = 1000.0
    results = [PhaseResult(n, {**bw, **md}[n], 1.0) for n in ORDER]
    s = calc_score(results)
    # By hand: BW = (1 x 4 x 2 x 8)^(1/4) = 64^(1/4); MD = (10^6 x 1000)^(1/7) = 10^(9/7).
    assert s.bandwidth_gib_s == pytest.approx(2.8284271, rel=1e-7)
    assert s.md_kiops == pytest.approx(19.3069773, rel=1e-7)
    assert s.total == pytest.approx(7.3897482, rel=1e-7)  # sqrt(2.8284271 x 19.3069773)
    assert calc_score([PhaseResult("find", 0.0, 1.0)]).total == 0.0  # no numbers: 0


def test_result_lines_are_io500s() -> None:
    """src/main.c: "[RESULT]" then " %20s %15s %s : time %.3f seconds", and the score line."""
    assert (
        result_line(PhaseResult("ior-easy-write", 0.79571, 0.0994))
        == "[RESULT]       ior-easy-write        0.795710 GiB/s : time 0.099 seconds"
    )
    assert (
        result_line(PhaseResult("find", 4.3676849, 0.2312))
        == "[RESULT]                 find        4.367685 kIOPS : time 0.231 seconds"
    )
    s = calc_score([PhaseResult("ior-easy-write", 2.0, 1.0), PhaseResult("find", 8.0, 1.0)])
    assert score_line(s) == (
        "[SCORE ] Bandwidth 2.000000 GiB/s : IOPS 8.000000 kiops : TOTAL 4.000000"
    )


def run_io500(tmp_path: Path, preset: str, timeout: float, *more: str) -> dict:
    """`benchfs-run launch --workload io500 --preset PRESET --json`: its report, checked to
    list every phase in IO500's order, each with a score."""
    proc = subprocess.run(
        [
            *benchfs_run_command(),
            *("launch", "--workload", "io500", "--preset", preset, *more),
            *("--results-root", str(tmp_path), "--json", "--timeout", str(int(timeout))),
        ],
        capture_output=True,
        text=True,
        timeout=timeout + 60,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert report["outcome"] == "ok" and report["workload"] == "io500"
    phases = [r for r in report["rows"] if r["kind"] == "phase"]
    assert [r["operation"] for r in phases] == ORDER
    assert all(r["score"] > 0 for r in phases), phases
    return report


@pytest.mark.timeout(120)
def test_benchfs_run_io500_ci_preset(tmp_path: Path) -> None:
    check_io500_run(run_io500(tmp_path, "ci", 50))


def check_io500_run(report: dict) -> None:
    """result_summary.txt in IO500's format, its score from its own numbers, and the run in
    IO500's durability mode."""
    run = Path(report["results_dir"])
    # result_summary.txt in IO500's format, and its score from its own numbers.
    lines = (run / "workload" / "result_summary.txt").read_text().splitlines()
    parsed = [
        re.match(r"\[RESULT\] +(\S+) +(\S+) (GiB/s|kIOPS) : time (\S+) seconds$", x)
        for x in lines[:-1]
    ]
    assert all(parsed) and [m[1] for m in parsed if m] == ORDER
    again = calc_score([PhaseResult(m[1], float(m[2]), float(m[4])) for m in parsed if m])
    score = re.match(
        r"\[SCORE \] Bandwidth (\S+) GiB/s : IOPS (\S+) kiops : TOTAL (\S+)$", lines[-1]
    )
    assert score and float(score[3]) == pytest.approx(again.total, rel=1e-5)
    # IO500's durability rule: data on persistent storage when close returns.
    config = tomllib.loads((run / "config.toml").read_text())
    assert config["storage"]["durability"] == "close"


@pytest.mark.long
@pytest.mark.timeout(900)
def test_benchfs_run_io500_small_preset(tmp_path: Path) -> None:
    """make test-long: the larger preset, every phase scoring."""
    run_io500(tmp_path, "small", 780)


def test_preset_needs_the_io500_workload(tmp_path: Path) -> None:
    proc = subprocess.run(
        [*benchfs_run_command(), "launch", "--preset", "ci", "--results-root", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "--preset and --ior-prefix go with --workload io500" in proc.stderr
    assert not any(tmp_path.iterdir())  # nothing started, nothing written


def test_an_ior_prefix_without_ior_is_refused_before_anything_starts(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            *benchfs_run_command(),
            *("launch", "--workload", "io500", "--ior-prefix", str(tmp_path / "none")),
            *("--results-root", str(tmp_path / "results")),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"no executable {tmp_path}/none/bin/ior" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "results").exists() or not any((tmp_path / "results").iterdir())

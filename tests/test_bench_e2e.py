"""`benchfs-bench e2e --quick`: the output keeps its shape (the figures are not asserted: speed
is measured by the full benchmark, not by tests), and nothing is left behind."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from benchfs.bench import e2e
from benchfs.procs import descendants
from conftest import rendered

CASES = [
    "write-t1m",
    "read-t1m",
    "write-t4m",
    "read-t4m",
    "write-t2m-chunk1m",
    "read-t2m-chunk1m",
]


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "netns",
    [
        False,
        pytest.param(
            True,
            marks=pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root"),
        ),
    ],
)
def test_e2e_quick_json(tmp_path: Path, netns: bool) -> None:
    """Also between nodes apart (--netns): the ranks on their own node reach the servers on
    theirs, and the namespaces are gone afterwards."""
    bench = Path(sys.executable).with_name("benchfs-bench")
    proc = subprocess.Popen(
        [str(bench), "e2e", "--quick", "--json", "--dir", str(tmp_path), *(["--netns"] * netns)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PATH": f"{bench.parent}:{os.environ['PATH']}"},
    )
    try:
        stdout, stderr = proc.communicate(timeout=280)
    finally:
        proc.kill()
    assert proc.returncode == 0, stderr
    report = json.loads(stdout)
    assert [c["name"] for c in report["cases"]] == CASES
    for case in report["cases"]:
        assert case["mib_s"] > 0 and case["fio_mib_s"] > 0, case
        assert case["ratio"] == pytest.approx(case["mib_s"] / case["fio_mib_s"])
        assert len(case["samples"]) == len(case["fio_samples"]) == 1
        assert case["copies_mib_s"] > 0 and len(case["copies_samples"]) == 1, case
        assert case["copies_ratio"] == pytest.approx(case["copies_mib_s"] / case["mib_s"])
        assert case["transport_mib_s"] > 0 and len(case["transport_samples"]) == 1, case
        assert case["limit_mib_s"] == min(case["fio_mib_s"], case["transport_mib_s"])
        assert case["binds"] == ("fio" if case["limit_mib_s"] == case["fio_mib_s"] else "transport")
        assert case["limit_ratio"] == pytest.approx(case["mib_s"] / case["limit_mib_s"])
    chunks = {c["name"]: c["chunk_size"] for c in report["cases"]}
    assert chunks["read-t2m-chunk1m"] == 1 << 20
    assert report["data_dir"].startswith(str(tmp_path)) and report["data_fs"] != "tmpfs"
    assert not Path(report["data_dir"]).exists()
    assert len(report["targets"]) == 2 * len(CASES)
    text = rendered(e2e.render, report)
    assert "read-t2m-chunk1m" in text and "target write-t1m" in text
    assert "the limits" in text and "ucx_perftest as BenchFS runs UCX" in text
    assert report["ranks"] == 2 and report["block_size"] == 8 << 20
    assert report["netns"] is netns
    wanted = {"write": "0.9", "read": "0.95"}
    limit_targets, copies_targets = report["targets"][: len(CASES)], report["targets"][len(CASES) :]
    for case, target in zip(report["cases"], limit_targets, strict=True):
        assert target["value"] == case["limit_ratio"]
        assert target["target"].endswith(
            f"binding limit ({case['binds']}) >= {'0.8' if netns else wanted[case['direction']]}"
        )
    copies_wanted = {"write": "0.45", "read": "0.95"}
    for case, target in zip(report["cases"], copies_targets, strict=True):
        assert target["target"].endswith(f"2 copies >= {copies_wanted[case['direction']]}x of one")
    assert "the cost of 2 copies" in text
    assert ("ranks on n3" in text) is netns
    assert descendants(os.getpid()) == []
    # Its own namespaces (named after its pid, simnodes.apart_nodes): other tests make theirs.
    left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not re.search(rf"^bb{proc.pid % 100000}-", left, re.M)


def test_e2e_rejects_bad_repeats() -> None:
    bench = Path(sys.executable).with_name("benchfs-bench")
    out = subprocess.run(
        [str(bench), "e2e", "--repeats", "0"], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 2 and "--repeats" in out.stderr


@pytest.mark.parametrize("size", ["5m", "0", "lots"])
def test_e2e_rejects_bad_block_size(size: str) -> None:
    bench = Path(sys.executable).with_name("benchfs-bench")
    out = subprocess.run(
        [str(bench), "e2e", "--block-size", size], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 2 and "--block-size" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr

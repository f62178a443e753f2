"""The placement study's command and library: output shape, bad input, the targets at 16."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from benchfs._core import PlacementStudy
from benchfs.bench import meta, placement
from conftest import rendered

ROW_KEYS = {
    "scheme",
    "default",
    "workload",
    "names",
    "servers",
    "max_over_mean",
    "step_max_over_mean",
    "cv",
    "moved_fraction",
}


def bench(*args: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-m", "benchfs.cli.bench", *args],
        capture_output=True,
        text=True,
        timeout=600,
        env=os.environ,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_placement_quick_json_shape_and_targets() -> None:
    report = bench("placement", "--quick", "--json")
    rows = report["rows"]
    assert "rendezvous" in rendered(placement.render, report)
    assert rows and all(ROW_KEYS <= set(r) for r in rows)
    assert {r["servers"] for r in rows} == {16, 64}
    assert {r["workload"] for r in rows} == {
        "fpp-2chunks",
        "fpp-4096chunks",
        "shared-16chunks",
        "shared-1chunk",
        "mdtest-100k",
    }
    assert {r["scheme"] for r in rows if r["default"]} == {"layout"}
    assert report["targets"] and all(t["met"] for t in report["targets"]), report["targets"]
    # Every copy counted (layout.replicas 2 and 3, nodes of four servers): as even.
    copies = [r for r in rows if r["replicas"] > 1 and r["servers"] == 16]
    assert {r["replicas"] for r in copies} == {2, 3}
    assert all(r["max_over_mean"] <= 1.10 for r in copies), copies
    by = {
        (r["scheme"], r["workload"], r["names"], r["servers"]): r
        for r in rows
        if r["replicas"] == 1
    }
    # The seed's trap, reproduced by the naive stripe and by the original system.
    assert by[("layout-naive", "shared-16chunks", "sequential", 16)]["step_max_over_mean"] == 8
    assert by[("original", "fpp-2chunks", "sequential", 16)]["max_over_mean"] > 2
    # Stored layouts move nothing when a server is added; modulo hashing moves almost all.
    assert by[("layout", "mdtest-100k", "random", 64)]["moved_fraction"] == 0
    assert by[("hash-mod", "mdtest-100k", "random", 64)]["moved_fraction"] > 0.9
    assert 0 < by[("jump", "mdtest-100k", "random", 64)]["moved_fraction"] < 0.05


def test_placement_study_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="unknown scheme"):
        PlacementStudy("nope", 4, ["/a"])
    with pytest.raises(ValueError, match="at least 1"):
        PlacementStudy("layout", 0, ["/a"])
    study = PlacementStudy("layout", 4, ["/d/a", "/d/b"])
    files = np.array([0, 1, 2], dtype=np.uint64)
    chunks = np.zeros(3, dtype=np.uint64)
    out = np.empty(3, dtype=np.uint32)
    with pytest.raises(ValueError, match="out of range"):
        study.servers_into(files, chunks, out)
    with pytest.raises(ValueError, match="same length"):
        study.servers_into(files[:2], chunks, out)
    study.servers_into(files[:2], chunks[:2], out[:2])
    # Two files of one directory start on consecutive servers.
    assert (int(out[1]) - int(out[0])) % 4 == 1
    # Copies: on distinct servers of distinct domains where there are enough domains.
    copies = np.empty(4, dtype=np.uint32)
    domains = ["a", "a", "b", "b"]
    study.copies_into(files[:2], chunks[:2], 2, domains, copies)
    for first, second in copies.reshape(2, 2):
        assert domains[first] != domains[second], copies
    with pytest.raises(ValueError, match="replicas must be 1, 2 or 3"):
        study.copies_into(files[:2], chunks[:2], 4, domains, np.empty(8, dtype=np.uint32))
    with pytest.raises(ValueError, match="replicas times as long"):
        study.copies_into(files[:2], chunks[:2], 2, domains, copies[:3])


@pytest.mark.serial
def test_meta_quick_json_shape() -> None:
    report = bench("meta", "--quick", "--json")
    modes = ["memory", "none", "fsync", "close", "none-x2", "none-chunkfile", "none-packed"]
    assert [(c["mode"], c["name"]) for c in report["cases"]] == [
        (m, p) for m in modes for p in meta.PHASES
    ]
    assert meta.PHASES == (
        "create", "stat", "symlink", "readlink", "stat-link", "unlink-link",
        "lock", "unlock", "lock-contended", "unlink", "write-small", "read-small", "unlink-small",
    )  # fmt: skip
    assert "unlink/s" in rendered(meta.render, report)
    for c in report["cases"]:
        assert c["ops_s"] > 0 and len(c["samples"]) == report["repeats"] == 1
    assert [t["target"] for t in report["targets"]] == [
        "create in none >= 0.95x memory",
        "unlink in none >= 0.95x memory",
        "create in fsync >= 0.5x none",
        "unlink in fsync >= 0.5x none",
        "create in none-x2 >= 0.6x none",
        "stat in none-x2 >= 0.9x none",
        "write-small in none >= 1.5x none-chunkfile",
        "read-small in none >= 1.5x none-chunkfile",
        "write-small in none >= 1.0x none-packed",
        "read-small in none >= 1.0x none-packed",
    ]
    for t in report["targets"]:
        assert t["met"] == (t["ratio"] >= float(t["target"].split(">= ")[1].split("x")[0]))
    assert report["data_fs"] != "tmpfs" and not os.path.exists(report["data_dir"])

"""`benchfs-bench access --quick`: the output keeps its shape (the figures are not asserted:
speed is measured by the full benchmark, not by tests), and nothing is left mounted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchfs.bench import access
from conftest import rendered

CASES = [
    "fio-psync-write",
    "fio-psync-read",
    "fio-uring-write",
    "fio-uring-read",
    "fio-psync-randwrite",
    "fio-psync-randread",
    "python-readinto",
    *(
        f"preload-{engine}-{direction}"
        for engine in ("psync", "pvsync2")
        for direction in ("write", "read", "randwrite", "randread")
    ),
    "preload-cp",
]


def _fuse_mounts_under(directory: str) -> list[str]:
    """The FUSE mounts at or under `directory` (other tests mount theirs elsewhere)."""
    lines = Path("/proc/self/mountinfo").read_text().splitlines()
    return [
        line
        for line in lines
        if "fuse" in line and (line.split()[4] + "/").startswith(directory.rstrip("/") + "/")
    ]


@pytest.mark.timeout(300)
def test_access_quick_json() -> None:
    bench = Path(sys.executable).with_name("benchfs-bench")
    out = subprocess.run(
        [str(bench), "access", "--quick", "--json", "--dir", "/dev/shm"],
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
        env={**os.environ, "PATH": f"{bench.parent}:{os.environ['PATH']}"},
    )
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert [c["name"] for c in report["cases"]] == CASES
    for case in report["cases"]:
        assert case["mib_s"] > 0 and case["native_mib_s"] > 0, case
        assert case["ratio"] == pytest.approx(case["mib_s"] / case["native_mib_s"])
    assert report["data_dir"].startswith("/dev/shm/") and report["data_fs"] == "tmpfs"
    assert not Path(report["data_dir"]).exists()
    # one per case, the preload's 4 KiB random cases against the mount's, one per
    # operation of the metadata loop, and one per mount-writer case
    assert len(report["targets"]) == len(CASES) + 2 + 3 + 4
    meta = report["metadata"]
    assert meta["files"] == 100 and [o["op"] for o in meta["ops"]] == ["create", "stat", "unlink"]
    for o in meta["ops"]:
        assert o["preload_ops_s"] > 0 and o["capi_ops_s"] > 0, o
    writer = report["mount_writer"]
    assert writer["mount_write_behind"] == 32 * 2**20 and writer["dd_size"] == 16 * 2**20
    assert [c["name"] for c in writer["cases"]] == ["dd-4k", "dd-64k", "dd-1m", "tar-x"]
    for c in writer["cases"]:
        assert c["mib_s"] > 0 and c["off_mib_s"] > 0, c
        assert c["ratio"] == pytest.approx(c["mib_s"] / c["off_mib_s"])
    assert writer["tar_bytes"] > 100_000 and writer["tar_tree"] == "email"
    text = rendered(access.render, report)
    assert "mount writer dd-1m" in text and "write-behind off >= 1.6" in text
    assert "python-readinto" in text and "target fio-psync-write" in text
    assert "fio-psync-randread: ratio >= 0.5" in text and "bs 4k" in text
    assert "preload-psync-randwrite over the mount >= 1.5" in text
    assert "metadata stat" in text and "preload-cp" in text
    assert _fuse_mounts_under(report["data_dir"]) == []

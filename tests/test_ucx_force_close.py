"""The UCX defect BenchFS works around, shown by a plain-UCP program
(contrib/ucx-tcp-force-close): UCX 1.22's TCP transport frees an endpoint inside progress and
then uses it, after a side force-closed an endpoint with unsent data and the peer closed its
own. Closing without force (what benchfs-ucx does for live peers) survives the same rounds.
If a UCX upgrade fixes the defect, the first test fails and says the workaround can go."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

RUN = Path(__file__).parent.parent / "contrib" / "ucx-tcp-force-close" / "run.sh"


def _runs(tmp_path: Path, *args: str) -> tuple[int, int, str]:
    done = subprocess.run(
        ["sh", str(RUN), str(tmp_path / "build"), "3", *args],
        env={**os.environ, "CHECK": "fastbin"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    found = re.search(r"^(\d+) / (\d+) runs failed", done.stdout, re.M)
    assert found, done.stdout + done.stderr
    return int(found[1]), int(found[2]), done.stdout


@pytest.mark.timeout(150)
def test_ucx_tcp_force_close_of_a_live_peer_crashes(tmp_path: Path) -> None:
    failed, _, out = _runs(tmp_path, "5")
    assert failed >= 1, f"UCX no longer crashes here: the workaround may be dropped\n{out}"
    assert "killed by signal" in out, out


@pytest.mark.timeout(150)
def test_ucx_tcp_flush_close_survives_the_same_rounds(tmp_path: Path) -> None:
    failed, runs, out = _runs(tmp_path, "--flush-close", "5")
    assert (failed, runs) == (0, 3), out

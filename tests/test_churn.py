"""Servers survive their clients' churn (tests/churn.py): clients SIGKILLed, stopped past the
request timeout and ended mid-transfer, against servers under glibc's malloc checks."""

from __future__ import annotations

import os
import random
import signal
from pathlib import Path

import pytest

from benchfs import coredumps
from benchfs.cluster import ServerExited
from churn import run_rounds


def _seed() -> int:
    seed = int(os.environ.get("BENCHFS_CHURN_SEED", random.randrange(1 << 30)))
    print(f"churn seed {seed} (BENCHFS_CHURN_SEED={seed} repeats it)")
    return seed


@pytest.mark.timeout(60)
def test_servers_survive_a_round_of_client_churn(tmp_path: Path) -> None:
    # Before the fix (UCX's TCP transport freeing an endpoint inside progress after a server
    # force-closed a stopped client's connection) 7 of 10 rounds of 12 s crashed a server.
    verdicts = run_rounds(1, clients=16, seconds=8.0, servers=2, seed=_seed(), base=tmp_path)
    assert verdicts == [None], verdicts


@pytest.mark.long
@pytest.mark.timeout(900)
def test_servers_survive_20_rounds_of_client_churn(tmp_path: Path) -> None:
    verdicts = run_rounds(20, clients=24, seconds=12.0, servers=2, seed=_seed(), base=tmp_path)
    assert [v for v in verdicts if v] == [], verdicts


@pytest.mark.timeout(60)
def test_a_crashed_server_names_its_core_dump_and_build_id(daemon_cluster) -> None:
    cluster = daemon_cluster(1)
    # SIGABRT: what an assertion or glibc's heap checks end in (a SIGSEGV sent by kill(2) is
    # absorbed by the handlers of Rust and UCX, which only act on real faults).
    daemon = cluster.kill(0, signal.SIGABRT)
    daemon.proc.wait(30)
    message = str(ServerExited(daemon))
    bid = coredumps.build_id(Path(daemon.binary))
    assert bid and len(bid) == 40, bid
    assert "was killed by signal 6" in message, message
    assert f"build id {bid}" in message, message
    assert daemon.core_dir is not None and daemon.core_dir.parent == daemon.log_path.parent
    if coredumps.CORE_PATTERN.read_text().startswith("|"):
        assert "core dump went to" in message, message
    else:
        cores = [p for p in daemon.core_dir.glob("core*") if p.suffix != ".txt"]
        assert cores and f"core dump {cores[0]}" in message, message
        note = cores[0].with_name(cores[0].name + ".txt").read_text()
        assert f"build_id {bid}" in note, note

"""Pure-Python pieces: sizes, the results layout, the workload's verification pattern."""

from __future__ import annotations

import json
import re
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from benchfs.procs import descendants, pid_alive, stop_process
from benchfs.results import Manifest, create_run_dir, read_json, write_json_atomic
from benchfs.units import format_size, parse_size
from benchfs.workloads.rw import (
    PERIOD_WORDS,
    WORD,
    Pattern,
    PatternBuffer,
    bandwidth_mib_s,
    describe_word,
    first_mismatch,
    transfers,
)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("4096", 4096),
        ("64M", 64 << 20),
        ("64m", 64 << 20),
        ("1MiB", 1 << 20),
        ("1MB", 1 << 20),
        ("4k", 4096),
        ("2 GiB", 2 << 30),
        ("1T", 1 << 40),
        ("10B", 10),
    ],
)
def test_parse_size(text: str, value: int) -> None:
    assert parse_size(text) == value


@pytest.mark.parametrize("text", ["", "M", "1.5M", "-4k", "4x", "4iB", "1 M B"])
def test_parse_size_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="invalid size"):
        parse_size(text)


@given(st.integers(min_value=0, max_value=1 << 55))
def test_format_size_round_trips(value: int) -> None:
    assert parse_size(format_size(value)) == value


def test_run_dir_layout(tmp_path: Path) -> None:
    now = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)
    a = create_run_dir(tmp_path / "results", "local", now)
    b = create_run_dir(tmp_path / "results", "local", now)
    assert a.path != b.path  # same second, still distinct
    assert re.fullmatch(r"20250102T030405Z-local-[0-9a-f]{6}", a.run_id)
    for sub in ("servers", "workload", "registry"):
        assert (a.path / sub).is_dir()
    assert stat.S_IMODE((a.path / "registry").stat().st_mode) == 0o700
    assert a.server_log(3) == a.path / "servers" / "server-3.log"
    assert a.rank_result(1) == a.path / "workload" / "rank-1.json"
    assert a.workload_summary == a.path / "workload" / "summary.json"
    assert a.config_path == a.path / "config.toml"
    with pytest.raises(ValueError):
        create_run_dir(tmp_path, "../escape")


def test_manifest_is_written_atomically_and_complete(tmp_path: Path) -> None:
    run_dir = create_run_dir(tmp_path, "local")
    manifest = Manifest(
        mode="local",
        commands=[{"what": "benchfs-run", "argv": ["benchfs-run", "launch"]}],
        versions={"benchfs": "0.1.0"},
    )
    with manifest.phase("wait_servers"):
        pass
    with pytest.raises(RuntimeError), manifest.phase("workload"):
        raise RuntimeError("timed even when it fails")
    manifest.event("server-died", "server 1 was killed", server_id=1)
    manifest.finish("failed", "EHOSTDOWN", "server 1 was killed", 1)
    manifest.write(run_dir)
    data = read_json(run_dir.manifest_path)
    assert set(data) >= {
        "schema_version",
        "versions",
        "commands",
        "hostname",
        "nodes",
        "excluded",
        "config",
        "config_hash",
        "timings_s",
        "membership",
        "processes",
        "outcome",
        "started",
        "finished",
    }
    assert set(data["timings_s"]) == {"wait_servers", "workload"}
    assert data["outcome"]["code"] == "EHOSTDOWN"
    assert data["events"][0]["server_id"] == 1
    assert data["finished"].endswith("Z")
    # No temporary files are left next to it.
    assert sorted(p.name for p in run_dir.path.iterdir()) == [
        "manifest.json",
        "registry",
        "servers",
        "telemetry",
        "workload",
    ]


def test_read_json_names_a_malformed_file(tmp_path: Path) -> None:
    path = tmp_path / "x.json"
    path.write_text('{"truncated": ')
    with pytest.raises(ValueError, match=r"x\.json"):
        read_json(path)
    write_json_atomic(path, {"ok": True})
    assert json.loads(path.read_text()) == {"ok": True}


@given(
    rank=st.integers(0, 1000),
    offset=st.integers(0, 1 << 34),
    first=st.integers(0, 3000),
    second=st.integers(0, 3000),
)
def test_pattern_is_defined_per_offset(rank: int, offset: int, first: int, second: int) -> None:
    """Any split of a range generates the same bytes, so transfers can be of any size."""
    pattern = Pattern(rank)
    whole = pattern.bytes_at(offset, first + second)
    assert len(whole) == first + second
    assert pattern.bytes_at(offset, first) + pattern.bytes_at(offset + first, second) == whole


@given(rank=st.integers(0, 1000), word=st.integers(0, PERIOD_WORDS - 2))
def test_pattern_words_name_rank_and_offset(rank: int, word: int) -> None:
    data = Pattern(rank).bytes_at(word * 8, 8)
    assert describe_word(data) == f"data of rank {rank} at offset {word * 8}"
    assert Pattern(rank + 1).bytes_at(word * 8, 8) != data
    assert Pattern(rank).bytes_at(word * 8 + 8, 8) != data


@given(
    period=st.integers(1, 50),
    offset=st.integers(0, 2000),
    length=st.integers(0, 900),
)
def test_pattern_wraps_at_its_period(period: int, offset: int, length: int) -> None:
    pattern = Pattern(3, period_words=period)
    expected = b"".join(
        (pattern.base | (i % period)).to_bytes(WORD, "little")
        for i in range(offset // WORD, (offset + length) // WORD + 1)
    )
    skip = offset % WORD
    assert pattern.bytes_at(offset, length) == expected[skip : skip + length]


@given(
    period=st.integers(1, 40),
    file_size=st.integers(0, 3000),
    transfer=st.integers(1, 700),
)
def test_pattern_buffer_matches_pattern(period: int, file_size: int, transfer: int) -> None:
    pattern = Pattern(5, period_words=period)
    buffer = PatternBuffer(pattern, file_size, transfer)
    for offset, length in transfers(file_size, transfer):
        assert bytes(buffer.view(offset, length)) == pattern.bytes_at(offset, length)


def test_first_mismatch_describes_found_data() -> None:
    expected = Pattern(0).bytes_at(4096, 4096)
    got = bytearray(expected)
    got[1000:1008] = bytes(8)
    assert "offset 5096" in first_mismatch(4096, got, expected)
    assert "found zeros" in first_mismatch(4096, got, expected)


def test_transfers_and_bandwidth() -> None:
    assert transfers(10, 4) == [(0, 4), (4, 4), (8, 2)]
    assert transfers(0, 4) == []
    assert bandwidth_mib_s(2 << 20, [1.0, 1.5], [2.0, 3.0]) == 1.0
    assert bandwidth_mib_s(0, [1.0], [1.0]) == 0.0


def _wait_until(predicate: Callable[[], object], timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return False


def test_stop_process_reaches_the_whole_group() -> None:
    """Teardown signals the group it created, so grandchildren do not survive their parent."""
    script = (
        "import subprocess, sys, time; "
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); time.sleep(60)"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], start_new_session=True)
    try:
        assert _wait_until(lambda: descendants(proc.pid))
        (child,) = descendants(proc.pid)
        assert pid_alive(child)
        assert stop_process(proc, grace_s=5.0, group=True) == -signal.SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert _wait_until(lambda: not pid_alive(child))
    assert not pid_alive(proc.pid)

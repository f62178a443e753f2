"""Darshan logs read with PyDarshan (benchfs.analysis.darshanlog): logs made by real Darshan
3.4.7 from programs on a BenchFS mount (tests/data/darshan/README.md names the commands), bad
logs refused in one line, and, where Darshan is built (contrib/darshan/build-darshan.sh and
BENCHFS_DARSHAN_PREFIX), a fresh log of a program through a mount."""

from __future__ import annotations

import os
import subprocess
from collections import Counter
from itertools import pairwise
from pathlib import Path

import pytest

from benchfs.analysis.darshanlog import read_log
from benchfs.errors import AnalyzeError
from conftest import benchfs_run_command
from test_lifecycle import BIN, exports

DATA = Path(__file__).parent / "data" / "darshan"
PREFIX = os.environ.get("BENCHFS_DARSHAN_PREFIX")  # read before the suite clears BENCHFS_*


def test_the_ior_log_has_every_read_and_write_of_both_ranks() -> None:
    log = read_log(DATA / "ior-posix-mount.darshan")
    assert (log.format, log.library, log.nprocs) == ("3.41", "3.4.7", 2)
    assert log.exe.split()[1:7] == ["-a", "POSIX", "-t", "64k", "-b", "1m"]
    assert "DXT_POSIX" in log.modules
    assert log.files == ("/tmp/dk/mnt/ior.dat.00000000", "/tmp/dk/mnt/ior.dat.00000001")
    counts = Counter((op.rank, op.op, op.length) for op in log.ops)
    assert counts == {(r, o, 65536): 16 for r in (0, 1) for o in ("write", "read")}
    for rank in (0, 1):
        writes = [op for op in log.ops if op.rank == rank and op.op == "write"]
        assert [op.offset for op in writes] == [i * 65536 for i in range(16)]
        reads = [op for op in log.ops if op.rank == rank and op.op == "read"]
        assert max(w.end_s for w in writes) <= min(r.start_s for r in reads)
    assert all(0 <= op.start_s <= op.end_s <= log.run_time_s + 1 for op in log.ops)


def test_the_planted_log_shows_one_rank_writing_small_blocks_at_random() -> None:
    log = read_log(DATA / "planted-small-random.darshan")
    mine = [op for op in log.ops if op.path.endswith("planted.0") and op.op == "write"]
    assert len(mine) == 2000 and {op.length for op in mine} == {512}
    offsets = [op.offset for op in mine]
    assert sum(b != a + 512 for a, b in pairwise(offsets)) > 1900
    other = [op for op in log.ops if op.path.endswith("planted.1") and op.op == "write"]
    assert [op.offset for op in other] == [i << 20 for i in range(8)]


def test_bad_logs_get_one_line(tmp_path: Path) -> None:
    whole = (DATA / "ior-posix-mount.darshan").read_bytes()
    truncated = tmp_path / "truncated.darshan"
    truncated.write_bytes(whole[:1500])
    other = tmp_path / "other.darshan"
    other.write_bytes(b"3.21" + whole[4:])
    text = tmp_path / "text.darshan"
    text.write_text("not a log\n")
    cases = {
        truncated: "the Darshan reader crashed",
        other: "a Darshan log of format 3.21; this reader reads 3.41",
        text: "not a Darshan log",
        tmp_path / "missing.darshan": "No such file or directory",
    }
    for path, said in cases.items():
        with pytest.raises(AnalyzeError) as e:
            read_log(path)
        assert said in e.value.message and "\n" not in e.value.message, e.value.message
        assert str(path) in e.value.message


@pytest.mark.skipif(
    not PREFIX,
    reason="real Darshan not built: run contrib/darshan/build-darshan.sh DARSHAN_SOURCE PREFIX, "
    "then set BENCHFS_DARSHAN_PREFIX=PREFIX",
)
def test_real_darshan_traces_a_program_through_the_mount(tmp_path: Path) -> None:
    prefix = Path(str(PREFIX))
    mount, logs = tmp_path / "mnt", tmp_path / "logs"
    mount.mkdir()
    logs.mkdir()
    start = subprocess.run(
        [BIN / "benchfs", "start", "--servers", "2", "--mount", str(mount),
         "--results-root", str(tmp_path)],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    env = {**os.environ, **exports(start.stdout)}
    try:
        program = "dd if=/dev/zero of=$0/out bs=4096 count=100 status=none"
        subprocess.run(
            ["sh", "-c", program, str(mount)],
            env={
                **env,
                "LD_PRELOAD": str(prefix / "lib" / "libdarshan.so"),
                "DARSHAN_ENABLE_NONMPI": "1",
                "DXT_ENABLE_IO_TRACE": "1",
                "DARSHAN_LOGPATH": str(logs),
            },
            check=True,
            timeout=60,
        )
    finally:
        subprocess.run([BIN / "benchfs", "stop"], env=env, capture_output=True, timeout=120)
    made = [read_log(p) for p in logs.glob("*.darshan")]
    dd = next(log for log in made if log.exe.startswith("dd "))
    writes = [op for op in dd.ops if op.path == str(mount / "out") and op.op == "write"]
    assert [(op.offset, op.length) for op in writes] == [(i * 4096, 4096) for i in range(100)]


def test_launch_refuses_darshan_where_it_would_see_nothing(tmp_path: Path) -> None:
    cases = {
        ("--workload", "rw"): "--darshan traces a program of yours",
        ("--workload", "command", "--command", "true", "--via", "capi"): "--darshan traces",
    }
    for args, said in cases.items():
        done = subprocess.run(
            [*benchfs_run_command(), "launch", "--darshan", str(tmp_path), *args,
             "--results-root", str(tmp_path / "results")],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert done.returncode == 2, done.stderr
        lines = [line for line in done.stderr.splitlines() if "error" in line]
        assert len(lines) == 1 and said in lines[0], done.stderr
    assert not (tmp_path / "results").exists()
    missing = subprocess.run(
        [*benchfs_run_command(), "launch", "--darshan", str(tmp_path), "--workload", "command",
         "--command", "true", "--results-root", str(tmp_path / "results")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert f"--darshan {tmp_path}: no lib/libdarshan.so" in missing.stderr


@pytest.mark.skipif(not PREFIX, reason="real Darshan not built (BENCHFS_DARSHAN_PREFIX)")
@pytest.mark.parametrize("via", ["mount", "preload"])
def test_launch_traces_a_command_with_darshan(tmp_path: Path, via: str) -> None:
    done = subprocess.run(
        [*benchfs_run_command(), "launch", "--darshan", str(PREFIX), "--workload", "command",
         "--via", via, "--clients", "2", "--results-root", str(tmp_path),
         "--command", "dd if=/dev/zero of={mount}/out.{rank} bs=4096 count=50 status=none"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    run = next(tmp_path.glob("*-local-*"))
    logs = [read_log(p) for p in (run / "darshan").glob("*.darshan")]
    assert len(logs) == 2  # dd has no MPI: one log per process
    for log in logs:
        out = log.exe.split("of=")[1].split()[0]
        writes = [(op.offset, op.length) for op in log.ops if op.path == out and op.op == "write"]
        assert writes == [(i * 4096, 4096) for i in range(50)]

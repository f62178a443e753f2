"""Real IOR and mdtest (built from hpc/ior with contrib/ior/build-ior.sh) on BenchFS: the
BENCHFS backend's own checks (-W -R -C, verify-write) in file-per-process, shared, ior-hard and
mdtest easy and hard shapes, `-e` and the default relative paths; the same through
`benchfs-run --workload command` (the C library and the mount with `-a POSIX`), with the
rows reaching the run's summary.

They need `BENCHFS_IOR_PREFIX` (printed by the build script); without it each test skips with
one line saying so. CI cannot fetch IOR; the stand-in headers of tests/c/ior_stub keep the
backend compiling there (test_capi.py).
"""

from __future__ import annotations

import json
import os
import shlex
from collections.abc import Callable
from pathlib import Path

import pytest

from benchfs.cluster import LocalCluster
from benchfs.mpi import MpiLauncher
from benchfs.native import preload_env
from benchfs.parsers import parse_ior, parse_mdtest
from conftest import benchfs_run_command, run_bounded

PREFIX = os.environ.get("BENCHFS_IOR_PREFIX")
pytestmark = pytest.mark.skipif(
    not PREFIX,
    reason="real IOR not built: run contrib/ior/build-ior.sh IOR_SOURCE PREFIX, then set "
    "BENCHFS_IOR_PREFIX=PREFIX",
)
RANKS = 2


def run_tool(
    cluster: LocalCluster, tool: str, args: str, cwd: Path, preload: Path | None = None
) -> str:
    """`tool` (ior or mdtest) as RANKS MPI ranks against `cluster` (with `preload`, under the
    interposition library with that prefix); its output, after checking that it succeeded
    without an error or a warning."""
    launcher = MpiLauncher()
    base = {
        **os.environ,
        "BENCHFS_REGISTRY": str(cluster.registry_dir),
        "BENCHFS_CONFIG": str(cluster.config_path),
    }
    env = launcher.env(base if preload is None else preload_env(base, preload))
    argv = launcher.command(RANKS, [f"{PREFIX}/bin/{tool}", *shlex.split(args)])
    out = run_bounded(argv, timeout=120, env=env, cwd=cwd)
    text = out.stdout + out.stderr
    assert out.returncode == 0, f"{tool} {args}:\n{text}"
    # mdtest's own note for files without data is not about the backend.
    noted = [
        line
        for line in text.splitlines()
        if ("ERROR" in line or "WARNING" in line) and "Read bytes is 0" not in line
    ]
    assert noted == [], text
    return out.stdout


@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    "args",
    [
        # file per process, fsync at the end of the write phase, IOR's default -o testFile
        "-a BENCHFS -F -w -r -W -R -C -e -t 1m -b 8m",
        # one shared file
        "-a BENCHFS -w -r -W -R -C -e -t 1m -b 8m -o /shared",
        # ior-hard: 47008-byte records interleaved in one file, read back by the other rank
        "-a BENCHFS -w -r -W -R -C -t 47008 -b 47008 -s 200 -o /hard",
    ],
    ids=["fpp-fsync-relative", "shared", "ior-hard"],
)
def test_ior_passes_its_own_checks(
    daemon_cluster: Callable[..., LocalCluster], tmp_path: Path, args: str
) -> None:
    cluster = daemon_cluster(2)
    out = run_tool(cluster, "ior", args, tmp_path)
    rows = parse_ior(out, "ior")
    assert {(r.operation, r.kind) for r in rows} >= {("write", "summary"), ("read", "summary")}
    assert all(r.api == "BENCHFS" and r.bw_mib_s > 0 for r in rows)
    assert "Used FS: -nan%" not in out and "Used FS:" in out  # statfs reports the cluster


@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    "args",
    [
        "-a BENCHFS -n 200 -u -F",  # mdtest-easy shape, mdtest's default -d ./out
        "-a BENCHFS -n 200 -F -w 3901 -e 3901 -X --verify-write -d /mdtest-hard",
    ],
    ids=["easy-relative", "hard-verified"],
)
def test_mdtest_passes_its_own_checks(
    daemon_cluster: Callable[..., LocalCluster], tmp_path: Path, args: str
) -> None:
    cluster = daemon_cluster(2)
    out = run_tool(cluster, "mdtest", args, tmp_path)
    rates = {r.operation: r.ops_s for r in parse_mdtest(out, "mdtest")}
    assert all(rates[op] > 0 for op in ("create", "stat", "read", "remove")), rates


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("via", "command", "operations"),
    [
        ("capi", "ior -a BENCHFS -w -r -W -R -C -e -t 1m -b 8m", {"write", "read"}),
        ("capi", "mdtest -a BENCHFS -n 100 -u", {"create", "stat", "remove"}),
        ("mount", "ior -a POSIX -w -r -W -R -C -e -t 1m -b 8m -o {mount}/f", {"write", "read"}),
    ],
    ids=["ior-capi", "mdtest-capi", "ior-posix-mount"],
)
def test_benchfs_run_command_summarises_them(
    tmp_path: Path, via: str, command: str, operations: set[str]
) -> None:
    env = {**os.environ, "PATH": f"{PREFIX}/bin:{os.environ['PATH']}"}
    argv = [
        *benchfs_run_command(),
        *("launch", "--workload", "command", "--via", via, "--command", command),
        *("--results-root", str(tmp_path), "--json"),
    ]
    out = run_bounded(argv, timeout=240, env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    report = json.loads(out.stdout)
    assert report["outcome"] == "ok"
    assert {r["operation"] for r in report["rows"]} >= operations, report["rows"]


@pytest.mark.timeout(240)
def test_io500_with_real_ior_and_mdtest(tmp_path: Path) -> None:
    """`--workload io500 --ior-prefix`: every phase a job of real ior or mdtest (IOR's -R and
    mdtest's -X checks, a wear-out stonewall and status files between the jobs), scored and
    written as the built-in run is."""
    from test_io500 import check_io500_run, run_io500

    report = run_io500(tmp_path, "ci", 150, "--ior-prefix", str(PREFIX))
    check_io500_run(report)
    log = (Path(report["results_dir"]) / "workload" / "output.log").read_text()
    assert log.count("IOR-") >= 4 and log.count("mdtest-") >= 7  # the real programs' banners


@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    ("tool", "args"),
    [
        ("ior", "-a POSIX -F -w -r -W -R -C -e -t 1m -b 8m -o {p}/fpp"),
        ("ior", "-a POSIX -w -r -W -R -C -e -t 47008 -b 47008 -s 200 -o {p}/hard"),
        ("ior", "-a MPIIO -w -r -W -R -C -t 1m -b 8m -o {p}/mpiio"),
        ("mdtest", "-a POSIX -d {p}/md -n 200 -u -F -w 3901 -e 3901"),
    ],
    ids=["ior-posix-fpp", "ior-posix-hard", "ior-mpiio-shared", "mdtest-posix"],
)
def test_ior_and_mdtest_through_the_interposition_library(
    daemon_cluster: Callable[..., LocalCluster], tmp_path: Path, tool: str, args: str
) -> None:
    """Unmodified IOR and mdtest with their POSIX and MPI-IO backends on the preload's prefix
    (a real, empty local directory, still empty afterwards): their own data checks pass."""
    cluster = daemon_cluster(2)
    prefix = tmp_path / "bfs"
    prefix.mkdir()
    out = run_tool(cluster, tool, args.format(p=prefix), tmp_path, preload=prefix)
    if tool == "ior":
        rows = parse_ior(out, "ior")
        assert {(r.operation, r.kind) for r in rows} >= {("write", "summary"), ("read", "summary")}
    else:
        assert {r.operation for r in parse_mdtest(out, "mdtest")} >= {
            "create",
            "stat",
            "read",
            "remove",
        }
    assert os.listdir(prefix) == [], "a call reached the local directory under the prefix"

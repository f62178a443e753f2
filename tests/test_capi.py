"""The C ABI from C: libbenchfs.so, benchfs.h and benchfs.pc as `make build` installs them into
the virtual environment, compiled here with gcc/mpicc and run against real daemons (the MPI
program drives the library the way IOR does), plus the IOR backend compiled against the AIORI
declarations it uses (tests/c/ior_stub) and its function table called the way IOR and mdtest
call it, for machines that cannot build real IOR; tests/test_ior_real.py runs real IOR
and mdtest when BENCHFS_IOR_PREFIX names a build (docs/ior.md).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import sys
import tomllib
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import xxhash

from benchfs.cluster import LocalCluster
from benchfs.mpi import MpiLauncher
from benchfs.units import MIB
from conftest import benchfs_run_command, run_bounded

ROOT = Path(__file__).resolve().parent.parent
C_DIR = ROOT / "tests" / "c"
# `make build` installs the library into the prefix of the environment running the tests.
PREFIX = Path(sys.prefix)


def pkg_config(*args: str) -> list[str]:
    env = {**os.environ, "PKG_CONFIG_PATH": str(PREFIX / "lib" / "pkgconfig")}
    out = run_bounded(["pkg-config", *args, "benchfs"], timeout=30, env=env)
    assert out.returncode == 0, (
        f"benchfs.pc not found in {PREFIX}/lib/pkgconfig (make build installs it): {out.stderr}"
    )
    return shlex.split(out.stdout)


def compile_c(*cmd: str) -> None:
    out = run_bounded(list(cmd), timeout=120)
    assert out.returncode == 0, f"{shlex.join(cmd)}\n{out.stdout}{out.stderr}"


@pytest.fixture(scope="module")
def programs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The C programs, built once per module with the flags pkg-config gives."""
    out = tmp_path_factory.mktemp("capi-build")
    flags = pkg_config("--cflags", "--libs")
    rpath = f"-Wl,-rpath,{pkg_config('--variable=libdir')[0]}"
    built = {"header_check": out / "header_check", "mpi_test": out / "benchfs_mpi_test"}
    strict = ("-Wall", "-Wextra", "-Werror")
    compile_c(
        "gcc", "-std=c99", "-pedantic", *strict, str(C_DIR / "header_check.c"),
        "-o", str(built["header_check"]), *flags, rpath,
    )  # fmt: skip
    compile_c(
        "mpicc", "-std=gnu99", "-O2", "-pthread", *strict, str(C_DIR / "benchfs_mpi_test.c"),
        "-o", str(built["mpi_test"]), *flags, rpath,
    )  # fmt: skip
    return built


def test_installed_files_match_the_tree() -> None:
    header = PREFIX / "include" / "benchfs.h"
    assert header.read_bytes() == (ROOT / "include" / "benchfs.h").read_bytes()
    libdir = Path(pkg_config("--variable=libdir")[0])
    assert (libdir / "libbenchfs.so").is_file()
    # The file is relocatable (its prefix is where it lies), so compare resolved paths.
    (cflag,) = pkg_config("--cflags")
    assert Path(cflag.removeprefix("-I")).resolve() == (PREFIX / "include").resolve()
    # The header declares exactly what the library exports.
    declared = set(re.findall(r"^\S.*?\b(benchfs_\w+)\(", header.read_text(), re.M))
    nm = run_bounded(["nm", "-D", "--defined-only", str(libdir / "libbenchfs.so")], timeout=30)
    exported = {line.split()[-1] for line in nm.stdout.splitlines()}
    assert declared == exported
    assert len(declared) == 24


@pytest.mark.timeout(60)
def test_header_is_strict_c99_and_errors_without_a_cluster(
    programs: dict[str, Path], tmp_path: Path
) -> None:
    registry = tmp_path / "empty-registry"
    registry.mkdir()
    out = run_bounded([str(programs["header_check"]), str(registry)], timeout=30)
    assert out.returncode == 0, out.stdout + out.stderr
    assert re.search(r"^header_check: OK \(libbenchfs \d+\.\d+\.\d+\)$", out.stdout, re.M)


def mpi_command(ranks: int, argv: list[str]) -> tuple[list[str], dict[str, str]]:
    launcher = MpiLauncher()
    return launcher.command(ranks, argv), launcher.env(dict(os.environ))


@pytest.mark.timeout(180)
def test_mpi_ranks_drive_the_library_like_ior(
    programs: dict[str, Path], daemon_cluster: Callable[..., LocalCluster]
) -> None:
    cluster = daemon_cluster(2)
    assert cluster.config_path is not None
    ranks = 3
    cmd, env = mpi_command(
        ranks,
        [str(programs["mpi_test"]), str(cluster.registry_dir), str(cluster.config_path), "ior"],
    )
    out = run_bounded(cmd, timeout=150, env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    for r in range(ranks):
        assert re.search(rf"^rank {r}: ok \(\d+ bytes verified\)$", out.stdout, re.M), out.stdout
    # Per rank: its own file and a neighbour's (4 MiB each, plus a 4 KiB tail read), the whole
    # shared file (2 segments x 3 ranks x 2 MiB), and two threads' files (3 MiB each).
    per_rank = 4 * MIB + 4096 + 4 * MIB + 2 * ranks * 2 * MIB + 2 * 3 * MIB
    assert f"benchfs_mpi_test: OK ranks={ranks} bytes_verified={ranks * per_rank}" in out.stdout
    # benchfs_checksum: each rank's 4 MiB file, hashed by the servers chunk by chunk, as xxhash
    # hashes the pattern the C program wrote (every 8-byte word: its seed's and its offset's).
    chunk = int(tomllib.loads(cluster.config_path.read_text())["layout"]["chunk_size"])
    for r in range(ranks):
        words = np.arange(0, 4 * MIB, 8, dtype=np.uint64) ^ np.uint64(
            ((r + 1) * 0x9E3779B97F4A7C15) % (1 << 64)
        )
        data = words.astype("<u8").tobytes()
        want = [xxhash.xxh3_128_hexdigest(data[i : i + chunk]) for i in range(0, len(data), chunk)]
        got = dict(
            re.findall(rf"^checksum rank {r} range (\d+) ([0-9a-f]{{32}})$", out.stdout, re.M)
        )
        assert [got.get(str(i)) for i in range(len(want))] == want, (r, got)
    # The servers survived all of it (bad input included).
    assert len(cluster.leftover_pids()) == 2


@pytest.mark.timeout(60)
def test_mpi_program_reports_failures(programs: dict[str, Path], tmp_path: Path) -> None:
    """The harness sees a failing run: a missing configuration file fails init in every rank."""
    registry = tmp_path / "registry"
    registry.mkdir()
    cmd, env = mpi_command(
        2, [str(programs["mpi_test"]), str(registry), str(tmp_path / "missing.toml")]
    )
    out = run_bounded(cmd, timeout=45, env=env)
    assert out.returncode != 0
    assert "FAIL" in out.stderr and "No such file or directory" in out.stderr, out.stderr


IOR_BACKEND = ROOT / "contrib" / "ior" / "aiori-BENCHFS.c"


@pytest.mark.timeout(60)
def test_ior_backend_compiles_against_the_aiori_declarations() -> None:
    """Syntax check of contrib/ior/aiori-BENCHFS.c against tests/c/ior_stub (IOR's declarations
    the backend uses, reproduced): not a real IOR build, which docs/ior.md describes."""
    compile_c(
        "mpicc", "-fsyntax-only", "-std=gnu99", "-Wall", "-Wextra", "-Werror",
        f"-I{C_DIR / 'ior_stub'}", *pkg_config("--cflags"), str(IOR_BACKEND),
    )  # fmt: skip


@pytest.mark.timeout(180)
def test_ior_backend_called_like_ior_and_mdtest(
    tmp_path: Path, daemon_cluster: Callable[..., LocalCluster]
) -> None:
    """The backend's function table driven as IOR and mdtest call it (tests/c/ior_driver.c),
    against real daemons: options, nested initialize, write/read/verify, metadata calls."""
    driver = tmp_path / "ior_driver"
    flags = pkg_config("--cflags", "--libs")
    rpath = f"-Wl,-rpath,{pkg_config('--variable=libdir')[0]}"
    compile_c(
        "mpicc", "-std=gnu99", "-Wall", "-Wextra", "-Werror", f"-I{C_DIR / 'ior_stub'}",
        str(C_DIR / "ior_driver.c"), str(IOR_BACKEND), "-o", str(driver), *flags, rpath,
    )  # fmt: skip
    cluster = daemon_cluster(2)
    assert cluster.config_path is not None
    # 65536 is the servers' chunk size (TEST_OVERRIDES in conftest.py).
    argv = [str(driver), str(cluster.registry_dir), str(cluster.config_path), "65536", "2"]
    cmd, env = mpi_command(2, argv)
    out = run_bounded(cmd, timeout=150, env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "ior_driver: OK" in out.stdout


@pytest.mark.timeout(120)
def test_docs_example_runs(tmp_path: Path, daemon_cluster: Callable[..., LocalCluster]) -> None:
    """The copy-paste example of docs/capi.md compiles warning-free and does what it says."""
    text = (ROOT / "docs" / "capi.md").read_text()
    match = re.search(r"```c\n(.*?)```", text, re.S)
    assert match, "no C example in docs/capi.md"
    source = tmp_path / "example.c"
    source.write_text(match.group(1))
    exe = tmp_path / "example"
    rpath = f"-Wl,-rpath,{pkg_config('--variable=libdir')[0]}"
    compile_c(
        "cc", "-std=c99", "-D_POSIX_C_SOURCE=200809L", "-Wall", "-Wextra", "-Werror",
        str(source), "-o", str(exe), *pkg_config("--cflags", "--libs"), rpath,
    )  # fmt: skip
    cluster = daemon_cluster(2)
    # The example passes no config file: $BENCHFS_CONFIG gives it the servers' settings.
    env = {**os.environ, "BENCHFS_CONFIG": str(cluster.config_path)}
    out = run_bounded([str(exe), str(cluster.registry_dir)], timeout=60, env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "read 13 bytes: hello from C" in out.stdout
    assert "over 2 servers" in out.stdout and "  data.bin\n" in out.stdout
    assert "found /run1/data.bin (13 bytes)\n1 of 2 names match" in out.stdout
    assert "latest -> data.bin, 13 bytes\n" in out.stdout
    assert "stat /run1/host: a symbolic link leads outside BenchFS, to /usr/include\n" in out.stdout
    # Everything it made is gone again.
    assert run_bounded([str(exe), str(cluster.registry_dir)], timeout=60, env=env).returncode == 0


@pytest.mark.timeout(150)
def test_pipeline_runs_a_c_program_through_the_library(
    programs: dict[str, Path], tmp_path: Path
) -> None:
    """`benchfs-run launch --workload command --via capi`: the pipeline hands a C program the
    cluster (BENCHFS_REGISTRY, BENCHFS_CONFIG, the library path) and runs it as the ranks."""
    command = f"{programs['mpi_test']} {{registry}} {{config}} pipeline"
    result = run_bounded(
        [
            *benchfs_run_command(),
            "launch",
            "--clients=2",
            "--workload=command",
            "--via=capi",
            f"--command={command}",
            f"--results-root={tmp_path}",
            "--no-analysis",
            "--json",
        ],
        timeout=140,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["outcome"] == "ok" and report["workload"] == "command"
    log = (Path(report["results_dir"]) / "workload" / "output.log").read_text()
    assert "benchfs_mpi_test: OK ranks=2" in log


def test_the_ior_build_script_refuses_what_is_not_an_ior_tree(tmp_path: Path) -> None:
    """contrib/ior/build-ior.sh (run for real by tests/test_ior_real.py's users): bad input is
    one line naming the problem, and nothing is built."""
    script = ROOT / "contrib" / "ior" / "build-ior.sh"
    out = run_bounded([str(script), str(tmp_path), str(tmp_path / "prefix")], timeout=30)
    assert out.returncode == 1
    assert out.stderr.strip().splitlines() == [
        f"build-ior: {tmp_path} is not an IOR source tree (no src/aiori.c)"
    ]
    usage = run_bounded([str(script)], timeout=30)
    assert usage.returncode == 2 and "usage:" in usage.stderr

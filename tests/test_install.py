"""Installing as a user would: the wheel in a fresh virtual environment with no source tree in
sight runs a cluster; `make install PREFIX` without root (apt-get and sudo fail on PATH) gives
commands, library, header, pkg-config file and a module file that Lmod loads; the Spack recipe
compiles and its install command is the one run here."""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import run_bounded

ROOT = Path(__file__).resolve().parent.parent
VERSION = re.search(r'^version = "(.*)"', (ROOT / "rust" / "Cargo.toml").read_text(), re.M)[1]
# The interpreter the source tree's environment was made from: the wheel's Python.
BASE_PYTHON = getattr(sys, "_base_executable", sys.executable)
SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"
LMOD_INIT = Path("/usr/share/lmod/lmod/init/bash")


def sh(script: str, *, env: dict[str, str], cwd: Path, timeout: float = 120) -> str:
    out = run_bounded(
        ["bash", "-c", f"set -euo pipefail\n{script}"], timeout=timeout, env=env, cwd=cwd
    )
    assert out.returncode == 0, f"{script}\n--- stdout\n{out.stdout}\n--- stderr\n{out.stderr}"
    return out.stdout


def clean_env(home: Path, path: str) -> dict[str, str]:
    """A user's environment: no source tree, no virtual environment, no BenchFS variables."""
    keep = {k: v for k, v in os.environ.items() if k in ("LANG", "LC_ALL", "TERM", "USER")}
    # The kernel trace of runs off: it traces the whole host (tests/test_kernel_trace.py has it).
    return {**keep, "HOME": str(home), "PATH": path, "TMPDIR": str(home),
            "BENCHFS_RUN_KERNEL_TRACE": "false"}  # fmt: skip


@pytest.fixture(scope="module")
def prefix(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """`make install PREFIX=...` as a user runs it after a build, with apt-get and sudo made to
    fail (they must not be needed); the Spack recipe runs the same command."""
    root = tmp_path_factory.mktemp("install")
    fake = root / "fakebin"
    fake.mkdir()
    for tool in ("apt-get", "sudo"):
        (fake / tool).write_text(f"#!/bin/sh\necho {tool} was called >> {root}/called\nexit 1\n")
        (fake / tool).chmod(0o755)
    env = {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}"}
    target = root / "prefix"
    recipe = (ROOT / "contrib" / "spack" / "packages" / "benchfs" / "package.py").read_text()
    assert '"install"' in recipe and "PREFIX={prefix}" in recipe  # the command run below
    out = run_bounded(
        ["make", "-C", str(ROOT), "install", f"PREFIX={target}", f"PYTHON={BASE_PYTHON}"],
        timeout=300,
        env=env,
    )
    assert out.returncode == 0, f"{out.stdout}\n{out.stderr}"
    assert not (root / "called").exists(), (root / "called").read_text()
    yield target


@pytest.mark.timeout(300)
def test_make_install_puts_everything_in_the_prefix_without_root(
    prefix: Path, tmp_path: Path
) -> None:
    for rel in (
        "bin/benchfs", "bin/benchfs-run", "bin/benchfs-analyze", "bin/benchfsd",
        "bin/benchfs-mount", "bin/benchfs-config", "lib/libbenchfs.so", "include/benchfs.h",
        "lib/pkgconfig/benchfs.pc", f"share/modulefiles/benchfs/{VERSION}.lua",
        "share/benchfs/burst_buffer.lua",
    ):  # fmt: skip
        assert (prefix / rel).exists(), rel
    # The docs' C example, built with the installed pkg-config file alone, runs on a cluster
    # the installed commands start.
    text = (ROOT / "docs" / "capi.md").read_text()
    example = re.search(r"## Example\n.*?```c\n(.*?)```", text, re.S)
    assert example
    (tmp_path / "app.c").write_text(example[1])
    env = clean_env(tmp_path, f"{prefix}/bin:{SYSTEM_PATH}")
    out = sh(
        f"""
        export PKG_CONFIG_PATH={prefix}/lib/pkgconfig
        cc -O2 -Wall -Werror app.c -o app $(pkg-config --cflags --libs benchfs)
        eval "$(benchfs start --servers 2 --results-root {tmp_path}/results)"
        trap 'benchfs stop >/dev/null' EXIT
        ./app
        """,
        env=env,
        cwd=tmp_path,
    )
    assert "read 13 bytes: hello from C" in out


@pytest.mark.timeout(120)
def test_the_module_file_loads_with_lmod(prefix: Path, tmp_path: Path) -> None:
    assert LMOD_INIT.exists(), "Debian's lmod is missing: run scripts/bootstrap --test"
    env = clean_env(tmp_path, SYSTEM_PATH)
    out = sh(
        f"""
        source {LMOD_INIT}
        module use {prefix}/share/modulefiles
        module load benchfs
        command -v benchfs-run
        benchfs-run --version
        pkg-config --modversion benchfs
        echo "UCX_MEM_MALLOC_HOOKS=$UCX_MEM_MALLOC_HOOKS"
        """,
        env=env,
        cwd=tmp_path,
    )
    lines = out.split()
    assert lines[0] == f"{prefix}/bin/benchfs-run"
    assert VERSION in out and f"{VERSION}\nUCX_MEM_MALLOC_HOOKS=no" in out


def test_the_spack_recipe_compiles() -> None:
    path = ROOT / "contrib" / "spack" / "packages" / "benchfs" / "package.py"
    compile(path.read_text(), str(path), "exec")
    assert "namespace: benchfs" in (ROOT / "contrib" / "spack" / "repo.yaml").read_text()


@pytest.mark.timeout(300)
def test_a_fresh_venv_with_only_the_wheel_runs_a_cluster(prefix: Path, tmp_path: Path) -> None:
    """The wheel `make install` built, without the analysis extra, in a new environment: start,
    use, stage and stop a cluster with no source tree on PATH or in the Python path; the
    analysis commands name the extra they need."""
    (wheel,) = (ROOT / "target" / "wheels").glob(f"benchfs-{VERSION}-cp3*.whl")
    venv = tmp_path / "venv"
    assert run_bounded([BASE_PYTHON, "-m", "venv", str(venv)], timeout=60).returncode == 0
    out = run_bounded(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", str(wheel)], timeout=180
    )
    assert out.returncode == 0, out.stderr
    data = tmp_path / "in"
    (data / "sub").mkdir(parents=True)
    (data / "sub" / "a.bin").write_bytes(os.urandom(300_000))
    (data / "b.txt").write_text("bee\n")
    env = clean_env(tmp_path, f"{venv}/bin:{SYSTEM_PATH}")
    out = sh(
        f"""
        cd {tmp_path}
        python -c 'import benchfs, pandas' 2>/dev/null && exit 3  # no extra here
        eval "$(benchfs start --servers 2 --results-root {tmp_path}/results)"
        trap 'benchfs stop >/dev/null' EXIT
        benchfs status
        benchfs stage-in {data} /staged
        python -c '
import benchfs

with benchfs.Client() as c:
    with c.open("/staged/sub/a.bin") as f:
        assert f.read() == open("{data}/sub/a.bin", "rb").read()
    print("listing", sorted(c.listdir("/staged")))
'
        benchfs stage-out /staged {tmp_path}/out
        cmp {data}/sub/a.bin {tmp_path}/out/sub/a.bin
        ls -l "$(benchfs-config --pkg-config-path)/benchfs.pc"
        benchfs-analyze . 2>&1 | tail -n 1 || true
        """,
        env=env,
        cwd=tmp_path,
        timeout=240,
    )
    assert "listing ['b.txt', 'sub']" in out
    assert "pip install 'benchfs[analysis]'" in out

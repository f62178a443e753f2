"""Workloads under both MPIs: Debian's Open MPI (the default) and MPICH from PyPI (opt-in).

Every run is real: `benchfsd` daemons, the MPI's own mpiexec, ranks that import mpi4py and
benchfs._core, data verified. Each launch carries a marker in its environment, and afterwards
no process on the machine may still carry it (mpiexec, Hydra proxies, orted, ranks).
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
import uuid
from pathlib import Path

import pytest

from benchfs.cluster import LocalCluster, child_env
from benchfs.mpi import NETMOD_VAR, MpiLauncher, find_mpich, find_mpiexec
from benchfs.results import read_json
from benchfs.units import MIB
from conftest import run_bounded

MARK = "MPI_FLAVOUR_TEST_MARK"
FLAVOURS = ["openmpi", "mpich"]

# Imports mpi4py first (the order in which MPICH's bundled UCX would win), then BenchFS, and
# writes which MPI and which libucp files the rank has mapped to <argv[1]>/rank-<r>.json
# (a file each: Hydra may interleave the ranks' stdout within a line).
PROBE = """
import json, os, sys
from mpi4py import MPI
import benchfs._core
maps = {l.split()[-1] for l in open("/proc/self/maps") if len(l.split()) == 6}
c = MPI.COMM_WORLD
record = json.dumps({
    "rank": c.Get_rank(), "size": c.Get_size(),
    "library": MPI.Get_library_version().splitlines()[0],
    "libucp": sorted(p for p in maps if os.path.basename(p).startswith("libucp.so")),
    "sum": c.allreduce(c.Get_rank() + 1),
    "pmi_hostname": os.environ.get("PMI_HOSTNAME"),
})
with open(os.path.join(sys.argv[1], f"rank-{c.Get_rank()}.json"), "w") as f:
    f.write(record)
"""


def launcher_for(flavour: str) -> MpiLauncher:
    launcher = MpiLauncher(find_mpiexec() if flavour == "openmpi" else find_mpich())
    assert launcher.flavour == flavour, launcher.mpiexec
    return launcher


def marked_processes(mark: str) -> list[int]:
    """PIDs of live processes whose environment holds `MARK=mark`."""
    needle = f"{MARK}={mark}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if needle in environ.split(b"\0"):
            found.append(int(entry.name))
    return found


def launch(
    launcher: MpiLauncher,
    ranks: int,
    argv: list[str],
    hosts: list[str] | None = None,
    timeout: float = 90,
) -> tuple[int, str, str]:
    """Run under `launcher`, bounded; then check that nothing it started is left."""
    mark = uuid.uuid4().hex
    env = launcher.env(child_env())
    env[MARK] = mark
    proc = run_bounded(launcher.command(ranks, argv, hosts=hosts), timeout, env=env)
    deadline = time.monotonic() + 5
    while (left := marked_processes(mark)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert left == [], f"processes left behind by {launcher.mpiexec}: {left}"
    return proc.returncode, proc.stdout, proc.stderr


def probe(
    launcher: MpiLauncher, out: Path, ranks: int, hosts: list[str] | None = None
) -> list[dict]:
    out.mkdir()
    code, stdout, stderr = launch(launcher, ranks, [sys.executable, "-c", PROBE, str(out)], hosts)
    assert code == 0, stdout + stderr
    # MPICH's ucx netmod on the system UCX says "UCP API version is incompatible" (UCX logs
    # to stdout); nothing in a rank may initialise a second UCX user of the wrong version.
    assert "UCX" not in stdout + stderr, stdout + stderr
    records = [json.loads((out / f"rank-{r}.json").read_text()) for r in range(ranks)]
    assert [r["rank"] for r in records] == list(range(ranks))
    return records


def system_libucp() -> str:
    """The libucp this test process (which imported benchfs._core, not MPICH) has mapped: the
    UCX 1.22 that scripts/bootstrap installs at .venv/ucx, not Debian's."""
    maps = {line.split()[-1] for line in open("/proc/self/maps") if len(line.split()) == 6}
    (path,) = [p for p in maps if os.path.basename(p).startswith("libucp.so")]
    bootstrap_ucx = os.path.realpath(Path(sys.prefix) / "ucx" / "lib")
    assert os.path.realpath(path).startswith(bootstrap_ucx + os.sep), path
    return os.path.realpath(path)


def rw_argv(cluster: LocalCluster, out: Path) -> list[str]:
    argv = [sys.executable, "-m", "benchfs.workloads.rw", "--registry", str(cluster.registry_dir)]
    argv += ["--out", str(out), "--config", str(cluster.config_path)]
    return [*argv, "--file-size", "6M", "--transfer-size", "256K"]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("flavour", FLAVOURS)
def test_ranks_load_their_mpi_and_the_system_ucx(tmp_path: Path, flavour: str) -> None:
    records = probe(launcher_for(flavour), tmp_path / "probe", 2)
    want = "Open MPI" if flavour == "openmpi" else "MPICH"
    ucp = system_libucp()
    for r in records:
        assert want in r["library"], r
        # One UCX in the process, and it is the one benchfs._core was built for.
        assert [os.path.realpath(p) for p in r["libucp"]] == [ucp], r
        assert r["size"] == 2 and r["sum"] == 3, r


@pytest.mark.timeout(180)
@pytest.mark.parametrize("flavour", FLAVOURS)
def test_rw_workload_verifies_every_byte(daemon_cluster, tmp_path: Path, flavour: str) -> None:
    cluster = daemon_cluster(2)
    out = tmp_path / "out"
    code, stdout, stderr = launch(launcher_for(flavour), 2, rw_argv(cluster, out))
    assert code == 0, stdout + stderr
    summary = read_json(out / "summary.json")
    assert summary["verified"] is True, summary
    assert summary["bytes"] == summary["bytes_read"] == 2 * 6 * MIB
    assert summary["errors"] == [] and summary["servers"] == [0, 1]
    assert summary["write_mib_s"] > 0 and summary["read_mib_s"] > 0


@pytest.mark.timeout(180)
@pytest.mark.parametrize("flavour", FLAVOURS)
def test_ior_workload_under_each_mpi(daemon_cluster, tmp_path: Path, flavour: str) -> None:
    cluster = daemon_cluster(2)
    out = tmp_path / "out"
    argv = [sys.executable, "-m", "benchfs.workloads.ior", "-w", "-r", "-R", "-F"]
    argv += ["-t", "1m", "-b", "8m", "--registry", str(cluster.registry_dir)]
    argv += ["--config", str(cluster.config_path), "--out", str(out)]
    code, stdout, stderr = launch(launcher_for(flavour), 2, argv)
    assert code == 0, stdout + stderr
    assert "Max Write" in stdout and "Max Read" in stdout, stdout
    summary = read_json(out / "summary.json")
    assert summary["verified"] is True and summary["errors"] == [], summary
    assert summary["bytes"] == 2 * 8 * MIB


@pytest.mark.timeout(180)
@pytest.mark.parametrize("flavour", FLAVOURS)
def test_rw_workload_with_ranks_placed_on_hosts(
    daemon_cluster, tmp_path: Path, flavour: str
) -> None:
    """Both MPIs accept this host's names as a host list; under MPICH each distinct entry is
    its own Hydra proxy (a separate node to MPICH), so MPI traffic crosses its netmod."""
    cluster = daemon_cluster(2)
    out = tmp_path / "out"
    hosts = ["localhost", socket.gethostname(), "localhost"]
    code, stdout, stderr = launch(launcher_for(flavour), 3, rw_argv(cluster, out), hosts=hosts)
    assert code == 0, stdout + stderr
    summary = read_json(out / "summary.json")
    assert summary["verified"] is True and summary["ranks"] == 3, summary


@pytest.mark.timeout(120)
def test_mpich_places_rank_i_on_host_i(tmp_path: Path) -> None:
    hosts = [socket.gethostname(), "localhost", "localhost", socket.gethostname()]
    records = probe(launcher_for("mpich"), tmp_path / "probe", 4, hosts=hosts)
    assert [r["pmi_hostname"] for r in records] == hosts
    assert all(r["sum"] == 10 for r in records)


@pytest.mark.timeout(120)
def test_openmpi_places_ranks_in_host_order(tmp_path: Path) -> None:
    launcher = launcher_for("openmpi")
    hosts = ["localhost", socket.gethostname(), "localhost"]
    cmd = launcher.command(3, ["true"], hosts=hosts)
    assert cmd[cmd.index("--host") + 1] == ",".join(hosts)
    assert cmd[cmd.index("--map-by") + 1] == "seq"
    records = probe(launcher, tmp_path / "probe", 3, hosts=hosts)
    assert all(r["sum"] == 6 for r in records)


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_bad_host_lists_are_refused(flavour: str) -> None:
    launcher = launcher_for(flavour)
    with pytest.raises(ValueError, match="3 ranks need 3 host entries, got 2"):
        launcher.command(3, ["true"], hosts=["localhost", "localhost"])
    with pytest.raises(ValueError, match="bad host name"):
        launcher.command(1, ["true"], hosts=["a,b"])
    with pytest.raises(ValueError, match="at least one rank"):
        launcher.command(0, ["true"])


def test_mpich_refuses_its_ucx_netmod() -> None:
    launcher = launcher_for("mpich")
    with pytest.raises(ValueError, match="bundles its own UCX"):
        launcher.env({NETMOD_VAR: "ucx"})
    env = launcher.env({"LD_PRELOAD": "/lib/other.so"})
    assert env[NETMOD_VAR] == "ofi"
    assert env["MPI4PY_LIBMPI"].endswith("libmpi.so.12")
    assert env["LD_PRELOAD"].split(":")[1:] == ["/lib/other.so"]
    assert os.path.realpath(env["LD_PRELOAD"].split(":")[0]) == system_libucp()


def test_openmpi_env_leaves_mpi4py_alone() -> None:
    env = launcher_for("openmpi").env({})
    assert "MPI4PY_LIBMPI" not in env and NETMOD_VAR not in env and "LD_PRELOAD" not in env


def test_find_mpich_says_where_it_looked(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(sys, "prefix", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="run scripts/bootstrap") as info:
        find_mpich()
    assert str(tmp_path / "mpich" / "bin" / "mpiexec") in str(info.value)

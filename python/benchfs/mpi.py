"""Launching workloads with the MPI on this machine: Open MPI (the default) or MPICH.

Open MPI needs flags the others reject (`--oversubscribe`, and permission to run as root), so
the launcher is identified once instead of guessing from its name.

MPICH from PyPI (the `mpich` wheel, which scripts/bootstrap installs into `.venv/mpich`, apart
from the Open MPI that `mpiexec` on PATH runs) is opt-in: `MpiLauncher(find_mpich())`. Its
ranks need two things that `env()` provides:

- mpi4py must load MPICH's libmpi: the mpi4py wheel carries one extension per MPI ABI and
  picks it from the libmpi it loads, `MPI4PY_LIBMPI` when set, else the system's (Open MPI).
- The wheel's libmpi comes with its own UCX 1.20 (`lib/mpich/libucp.so.0`), while
  `benchfs._core` is built for UCX 1.22 (`.venv/ucx`, from scripts/bootstrap). Both have the
  soname `libucp.so.0`, so a process gets only the one loaded first, and BenchFS must not run
  on a UCX older than its own. So BenchFS's libucp is preloaded, which it gets whichever module
  a rank imports first, and MPICH is told to use its ofi netmod (libfabric, which it bundles and
  which has no UCX in it), so MPICH never depends on which UCX that is.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from benchfs.ucx import loaded_libucp

__all__ = ["MpiLauncher", "find_mpich", "find_mpiexec"]

MPICH_PREFIX = "mpich"
"""Where scripts/bootstrap installs the PyPI MPICH wheel, relative to the venv (sys.prefix)."""
NETMOD_VAR = "MPIR_CVAR_CH4_NETMOD"
_HOST = re.compile(r"[A-Za-z0-9_.\-\[\]]+")


def find_mpiexec() -> str:
    """The `mpiexec` on PATH (Open MPI from Debian after `make bootstrap`)."""
    found = shutil.which("mpiexec")
    if found is None:
        raise FileNotFoundError("mpiexec not found on PATH: install an MPI (make bootstrap)")
    return found


def find_mpich() -> str:
    """The PyPI MPICH wheel's mpiexec: `<venv>/mpich/bin/mpiexec` (where bootstrap puts it), or
    `<venv>/bin/mpiexec` if the wheel was pip-installed into the venv itself."""
    prefix = Path(sys.prefix)
    candidates = [prefix / MPICH_PREFIX / "bin" / "mpiexec", prefix / "bin" / "mpiexec"]
    for path in candidates:
        if os.access(path, os.X_OK) and _flavour(str(path)) == "mpich":
            return str(path)
    looked = ", ".join(str(p) for p in candidates)
    raise FileNotFoundError(
        f"MPICH's mpiexec not found (looked at {looked}): run scripts/bootstrap, which installs "
        f"the PyPI mpich wheel into {prefix / MPICH_PREFIX}"
    )


SONAMES = {"libmpi.so.40": "openmpi", "libmpi.so.12": "mpich"}
"""Which MPI a binary links, by the soname of its libmpi."""


def linked_mpi(binary: str | os.PathLike[str]) -> str | None:
    """ "openmpi", "mpich", another libmpi soname, or None (no MPI) for a program or library,
    by ldd (its own links: LD_PRELOAD left out)."""
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    try:
        out = subprocess.run(
            ["ldd", os.fspath(binary)], capture_output=True, text=True, timeout=30, env=env
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    found = re.search(r"\b(libmpi\.so\.\d+)\b", out.stdout)
    return None if found is None else SONAMES.get(found.group(1), found.group(1))


def flavour(mpiexec: str) -> str:
    """ "openmpi", "mpich" or "unknown": which MPI `mpiexec` launches."""
    return _flavour(mpiexec)


@functools.cache
def _flavour(mpiexec: str) -> str:
    """ "openmpi", "mpich" or "unknown", from `mpiexec --version`."""
    try:
        out = subprocess.run(
            [mpiexec, "--version"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    text = out.stdout + out.stderr
    if "Open MPI" in text or "OpenRTE" in text:
        return "openmpi"
    if "HYDRA" in text or "MPICH" in text:
        return "mpich"
    return "unknown"


def _mpich_libmpi(mpiexec: str) -> Path | None:
    """MPICH's libmpi in the same prefix as its mpiexec (`<prefix>/bin` and `<prefix>/lib`)."""
    lib = Path(os.path.realpath(mpiexec)).parent.parent / "lib" / "libmpi.so.12"
    return lib if lib.is_file() else None


class MpiLauncher:
    """Builds the mpiexec command line and environment for N ranks.

    Use both: `Popen(launcher.command(n, argv), env=launcher.env(base))`. The interface
    (`mpiexec`, `flavour`, `command(ranks, argv, hosts=None)`, `env(base)`) is what other
    launchers build on.
    """

    def __init__(self, mpiexec: str | None = None) -> None:
        self.mpiexec = mpiexec or find_mpiexec()
        self.flavour = _flavour(self.mpiexec)

    def command(
        self, ranks: int, argv: Sequence[str], hosts: Sequence[str] | None = None
    ) -> list[str]:
        """The command that runs `argv` as `ranks` MPI processes.

        Without `hosts` all ranks run on this host. With `hosts`, rank i runs on `hosts[i]`
        (one entry per rank, in rank order; a host may repeat): Open MPI's sequential mapper
        over `--host`, MPICH's `-hosts`, each of which places one rank per entry in order.
        """
        if ranks < 1:
            raise ValueError(f"need at least one rank, got {ranks}")
        cmd = [self.mpiexec, "-n", str(ranks)]
        if hosts is not None:
            cmd += self._placement(ranks, list(hosts))
        if self.flavour == "openmpi":
            # More ranks than cores is normal for a local test cluster; do not pin ranks to
            # cores that the servers also use.
            cmd += ["--oversubscribe", "--bind-to", "none"]
        return cmd + list(argv)

    def _placement(self, ranks: int, hosts: list[str]) -> list[str]:
        if len(hosts) != ranks:
            raise ValueError(f"{ranks} ranks need {ranks} host entries, got {len(hosts)}")
        for host in hosts:
            if not _HOST.fullmatch(host):
                raise ValueError(f"bad host name {host!r}")
        joined = ",".join(hosts)
        if self.flavour == "openmpi":
            # `--host a,b,a` alone would merge repeats into slots (a:2,b:1) and fill a first;
            # the seq mapper walks the list as given.
            return ["--host", joined, "--map-by", "seq"]
        if self.flavour == "mpich":
            # Hydra gives each entry one slot and deals ranks out in list order (consecutive
            # repeats share one proxy).
            return ["-hosts", joined]
        raise ValueError(f"{self.mpiexec} is no known MPI: cannot place ranks on hosts")

    def env(self, base: Mapping[str, str]) -> dict[str, str]:
        """`base` plus what this MPI needs in the ranks (see the module doc for MPICH)."""
        env = dict(base)
        if self.flavour == "openmpi" and os.geteuid() == 0:
            env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
            env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        if self.flavour == "mpich":
            libmpi = _mpich_libmpi(self.mpiexec)
            if libmpi is not None:
                # The mpiexec and the libmpi of the ranks must be the same MPI.
                env["MPI4PY_LIBMPI"] = str(libmpi)
                env.pop("MPI4PY_MPIABI", None)  # it would make mpi4py skip loading that file
                if (libmpi.parent / "mpich" / "libucp.so.0").exists():
                    self._avoid_bundled_ucx(env, libmpi.parent)
        return env

    @staticmethod
    def _avoid_bundled_ucx(env: dict[str, str], libdir: Path) -> None:
        netmod = env.get(NETMOD_VAR, "ofi")
        if netmod.lower() != "ofi":
            raise ValueError(
                f"{NETMOD_VAR}={netmod}: this MPICH bundles its own UCX, which cannot share a "
                "process with the UCX of benchfs._core; use ofi (unset the variable)"
            )
        env[NETMOD_VAR] = "ofi"
        try:
            libucp = loaded_libucp(avoid=libdir)
        except RuntimeError as e:
            raise RuntimeError(
                f"{e}: launch MPICH from a process that has not loaded MPICH's own UCX"
            ) from None
        preload = [p for p in env.get("LD_PRELOAD", "").replace(" ", ":").split(":") if p]
        if libucp not in preload:
            env["LD_PRELOAD"] = ":".join([libucp, *preload])

"""Launching workloads with the MPI on this machine (Open MPI or MPICH's mpiexec).

Open MPI needs flags the others reject (`--oversubscribe`, and permission to run as root), so
the launcher is identified once instead of guessing from its name.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from collections.abc import Sequence

__all__ = ["MpiLauncher", "find_mpiexec"]


def find_mpiexec() -> str:
    found = shutil.which("mpiexec")
    if found is None:
        raise FileNotFoundError("mpiexec not found on PATH: install an MPI (make bootstrap)")
    return found


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


class MpiLauncher:
    """Builds the mpiexec command line and environment for N ranks on this host."""

    def __init__(self, mpiexec: str | None = None) -> None:
        self.mpiexec = mpiexec or find_mpiexec()
        self.flavour = _flavour(self.mpiexec)

    def command(self, ranks: int, argv: Sequence[str]) -> list[str]:
        """The command that runs `argv` as `ranks` MPI processes on this host."""
        cmd = [self.mpiexec, "-n", str(ranks)]
        if self.flavour == "openmpi":
            # More ranks than cores is normal for a local test cluster; do not pin ranks to
            # cores that the servers also use.
            cmd += ["--oversubscribe", "--bind-to", "none"]
        return cmd + list(argv)

    def env(self, base: dict[str, str]) -> dict[str, str]:
        """`base` plus what this MPI needs (Open MPI refuses root without being told)."""
        env = dict(base)
        if self.flavour == "openmpi" and os.geteuid() == 0:
            env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
            env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        return env

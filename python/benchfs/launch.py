"""Launchers: how the pipeline starts processes on nodes (local, mpiexec, srun).

Every launcher does three things, and nothing else differs between the modes:

- `spawn(node, argv, log)`: one long-running process on a node (a server, an iostat capture, a
  FUSE mount), in its own session so that a Ctrl-C reaches only the pipeline;
- `run(node, argv, timeout)`: one short command on a node (create or delete its job directory);
- `ranks(hosts, argv, log)`: one MPI job with rank i on `hosts[i]` (the workload, a screen).

Ranks run under `python -m benchfs.rankexec PLAN -- argv`, which gives each rank its node's
name, command prefix, CPU set and mount point from a plan file the pipeline writes, so that the
same workload runs unchanged under every launcher. Processes are stopped by the pid the
launcher returned (SIGTERM to mpiexec or srun is forwarded to the remote processes); nothing is
ever killed by name.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from benchfs.cluster import child_env
from benchfs.errors import LaunchError
from benchfs.mpi import MpiLauncher
from benchfs.nodes import Node

__all__ = [
    "LAUNCHERS",
    "LaunchError",
    "Launcher",
    "LocalLauncher",
    "MpiexecLauncher",
    "SrunLauncher",
    "make_launcher",
    "rank_command",
]

LAUNCHERS = ("local", "mpiexec", "srun")


def rank_command(plan: Path, argv: Sequence[str]) -> list[str]:
    """`argv` wrapped so that each rank takes its node from `plan` (benchfs.rankexec)."""
    return [sys.executable, "-m", "benchfs.rankexec", str(plan), "--", *argv]


def _base_env(base: Mapping[str, str] | None) -> dict[str, str]:
    return dict(base) if base is not None else child_env()


def _popen(argv: Sequence[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )


class Launcher:
    """Base: turns "argv on node" into a local command line; subclasses say how."""

    name = "base"
    stop_signal: int = signal.SIGTERM
    """What asks a process started by `spawn` to stop (forwarded by mpiexec to the process)."""
    interrupt_signal: int = signal.SIGINT
    """What asks iostat to stop and close its JSON document."""

    def node_command(self, node: Node, argv: Sequence[str]) -> list[str]:
        """The local command that runs `argv` (under the node's prefix) on `node`."""
        raise NotImplementedError

    def ranks_command(self, hosts: Sequence[str], argv: Sequence[str]) -> list[str]:
        """The local command that runs `len(hosts)` ranks of `argv`, rank i on hosts[i]."""
        raise NotImplementedError

    def env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """The environment of the launcher's commands: `base` as given (the caller chose it),
        else child_env()."""
        return _base_env(base)

    def ranks_env(self, env: dict[str, str], hosts: Sequence[str], log: Path) -> dict[str, str]:
        """What an MPI job needs on top of `env` (nothing by default)."""
        return env

    def spawn(
        self, node: Node, argv: Sequence[str], log: Path, env: Mapping[str, str] | None = None
    ) -> tuple[subprocess.Popen[bytes], list[str]]:
        cmd = self.node_command(node, argv)
        return _popen(cmd, log, self.env(env)), cmd

    def run(
        self, node: Node, argv: Sequence[str], timeout_s: float
    ) -> subprocess.CompletedProcess[str]:
        """Run a short command on `node`; raises subprocess.TimeoutExpired after `timeout_s`."""
        return subprocess.run(
            self.node_command(node, argv),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            env=self.env(),
            timeout=timeout_s,
            check=False,
        )

    def ranks(
        self,
        hosts: Sequence[str],
        argv: Sequence[str],
        log: Path,
        env: Mapping[str, str] | None = None,
    ) -> tuple[subprocess.Popen[bytes], list[str]]:
        cmd = self.ranks_command(hosts, argv)
        return _popen(cmd, log, self.ranks_env(self.env(env), hosts, log)), cmd

    def describe(self) -> dict[str, Any]:
        """What the manifest records about the launcher."""
        return {"name": self.name}


class LocalLauncher(Launcher):
    """Processes on this host (the embedded default): simulated nodes differ by name, scratch
    directory and prefix only. Ranks still go through mpiexec on this host, since the
    workloads coordinate with MPI."""

    name = "local"

    def __init__(self, mpi: MpiLauncher | None = None) -> None:
        self._mpi = mpi

    @property
    def mpi(self) -> MpiLauncher:
        if self._mpi is None:
            try:
                self._mpi = MpiLauncher()
            except FileNotFoundError as e:
                raise LaunchError("ENOENT", str(e)) from e
        return self._mpi

    def node_command(self, node: Node, argv: Sequence[str]) -> list[str]:
        return node.command(argv)

    def ranks_command(self, hosts: Sequence[str], argv: Sequence[str]) -> list[str]:
        return self.mpi.command(len(hosts), argv)

    def ranks_env(self, env: dict[str, str], hosts: Sequence[str], log: Path) -> dict[str, str]:
        return self.mpi.env(env)

    def describe(self) -> dict[str, Any]:
        info: dict[str, Any] = {"name": self.name}
        if self._mpi is not None:
            info.update(mpiexec=self._mpi.mpiexec, mpi=self._mpi.flavour)
        return info


class MpiexecLauncher(Launcher):
    """mpiexec (Open MPI or MPICH) places every process on its node's host; servers and other
    node processes are one-rank jobs, the workload one job over all client hosts."""

    name = "mpiexec"

    def __init__(self, mpiexec: str | None = None) -> None:
        try:
            self.mpi = MpiLauncher(mpiexec)
        except FileNotFoundError as e:
            raise LaunchError("ENOENT", str(e)) from e

    def node_command(self, node: Node, argv: Sequence[str]) -> list[str]:
        return self.mpi.command(1, node.command(argv), hosts=[node.host])

    def ranks_command(self, hosts: Sequence[str], argv: Sequence[str]) -> list[str]:
        return self.mpi.command(len(hosts), argv, hosts=list(hosts))

    def env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        return self.mpi.env(_base_env(base))

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "mpiexec": self.mpi.mpiexec, "mpi": self.mpi.flavour}


class SrunLauncher(Launcher):
    """srun inside a Slurm allocation: every process is a job step with `--overlap`, so that
    the servers' steps and the workload's step share the allocated nodes. Workload ranks get
    Slurm's PMIx (`--mpi=pmix`, what Open MPI and MPICH accept when launched by srun) and an
    arbitrary distribution from a host file, so that rank i lands on hosts[i]."""

    name = "srun"
    # srun kills its step outright on SIGTERM and only reports status on a first SIGINT, but
    # forwards SIGUSR1 to the tasks: benchfsd and benchfs-mount stop cleanly on it, iostat
    # ends (its JSON then stays unclosed, which the reader accepts).
    stop_signal = signal.SIGUSR1
    interrupt_signal = signal.SIGUSR1

    def __init__(self, srun: str | None = None, mpi_plugin: str = "pmix") -> None:
        found = srun or shutil.which("srun")
        if found is None:
            raise LaunchError("ENOENT", "srun not found on PATH: the srun launcher needs Slurm")
        if not (os.environ.get("SLURM_JOB_ID") or os.environ.get("SLURM_JOBID")):
            raise LaunchError(
                "EINVAL",
                "the srun launcher runs inside a Slurm allocation (SLURM_JOB_ID is unset); "
                "use `benchfs-run submit --scheduler slurm` or salloc",
            )
        self.srun = found
        self.mpi_plugin = mpi_plugin

    def node_command(self, node: Node, argv: Sequence[str]) -> list[str]:
        return [
            self.srun,
            "--overlap",
            "--nodes=1",
            "--ntasks=1",
            f"--nodelist={node.host}",
            "--mpi=none",
            "--kill-on-bad-exit=0",
            "--quiet",
            *node.command(argv),
        ]

    def ranks_command(self, hosts: Sequence[str], argv: Sequence[str]) -> list[str]:
        return [
            self.srun,
            "--overlap",
            f"--ntasks={len(hosts)}",
            # Ranks per node are the user's choice, not the allocation's CPU count.
            "--overcommit",
            "--distribution=arbitrary",
            f"--mpi={self.mpi_plugin}",
            "--kill-on-bad-exit=1",
            *argv,
        ]

    def ranks_env(self, env: dict[str, str], hosts: Sequence[str], log: Path) -> dict[str, str]:
        """SLURM_HOSTFILE, one host per rank, written beside the job's log (`<log>.hosts`),
        so that it stays part of the record."""
        hostfile = log.with_suffix(".hosts")
        hostfile.write_text("".join(f"{h}\n" for h in hosts))
        return {**env, "SLURM_HOSTFILE": str(hostfile)}

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "srun": self.srun, "mpi_plugin": self.mpi_plugin}


def make_launcher(name: str, mpiexec: str | None = None) -> Launcher:
    """The launcher called `name` (LAUNCHERS); LaunchError if it cannot work here."""
    if name == "local":
        return LocalLauncher(MpiLauncher(mpiexec) if mpiexec else None)
    if name == "mpiexec":
        return MpiexecLauncher(mpiexec)
    if name == "srun":
        return SrunLauncher()
    raise LaunchError("EINVAL", f"unknown launcher {name!r} (choose from {', '.join(LAUNCHERS)})")


def this_host() -> str:
    """This machine's short host name (what simulated nodes default to)."""
    return socket.gethostname().split(".", 1)[0]

"""A cluster of `benchfsd` daemons on this host: start, wait for membership, watch, stop.

Each daemon gets its own data directory, log file and node name (BENCHFS_NODE_NAME), and runs
in its own session so that a Ctrl-C at the terminal reaches only the launcher, which then
stops the daemons in order instead of leaving them half-dead.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchfs import _core, coredumps
from benchfs.config import with_overrides
from benchfs.errors import BenchfsError
from benchfs.native import find_binary
from benchfs.procs import pid_alive, stop_process, tail

__all__ = ["DOMAIN_ENV", "Daemon", "LocalCluster", "ServerExited", "child_env", "find_benchfsd"]

NODE_ENV = "BENCHFS_NODE_NAME"
DOMAIN_ENV = "BENCHFS_DOMAIN"
"""A server's failure domain (default: its node's name)."""
Spawn = Callable[[Sequence[str], Path], tuple["subprocess.Popen[bytes]", list[str]]]
"""Starts argv with output to a log file; returns the process and the command it ran."""
WAIT_SLICE_S = 0.2
"""How often membership waiting stops to check that no daemon has died meanwhile."""


class ServerExited(BenchfsError, RuntimeError):
    """A daemon this cluster started is no longer running."""

    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon
        status = daemon.proc.returncode
        how = f"was killed by signal {-status}" if status < 0 else f"exited with code {status}"
        if status < 0 and -status in coredumps.CORE_SIGNALS and daemon.core_dir is not None:
            how += f" ({coredumps.report(daemon.core_dir, daemon.binary)})"
        self.headline = f"server {daemon.server_id} (pid {daemon.pid}, node {daemon.node}) {how}"
        log = tail(daemon.log_path, 5)
        super().__init__(
            "EHOSTDOWN",
            self.headline + (f"; last log lines ({daemon.log_path}):\n{log}" if log else ""),
        )


def find_benchfsd() -> str:
    """Path of the daemon (`benchfs.native.find_binary`)."""
    return find_binary("benchfsd")


def child_env(node: str | None = None, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment for a process that gets the effective config as a file, on `node`.

    Nothing is removed: the `BENCHFS_*` variables are already folded into that file, and a
    process reading an effective configuration does not apply them again (docs/config.md).
    """
    env = dict(os.environ if base is None else base)
    if node is not None:
        env[NODE_ENV] = node
    return env


@dataclass
class Daemon:
    """One `benchfsd` process this cluster started."""

    server_id: int
    node: str
    data_dir: Path
    log_path: Path
    argv: list[str]
    proc: subprocess.Popen[bytes]
    binary: str = ""
    #: Where it started, and where a crash leaves its core dump (benchfs.coredumps).
    core_dir: Path | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def running(self) -> bool:
        return self.proc.poll() is None

    def describe(self) -> dict[str, Any]:
        """The manifest's record of this process."""
        return {
            "role": "benchfsd",
            "server_id": self.server_id,
            "node": self.node,
            "pid": self.pid,
            "argv": self.argv,
            "log": str(self.log_path),
            "data_dir": str(self.data_dir),
            "exit_status": self.proc.returncode,
        }


@dataclass
class LocalCluster:
    """Daemons started on this host that share one registry directory."""

    registry_dir: Path
    config_path: Path | None = None
    benchfsd: str = field(default_factory=find_benchfsd)
    extra_args: Sequence[str] = ()
    daemons: list[Daemon] = field(default_factory=list)

    def start(
        self,
        server_id: int,
        data_dir: Path,
        log_path: Path,
        node: str,
        prefix: Sequence[str] = (),
        spawn: Spawn | None = None,
    ) -> Daemon:
        """Start one daemon; it registers itself once it serves (see `wait_ready`).

        `prefix` is the node's command prefix (nodes file): e.g. `ip netns exec n1`, under
        which the daemon runs (the prefix must exec the daemon, so that its PID is ours).
        `spawn(argv, log)` starts it elsewhere instead (a launcher of benchfs.launch: mpiexec
        or srun onto the node's host, which then owns the prefix and creates nothing here);
        the process it returns is what `stop` signals.
        """
        argv = [
            self.benchfsd,
            "--registry",
            str(self.registry_dir),
            "--data-dir",
            str(data_dir),
            "--id",
            str(server_id),
            "--node",
            node,
        ]
        if self.config_path is not None:
            argv += ["--config", str(self.config_path)]
        argv += list(self.extra_args)
        cores = coredumps.core_dir(log_path, f"server-{server_id}")
        cores.mkdir(parents=True, exist_ok=True)
        argv = coredumps.in_dir(cores, argv)
        if spawn is not None:
            proc, argv = spawn(argv, log_path)
        else:
            data_dir.mkdir(parents=True, exist_ok=True)
            argv = [*prefix, *argv]
            with open(log_path, "ab") as log:
                proc = subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=child_env(node),
                    start_new_session=True,
                )
        daemon = Daemon(server_id, node, data_dir, log_path, argv, proc, self.benchfsd, cores)
        self.daemons.append(daemon)
        return daemon

    @classmethod
    def start_in(
        cls,
        root: Path,
        config_text: str,
        nodes: Sequence[str],
        ready_timeout_s: float,
        *,
        data_dirs: Sequence[Path] | None = None,
        prefix: Sequence[str] = (),
        prefixes: Sequence[Sequence[str]] | None = None,
        benchfsd: str | None = None,
        extra_args: Sequence[str] = (),
    ) -> LocalCluster:
        """The one way to bring up a cluster of its own in a directory: one daemon per name in
        `nodes`, all registered before it returns.

        Every daemon runs under `prefix`, or daemon i under `prefixes[i]` (each its own node).
        `root` gets the registry (mode 0700), the effective configuration (`config.toml`:
        `config_text` with this cluster's size and registry) and one log per daemon; each
        daemon's data goes to `data_dirs[i]` (default `root/data-i`); `extra_args` go to every
        daemon's command line. If a daemon dies or the
        membership is not full within `ready_timeout_s`, the daemons started are stopped and
        ServerExited or TimeoutError is raised. A run's servers, started through a launcher
        onto other nodes, use `start` and `wait_ready` (benchfs.pipeline).
        """
        registry = root / "registry"
        registry.mkdir(parents=True, mode=0o700, exist_ok=True)
        config_path = root / "config.toml"
        config_path.write_text(
            with_overrides(
                config_text,
                [f"cluster.expected_servers={len(nodes)}", f"cluster.registry_dir={registry}"],
            )
        )
        cluster = cls(registry, config_path, benchfsd or find_benchfsd(), extra_args)
        try:
            for i, node in enumerate(nodes):
                data = data_dirs[i] if data_dirs is not None else root / f"data-{i}"
                mine = prefixes[i] if prefixes is not None else prefix
                cluster.start(i, data, root / f"server-{i}.log", node, prefix=mine)
            cluster.wait_ready(ready_timeout_s)
        except BaseException:
            cluster.stop(grace_s=5.0)
            raise
        return cluster

    def exited(self) -> list[Daemon]:
        """Daemons that are no longer running (crashed, killed or stopped)."""
        return [d for d in self.daemons if not d.running()]

    def check_alive(self) -> None:
        """Raise ServerExited for the first daemon that is gone."""
        for daemon in self.exited():
            raise ServerExited(daemon)

    def wait_ready(self, timeout_s: float) -> list[dict[str, Any]]:
        """Wait until every started daemon has registered; return the membership.

        Waits in short slices so that a daemon that dies at start-up (bad config, port in use)
        is reported at once with its log, not after the full timeout.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            remaining = deadline - time.monotonic()
            try:
                return _core.wait_for_servers(
                    str(self.registry_dir),
                    len(self.daemons),
                    max(0.01, min(WAIT_SLICE_S, remaining)),
                )
            except TimeoutError:
                self.check_alive()
                if remaining <= WAIT_SLICE_S:
                    raise

    def kill(self, server_id: int, sig: int = signal.SIGKILL) -> Daemon:
        """Signal one daemon (fault tests use SIGKILL to simulate a crashed node)."""
        daemon = next(d for d in self.daemons if d.server_id == server_id)
        if daemon.running():
            daemon.proc.send_signal(sig)
        return daemon

    def stop(self, grace_s: float = 10.0, sig: int = signal.SIGTERM) -> dict[int, int]:
        """Send `sig` (SIGTERM; srun needs SIGUSR1, which it forwards) to every daemon, SIGKILL
        those still alive after `grace_s`; return exit codes.

        The daemons are signalled together and then waited for, so stopping N of them takes
        one grace period, not N.
        """
        for daemon in self.daemons:
            if daemon.running():
                daemon.proc.send_signal(sig)
        deadline = time.monotonic() + grace_s
        codes: dict[int, int] = {}
        for daemon in self.daemons:
            codes[daemon.server_id] = stop_process(
                daemon.proc, max(0.0, deadline - time.monotonic()), sig=None
            )
        for daemon in self.daemons:
            if daemon.core_dir is not None:
                coredumps.tidy(daemon.core_dir)
        # The job is over: its secret (created by the first server) goes with it.
        (self.registry_dir / _core.JOB_SECRET_FILE).unlink(missing_ok=True)
        return codes

    def leftover_pids(self) -> list[int]:
        return [d.pid for d in self.daemons if pid_alive(d.pid)]

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

"""The resources a run starts, each a stage with a start and a stop: node-local job
directories, iostat on every node, the servers, the FUSE mounts.

The pipeline pushes a stage on its stack before starting it, so that a stage that fails half
way is still stopped; teardown stops the stack in reverse. `stop` undoes whatever part of
`start` happened, is bounded in time, never raises, and returns the error it met (or None):
the run's error, if the run had none.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from benchfs import coredumps
from benchfs.cluster import DOMAIN_ENV, Daemon, LocalCluster, ServerExited, child_env
from benchfs.errors import RunError, errno_name
from benchfs.launch import LocalLauncher
from benchfs.mount import detach_command
from benchfs.nodes import Node
from benchfs.pipeline.context import RunContext
from benchfs.probes.kerneltrace import READY
from benchfs.procs import descendants, kill_pids, stop_process, tail
from benchfs.results import write_json_atomic

SERVER_STOP_GRACE_S = 10.0
MOUNT_WAIT_S = 30


class Stage:
    """Something a run starts and must stop; `phase` names it in the manifest."""

    phase = ""

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> RunError | None:
        raise NotImplementedError


@dataclass
class Started:
    """A process this run started through its launcher, and what the manifest says of it."""

    proc: subprocess.Popen[bytes]
    record: dict[str, Any]
    node: Node | None = None


def interrupt_all(started: Sequence[Started], sig: int, grace_s: float) -> None:
    """`sig` to every process at once (so they finish their output side by side), then the
    bounded stop of each, its exit status recorded, and of whatever still runs under it."""
    for s in started:
        if s.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                s.proc.send_signal(sig)
    for s in started:
        children = descendants(s.proc.pid)
        s.record["exit_status"] = stop_process(s.proc, grace_s, sig=None)
        kill_pids(children, 2.0)


class JobDirs(Stage):
    """A job directory on every node of the run (servers' data, mount points); deleted at the
    end unless --keep-data."""

    phase = "prepare_nodes"

    def __init__(self, ctx: RunContext) -> None:
        self.ctx = ctx
        self.dirs: dict[str, tuple[Node, Path]] = {}
        """Node name -> (node, its job directory)."""

    def start(self) -> None:
        ctx = self.ctx
        assert ctx.roles is not None
        for node in ctx.roles.nodes():
            job = ctx.job_dir(node)
            self.dirs[node.name] = (node, job)  # before mkdir: a half-made dir is removed too
            if not ctx.here(node):
                ctx.on_node(node, ["mkdir", "-p", str(job)], f"creating {job}")
                continue
            try:
                job.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise RunError(
                    errno_name(e), f"cannot create the job directory {job} on {node.name}: {e}"
                ) from e

    def stop(self) -> RunError | None:
        ctx = self.ctx
        ctx.manifest.data_kept = ctx.spec.keep_data
        ctx.manifest.scratch_dirs = {name: str(job) for name, (_, job) in self.dirs.items()}
        if ctx.spec.keep_data:
            kept = ", ".join(str(job) for _, job in self.dirs.values())
            ctx.progress.message(f"kept node-local data in {kept}")
            return None
        problems = []
        for node, job in self.dirs.values():
            if ctx.here(node):
                shutil.rmtree(job, ignore_errors=True)
                if job.exists():
                    problems.append(f"could not remove {job} on {node.name}")
                continue
            try:
                ctx.on_node(node, ["rm", "-rf", "--one-file-system", str(job)], f"removing {job}")
            except RunError as e:
                problems.append(e.message)
        return RunError("EIO", "; ".join(problems)) if problems else None


class IostatCapture(Stage):
    """`iostat` on every node, one JSON capture each (skipped, with an event, without
    sysstat)."""

    phase = "iostat"

    def __init__(self, ctx: RunContext) -> None:
        self.ctx = ctx
        self.captures: list[Started] = []

    def start(self) -> None:
        from benchfs.probes.iostat import find_iostat, iostat_command, iostat_env

        ctx = self.ctx
        assert ctx.roles is not None
        try:
            find_iostat()
        except Exception as e:
            ctx.manifest.event("iostat-missing", str(e))
            return
        ctx.run_dir.iostat_dir.mkdir(exist_ok=True)
        for node in ctx.roles.nodes():
            argv = iostat_command(1.0, node.devices)
            path = ctx.run_dir.iostat_capture(node.name)
            proc, cmd = ctx.launcher.spawn(node, argv, path, iostat_env(child_env()))
            record = {"role": "iostat", "node": node.name, "host": node.host, "pid": proc.pid}
            record.update(argv=cmd, output=str(path))
            self.captures.append(Started(proc, record, node))
            ctx.manifest.processes.append(record)

    def stop(self) -> RunError | None:
        """SIGINT, so that iostat closes its JSON document; then the usual bounded stop."""
        interrupt_all(self.captures, self.ctx.launcher.interrupt_signal, 5.0)
        return None


class NetworkCounters(Stage):
    """Every node's TCP counters (`benchfs.probes.netstat`) when the run's servers start and
    when it ends, one JSON file each in `network/`; a node whose counters cannot be read is
    left out with an event. Nodes that share a network stack (one host, no namespace of
    their own) share their counters: each file says which stack it read."""

    phase = "network_counters"

    def __init__(self, ctx: RunContext) -> None:
        self.ctx = ctx
        self.before: dict[str, dict[str, int]] = {}

    def _read(self, node: Node) -> dict[str, int] | None:
        from benchfs.probes.netstat import parse, snapshot_command

        try:
            done = self.ctx.launcher.run(node, snapshot_command(), 10.0)
        except (OSError, subprocess.TimeoutExpired) as e:
            self.ctx.manifest.event("network-counters", f"{node.name}: {e}")
            return None
        if done.returncode != 0:
            self.ctx.manifest.event("network-counters", f"{node.name}: {done.stderr.strip()}")
            return None
        return parse(done.stdout)

    def start(self) -> None:
        assert self.ctx.roles is not None
        for node in self.ctx.roles.nodes():
            if (counters := self._read(node)) is not None:
                self.before[node.name] = counters

    def stop(self) -> RunError | None:
        from benchfs.probes.netstat import delta

        ctx = self.ctx
        if not self.before or ctx.roles is None:
            return None
        ctx.run_dir.network_dir.mkdir(exist_ok=True)
        for node in ctx.roles.nodes():
            before = self.before.get(node.name)
            after = self._read(node) if before is not None else None
            if before is None or after is None:
                continue
            record = {
                "node": node.name,
                "host": node.host,
                "netns": node.netns,
                "before": before,
                "after": after,
                "delta": delta(before, after),
            }
            with contextlib.suppress(OSError):
                write_json_atomic(ctx.run_dir.network_capture(node.name), record)
        return None


class KernelTrace(Stage):
    """`benchfs-diagnose trace` on every host (one per host, whatever the number of nodes on
    it: the nodes on this host count as one), its JSON lines into `kernel/<host>.jsonl`
    (run.kernel_trace; docs/diagnose.md). A host that cannot trace says why in its file and
    the run goes on."""

    phase = "kernel_trace"

    def __init__(self, ctx: RunContext, config: dict[str, Any]) -> None:
        self.ctx = ctx
        self.enabled = bool(config["run"]["kernel_trace"])
        self.tracers: list[Started] = []

    def start(self) -> None:
        ctx = self.ctx
        assert ctx.roles is not None
        # A cluster left serving (`benchfs start`) lasts as long as the job: its profiles
        # would grow without bound, so it is not traced.
        if not self.enabled or ctx.spec.serve:
            return
        ctx.run_dir.kernel_dir.mkdir(exist_ok=True)
        hosts: dict[str, list[Node]] = {}
        for node in ctx.roles.nodes():
            here = ctx.here(node) or node.netns
            hosts.setdefault("localhost" if here else node.host, []).append(node)
        for host, on_host in hosts.items():
            node = on_host[0]
            argv = [sys.executable, "-m", "benchfs.cli.diagnose", "trace"]
            argv += ["--work", str(ctx.job_dir(node))]
            path = ctx.run_dir.kernel_capture(host)
            launcher = ctx.launcher
            if host == "localhost":
                # This host's tracer runs outside any network namespace or prefix: `ip netns
                # exec` gives its processes a sysfs of their own, without tracefs.
                node, launcher = replace(node, prefix=(), netns=None), LocalLauncher()
            proc, cmd = launcher.spawn(node, argv, path, child_env(node.name))
            record = {"role": "kernel_trace", "node": node.name, "host": host, "pid": proc.pid}
            record["nodes"] = [n.name for n in on_host]
            record.update(argv=cmd, output=str(path))
            self.tracers.append(Started(proc, record, node))
            ctx.manifest.processes.append(record)
        self._wait_ready()

    def _wait_ready(self, timeout_s: float = 60.0) -> None:
        """Until every tracer says it is attached (bpftrace compiles its programs first: a
        second or two), so that the run is traced from its start; a tracer that exits or is
        late is an event of the run, not its failure."""
        deadline = time.monotonic() + timeout_s
        waiting = list(self.tracers)
        while waiting and time.monotonic() < deadline:
            for started in list(waiting):
                path = Path(started.record["output"])
                with contextlib.suppress(OSError):
                    if f'"{READY}"'.encode() in path.read_bytes():
                        waiting.remove(started)
                        continue
                if started.proc.poll() is not None:
                    waiting.remove(started)
                    self.ctx.manifest.event(
                        "kernel-trace", f"the tracer of {started.record['host']} exited "
                        f"{started.proc.returncode} (see {path})",
                    )  # fmt: skip
            time.sleep(0.05)
        for started in waiting:
            self.ctx.manifest.event(
                "kernel-trace",
                f"the tracer of {started.record['host']} was not ready within {timeout_s:g} s",
            )

    def stop(self) -> RunError | None:
        """SIGINT, then time for the tracers to print and perf to fold its stacks."""
        interrupt_all(self.tracers, self.ctx.launcher.interrupt_signal, 300.0)
        return None


class Servers(Stage):
    """One `benchfsd` per server id, each on its node through the launcher, with its data in
    the node's job directory; `wait_ready` waits for the full membership."""

    phase = "start_servers"

    def __init__(self, ctx: RunContext, config: dict[str, Any]) -> None:
        self.ctx = ctx
        self.config = config
        self.cluster: LocalCluster | None = None
        self.children: dict[int, list[int]] = {}
        """Per daemon (launcher) pid, the pids found under it once the membership was full."""
        self.killed: list[int] = []
        """The server ids killed on purpose (--kill-server-after): their exit is no error."""
        self.outlived: set[int] = set()
        """Servers whose death the run outlived (copies of their chunks are elsewhere)."""

    def start(self) -> None:
        ctx = self.ctx
        roles, launcher = ctx.roles, ctx.launcher
        assert roles is not None
        try:
            self.cluster = LocalCluster(
                ctx.run_dir.registry_dir, config_path=ctx.run_dir.config_path
            )
        except FileNotFoundError as e:
            raise RunError("ENOENT", str(e)) from e
        hosts = len({n.name for _, n in roles.servers})
        ctx.progress.message(
            f"starting {len(roles.servers)} servers on {hosts} nodes ({launcher.name})"
        )
        on_node: dict[str, int] = {}
        for sid, node in roles.servers:
            index = on_node.get(node.name, 0)
            on_node[node.name] = index + 1
            cpus = ctx.cpus(node, index)
            pin = ["taskset", "--cpu-list", ",".join(map(str, cpus))] if cpus else []

            def spawn(
                argv: Sequence[str], log: Path, node: Node = node, pin: list[str] = pin
            ) -> tuple[subprocess.Popen[bytes], list[str]]:
                env = {**child_env(node.name), DOMAIN_ENV: node.failure_domain}
                return launcher.spawn(node, [*pin, *argv], log, env)

            daemon = self.cluster.start(
                sid, ctx.job_dir(node) / f"server-{sid}", ctx.run_dir.server_log(sid), node.name,
                spawn=spawn,
            )  # fmt: skip
            ctx.manifest.processes.append({**daemon.describe(), "host": node.host})
        ctx.manifest.write(ctx.run_dir)

    def wait_ready(self) -> None:
        assert self.cluster is not None
        ctx = self.ctx
        ctx.progress.phase("wait_servers")
        timeout = self.config["cluster"]["connect_timeout_s"]
        try:
            membership = self.cluster.wait_ready(timeout)
        except ServerExited as e:
            raise RunError("EHOSTDOWN", f"a server died before registering: {e}") from e
        except TimeoutError as e:
            raise RunError("ETIMEDOUT", f"servers did not register within {timeout} s: {e}") from e
        except ValueError as e:
            raise RunError("EINVAL", f"bad registry entry: {e}") from e
        # Launched through mpiexec or srun, the daemons are children of the launcher
        # processes; their pids are recorded, so teardown can reach them by pid if needed.
        for daemon in self.cluster.daemons:
            self.children[daemon.pid] = descendants(daemon.pid)
        ctx.manifest.membership = membership
        ctx.manifest.write(ctx.run_dir)

    def kill_last(self, whole_node: bool = False) -> list[Daemon]:
        """SIGKILL the last server (`whole_node`: every server of its node) and what runs
        under them (fault injection)."""
        assert self.cluster is not None and self.ctx.roles is not None
        last = self.cluster.daemons[-1]
        node_of = {sid: node.name for sid, node in self.ctx.roles.servers}
        victims = [
            d
            for d in self.cluster.daemons
            if d is last or (whole_node and node_of.get(d.server_id) == node_of[last.server_id])
        ]
        for victim in victims:
            for pid in reversed([victim.pid, *descendants(victim.pid)]):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            self.killed.append(victim.server_id)
        return victims

    def outlives(self, dead: list[int]) -> bool:
        """Whether files keep a copy of every chunk with the servers `dead` gone: they span
        fewer failure domains than `layout.replicas` copies (or, where the servers span
        fewer domains than that and copies share domains, they are fewer servers)."""
        assert self.ctx.roles is not None
        copies = int(self.config["layout"]["replicas"])
        domain = {sid: node.failure_domain for sid, node in self.ctx.roles.servers}
        if len(set(domain.values())) < copies:
            return len(set(dead)) < copies
        return len({domain[sid] for sid in dead}) < copies

    def stop(self) -> RunError | None:
        ctx, cluster = self.ctx, self.cluster
        if cluster is None:
            return None
        if cluster.daemons:
            ctx.progress.message("stopping servers")
        codes = cluster.stop(SERVER_STOP_GRACE_S, ctx.launcher.stop_signal)
        children = [pid for pids in self.children.values() for pid in pids]
        survivors = kill_pids(children, 2.0)
        if survivors:
            ctx.manifest.event("leftover", f"server processes outlived SIGKILL: {survivors}")
        daemons = {d.pid: d for d in cluster.daemons}
        for record in ctx.manifest.processes:
            if record.get("role") == "benchfsd" and record["pid"] in daemons:
                record["exit_status"] = daemons[record["pid"]].proc.returncode
                record["children"] = self.children.get(record["pid"], [])
        unclean = {
            sid: code
            for sid, code in codes.items()
            if not self._clean_exit(sid, code)
            and sid not in self.killed
            and sid not in self.outlived
        }
        if not unclean:
            return None
        sid, code = next(iter(unclean.items()))
        log = self._log(sid)
        return RunError(
            "EIO",
            f"server {sid} did not stop cleanly (exit status {code}); see {log}:\n{tail(log, 5)}",
        )

    def _log(self, sid: int) -> Path:
        assert self.cluster is not None
        return next(d.log_path for d in self.cluster.daemons if d.server_id == sid)

    def _clean_exit(self, sid: int, code: int) -> bool:
        """Status 0 is a clean stop. Through mpiexec or srun the status is the launcher's
        (Open MPI reports a signalled job as 1 even when the daemon exited 0), so there the
        daemon's own last log line, "server N stopped", is what says it stopped cleanly."""
        if code == 0:
            return True
        if self.ctx.launcher.name == "local":
            return False
        return tail(self._log(sid), 1).startswith(f"benchfsd: server {sid} stopped")


def mount_side(node: Node) -> Node:
    """Where `node`'s mount and its commands run. `ip netns exec` would also give them a private
    mount namespace, which the node's other processes cannot see: a node in a network namespace
    mounts in the host's, and the mount's client enters the node's network (BENCHFS_NETNS), as
    MPI ranks do."""
    return replace(node, netns="") if node.netns else node


class Mounts(Stage):
    """`benchfs-mount` on every client node, for a user command through the mount."""

    phase = "mount"

    def __init__(self, ctx: RunContext) -> None:
        self.ctx = ctx
        self.mounts: list[Started] = []

    def start(self) -> None:
        from benchfs.mount import find_benchfs_mount

        ctx = self.ctx
        assert ctx.roles is not None
        ctx.mounted = True
        run_dir = ctx.run_dir
        clients = {n.name: n for n in ctx.roles.clients}.values()
        if ctx.spec.mount_point:  # one path: one mount per host
            clients = {n.host: n for n in clients}.values()
        for node in list(clients):
            point = ctx.mountpoint(node)
            ctx.on_node(mount_side(node), ["mkdir", "-p", str(point)], f"creating {point}")
            argv = [find_benchfs_mount(), "--registry", str(run_dir.registry_dir)]
            if ctx.spec.mount_owner is not None:
                argv += ["--owner", "{}:{}".format(*ctx.spec.mount_owner)]
            argv += ["--config", str(run_dir.config_path), str(point)]
            log = run_dir.servers_dir / f"mount-{node.name}.log"
            cores = coredumps.core_dir(log, f"mount-{node.name}")
            cores.mkdir(parents=True, exist_ok=True)
            argv = coredumps.in_dir(cores, argv)
            env = child_env(node.name)
            if node.netns:
                env["BENCHFS_NETNS"] = node.netns
            proc, cmd = ctx.launcher.spawn(mount_side(node), argv, log, env)
            record: dict[str, Any] = {"role": "benchfs-mount", "node": node.name, "host": node.host}
            record.update(pid=proc.pid, argv=cmd, log=str(log), mountpoint=str(point))
            self.mounts.append(Started(proc, record, node))
            ctx.manifest.processes.append(record)
        for started in self.mounts:
            assert started.node is not None
            point = ctx.mountpoint(started.node)
            # One bounded wait on the node, not one launcher call per poll.
            quoted = shlex.quote(str(point))
            polls = MOUNT_WAIT_S * 10
            wait = f"for i in $(seq {polls}); do mountpoint -q {quoted} && exit 0; sleep 0.1; done"
            wait += "; exit 1"
            try:
                ctx.on_node(
                    mount_side(started.node), ["sh", "-c", wait], f"waiting for the mount {point}"
                )
            except RunError as e:
                log = Path(started.record["log"])
                raise RunError(
                    "EIO", f"{e.message}; benchfs-mount said ({log}):\n{tail(log)}"
                ) from e

    def stop(self) -> RunError | None:
        ctx = self.ctx
        unclean: RunError | None = None
        for started in self.mounts:
            children = descendants(started.proc.pid)
            code = stop_process(started.proc, SERVER_STOP_GRACE_S, sig=ctx.launcher.stop_signal)
            started.record["exit_status"] = code
            kill_pids(children, 2.0)
            if started.node is not None:
                point = ctx.mountpoint(started.node)
                # A mount whose process died is still there, disconnected: detach it.
                with contextlib.suppress(RunError):
                    ctx.on_node(
                        mount_side(started.node), detach_command(point), f"unmounting {point}"
                    )
            log = Path(started.record["log"])
            cores = coredumps.core_dir(log, f"mount-{started.record['node']}")
            if (code != 0 or coredumps.cores_in(cores)) and unclean is None:
                crash = coredumps.report(
                    cores, coredumps.binary_in(started.record["argv"], "benchfs-mount")
                )
                unclean = RunError(
                    "EIO",
                    f"the mount on {started.record['node']} did not stop cleanly (exit status "
                    f"{code}; {crash}); see {log}:\n{tail(log, 5)}",
                )
            coredumps.tidy(cores)
        return unclean

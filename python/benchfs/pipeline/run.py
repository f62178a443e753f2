"""One run of the pipeline: resolve, place, start each stage, run the workload, unwind.

`Pipeline.execute` never raises: whatever fails, or a Ctrl-C / SIGTERM, the stages started so
far are stopped in reverse (each bounded in time), and the run ends with an errno-like code
and a reason, in the manifest and on the terminal; it returns a RunReport.
"""

from __future__ import annotations

import contextlib
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from types import FrameType
from typing import Any

from benchfs import __version__
from benchfs.cluster import child_env, find_benchfsd
from benchfs.config import config_hash, parse_config, resolve_config_text, with_overrides
from benchfs.errors import EXIT_INTERRUPTED, EXIT_USAGE, BenchfsError, RunError, errno_name
from benchfs.launch import make_launcher, this_host
from benchfs.nodes import Node, NodesFileError, load_nodes, read_exclusions, write_nodes
from benchfs.pipeline.context import RunContext
from benchfs.pipeline.darshanrun import darshan_problems
from benchfs.pipeline.roles import NodeRoles, apply_exclusions, plan_roles
from benchfs.pipeline.screen import screen_nodes
from benchfs.pipeline.spec import VIA, WORKLOADS, MessageSink, ProgressSink, RunReport, RunSpec
from benchfs.pipeline.stages import (
    IostatCapture,
    JobDirs,
    KernelTrace,
    Mounts,
    NetworkCounters,
    Servers,
    Stage,
)
from benchfs.pipeline.workload import Workload, check_workload_options
from benchfs.probes.system import tool_version
from benchfs.results import Manifest, RunDir, create_run_dir, write_text_atomic
from benchfs.ucx import find_tool

ANALYSIS_TIMEOUT_S = 600.0


class Terminated(KeyboardInterrupt):
    """SIGTERM to the launcher, handled like Ctrl-C: tear down, record, exit non-zero."""


def collect_versions(mpiexec: str | None) -> dict[str, str | None]:
    """The manifest's `versions`: what ran, so that two runs can be told apart later."""
    try:
        ucx = tool_version([find_tool("ucx_info"), "-v"])
    except FileNotFoundError:
        ucx = None
    return {
        "benchfs": __version__,
        "ucx": ucx.lstrip("# ") if ucx else None,
        "mpi": tool_version([mpiexec, "--version"]) if mpiexec else None,
        "kernel": platform.release(),
        "fio": tool_version(["fio", "--version"]),
        "sysstat": tool_version(["iostat", "-V"]),
        "python": platform.python_version(),
    }


class _Signals:
    """SIGINT and SIGTERM for the whole of `Pipeline.execute`, with no gap between the run
    and its teardown: the first signal received is kept, whenever it comes, and decides the
    outcome; while `armed` (the run proper) it also interrupts the run like Ctrl-C, once, and
    from then on it is only recorded, so that teardown (bounded by its grace periods) finishes.

    Under a scheduler a cancellation reaches the run's children too: scancel has slurmctld
    tell every srun step and slurmd signal every step's processes, the batch step (this
    process) among them, in no set order. A workload or server step may die first and its
    failure be seen before this process gets its own SIGTERM, which then comes during the
    teardown; it must still make the run "interrupted"."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.first: int | None = None
        self.armed = False

    def handle(self, signum: int, frame: FrameType | None) -> None:
        if self.first is None:
            self.first = signum
        if self.armed:
            self.armed = False
            raise Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        previous = {s: signal.signal(s, self.handle) for s in self.SIGNALS}
        try:
            yield
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)


DEFAULT_INTERVAL_MS = 1000
"""telemetry.interval_ms's built-in default: a run that keeps it gets one chosen for it."""
TELEMETRY_SAMPLES = 20
ASSUMED_MIB_S = 1024.0
"""The rate a run's expected length is estimated at (a guess, on the fast side: a slower run
only gets more samples)."""


def telemetry_interval_ms(config: dict[str, Any], spec: RunSpec) -> int | None:
    """The telemetry interval that gives a run about TELEMETRY_SAMPLES snapshots, from 100 ms
    to 1 s, when the configuration keeps the default (None otherwise): the expected length of
    the default workload (and of the built-in IOR without arguments) is its bytes at
    ASSUMED_MIB_S; for any other workload, whose length cannot be told, 250 ms."""
    if config["telemetry"]["interval_ms"] != DEFAULT_INTERVAL_MS:
        return None
    run = config["run"]
    if spec.workload == "rw" or (spec.workload == "ior" and spec.workload_args is None):
        moved = 2 * run["clients"] * run["file_size"] * run["repetitions"]
        seconds = moved / (ASSUMED_MIB_S * (1 << 20))
        ms = seconds * 1000 / TELEMETRY_SAMPLES
    else:
        ms = 250
    return int(min(max(round(ms / 50) * 50, 100), DEFAULT_INTERVAL_MS))


def run_analysis(run_dir: RunDir, manifest: Manifest) -> None:
    """`benchfs-analyze --save` on a finished run, recorded in its manifest; a failed
    analysis is an event, not a failure of the run."""
    argv = [sys.executable, "-m", "benchfs.cli.analyze", str(run_dir.path), "--save"]
    manifest.commands.append({"what": "analysis", "argv": argv})
    log = run_dir.analysis_dir / "analyze.log"
    run_dir.analysis_dir.mkdir(exist_ok=True)
    try:
        with open(log, "wb") as out:
            done = subprocess.run(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                timeout=ANALYSIS_TIMEOUT_S,
                check=False,
                env=child_env(),
            )
        status: int | str = done.returncode
    except subprocess.TimeoutExpired:
        status = "timeout"
    manifest.analysis = {"exit_status": status, "log": str(log)}
    if status != 0:
        manifest.event("analysis-failed", f"benchfs-analyze exited with {status}; see {log}")
    manifest.write(run_dir)


class Pipeline:
    """One `benchfs-run` run: `execute` never raises, it returns a RunReport."""

    def __init__(
        self,
        spec: RunSpec,
        command: Sequence[str],
        progress: ProgressSink | Callable[[str], None] | None = None,
    ) -> None:
        self.spec = spec
        self.command = list(command)
        if progress is None:
            progress = ProgressSink()
        elif not isinstance(progress, ProgressSink):
            progress = MessageSink(progress)
        self.progress: ProgressSink = progress
        self.report = RunReport(launcher=spec.launcher, workload=spec.workload)
        self.started: list[Stage] = []
        """The stages started (or starting), in order; teardown stops them in reverse."""
        self.left_running: list[Stage] = []
        """With `spec.serve`: the stages left running once the cluster is up (benchfs start
        records them; benchfs stop stops them by process)."""
        self.ctx: RunContext | None = None
        self.signals = _Signals()

    def execute(self) -> RunReport:
        start = time.monotonic()
        with self.signals.installed():
            try:
                self._interruptible()
            except BenchfsError as e:  # a run's own, or a launcher's
                self.report.error = e
            except KeyboardInterrupt as e:
                what = (
                    "terminated (SIGTERM)" if isinstance(e, Terminated) else "interrupted (Ctrl-C)"
                )
                self.report.error = RunError("EINTR", what, EXIT_INTERRUPTED)
            except OSError as e:  # e.g. an unwritable results root: the errno says it all
                self.report.error = RunError(errno_name(e), str(e))
            except Exception as e:  # a bug, but it still has to tear down and be recorded
                traceback.print_exc()
                self.report.error = RunError("EIO", f"unexpected error: {type(e).__name__}: {e}")
            finally:
                # Signals are only recorded from here on: teardown is bounded by grace periods.
                if self.started:
                    self.progress.phase("teardown")
                self._teardown()
            self.report.elapsed_s = time.monotonic() - start
            self._first_signal_wins()
            if self.left_running:  # `benchfs stop` finishes the manifest
                self.progress.close()
                return self.report
            self._finish_manifest()
            # After the final manifest: the saved report shows the run's outcome and figures.
            self._analyze()
        self.progress.close()
        return self.report

    def _interruptible(self) -> None:
        """The run proper, during which SIGINT/SIGTERM interrupt it (once)."""
        self.signals.armed = True
        try:
            self._pipeline()
        finally:
            # A signal that comes before this line replaces whatever the run raised (it is
            # caught as an interrupt); one that comes after is recorded for the outcome.
            self.signals.armed = False

    def _first_signal_wins(self) -> None:
        """A run that received SIGINT or SIGTERM before its outcome was written is
        interrupted, even if it had already failed: a child that the same cancellation
        stopped first (a srun step on scancel) fails the run before this process gets its
        own signal. The failure seen first stays in the record as an event."""
        signum, error = self.signals.first, self.report.error
        if signum is None or error is None or error.code == "EINTR":
            # No signal; or one during the teardown of a run that had done its work (its
            # outcome stays "ok"); or the run was interrupted already.
            return
        name = signal.Signals(signum).name
        if self.report.manifest is not None:
            self.report.manifest.event(
                "interrupted",
                f"{name} received; before it, the run had failed: {error.code}: {error.message}",
                signal=name,
                failure={"code": error.code, "message": error.message},
            )
        what = "terminated (SIGTERM)" if signum == signal.SIGTERM else "interrupted (Ctrl-C)"
        self.report.error = RunError("EINTR", what, EXIT_INTERRUPTED)

    def _pipeline(self) -> None:
        spec = self.spec
        self.progress.phase("setup")
        if spec.workload == "command" and not spec.command:
            raise RunError("EINVAL", "--workload command needs --command", EXIT_USAGE)
        nodes, excluded_in = self._nodes()
        # IO500's rule: data on persistent storage when close returns (docs/storage.md); a
        # --set of storage.durability still wins.
        io500 = ["storage.durability=close"] if spec.workload == "io500" else []
        overrides = [*io500, *spec.sets, *spec.flag_overrides()]
        try:
            # The one resolution of the run (file, BENCHFS_*, --set and flags); what the run
            # learns later is added to it with nothing else (with_overrides).
            resolved = resolve_config_text(spec.config, overrides)
            interval = telemetry_interval_ms(parse_config(resolved), spec)
            if interval is not None:
                # Below every setting of the user's: a file, BENCHFS_* or --set still wins.
                resolved = resolve_config_text(
                    spec.config, [f"telemetry.interval_ms={interval}", *overrides]
                )
        except (ValueError, FileNotFoundError) as e:
            raise RunError("EINVAL", f"configuration: {e}", EXIT_USAGE) from e
        run = parse_config(resolved)["run"]
        if nodes is None:
            # No nodes file: one simulated node per server on this host.
            servers = run["servers"]
            scratch = run["scratch_dir"] or tempfile.gettempdir()
            nodes = [Node(f"local-{i}", this_host(), scratch) for i in range(servers)]
        self._validate(run)
        roles = self._roles(nodes, run)  # checked before anything starts or is written
        launcher = make_launcher(spec.launcher, spec.mpiexec)

        run_dir = create_run_dir(run["results_root"], spec.launcher)
        self.report.run_dir = run_dir
        manifest = Manifest(
            mode=spec.launcher,
            commands=[{"what": "benchfs-run", "argv": self.command}],
            versions=collect_versions(self._mpiexec_path()),
            launcher=launcher.describe(),
        )
        manifest.excluded = excluded_in
        self.report.manifest = manifest
        manifest.write(run_dir)
        self.progress.message(f"results directory {run_dir.path}")
        ctx = RunContext(spec, launcher, run_dir, manifest, self.progress)

        if spec.screen:
            with manifest.phase("screen"):
                kept = screen_nodes(ctx, nodes)
            if spec.screen_keeps_clients:
                slow = [n for n in nodes if n not in kept]
                roles = self._roles(kept + slow, run, len(kept), clients_on_all=True)
            else:
                nodes = kept
                roles = self._roles(nodes, run)
        ctx.roles = roles
        self.report.nodes = len(roles.nodes())
        # The cluster's shape is part of the effective config, so config.toml says what ran.
        text = with_overrides(
            resolved,
            [
                f"run.servers={len(roles.servers)}",
                f"run.clients={len(roles.clients)}",
                f"cluster.expected_servers={len(roles.servers)}",
                f"cluster.registry_dir={run_dir.registry_dir}",
                f"telemetry.dir={run_dir.telemetry_dir}",
            ],
        )
        config = parse_config(text)
        self.report.config = config
        write_text_atomic(run_dir.config_path, text)
        manifest.config = config
        manifest.config_hash = config_hash(text)
        manifest.nodes = ctx.node_records()
        write_nodes(run_dir.nodes_path, roles.nodes())
        manifest.write(run_dir)

        self._start(JobDirs(ctx))
        self._start(IostatCapture(ctx))
        self._start(KernelTrace(ctx, config))
        self._start(NetworkCounters(ctx))
        servers = Servers(ctx, config)
        self._start(servers)
        with manifest.phase("wait_servers"):
            servers.wait_ready()
        if spec.serve:
            if spec.mount_point:
                self._start(Mounts(ctx))
            self.ctx = ctx
            self.left_running, self.started = self.started, []
            return
        if spec.workload == "command" and spec.via == "mount":
            self._start(Mounts(ctx))
        with manifest.phase("workload"):
            Workload(ctx, config, servers, self.report).run()

    def _start(self, stage: Stage) -> None:
        """Start a stage, on the stack first: a stage that fails half way is stopped too."""
        assert self.report.manifest is not None
        self.started.append(stage)
        with self.report.manifest.phase(stage.phase):
            stage.start()

    def _teardown(self) -> None:
        """Stop every stage started, in reverse; the first error is the run's if it had none."""
        while self.started:
            stage = self.started.pop()
            try:
                error = stage.stop()
            except Exception as e:  # a bug in a stop: record it, and stop the rest anyway
                traceback.print_exc()
                error = RunError("EIO", f"stopping {stage.phase}: {type(e).__name__}: {e}")
            if error is not None and self.report.error is None:
                self.report.error = error

    def _mpiexec_path(self) -> str | None:
        """The mpiexec whose version the manifest records (the one the ranks will use)."""
        if self.spec.mpiexec:
            return self.spec.mpiexec
        if self.spec.launcher == "srun":
            return None
        return shutil.which("mpiexec")

    def _nodes(self) -> tuple[list[Node] | None, list[dict[str, Any]]]:
        """The nodes file's nodes minus the exclusions (None without a nodes file)."""
        spec = self.spec
        nodes: list[Node] | None = None
        if spec.nodes_file is not None:
            try:
                nodes = load_nodes(spec.nodes_file)
            except (NodesFileError, FileNotFoundError) as e:
                raise RunError("EINVAL", str(e), EXIT_USAGE) from e
        if spec.exclude_from is None:
            return nodes, []
        try:
            exclusions = read_exclusions(spec.exclude_from)
        except (NodesFileError, FileNotFoundError) as e:
            raise RunError("EINVAL", str(e), EXIT_USAGE) from e
        if nodes is None:
            raise RunError("EINVAL", "--exclude-from needs --nodes-file (the nodes to filter)", 2)
        kept, removed = apply_exclusions(nodes, exclusions)
        if not kept:
            raise RunError("EINVAL", f"every node is excluded by {spec.exclude_from}", 2)
        for entry in removed:
            self.progress.message(
                f"excluded {entry['node']} ({entry['host']}): "
                + ("; ".join(entry["reasons"]) or "listed in " + str(spec.exclude_from))
            )
        return kept, removed

    def _validate(self, run: dict[str, Any]) -> None:
        # Counts and sizes are the configuration's to check (resolved once, before this).
        problems = []
        if self.spec.workload not in WORKLOADS:
            problems.append(f"unknown workload {self.spec.workload!r}")
        if self.spec.via not in VIA:
            problems.append(f"--via {self.spec.via!r}: choose mount, capi or preload")
        if self.spec.darshan is not None:
            problems += darshan_problems(self.spec, self._mpiexec_path())
        try:  # before the results directory is made: a run that cannot start leaves none
            find_benchfsd()
        except FileNotFoundError as e:
            problems.append(str(e))
        if problems:
            raise RunError("EINVAL", "; ".join(problems), EXIT_USAGE)
        check_workload_options(self.spec.workload, self.spec.workload_args, run)

    def _roles(
        self,
        nodes: list[Node],
        run: dict[str, Any],
        server_nodes: int | None = None,
        clients_on_all: bool = False,
    ) -> NodeRoles:
        spec = self.spec
        simulated = spec.nodes_file is None
        if simulated and (spec.server_nodes or spec.servers_per_node or spec.clients_per_node):
            raise RunError(
                "EINVAL",
                "--server-nodes, --servers-per-node and --clients-per-node place processes on "
                "the nodes of --nodes-file (without one: --servers and --clients)",
                EXIT_USAGE,
            )
        try:
            return plan_roles(
                nodes,
                # Without a nodes file the nodes were made one per server; with one, totals
                # apply only when given on the command line (else one per node).
                None if simulated else spec.servers,
                run["clients"] if simulated else spec.clients,
                server_nodes or spec.server_nodes,
                spec.servers_per_node,
                spec.clients_per_node,
                clients_on_all,
            )
        except ValueError as e:
            raise RunError("EINVAL", str(e), EXIT_USAGE) from e

    def _analyze(self) -> None:
        """Run `benchfs-analyze --save` on a finished run (when it exists); a failed analysis
        is recorded, it does not fail the run."""
        run_dir, manifest = self.report.run_dir, self.report.manifest
        if not self.spec.analyze or run_dir is None or manifest is None:
            return
        if self.report.error is not None or not run_dir.telemetry_files():
            return
        self.progress.phase("analysis")
        run_analysis(run_dir, manifest)

    def _finish_manifest(self) -> None:
        manifest, run_dir, error = self.report.manifest, self.report.run_dir, self.report.error
        if manifest is None or run_dir is None:
            return
        if error is None:
            manifest.finish("ok", None, None, 0)
        else:
            status = "interrupted" if error.code == "EINTR" else "failed"
            manifest.finish(status, error.code, error.message, error.exit_code)
        manifest.timings_s["total"] = round(self.report.elapsed_s, 6)
        manifest.write(run_dir)

"""The one `benchfs-run` pipeline, the same for every launcher (local, mpiexec, srun).

    nodes (nodes file, allocation, or simulated) - exclusions - optional screen
    -> node-local job directories -> iostat on every node -> servers, each with its own data
    directory -> the full membership (no fixed sleeps) -> the workload (built-in rw, ior,
    mdtest, or a user-named command through the FUSE mount or the C library)
    -> stop the servers (SIGTERM, bounded wait, SIGKILL of what this run started)
    -> delete the node-local data unless --keep-data -> stop iostat -> analysis -> manifest

Whatever fails, or a Ctrl-C / SIGTERM, the teardown still runs every step that applies (each
bounded in time) and the run ends with an errno-like code and a reason, in the manifest and on
the terminal. `Pipeline.execute` never raises; it returns a RunReport.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from benchfs import __version__
from benchfs.cluster import LocalCluster, ServerExited, child_env
from benchfs.config import config_hash, parse_config, resolve_config_text, with_overrides
from benchfs.errors import (
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    BenchfsError,
    RunError,
    errno_name,
)
from benchfs.launch import Launcher, make_launcher, rank_command, this_host
from benchfs.nodes import Exclusion, Node, NodesFileError, load_nodes, read_exclusions, write_nodes
from benchfs.procs import descendants, kill_pids, stop_process, tail
from benchfs.results import (
    Manifest,
    RunDir,
    ScreenDir,
    create_run_dir,
    read_json,
    write_json_atomic,
    write_text_atomic,
)
from benchfs.telemetry import TelemetryFollower
from benchfs.ucx import find_tool
from benchfs.units import format_size

__all__ = [
    "Layout",
    "Pipeline",
    "ProgressSink",
    "RunError",
    "RunReport",
    "RunSpec",
    "apply_exclusions",
    "plan_layout",
]

SERVER_STOP_GRACE_S = 10.0
WORKLOAD_STOP_GRACE_S = 5.0
NODE_COMMAND_TIMEOUT_S = 120.0
"""Bound of one short command on a node (create or delete its job directory)."""
ANALYSIS_TIMEOUT_S = 600.0
SCREEN_TIMEOUT_S = 1800.0
POLL_S = 0.1
"""How often the workload watch checks the daemons and the deadlines."""
PROGRESS_S = 1.0
"""How often the live display reads the servers' telemetry for bytes and bandwidth."""
WORKLOADS = ("rw", "ior", "mdtest", "command")
VIA = ("mount", "capi")

# The workload's error types mapped to errno-like codes, for errors without an errno.
_ERROR_CODES = {
    "TimeoutError": "ETIMEDOUT",
    "ConnectionError": "ECONNRESET",
    "ConnectionResetError": "ECONNRESET",
    "ConnectionRefusedError": "ECONNREFUSED",
    "BrokenPipeError": "EPIPE",
    "FileNotFoundError": "ENOENT",
    "VerificationError": "EIO",
}


class Terminated(KeyboardInterrupt):
    """SIGTERM to the launcher, handled like Ctrl-C: tear down, record, exit non-zero."""


@dataclass
class RunSpec:
    """What the user asked for; None means "take it from the configuration" (or the nodes)."""

    servers: int | None = None
    clients: int | None = None
    file_size: int | None = None
    transfer_size: int | None = None
    config: str | None = None
    sets: Sequence[str] = ()
    keep_data: bool = False
    results_root: str | None = None
    timeout_s: float = 300.0
    kill_server_after_s: float | None = None
    workload: str = "rw"
    """"rw" (write, cross-read, verify), "ior", "mdtest" (benchfs.workloads.*) or "command"."""
    workload_args: str | None = None
    """Options of the ior or mdtest workload, one shell-quoted string; None: derived defaults."""
    command: str | None = None
    """The user-named command of workload "command" (shell-quoted; `{mount}` is replaced)."""
    via: str = "mount"
    """How the user command reaches BenchFS: "mount" (FUSE, per client node) or "capi"."""
    nodes_file: str | None = None
    exclude_from: str | None = None
    screen: bool = False
    screen_args: str | None = None
    launcher: str = "local"
    mpiexec: str | None = None
    server_nodes: int | None = None
    servers_per_node: int | None = None
    clients_per_node: int | None = None
    pin_cpus: bool = False
    analyze: bool = True

    def flag_overrides(self) -> list[str]:
        """Flags as config overrides: they are the highest layer of the one configuration."""
        pairs = {
            "run.servers": self.servers,
            "run.clients": self.clients,
            "run.file_size": self.file_size,
            "run.transfer_size": self.transfer_size,
            "run.results_root": self.results_root,
        }
        return [f"{key}={value}" for key, value in pairs.items() if value is not None]


RUN_SUMMARY_SCHEMA_VERSION = 1
"""Version of `benchfs-run local --json`'s object (benchfs/schemas/run-summary.schema.json)."""


@dataclass
class RunReport:
    """The result of a run, for the terminal and for --json."""

    run_dir: RunDir | None = None
    manifest: Manifest | None = None
    summary: dict[str, Any] | None = None
    error: BenchfsError | None = None
    config: dict[str, Any] = field(default_factory=dict)
    elapsed_s: float = 0.0
    launcher: str = "local"
    nodes: int = 0
    workload: str | None = None
    """The workload's kind (`rw`, `ior`, `mdtest`, `command`), known before it starts."""
    workload_line: str | None = None
    """What the workload runs, in words, once its command line is built."""

    @property
    def exit_code(self) -> int:
        return 0 if self.error is None else self.error.exit_code

    def to_json(self) -> dict[str, Any]:
        run = self.config.get("run", {})
        summary = self.summary or {}
        if self.error is None:
            outcome = "ok"
        else:
            outcome = "interrupted" if self.error.code == "EINTR" else "failed"
        excluded = [] if self.manifest is None else self.manifest.excluded
        return {
            "schema_version": RUN_SUMMARY_SCHEMA_VERSION,
            "outcome": outcome,
            "code": None if self.error is None else self.error.code,
            "message": None if self.error is None else self.error.message,
            "write_mib_s": summary.get("write_mib_s"),
            "read_mib_s": summary.get("read_mib_s"),
            "verified": bool(summary.get("verified")) and self.error is None,
            "verify_requested": summary.get("verify_requested", self.workload in ("rw", "mdtest")),
            "bytes": summary.get("bytes"),
            "workload": summary.get("workload", self.workload),
            "workload_line": self.workload_line,
            "rows": summary.get("rows"),
            "launcher": self.launcher,
            "nodes": self.nodes,
            "excluded": [e["host"] for e in excluded],
            "servers": run.get("servers"),
            "clients": run.get("clients"),
            "file_size": run.get("file_size"),
            "transfer_size": run.get("transfer_size"),
            "elapsed_s": round(self.elapsed_s, 3),
            "results_dir": None if self.run_dir is None else str(self.run_dir.path),
            "telemetry_files": None
            if self.run_dir is None
            else len(self.run_dir.telemetry_files()),
        }


class ProgressSink:
    """Where the pipeline reports: phase changes, messages, and bytes moved (live display)."""

    def phase(self, name: str) -> None: ...

    def message(self, text: str) -> None: ...

    def moved(self, written: int, read: int) -> None: ...

    def totals(self, written: int, read: int) -> None:
        """The workload's own byte counts once it ended (the servers' telemetry, behind
        `moved`, lags by up to a snapshot)."""

    def close(self) -> None: ...


#: Servers plus client ranks one host may run: far more than any node has cores, far fewer
#: than a typo (`--clients 100000`) would start.
MAX_PROCESSES_PER_HOST = 1024


@dataclass(frozen=True)
class Layout:
    """Which server ids run on which node, and which node each client rank runs on."""

    servers: list[tuple[int, Node]]
    clients: list[Node]

    def nodes(self) -> list[Node]:
        """Every node that runs something, in nodes-file order, once."""
        seen: dict[str, Node] = {}
        for _, node in self.servers:
            seen.setdefault(node.name, node)
        for node in self.clients:
            seen.setdefault(node.name, node)
        return list(seen.values())


def plan_layout(
    nodes: Sequence[Node],
    servers: int | None,
    clients: int | None,
    server_nodes: int | None = None,
    servers_per_node: int | None = None,
    clients_per_node: int | None = None,
) -> Layout:
    """Place servers and client ranks on nodes.

    Servers go on the first `server_nodes` nodes (all of them by default); clients on the
    others when `server_nodes` leaves some, else on every node. Per-node counts put that many
    on each node of the set (server i on node i // per-node); totals spread over the set
    (servers round-robin, clients in blocks so that a node's ranks are consecutive).
    Neither given: one per node. ValueError says what does not fit.
    """
    if not nodes:
        raise ValueError("no nodes left to run on")
    k = len(nodes) if server_nodes is None else server_nodes
    if not 1 <= k <= len(nodes):
        raise ValueError(f"--server-nodes {k}: the run has {len(nodes)} nodes")
    server_set = list(nodes[:k])
    client_set = list(nodes[k:]) if k < len(nodes) else list(nodes)
    if servers is not None and servers_per_node is not None:
        raise ValueError("give --servers or --servers-per-node, not both")
    if clients is not None and clients_per_node is not None:
        raise ValueError("give --clients or --clients-per-node, not both")
    if servers is None:
        per = servers_per_node or 1
        placed = [(i, server_set[i // per]) for i in range(per * len(server_set))]
    else:
        placed = [(i, server_set[i % len(server_set)]) for i in range(servers)]
    if clients is None:
        per = clients_per_node or 1
        ranks = [client_set[r // per] for r in range(per * len(client_set))]
    else:
        ranks = [client_set[r * len(client_set) // clients] for r in range(clients)]
    if not placed or not ranks:
        raise ValueError("a run needs at least one server and one client")
    per_host = Counter([n.host for _, n in placed] + [n.host for n in ranks])
    host, most = per_host.most_common(1)[0]
    if most > MAX_PROCESSES_PER_HOST:
        raise ValueError(
            f"{len(placed)} servers and {len(ranks)} clients put {most} processes on host "
            f"{host}: at most {MAX_PROCESSES_PER_HOST} per host"
        )
    return Layout(placed, ranks)


def apply_exclusions(
    nodes: Sequence[Node], excluded: Sequence[Exclusion]
) -> tuple[list[Node], list[dict[str, Any]]]:
    """The nodes left after `excluded` (matched by host or node name, short names too), and
    the manifest's `excluded` list ({host, reasons}) of the nodes that were removed."""
    reasons: dict[str, tuple[str, ...]] = {}
    for e in excluded:
        reasons.setdefault(e.host, e.reasons)
        reasons.setdefault(e.host.split(".", 1)[0], e.reasons)
    kept: list[Node] = []
    removed: list[dict[str, Any]] = []
    for node in nodes:
        keys = (node.host, node.host.split(".", 1)[0], node.name)
        hit = next((k for k in keys if k in reasons), None)
        if hit is None:
            kept.append(node)
        else:
            removed.append({"host": node.host, "node": node.name, "reasons": list(reasons[hit])})
    return kept, removed


def _workload_options(workload: str, args: str | None, run: dict[str, Any]) -> list[str]:
    """The ior/mdtest options: the user's, else IOR's file-per-process write, read and
    verify of run.file_size per client in run.transfer_size transfers (mdtest: 1000 files)."""
    if args is not None:
        try:
            return shlex.split(args)
        except ValueError as e:
            raise RunError("EINVAL", f"--{workload}-args: {e}", EXIT_USAGE) from e
    if workload == "ior":
        sizes = ["-t", str(run["transfer_size"]), "-b", str(run["file_size"])]
        return ["-w", "-r", "-R", "-F", *sizes]
    return ["-n", "1000"]


def _workload_error(summary: dict[str, Any] | None, log: Path) -> tuple[str, str]:
    """(code, message) for a failed workload, from its summary or else the tail of its log."""
    errors = (summary or {}).get("errors") or []
    if not errors:
        return "EIO", f"workload failed without a summary; last output ({log}):\n{tail(log)}"
    first = errors[0]
    code = first.get("errno") or _ERROR_CODES.get(first.get("type", ""), "EIO")
    more = f" (and {len(errors) - 1} more errors)" if len(errors) > 1 else ""
    return code, f"rank {first['rank']} {first['phase']}: {first['message']}{more}"


def _first_line(argv: Sequence[str]) -> str | None:
    """The first non-empty output line of a version command, or None if it cannot run."""
    try:
        out = subprocess.run(list(argv), capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    for line in (out.stdout + out.stderr).splitlines():
        if line.strip():
            return line.strip()
    return None


def collect_versions(mpiexec: str | None) -> dict[str, str | None]:
    """The manifest's `versions`: what ran, so that two runs can be told apart later."""
    try:
        ucx = _first_line([find_tool("ucx_info"), "-v"])
    except FileNotFoundError:
        ucx = None
    return {
        "benchfs": __version__,
        "ucx": ucx.lstrip("# ") if ucx else None,
        "mpi": _first_line([mpiexec, "--version"]) if mpiexec else None,
        "kernel": platform.release(),
        "fio": _first_line(["fio", "--version"]),
        "sysstat": _first_line(["iostat", "-V"]),
        "python": platform.python_version(),
    }


@contextlib.contextmanager
def _signals_as_interrupts() -> Iterator[None]:
    """Turn SIGTERM into an interrupt during the run, so that it tears down like Ctrl-C."""

    def on_term(signum: int, frame: FrameType | None) -> None:
        raise Terminated()

    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def _signals_ignored() -> Iterator[None]:
    """Let teardown finish (it is bounded by grace periods) even if the user presses Ctrl-C."""
    previous = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


@dataclass
class _Started:
    """A process this run started through its launcher, and what the manifest says of it."""

    proc: subprocess.Popen[bytes]
    record: dict[str, Any]
    node: Node | None = None


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
            progress = _MessageSink(progress)
        self.progress: ProgressSink = progress
        self.report = RunReport(launcher=spec.launcher, workload=spec.workload)
        self.launcher: Launcher | None = None
        self.cluster: LocalCluster | None = None
        self.layout: Layout | None = None
        self.job_dirs: dict[str, tuple[Node, Path]] = {}
        """Node name -> (node, its job directory), created on the node; deleted at the end."""
        self.captures: list[_Started] = []
        self.mounts: list[_Started] = []
        self.server_children: dict[int, list[int]] = {}
        """Per daemon (launcher) pid, the pids found under it once the membership was full."""
        self.killed_server: int | None = None

    # The pipeline, step by step.

    def execute(self) -> RunReport:
        start = time.monotonic()
        try:
            with _signals_as_interrupts():
                self._pipeline()
        except BenchfsError as e:  # a run's own, or a launcher's
            self.report.error = e
        except KeyboardInterrupt as e:
            what = "terminated (SIGTERM)" if isinstance(e, Terminated) else "interrupted (Ctrl-C)"
            self.report.error = RunError("EINTR", what, EXIT_INTERRUPTED)
        except OSError as e:  # e.g. an unwritable results root: the errno says it all
            code = errno_name(e)
            self.report.error = RunError(code, str(e))
        except Exception as e:  # a bug, but it still has to tear down and be recorded
            traceback.print_exc()
            self.report.error = RunError("EIO", f"unexpected error: {type(e).__name__}: {e}")
        finally:
            with _signals_ignored():
                self.progress.phase("teardown")
                self._teardown()
        self.report.elapsed_s = time.monotonic() - start
        self._finish_manifest()
        # After the final manifest: the saved report shows the run's outcome and figures.
        with _signals_ignored():
            self._analyze()
        self.progress.close()
        return self.report

    def _pipeline(self) -> None:
        spec = self.spec
        self.progress.phase("setup")
        if spec.workload == "command" and not spec.command:
            raise RunError("EINVAL", "--workload command needs --command", EXIT_USAGE)
        nodes, excluded_in = self._nodes()
        overrides = [*spec.sets, *spec.flag_overrides()]
        try:
            # The one resolution of the run (file, BENCHFS_*, --set and flags); what the run
            # learns later is added to it with nothing else (with_overrides).
            resolved = resolve_config_text(spec.config, overrides)
        except (ValueError, FileNotFoundError) as e:
            raise RunError("EINVAL", f"configuration: {e}", EXIT_USAGE) from e
        run = parse_config(resolved)["run"]
        if nodes is None:
            # No nodes file: one simulated node per server on this host.
            servers = run["servers"]
            if servers < 1:
                raise RunError("EINVAL", f"run.servers must be at least 1 (got {servers})", 2)
            scratch = run["scratch_dir"] or tempfile.gettempdir()
            nodes = [Node(f"local-{i}", this_host(), scratch) for i in range(servers)]
        self._validate(run)
        layout = self._layout(nodes, run)  # checked before anything starts or is written
        self.launcher = make_launcher(spec.launcher, spec.mpiexec)

        run_dir = create_run_dir(run["results_root"], spec.launcher)
        self.report.run_dir = run_dir
        manifest = Manifest(
            mode=spec.launcher,
            commands=[{"what": "benchfs-run", "argv": self.command}],
            versions=collect_versions(self._mpiexec_path()),
            launcher=self.launcher.describe(),
        )
        manifest.excluded = excluded_in
        self.report.manifest = manifest
        manifest.write(run_dir)
        self.progress.message(f"results directory {run_dir.path}")

        if spec.screen:
            with manifest.phase("screen"):
                nodes = self._screen(run_dir, nodes)
            layout = self._layout(nodes, run)
        self.layout = layout
        self.report.nodes = len(layout.nodes())
        # The cluster's shape is part of the effective config, so config.toml says what ran.
        text = with_overrides(
            resolved,
            [
                f"run.servers={len(layout.servers)}",
                f"run.clients={len(layout.clients)}",
                f"cluster.expected_servers={len(layout.servers)}",
                f"cluster.registry_dir={run_dir.registry_dir}",
                f"telemetry.dir={run_dir.telemetry_dir}",
            ],
        )
        config = parse_config(text)
        self.report.config = config
        write_text_atomic(run_dir.config_path, text)
        manifest.config = config
        manifest.config_hash = config_hash(text)
        manifest.nodes = self._node_records(layout)
        write_nodes(run_dir.nodes_path, layout.nodes())
        manifest.write(run_dir)

        with manifest.phase("prepare_nodes"):
            self._prepare_nodes(run_dir, layout)
        with manifest.phase("iostat"):
            self._start_iostat(run_dir, layout)
        with manifest.phase("start_servers"):
            self._start_servers(run_dir, config, layout)
        with manifest.phase("wait_servers"):
            self._wait_servers(run_dir, config)
        if spec.workload == "command" and spec.via == "mount":
            with manifest.phase("mount"):
                self._mount(run_dir, layout)
        with manifest.phase("workload"):
            self._run_workload(run_dir, config, layout)

    def _mpiexec_path(self) -> str | None:
        """The mpiexec whose version the manifest records (the one the ranks will use)."""
        if self.spec.mpiexec:
            return self.spec.mpiexec
        if self.spec.launcher == "srun":
            return None
        return shutil.which("mpiexec")

    # Nodes: the file, exclusions, screening, layout.

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
        problems = []
        for key in ("servers", "clients", "transfer_size"):
            if run[key] < 1:
                problems.append(f"run.{key} must be at least 1 (got {run[key]})")
        if run["file_size"] < 0:
            problems.append(f"run.file_size must not be negative (got {run['file_size']})")
        if self.spec.workload not in WORKLOADS:
            problems.append(f"unknown workload {self.spec.workload!r}")
        if self.spec.via not in VIA:
            problems.append(f"--via {self.spec.via!r}: choose mount or capi")
        if problems:
            raise RunError("EINVAL", "; ".join(problems), EXIT_USAGE)
        self._check_workload_options(run)

    def _check_workload_options(self, run: dict[str, Any]) -> None:
        """--ior-args and --mdtest-args through the workload's own parser, before anything
        starts (the ranks would refuse them only after the servers and MPI were up)."""
        workload = self.spec.workload
        if workload not in ("ior", "mdtest"):
            return
        from benchfs.workloads import ior, mdtest
        from benchfs.workloads.steps import UsageError

        options = [*_workload_options(workload, self.spec.workload_args, run), "--registry", "-"]
        try:
            if workload == "ior":
                ior.parse_options(options)
            else:
                mdtest.parse_args(options)
        except UsageError as e:
            raise RunError("EINVAL", f"--{workload}-args: {e}", EXIT_USAGE) from e

    def _layout(self, nodes: list[Node], run: dict[str, Any]) -> Layout:
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
            return plan_layout(
                nodes,
                # Without a nodes file the nodes were made one per server; with one, totals
                # apply only when given on the command line (else one per node).
                None if simulated else spec.servers,
                run["clients"] if simulated else spec.clients,
                spec.server_nodes,
                spec.servers_per_node,
                spec.clients_per_node,
            )
        except ValueError as e:
            raise RunError("EINVAL", str(e), EXIT_USAGE) from e

    def _screen(self, run_dir: RunDir, nodes: list[Node]) -> list[Node]:
        """Screen `nodes` with benchfs-diagnose (as a program, as a user would) and drop the
        ones it excludes; the screen's directory goes under the run's diagnose/."""
        from benchfs.diagnose.screen import load_screen

        assert self.launcher is not None and self.report.manifest is not None
        manifest = self.report.manifest
        run_dir.diagnose_dir.mkdir(exist_ok=True)
        screened = run_dir.diagnose_dir / "nodes.toml"
        write_nodes(screened, nodes)
        argv = [sys.executable, "-m", "benchfs.cli.diagnose", "screen", "--nodes", str(screened)]
        argv += ["--results-root", str(run_dir.diagnose_dir)]
        if self.spec.config:
            argv += ["--config", self.spec.config]
        try:
            argv += shlex.split(self.spec.screen_args or "")
        except ValueError as e:
            raise RunError("EINVAL", f"--screen-args: {e}", EXIT_USAGE) from e
        log = run_dir.diagnose_dir / "screen.log"
        self.progress.message(f"screening {len(nodes)} nodes with benchfs-diagnose")
        if self.launcher.name == "local":
            # All nodes are here: one process probes them at once (network probe included).
            with open(log, "ab") as out:
                proc = subprocess.Popen(
                    argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                    env=child_env(), start_new_session=True,
                )  # fmt: skip
            cmd = argv
        else:
            # One rank per node, each probing its own (benchfs-diagnose screen --mpi).
            plan = self._rank_plan(run_dir, "screen", nodes)
            hosts = [n.host for n in nodes]
            proc, cmd = self.launcher.ranks(hosts, rank_command(plan, [*argv, "--mpi"]), log)
        manifest.commands.append({"what": "screen", "argv": cmd})
        record = {"role": "screen", "pid": proc.pid, "argv": cmd}
        manifest.processes.append(record)
        try:
            record["exit_status"] = proc.wait(timeout=SCREEN_TIMEOUT_S)
        except BaseException:
            record["exit_status"] = stop_process(proc, WORKLOAD_STOP_GRACE_S, group=True)
            raise
        try:
            (screen_dir,) = run_dir.diagnose_dir.glob("*-screen-*")
            screen = load_screen(screen_dir)
        except (ValueError, FileNotFoundError) as e:
            raise RunError(
                "EIO",
                f"benchfs-diagnose screen wrote no screen (exit {proc.returncode}); "
                f"see {log}:\n{tail(log)}",
            ) from e
        shutil.copyfile(ScreenDir(screen_dir).screen_json, run_dir.prerun_screen)
        excluded = [
            Exclusion(e["host"], tuple(e.get("reasons", []))) for e in screen.get("excluded", [])
        ]
        kept, removed = apply_exclusions(nodes, excluded)
        for entry in removed:
            self.progress.message(f"screen excluded {entry['node']}: {'; '.join(entry['reasons'])}")
            manifest.excluded.append(entry)
        if not kept:
            raise RunError("EHOSTDOWN", "the screen excluded every node; see diagnose/")
        return kept

    def _node_records(self, layout: Layout) -> list[dict[str, Any]]:
        records = []
        for node in layout.nodes():
            records.append(
                {
                    "name": node.name,
                    "host": node.host,
                    "scratch": node.scratch,
                    "devices": list(node.devices),
                    "prefix": list(node.prefix),
                    "servers": [sid for sid, n in layout.servers if n.name == node.name],
                    "ranks": [r for r, n in enumerate(layout.clients) if n.name == node.name],
                }
            )
        return records

    def _cpus(self, node: Node, index: int) -> list[int] | None:
        """CPU of the index-th process on a node with --pin-cpus (servers first, then ranks),
        assuming nodes have this host's CPU count."""
        if not self.spec.pin_cpus:
            return None
        count = os.cpu_count() or 1
        return [index % count]

    def _rank_plan(self, run_dir: RunDir, name: str, nodes: Sequence[Node]) -> Path:
        """Write the per-rank plan of benchfs.rankexec: rank i runs as nodes[i]."""
        assert self.layout is not None or name == "screen"
        per_node_servers: dict[str, int] = {}
        if self.layout is not None:
            for _, node in self.layout.servers:
                per_node_servers[node.name] = per_node_servers.get(node.name, 0) + 1
        seen: dict[str, int] = {}
        ranks = []
        for node in nodes:
            index = per_node_servers.get(node.name, 0) + seen.get(node.name, 0)
            seen[node.name] = seen.get(node.name, 0) + 1
            mount = self._mountpoint(node) if self.mounts else None
            ranks.append(
                {
                    "node": node.name,
                    "host": node.host,
                    "prefix": list(node.prefix),
                    "cpus": self._cpus(node, index) if name != "screen" else None,
                    "mount": None if mount is None else str(mount),
                }
            )
        path = run_dir.path / f"{name}.ranks.json"
        write_json_atomic(path, {"ranks": ranks})
        return path

    # Node-local job directories.

    def _job_dir(self, node: Node) -> Path:
        assert self.report.run_dir is not None
        return Path(node.scratch) / f"benchfs-{self.report.run_dir.run_id}-{node.name}"

    def _mountpoint(self, node: Node) -> Path:
        return self._job_dir(node) / "mnt"

    def _on_node(self, node: Node, argv: Sequence[str], what: str) -> None:
        assert self.launcher is not None
        try:
            done = self.launcher.run(node, argv, NODE_COMMAND_TIMEOUT_S)
        except subprocess.TimeoutExpired as e:
            raise RunError("ETIMEDOUT", f"{what} on {node.name} took over {e.timeout} s") from e
        except OSError as e:
            raise RunError(errno_name(e), f"{what} on {node.name}: {e}") from e
        if done.returncode != 0:
            raise RunError(
                "EIO", f"{what} on {node.name} failed: {(done.stderr or done.stdout).strip()}"
            )

    def _here(self, node: Node) -> bool:
        """True when the node's files are this process's files: no prefix, and the local
        launcher or the node is this host. Then its job directory is made and removed here,
        which also works while a cancelled Slurm job can no longer start steps."""
        if self.launcher is None or node.prefix:
            return False
        return self.launcher.name == "local" or node.host.split(".", 1)[0] == this_host()

    def _prepare_nodes(self, run_dir: RunDir, layout: Layout) -> None:
        for node in layout.nodes():
            job = self._job_dir(node)
            self.job_dirs[node.name] = (node, job)  # before mkdir: a half-made dir is removed too
            if not self._here(node):
                self._on_node(node, ["mkdir", "-p", str(job)], f"creating {job}")
                continue
            try:
                job.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                code = errno_name(e)
                raise RunError(
                    code, f"cannot create the job directory {job} on {node.name}: {e}"
                ) from e

    def _remove_node_data(self) -> list[str]:
        """Delete every job directory this run created; return what could not be deleted."""
        problems = []
        for node, job in self.job_dirs.values():
            if self._here(node):
                shutil.rmtree(job, ignore_errors=True)
                if job.exists():
                    problems.append(f"could not remove {job} on {node.name}")
                continue
            try:
                self._on_node(node, ["rm", "-rf", "--one-file-system", str(job)], f"removing {job}")
            except RunError as e:
                problems.append(e.message)
        return problems

    # iostat on every node.

    def _start_iostat(self, run_dir: RunDir, layout: Layout) -> None:
        from benchfs.probes.iostat import find_iostat, iostat_command, iostat_env

        assert self.launcher is not None and self.report.manifest is not None
        try:
            find_iostat()
        except Exception as e:
            self.report.manifest.event("iostat-missing", str(e))
            return
        run_dir.iostat_dir.mkdir(exist_ok=True)
        for node in layout.nodes():
            argv = iostat_command(1.0, node.devices)
            path = run_dir.iostat_capture(node.name)
            proc, cmd = self.launcher.spawn(node, argv, path, iostat_env(child_env()))
            record = {"role": "iostat", "node": node.name, "host": node.host, "pid": proc.pid}
            record.update(argv=cmd, output=str(path))
            self.captures.append(_Started(proc, record, node))
            self.report.manifest.processes.append(record)

    def _stop_iostat(self) -> None:
        """SIGINT, so that iostat closes its JSON document; then the usual bounded stop."""
        sig = self.launcher.interrupt_signal if self.launcher else signal.SIGINT
        for started in self.captures:
            if started.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    started.proc.send_signal(sig)
        for started in self.captures:
            children = descendants(started.proc.pid)
            started.record["exit_status"] = stop_process(started.proc, 5.0, sig=None)
            kill_pids(children, 2.0)

    # Servers.

    def _start_servers(self, run_dir: RunDir, config: dict[str, Any], layout: Layout) -> None:
        manifest = self.report.manifest
        launcher = self.launcher
        assert manifest is not None and launcher is not None
        try:
            self.cluster = LocalCluster(run_dir.registry_dir, config_path=run_dir.config_path)
        except FileNotFoundError as e:
            raise RunError("ENOENT", str(e)) from e
        self.progress.message(
            f"starting {len(layout.servers)} servers on {len({n.name for _, n in layout.servers})} "
            f"nodes ({launcher.name})"
        )
        on_node: dict[str, int] = {}
        for sid, node in layout.servers:
            index = on_node.get(node.name, 0)
            on_node[node.name] = index + 1
            cpus = self._cpus(node, index)
            pin = ["taskset", "--cpu-list", ",".join(map(str, cpus))] if cpus else []

            def spawn(
                argv: Sequence[str], log: Path, node: Node = node, pin: list[str] = pin
            ) -> tuple[subprocess.Popen[bytes], list[str]]:
                return launcher.spawn(node, [*pin, *argv], log, child_env(node.name))

            daemon = self.cluster.start(
                sid,
                self._job_dir(node) / f"server-{sid}",
                run_dir.server_log(sid),
                node.name,
                spawn=spawn,
            )
            manifest.processes.append({**daemon.describe(), "host": node.host})
        manifest.write(run_dir)

    def _wait_servers(self, run_dir: RunDir, config: dict[str, Any]) -> None:
        assert self.cluster is not None and self.report.manifest is not None
        self.progress.phase("wait_servers")
        timeout = config["cluster"]["connect_timeout_s"]
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
            self.server_children[daemon.pid] = descendants(daemon.pid)
        self.report.manifest.membership = membership
        self.report.manifest.write(run_dir)

    # FUSE mounts for a user command.

    def _mount(self, run_dir: RunDir, layout: Layout) -> None:
        from benchfs.mount import find_benchfs_mount

        assert self.launcher is not None and self.report.manifest is not None
        client_nodes = list({n.name: n for n in layout.clients}.values())
        for node in client_nodes:
            point = self._mountpoint(node)
            self._on_node(node, ["mkdir", "-p", str(point)], f"creating {point}")
            argv = [find_benchfs_mount(), "--registry", str(run_dir.registry_dir)]
            argv += ["--config", str(run_dir.config_path), str(point)]
            log = run_dir.servers_dir / f"mount-{node.name}.log"
            proc, cmd = self.launcher.spawn(node, argv, log, child_env(node.name))
            record = {"role": "benchfs-mount", "node": node.name, "host": node.host}
            record.update(pid=proc.pid, argv=cmd, log=str(log), mountpoint=str(point))
            self.mounts.append(_Started(proc, record, node))
            self.report.manifest.processes.append(record)
        for started in self.mounts:
            assert started.node is not None
            point = self._mountpoint(started.node)
            # One bounded wait on the node (30 s), not one launcher call per poll.
            quoted = shlex.quote(str(point))
            wait = f"for i in $(seq 300); do mountpoint -q {quoted} && exit 0; sleep 0.1; done"
            wait += "; exit 1"
            try:
                self._on_node(started.node, ["sh", "-c", wait], f"waiting for the mount {point}")
            except RunError as e:
                log = Path(started.record["log"])
                raise RunError(
                    "EIO", f"{e.message}; benchfs-mount said ({log}):\n{tail(log)}"
                ) from e

    def _unmount(self) -> None:
        for started in self.mounts:
            children = descendants(started.proc.pid)
            stop = self.launcher.stop_signal if self.launcher else signal.SIGTERM
            started.record["exit_status"] = stop_process(
                started.proc, SERVER_STOP_GRACE_S, sig=stop
            )
            kill_pids(children, 2.0)
            node = started.node
            if node is not None:
                point = shlex.quote(str(self._mountpoint(node)))
                # A mount whose process died is still there, disconnected: detach it.
                detach = f"! mountpoint -q {point} || fusermount3 -uz {point} || umount -l {point}"
                with contextlib.suppress(RunError):
                    self._on_node(node, ["sh", "-c", detach], f"unmounting {point}")

    # The workload.

    def _workload_argv(self, run_dir: RunDir, run: dict[str, Any]) -> tuple[list[str], str]:
        spec = self.spec
        workload = spec.workload
        common = ["--registry", str(run_dir.registry_dir), "--out", str(run_dir.workload_dir)]
        common += ["--config", str(run_dir.config_path)]
        if workload == "rw":
            argv = [sys.executable, "-m", "benchfs.workloads.rw", *common]
            argv += ["--file-size", str(run["file_size"]), "--transfer-size"]
            argv += [str(run["transfer_size"])]
            what = (
                f"{format_size(run['file_size'])} per client in "
                f"{format_size(run['transfer_size'])} transfers"
            )
            return argv, what
        if workload == "command":
            try:
                argv = shlex.split(spec.command or "")
            except ValueError as e:
                raise RunError("EINVAL", f"--command: {e}", EXIT_USAGE) from e
            if not argv:
                raise RunError("EINVAL", "--command is empty", EXIT_USAGE)
            return argv, f"{shlex.join(argv)} (via {spec.via})"
        options = _workload_options(workload, spec.workload_args, run)
        argv = [sys.executable, "-m", f"benchfs.workloads.{workload}", *options, *common]
        return argv, f"{workload} {shlex.join(options)}"

    def _command_env(self, run_dir: RunDir) -> dict[str, str]:
        """What a user command needs to find the cluster through the C library."""
        env = child_env()
        env["BENCHFS_REGISTRY"] = str(run_dir.registry_dir)
        env["BENCHFS_CONFIG"] = str(run_dir.config_path)
        lib = Path(sys.executable).parent.parent / "lib"
        if (lib / "libbenchfs.so").exists():
            env["LD_LIBRARY_PATH"] = ":".join(filter(None, [str(lib), env.get("LD_LIBRARY_PATH")]))
        return env

    def _run_workload(self, run_dir: RunDir, config: dict[str, Any], layout: Layout) -> None:
        manifest = self.report.manifest
        launcher = self.launcher
        assert self.cluster is not None and manifest is not None and launcher is not None
        run = config["run"]
        argv, what = self._workload_argv(run_dir, run)
        self.report.workload_line = what
        self.progress.phase("workload")
        self.progress.message(f"running {len(layout.clients)} clients: {what}")
        plan = self._rank_plan(run_dir, "workload", layout.clients)
        env = self._command_env(run_dir) if self.spec.workload == "command" else None
        proc, cmd = launcher.ranks(
            [n.host for n in layout.clients], rank_command(plan, argv), run_dir.workload_log, env
        )
        manifest.commands.append({"what": "workload", "argv": cmd})
        record: dict[str, Any] = {"role": "workload", "pid": proc.pid, "argv": cmd}
        manifest.processes.append(record)
        manifest.write(run_dir)
        try:
            status, server_failure = self._watch(proc, config, run_dir)
        finally:
            if proc.poll() is None:
                children = descendants(proc.pid)
                record["children"] = children
                stop_process(proc, WORKLOAD_STOP_GRACE_S, group=True)
                kill_pids(children, WORKLOAD_STOP_GRACE_S)
            record["exit_status"] = proc.returncode

        summary = self._summary(run_dir, status)
        for rank in range(len(layout.clients)):
            path = run_dir.rank_result(rank)
            if path.exists():
                manifest.processes.append(
                    {
                        "role": "rank",
                        "rank": rank,
                        "node": layout.clients[rank].name,
                        "pid": read_json(path)["pid"],
                    }
                )
        if server_failure is not None:
            _, detail = _workload_error(summary, run_dir.workload_log)
            outcome = "failed" if status else "finished"
            raise RunError(
                "EHOSTDOWN",
                f"{server_failure}; the workload {outcome} (exit status {status})"
                + (f": {detail}" if status else ""),
            )
        if status != 0:
            code, detail = _workload_error(summary, run_dir.workload_log)
            raise RunError(code, f"workload failed (exit status {status}): {detail}")
        if summary is None:
            raise RunError("EIO", f"workload wrote no summary ({run_dir.workload_summary})")
        if self.spec.workload == "rw" and not summary.get("verified"):
            raise RunError("EIO", "workload finished but did not verify every byte")

    def _summary(self, run_dir: RunDir, status: int) -> dict[str, Any] | None:
        """The workload's summary.json; for a user command, its output parsed into rows."""
        summary = None
        if self.spec.workload == "command":
            if status == 0:
                summary = _command_summary(self.spec.command or "", run_dir)
                write_json_atomic(run_dir.workload_summary, summary)
        elif run_dir.workload_summary.exists():
            summary = read_json(run_dir.workload_summary)
        if summary is not None:
            self.report.summary = summary
            assert self.report.manifest is not None
            self.report.manifest.workload = summary
            if summary.get("bytes") is not None:
                self.progress.totals(summary["bytes"], summary.get("bytes_read") or 0)
        return summary

    def _watch(
        self, proc: subprocess.Popen[bytes], config: dict[str, Any], run_dir: RunDir
    ) -> tuple[int, str | None]:
        """Wait for the workload while watching the daemons and the deadlines.

        Returns (exit status, description of a dead server or None). When a server dies, the
        clients get `request_timeout_s` (plus slack) to notice and fail on their own, which is
        what a user would see on a real cluster; only then is the workload stopped.
        """
        assert self.cluster is not None and self.report.manifest is not None
        manifest = self.report.manifest
        start = time.monotonic()
        deadline = start + self.spec.timeout_s
        kill_after = self.spec.kill_server_after_s
        server_failure: str | None = None
        give_up_at: float | None = None
        follower = TelemetryFollower(run_dir.telemetry_dir)
        next_progress = start
        while True:
            try:
                return proc.wait(timeout=POLL_S), server_failure
            except subprocess.TimeoutExpired:
                pass
            now = time.monotonic()
            if now >= next_progress:
                moved = follower.poll()
                self.progress.moved(moved["write"], moved["read"])
                next_progress = now + PROGRESS_S
            if kill_after is not None and self.killed_server is None and now - start >= kill_after:
                victim = self.cluster.daemons[-1]
                targets = [victim.pid, *descendants(victim.pid)]
                for pid in reversed(targets):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                self.killed_server = victim.server_id
                manifest.event(
                    "fault-injection",
                    f"killed server {victim.server_id} (pid {victim.pid}) with SIGKILL "
                    f"{now - start:.1f} s into the workload (--kill-server-after)",
                    server_id=victim.server_id,
                    pid=victim.pid,
                )
            if server_failure is None:
                for daemon in self.cluster.exited():
                    server_failure = ServerExited(daemon).headline
                    manifest.event("server-died", server_failure, server_id=daemon.server_id)
                    self.progress.message(f"{server_failure}; waiting for the clients to notice")
                    slack = config["client"]["request_timeout_s"] + 10.0
                    give_up_at = now + slack
                    break
            if give_up_at is not None and now >= give_up_at:
                raise RunError(
                    "ETIMEDOUT",
                    f"{server_failure}, and the workload did not fail within "
                    f"client.request_timeout_s + 10 s; it was stopped",
                )
            if now >= deadline:
                raise RunError(
                    "ETIMEDOUT",
                    f"the workload did not finish within --timeout {self.spec.timeout_s} s",
                )

    # Teardown: everything this run started, in reverse order, each step bounded.

    def _teardown(self) -> None:
        manifest = self.report.manifest
        self._unmount()
        if self.cluster is not None:
            if self.cluster.daemons:
                self.progress.message("stopping servers")
            stop = self.launcher.stop_signal if self.launcher else signal.SIGTERM
            codes = self.cluster.stop(SERVER_STOP_GRACE_S, stop)
            children = [pid for pids in self.server_children.values() for pid in pids]
            survivors = kill_pids(children, 2.0)
            if survivors and manifest is not None:
                manifest.event("leftover", f"server processes outlived SIGKILL: {survivors}")
            unclean = {
                sid: code
                for sid, code in codes.items()
                if not self._clean_exit(sid, code) and sid != self.killed_server
            }
            if manifest is not None:
                daemons = {d.pid: d for d in self.cluster.daemons}
                for record in manifest.processes:
                    if record.get("role") == "benchfsd" and record["pid"] in daemons:
                        record["exit_status"] = daemons[record["pid"]].proc.returncode
                        record["children"] = self.server_children.get(record["pid"], [])
            if unclean and self.report.error is None:
                sid, code = next(iter(unclean.items()))
                log = next(d.log_path for d in self.cluster.daemons if d.server_id == sid)
                self.report.error = RunError(
                    "EIO",
                    f"server {sid} did not stop cleanly (exit status {code}); see {log}:\n"
                    + tail(log, 5),
                )
        self._stop_iostat()
        if self.job_dirs:
            if self.spec.keep_data:
                kept = ", ".join(str(job) for _, job in self.job_dirs.values())
                self.progress.message(f"kept node-local data in {kept}")
            else:
                problems = self._remove_node_data()
                if problems and self.report.error is None:
                    self.report.error = RunError("EIO", "; ".join(problems))
            if manifest is not None:
                manifest.data_kept = self.spec.keep_data
                manifest.scratch_dirs = {name: str(job) for name, (_, job) in self.job_dirs.items()}

    def _clean_exit(self, sid: int, code: int) -> bool:
        """Status 0 is a clean stop. Through mpiexec or srun the status is the launcher's
        (Open MPI reports a signalled job as 1 even when the daemon exited 0), so there the
        daemon's own last log line, "server N stopped", is what says it stopped cleanly."""
        if code == 0:
            return True
        if self.launcher is None or self.launcher.name == "local" or self.cluster is None:
            return False
        log = next(d.log_path for d in self.cluster.daemons if d.server_id == sid)
        last = tail(log, 1)
        return last.startswith(f"benchfsd: server {sid} stopped")

    def _analyze(self) -> None:
        """Run `benchfs-analyze --save` on a finished run (when it exists); a failed analysis
        is recorded, it does not fail the run."""
        run_dir, manifest = self.report.run_dir, self.report.manifest
        if not self.spec.analyze or run_dir is None or manifest is None:
            return
        if self.report.error is not None or not run_dir.telemetry_files():
            return
        self.progress.phase("analysis")
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


def _json_documents(text: str) -> list[str]:
    """Every top-level JSON object in `text` (one per rank of a user command), as text."""
    decoder = json.JSONDecoder()
    docs, i = [], text.find("{")
    while i >= 0:
        try:
            _, end = decoder.raw_decode(text, i)
        except json.JSONDecodeError:
            i = text.find("{", i + 1)
            continue
        docs.append(text[i:end])
        i = text.find("{", end)
    return docs


def _command_summary(command: str, run_dir: RunDir) -> dict[str, Any]:
    """Rows parsed from a user command's output: fio JSON (`--output-format=json`), IOR or
    mdtest text or JSON (`-O summaryFormat=JSON`); other programs give no rows."""
    from benchfs.parsers import ParseError, parse_fio, parse_ior

    argv = shlex.split(command)
    program = Path(argv[0]).name if argv else ""
    text = run_dir.workload_log.read_text(errors="replace")
    rows: list[dict[str, Any]] = []
    summary: dict[str, Any] = {"workload": "command", "command": command, "rows": rows}
    try:
        if program == "fio":
            docs = _json_documents(text)
            if not docs:
                raise ParseError(f"{run_dir.workload_log}: no fio JSON (use --output-format=json)")
            for k, doc in enumerate(docs):
                rows += [r.to_dict() for r in parse_fio(doc, f"fio rank {k}")]
        elif program == "ior":
            docs = _json_documents(text)
            rows += [r.to_dict() for r in parse_ior(docs[0] if docs else text, "ior")]
    except ParseError as e:
        summary["parse_error"] = str(e)
    for op in ("write", "read"):
        if program == "fio":
            # One row per fio job, all running at once: the aggregate is their sum.
            bws = [r["bw_mib_s"] for r in rows if r["operation"] == op]
            if bws:
                summary[f"{op}_mib_s"] = sum(bws)
        else:
            best = [r["bw_mib_s"] for r in rows if r["operation"] == op and r["kind"] == "summary"]
            if best:
                summary[f"{op}_mib_s"] = max(best)
    return summary


class _MessageSink(ProgressSink):
    """A progress sink that passes messages to a function (the sweep's and tests' way)."""

    def __init__(self, emit: Callable[[str], None]) -> None:
        self.emit = emit

    def message(self, text: str) -> None:
        self.emit(text)

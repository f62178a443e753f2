"""`benchfs-run`: start a BenchFS cluster, run a workload against it, record everything.

`benchfs-run local` runs the whole pipeline on this host: resolve the configuration, create the
results directory, start N `benchfsd` daemons, wait for all of them to register, run the
write/read/verify workload as M MPI ranks, stop the daemons, delete their data, and write the
manifest. Whatever fails (or a Ctrl-C), it stops what it started and says why, in the manifest
and on the terminal, with a non-zero exit status.
"""

from __future__ import annotations

import contextlib
import errno
import json
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from benchfs import __version__
from benchfs.cluster import LocalCluster, ServerExited, child_env
from benchfs.config import config_hash, load_config, parse_config, resolve_config_text
from benchfs.mpi import MpiLauncher
from benchfs.procs import descendants, kill_pids, stop_process, tail
from benchfs.results import Manifest, RunDir, create_run_dir, read_json, write_text_atomic
from benchfs.units import format_size, parse_size

EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
SERVER_STOP_GRACE_S = 10.0
WORKLOAD_STOP_GRACE_S = 5.0
POLL_S = 0.1
"""How often the workload watch checks the daemons and the deadlines."""

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


class RunError(Exception):
    """A run failed: `code` is an errno-like name, `message` says what happened and where."""

    def __init__(self, code: str, message: str, exit_code: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.exit_code = exit_code


class Terminated(KeyboardInterrupt):
    """SIGTERM to the launcher, handled like Ctrl-C: tear down, record, exit non-zero."""


@dataclass
class LocalRunSpec:
    """What the user asked for; None means "take it from the configuration"."""

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
    """"rw" (write, cross-read, verify), "ior" or "mdtest" (benchfs.workloads.*)."""
    workload_args: str | None = None
    """Options of the ior or mdtest workload, one shell-quoted string; None: derived defaults."""

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


@dataclass
class RunReport:
    """The result of a run, for the terminal and for --json."""

    run_dir: RunDir | None = None
    manifest: Manifest | None = None
    summary: dict[str, Any] | None = None
    error: RunError | None = None
    config: dict[str, Any] = field(default_factory=dict)
    elapsed_s: float = 0.0

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
        return {
            "outcome": outcome,
            "code": None if self.error is None else self.error.code,
            "message": None if self.error is None else self.error.message,
            "write_mib_s": summary.get("write_mib_s"),
            "read_mib_s": summary.get("read_mib_s"),
            "verified": bool(summary.get("verified")) and self.error is None,
            "bytes": summary.get("bytes"),
            "workload": summary.get("workload", "rw" if summary else None),
            "rows": summary.get("rows"),
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


def _validate(run: dict[str, Any]) -> None:
    problems = []
    for key in ("servers", "clients", "transfer_size"):
        if run[key] < 1:
            problems.append(f"run.{key} must be at least 1 (got {run[key]})")
    if run["file_size"] < 0:
        problems.append(f"run.file_size must not be negative (got {run['file_size']})")
    if problems:
        raise RunError("EINVAL", "; ".join(problems), EXIT_USAGE)


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


class LocalRun:
    """One `benchfs-run local` pipeline; `execute` never raises, it returns a RunReport."""

    def __init__(
        self, spec: LocalRunSpec, command: Sequence[str], progress: Callable[[str], None]
    ) -> None:
        self.spec = spec
        self.command = list(command)
        self.progress = progress
        self.report = RunReport()
        self.cluster: LocalCluster | None = None
        self.scratch: Path | None = None
        self.killed_server: int | None = None

    # The pipeline, step by step.

    def execute(self) -> RunReport:
        start = time.monotonic()
        try:
            with _signals_as_interrupts():
                self._pipeline()
        except RunError as e:
            self.report.error = e
        except KeyboardInterrupt as e:
            what = "terminated (SIGTERM)" if isinstance(e, Terminated) else "interrupted (Ctrl-C)"
            self.report.error = RunError("EINTR", what, EXIT_INTERRUPTED)
        except OSError as e:  # e.g. an unwritable results root: the errno says it all
            code = errno.errorcode.get(e.errno or 0, "EIO")
            self.report.error = RunError(code, str(e))
        except Exception as e:  # a bug, but it still has to tear down and be recorded
            traceback.print_exc()
            self.report.error = RunError("EIO", f"unexpected error: {type(e).__name__}: {e}")
        finally:
            with _signals_ignored():
                self._teardown()
        self.report.elapsed_s = time.monotonic() - start
        self._finish_manifest()
        return self.report

    def _pipeline(self) -> None:
        spec = self.spec
        overrides = [*spec.sets, *spec.flag_overrides()]
        try:
            first = load_config(spec.config, overrides)
        except (ValueError, FileNotFoundError) as e:
            raise RunError("EINVAL", f"configuration: {e}", EXIT_USAGE) from e
        _validate(first["run"])
        servers = first["run"]["servers"]

        run_dir = create_run_dir(first["run"]["results_root"], "local")
        self.report.run_dir = run_dir
        # The cluster's shape is part of the effective config, so config.toml says what ran.
        overrides += [
            f"cluster.expected_servers={servers}",
            f"cluster.registry_dir={run_dir.registry_dir}",
            f"telemetry.dir={run_dir.telemetry_dir}",
        ]
        text = resolve_config_text(spec.config, overrides)
        config = parse_config(text)
        self.report.config = config
        write_text_atomic(run_dir.config_path, text)

        manifest = Manifest(
            mode="local",
            command=self.command,
            benchfs_version=__version__,
            config_sha256=config_hash(text),
        )
        self.report.manifest = manifest
        manifest.nodes = [
            {"name": f"local-{i}", "host": manifest.hostname, "role": "server", "server_id": i}
            for i in range(servers)
        ]
        manifest.write(run_dir)
        self.progress(f"results directory {run_dir.path}")

        with manifest.phase("start_servers"):
            self._start_servers(run_dir, config)
        with manifest.phase("wait_servers"):
            self._wait_servers(run_dir, config)
        with manifest.phase("workload"):
            self._run_workload(run_dir, config)

    def _start_servers(self, run_dir: RunDir, config: dict[str, Any]) -> None:
        manifest = self.report.manifest
        assert manifest is not None
        scratch_root = config["run"]["scratch_dir"]
        try:
            if scratch_root:
                scratch = Path(scratch_root) / run_dir.run_id
                scratch.mkdir(parents=True)
            else:
                scratch = Path(tempfile.mkdtemp(prefix=f"benchfs-{run_dir.run_id}-"))
        except OSError as e:
            raise RunError(
                errno.errorcode.get(e.errno or 0, "EIO"),
                f"cannot create the scratch directory under {scratch_root or '/tmp'}: {e}",
            ) from e
        self.scratch = scratch
        manifest.scratch_dir = str(scratch)
        try:
            self.cluster = LocalCluster(run_dir.registry_dir, config_path=run_dir.config_path)
        except FileNotFoundError as e:
            raise RunError("ENOENT", str(e)) from e
        servers = config["run"]["servers"]
        self.progress(f"starting {servers} servers")
        for i in range(servers):
            self.cluster.start(i, self.scratch / f"server-{i}", run_dir.server_log(i), f"local-{i}")
        manifest.processes = [d.describe() for d in self.cluster.daemons]
        manifest.write(run_dir)

    def _wait_servers(self, run_dir: RunDir, config: dict[str, Any]) -> None:
        assert self.cluster is not None and self.report.manifest is not None
        timeout = config["cluster"]["connect_timeout_s"]
        try:
            membership = self.cluster.wait_ready(timeout)
        except ServerExited as e:
            raise RunError("EHOSTDOWN", f"a server died before registering: {e}") from e
        except TimeoutError as e:
            raise RunError("ETIMEDOUT", f"servers did not register within {timeout} s: {e}") from e
        except ValueError as e:
            raise RunError("EINVAL", f"bad registry entry: {e}") from e
        self.report.manifest.membership = membership
        self.report.manifest.write(run_dir)

    def _run_workload(self, run_dir: RunDir, config: dict[str, Any]) -> None:
        manifest = self.report.manifest
        assert self.cluster is not None and manifest is not None
        run = config["run"]
        try:
            launcher = MpiLauncher()
        except FileNotFoundError as e:
            raise RunError("ENOENT", str(e)) from e
        workload = self.spec.workload
        common = ["--registry", str(run_dir.registry_dir), "--out", str(run_dir.workload_dir)]
        common += ["--config", str(run_dir.config_path)]
        if workload == "rw":
            argv = [sys.executable, "-m", "benchfs.workloads.rw", *common]
            argv += ["--file-size", str(run["file_size"]), "--transfer-size"]
            argv += [str(run["transfer_size"])]
            self.progress(
                f"running {run['clients']} clients: {format_size(run['file_size'])} each "
                f"in {format_size(run['transfer_size'])} transfers"
            )
        else:
            options = _workload_options(workload, self.spec.workload_args, run)
            argv = [sys.executable, "-m", f"benchfs.workloads.{workload}", *options, *common]
            self.progress(f"running {run['clients']} clients: {workload} {shlex.join(options)}")
        cmd = launcher.command(run["clients"], argv)
        with open(run_dir.workload_log, "ab") as log:
            proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=launcher.env(child_env()),
                start_new_session=True,
            )
        record: dict[str, Any] = {"role": "mpiexec", "pid": proc.pid, "argv": cmd}
        manifest.processes.append(record)
        manifest.write(run_dir)
        try:
            status, server_failure = self._watch(proc, config)
        finally:
            if proc.poll() is None:
                children = descendants(proc.pid)
                record["children"] = children
                stop_process(proc, WORKLOAD_STOP_GRACE_S, group=True)
                kill_pids(children, WORKLOAD_STOP_GRACE_S)
            record["exit_status"] = proc.returncode

        summary = None
        if run_dir.workload_summary.exists():
            summary = read_json(run_dir.workload_summary)
            self.report.summary = summary
            manifest.workload = summary
        for rank in range(run["clients"]):
            path = run_dir.rank_result(rank)
            if path.exists():
                manifest.processes.append(
                    {"role": "rank", "rank": rank, "pid": read_json(path)["pid"]}
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
        if workload == "rw" and not summary.get("verified"):
            raise RunError("EIO", "workload finished but did not verify every byte")

    def _watch(
        self, proc: subprocess.Popen[bytes], config: dict[str, Any]
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
        while True:
            try:
                return proc.wait(timeout=POLL_S), server_failure
            except subprocess.TimeoutExpired:
                pass
            now = time.monotonic()
            if kill_after is not None and self.killed_server is None and now - start >= kill_after:
                victim = self.cluster.daemons[-1]
                self.cluster.kill(victim.server_id, signal.SIGKILL)
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
                    self.progress(f"{server_failure}; waiting for the clients to notice")
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
        if self.cluster is not None:
            if self.cluster.daemons:
                self.progress("stopping servers")
            codes = self.cluster.stop(SERVER_STOP_GRACE_S)
            unclean = {
                sid: code for sid, code in codes.items() if code != 0 and sid != self.killed_server
            }
            if manifest is not None:
                daemons = {d.pid: d for d in self.cluster.daemons}
                for record in manifest.processes:
                    if record.get("role") == "benchfsd" and record["pid"] in daemons:
                        record["exit_status"] = daemons[record["pid"]].proc.returncode
            if unclean and self.report.error is None:
                sid, code = next(iter(unclean.items()))
                log = self.cluster.daemons[sid].log_path
                self.report.error = RunError(
                    "EIO",
                    f"server {sid} did not stop cleanly (exit status {code}); see {log}:\n"
                    + tail(log, 5),
                )
        if self.scratch is not None:
            if self.spec.keep_data:
                self.progress(f"kept server data in {self.scratch}")
            else:
                shutil.rmtree(self.scratch, ignore_errors=True)
            if manifest is not None:
                manifest.data_kept = self.spec.keep_data

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


class SizeType(click.ParamType):
    """Byte sizes with binary suffixes: 64M, 1MiB, 4k, 4096."""

    name = "size"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        try:
            return parse_size(value)
        except ValueError as e:
            self.fail(str(e), param, ctx)


def _print_report(console: Console, report: RunReport) -> None:
    data = report.to_json()
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold")
    table.add_column()
    ok = report.error is None
    table.add_row("outcome", "[green]ok[/]" if ok else f"[red]failed[/] ({data['code']})")
    if data["servers"] is not None:
        table.add_row("cluster", f"{data['servers']} servers, {data['clients']} clients")
        if data["workload"] in ("ior", "mdtest"):
            table.add_row("workload", f"built-in {data['workload']} (see workload/output.log)")
        else:
            table.add_row(
                "workload",
                f"{format_size(data['file_size'])} per client in "
                f"{format_size(data['transfer_size'])} transfers",
            )
    for key, label in (("write_mib_s", "write"), ("read_mib_s", "read")):
        if data[key] is not None:
            table.add_row(label, f"{data[key]:.1f} MiB/s")
    total = f" ({format_size(data['bytes'])})" if data["bytes"] else ""
    table.add_row(
        "verified", ("[green]every byte[/]" + total) if data["verified"] else "[red]no[/]"
    )
    table.add_row("elapsed", f"{data['elapsed_s']:.1f} s")
    if data["telemetry_files"]:
        table.add_row(
            "telemetry",
            f"{data['telemetry_files']} files in telemetry/ (load with benchfs.telemetry.load)",
        )
    console.print(table)
    if data["results_dir"]:
        # Outside the table and never wrapped: the path must survive copy and paste.
        console.print(
            f"[bold]results[/]   {escape(data['results_dir'])}", soft_wrap=True, highlight=False
        )


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="benchfs-run")
def main() -> None:
    """Run BenchFS clusters and workloads, recording each run in a results directory."""


@main.command()
@click.option(
    "--servers", type=click.IntRange(min=1), help="Servers to start [config run.servers]."
)
@click.option(
    "--clients", type=click.IntRange(min=1), help="MPI client ranks [config run.clients]."
)
@click.option("--file-size", type=SizeType(), help="Bytes per client, e.g. 64M [run.file_size].")
@click.option(
    "--transfer-size", type=SizeType(), help="Bytes per call, e.g. 1M [run.transfer_size]."
)
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False),
    help="Configuration file [$BENCHFS_CONFIG].",
)
@click.option(
    "--set",
    "sets",
    multiple=True,
    metavar="SECTION.KEY=VALUE",
    help="Override one configuration key (repeatable; wins over file and environment).",
)
@click.option("--keep-data", is_flag=True, help="Keep the servers' data directories.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of a table.")
@click.option(
    "--results-root",
    type=click.Path(file_okay=False),
    help="Where results directories go [run.results_root, $BENCHFS_RESULTS].",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=300.0,
    show_default=True,
    help="Seconds the workload may take before it is stopped.",
)
@click.option(
    "--kill-server-after",
    type=click.FloatRange(min=0),
    hidden=True,
    help="Fault tests only: SIGKILL the last server this many seconds into the workload.",
)
@click.option(
    "--workload",
    type=click.Choice(["rw", "ior", "mdtest"]),
    default="rw",
    show_default=True,
    help="rw: write, cross-read, verify; ior / mdtest: the built-in IOR and mdtest workloads.",
)
@click.option("--ior-args", metavar="OPTIONS", help='IOR options, e.g. "-w -r -t 1m -b 16m -F".')
@click.option("--mdtest-args", metavar="OPTIONS", help='mdtest options, e.g. "-n 1000 -u".')
def local(
    servers: int | None,
    clients: int | None,
    file_size: int | None,
    transfer_size: int | None,
    config_path: str | None,
    sets: tuple[str, ...],
    keep_data: bool,
    as_json: bool,
    results_root: str | None,
    timeout: float,
    kill_server_after: float | None,
    workload: str,
    ior_args: str | None,
    mdtest_args: str | None,
) -> None:
    """Start a cluster on this host, write, read back and verify, and report bandwidth."""
    out = Console()
    err = Console(stderr=True)

    def progress(message: str) -> None:
        if not as_json:
            err.print(f"[dim]benchfs-run:[/] {escape(message)}", highlight=False, soft_wrap=True)

    spec = LocalRunSpec(
        servers=servers,
        clients=clients,
        file_size=file_size,
        transfer_size=transfer_size,
        config=config_path,
        sets=sets,
        keep_data=keep_data,
        results_root=results_root,
        timeout_s=timeout,
        kill_server_after_s=kill_server_after,
        workload=workload,
        workload_args=ior_args if workload == "ior" else mdtest_args,
    )
    if (ior_args and workload != "ior") or (mdtest_args and workload != "mdtest"):
        err.print(
            "[red]benchfs-run: error EINVAL:[/] --ior-args needs --workload ior, "
            "--mdtest-args --workload mdtest"
        )
        sys.exit(EXIT_USAGE)
    report = LocalRun(spec, sys.argv, progress).execute()
    if report.error is not None:
        err.print(
            f"[red]benchfs-run: error {report.error.code}:[/] {escape(report.error.message)}",
            highlight=False,
            soft_wrap=True,
        )
    if as_json:
        click.echo(json.dumps(report.to_json()))
    else:
        _print_report(out, report)
    sys.exit(report.exit_code)


def _fail(code: str, message: str, exit_code: int = EXIT_FAILED) -> NoReturn:
    Console(stderr=True).print(
        f"[red]benchfs-run: error {code}:[/] {escape(message)}", highlight=False, soft_wrap=True
    )
    sys.exit(exit_code)


@main.command(context_settings={"ignore_unknown_options": True})
@click.option(
    "--scheduler",
    type=click.Choice(["slurm", "pbs", "nqsv"]),
    required=True,
    help="Batch system: sbatch (Slurm), qsub (PBS Pro/OpenPBS) or qsub (NEC NQSV).",
)
@click.option("--nodes", type=click.IntRange(min=1), required=True, help="Nodes to allocate.")
@click.option("--time-limit", help="Wall time: minutes, 30s, 90m, 2h, HH:MM:SS, D-HH:MM:SS.")
@click.option("--queue", "--partition", "queue", help="Queue (PBS, NQSV) or partition (Slurm).")
@click.option("--account", help="Account or project to charge.")
@click.option(
    "--exclude-from",
    type=click.Path(exists=True),
    help="excluded.txt / excluded.json (or a screen directory) of hosts to leave out.",
)
@click.option(
    "--scratch", default="/tmp", show_default=True, help="Node-local scratch, for nodes.toml."
)
@click.option("--job-name", default="benchfs", show_default=True, help="The job's name.")
@click.option(
    "--directive",
    "directives",
    multiple=True,
    metavar="TEXT",
    help="Extra directive line after #SBATCH / #PBS, e.g. '--ntasks=4' (repeatable).",
)
@click.option(
    "--results-root",
    type=click.Path(file_okay=False),
    help="Where the job directory goes [run.results_root, $BENCHFS_RESULTS].",
)
@click.option("--dry-run", is_flag=True, help="Print the job script instead of submitting it.")
@click.argument("pipeline_args", nargs=-1, type=click.UNPROCESSED)
def submit(
    scheduler: str,
    nodes: int,
    time_limit: str | None,
    queue: str | None,
    account: str | None,
    exclude_from: str | None,
    scratch: str,
    job_name: str,
    directives: tuple[str, ...],
    results_root: str | None,
    dry_run: bool,
    pipeline_args: tuple[str, ...],
) -> None:
    """Render a batch job that runs `benchfs-run local PIPELINE_ARGS` and submit it.

    Give the pipeline's options after `--`, e.g.
    `benchfs-run submit --scheduler slurm --nodes 1 -- --servers 2 --clients 2 --file-size 8M`.
    """
    from benchfs.nodes import NodesFileError, read_exclusions
    from benchfs.submit import (
        JobSpec,
        SubmitError,
        find_benchfs_run,
        new_job_dir_path,
        parse_time_limit,
    )
    from benchfs.submit import (
        submit as submit_job,
    )

    args = list(pipeline_args)
    if args and args[0] == "--":
        args = args[1:]
    if "--help" in args or "-h" in args:
        _fail("EINVAL", "the pipeline's --help is `benchfs-run local --help`", EXIT_USAGE)
    # Check the pipeline's arguments now, not an hour later on the compute node.
    try:
        local.make_context("local", list(args))
    except click.ClickException as e:
        _fail("EINVAL", f"pipeline arguments after `--`: {e.format_message()}", EXIT_USAGE)
    try:
        limit = None if time_limit is None else parse_time_limit(time_limit)
        excluded = read_exclusions(exclude_from) if exclude_from else []
        root = results_root or load_config(None, [])["run"]["results_root"]
        spec = JobSpec(
            scheduler=scheduler,
            nodes=nodes,
            pipeline_args=args,
            job_dir=new_job_dir_path(root, scheduler),
            benchfs_run=find_benchfs_run(),
            time_limit_s=limit,
            queue=queue,
            account=account,
            excluded=excluded,
            scratch=scratch,
            job_name=job_name,
            extra_directives=directives,
        )
        if dry_run:
            from benchfs.submit import render

            click.echo(render(spec), nl=False)
            return
        done = submit_job(spec)
    except (ValueError, NodesFileError, FileNotFoundError) as e:
        _fail("EINVAL", str(e), EXIT_USAGE)
    except SubmitError as e:
        _fail(e.code, e.message, EXIT_USAGE if e.code == "EINVAL" else EXIT_FAILED)
    click.echo(f"job       {done.job_id}")
    click.echo(f"results   {done.job_dir}")


@main.command()
@click.option(
    "--from-allocation",
    is_flag=True,
    required=True,
    help="Take the nodes of the current Slurm or PBS/NQSV allocation.",
)
@click.option("--scratch", default="/tmp", show_default=True, help="Node-local scratch directory.")
@click.option(
    "--device", "devices", multiple=True, help="Block device behind scratch (repeatable)."
)
@click.option("--exclude", "excludes", multiple=True, help="Host to leave out (repeatable).")
@click.option(
    "--exclude-from", type=click.Path(exists=True), help="excluded.txt / excluded.json to apply."
)
@click.option(
    "--output", "-o", type=click.Path(dir_okay=False), help="Write here instead of stdout."
)
def nodes(
    from_allocation: bool,
    scratch: str,
    devices: tuple[str, ...],
    excludes: tuple[str, ...],
    exclude_from: str | None,
    output: str | None,
) -> None:
    """Print (or write) the nodes file of the allocation this runs in (docs/nodes.md)."""
    from benchfs.nodes import (
        NodesFileError,
        dump_nodes,
        read_exclusions,
    )
    from benchfs.nodes import (
        from_allocation as allocation_nodes,
    )

    try:
        left_out = set(excludes)
        if exclude_from:
            left_out |= {e.host for e in read_exclusions(exclude_from)}
        found = allocation_nodes(scratch, devices)
    except (NodesFileError, FileNotFoundError) as e:
        _fail("EINVAL", str(e), EXIT_USAGE)
    short = {h.split(".", 1)[0] for h in left_out}
    kept = [n for n in found if n.host not in left_out and n.host.split(".", 1)[0] not in short]
    if not kept:
        _fail("EINVAL", f"every node of the allocation is excluded ({', '.join(sorted(left_out))})")
    text = dump_nodes(kept)
    if output:
        write_text_atomic(output, text)
    else:
        click.echo(text, nl=False)


@main.command()
@click.argument("params", type=click.Path(exists=True, dir_okay=False))
@click.option(
    "--results-root",
    type=click.Path(file_okay=False),
    help="Where the sweep directory goes [run.results_root, $BENCHFS_RESULTS].",
)
@click.option(
    "--config", "config_path", type=click.Path(dir_okay=False), help="Base configuration."
)
@click.option("--dry-run", is_flag=True, help="List the points without running them.")
@click.option(
    "--timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=300.0,
    show_default=True,
    help="Seconds each point's workload may take.",
)
def sweep(
    params: str, results_root: str | None, config_path: str | None, dry_run: bool, timeout: float
) -> None:
    """Run every point of a parameter file (jobs/params/*.toml); write index.csv."""
    from benchfs.sweep import SweepError, load_params, run_sweep, sweep_table

    err = Console(stderr=True)
    try:
        plan = load_params(params)
    except SweepError as e:
        _fail("EINVAL", str(e), EXIT_USAGE)
    if dry_run:
        Console().print(sweep_table(plan.rows_preview()))
        return

    def progress(message: str) -> None:
        err.print(f"[dim]benchfs-run:[/] {escape(message)}", highlight=False, soft_wrap=True)

    root = results_root or load_config(config_path, [])["run"]["results_root"]
    try:
        outcome = run_sweep(plan, root, progress, config=config_path, timeout_s=timeout)
    except KeyboardInterrupt:
        _fail(
            "EINTR", "sweep interrupted; index.csv lists the runs that finished", EXIT_INTERRUPTED
        )
    except OSError as e:
        _fail(errno.errorcode.get(e.errno or 0, "EIO"), f"sweep: {e}")
    Console().print(sweep_table(outcome.rows))
    click.echo(f"index     {outcome.index_path}")
    if outcome.interrupted:
        sys.exit(EXIT_INTERRUPTED)
    sys.exit(0 if outcome.ok else EXIT_FAILED)


if __name__ == "__main__":
    main()

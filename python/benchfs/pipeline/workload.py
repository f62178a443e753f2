"""The workload stage: build its command (built-in rw, ior, mdtest, or a user's command), run
it as the client ranks while watching the servers and the deadlines, and read its summary
(for a user command, its output parsed into rows)."""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchfs.cluster import ServerExited, child_env
from benchfs.errors import EXIT_USAGE, RunError
from benchfs.launch import rank_command
from benchfs.pipeline.context import RunContext
from benchfs.pipeline.spec import RunReport
from benchfs.pipeline.stages import Servers
from benchfs.procs import descendants, kill_pids, stop_process, tail
from benchfs.results import read_json, write_json_atomic
from benchfs.units import format_size

WORKLOAD_STOP_GRACE_S = 5.0
POLL_S = 0.1
STARTUP_S_PER_RANK = 1.0
"""What starting a rank may take beyond --timeout before its workload's timeout counts."""
"""How often the workload watch checks the daemons and the deadlines."""
PROGRESS_S = 1.0
"""How often the live display reads the servers' telemetry for bytes and bandwidth."""

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


def workload_options(workload: str, args: str | None, run: dict[str, Any]) -> list[str]:
    """The ior/mdtest options: the user's, else IOR's file-per-process write, read and
    verify of run.file_size per client in run.transfer_size transfers (mdtest: 1000 files),
    run.repetitions times (`-i`)."""
    reps = int(run.get("repetitions", 1))
    if args is not None:
        if reps > 1 and workload != "io500":
            raise RunError(
                "EINVAL",
                f"run.repetitions ({reps}) with --{workload}-args: give -i {reps} among the "
                f"{workload} arguments instead",
                EXIT_USAGE,
            )
        try:
            return shlex.split(args)
        except ValueError as e:
            raise RunError("EINVAL", f"--{workload}-args: {e}", EXIT_USAGE) from e
    iterations = ["-i", str(reps)] if reps > 1 else []
    if workload == "ior":
        sizes = ["-t", str(run["transfer_size"]), "-b", str(run["file_size"])]
        return ["-w", "-r", "-R", "-F", *sizes, *iterations]
    if workload == "io500":
        return ["--preset", "ci"]
    return ["-n", "1000", *iterations]


def check_workload_options(workload: str, args: str | None, run: dict[str, Any]) -> None:
    """--ior-args and --mdtest-args through the workload's own parser, before anything
    starts (the ranks would refuse them only after the servers and MPI were up)."""
    if workload not in ("ior", "mdtest", "io500"):
        return
    from benchfs.workloads import io500, ior, mdtest
    from benchfs.workloads.steps import UsageError

    options = [*workload_options(workload, args, run), "--registry", "-"]
    try:
        if workload == "ior":
            ior.parse_options(options)
        elif workload == "io500":
            io500.parse_args(options)
        else:
            mdtest.parse_args(options)
    except UsageError as e:
        raise RunError("EINVAL", f"--{workload}-args: {e}", EXIT_USAGE) from e


def _workload_error(summary: dict[str, Any] | None, log: Path) -> tuple[str, str]:
    """(code, message) for a failed workload, from its summary or else the tail of its log."""
    errors = (summary or {}).get("errors") or []
    if not errors:
        return "EIO", f"workload failed without a summary; last output ({log}):\n{tail(log)}"
    first = errors[0]
    code = first.get("errno") or _ERROR_CODES.get(first.get("type", ""), "EIO")
    more = f" (and {len(errors) - 1} more errors)" if len(errors) > 1 else ""
    return code, f"rank {first['rank']} {first['phase']}: {first['message']}{more}"


class Workload:
    """The client ranks of one run, started through the launcher and watched to the end."""

    def __init__(
        self, ctx: RunContext, config: dict[str, Any], servers: Servers, report: RunReport
    ) -> None:
        self.ctx = ctx
        self.config = config
        self.servers = servers
        self.report = report
        self.started = time.monotonic()
        #: Where the current job's ranks say they are up, and how many ranks it has.
        self.up: tuple[Path, int] | None = None
        #: When the last rank of the workload was up (its timeout counts from then).
        self.all_up: float | None = None

    def argv(self) -> tuple[list[str], str]:
        """The ranks' command, and what it runs in words."""
        ctx = self.ctx
        spec, run_dir, run = ctx.spec, ctx.run_dir, self.config["run"]
        workload = spec.workload
        common = ["--registry", str(run_dir.registry_dir), "--out", str(run_dir.workload_dir)]
        common += ["--config", str(run_dir.config_path)]
        if workload == "rw":
            argv = [sys.executable, "-m", "benchfs.workloads.rw", *common]
            argv += ["--file-size", str(run["file_size"]), "--transfer-size"]
            argv += [str(run["transfer_size"]), "--repetitions", str(run["repetitions"])]
            what = (
                f"{format_size(run['file_size'])} per client in "
                f"{format_size(run['transfer_size'])} transfers"
                + (f", {run['repetitions']} times" if run["repetitions"] > 1 else "")
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
        options = workload_options(workload, spec.workload_args, run)
        argv = [sys.executable, "-m", f"benchfs.workloads.{workload}", *options, *common]
        return argv, f"{workload} {shlex.join(options)}"

    def command_env(self) -> dict[str, str]:
        """What a user command needs to find the cluster through the C library."""
        run_dir = self.ctx.run_dir
        env = child_env()
        env["BENCHFS_REGISTRY"] = str(run_dir.registry_dir)
        env["BENCHFS_CONFIG"] = str(run_dir.config_path)
        lib = Path(sys.executable).parent.parent / "lib"
        if (lib / "libbenchfs.so").exists():
            env["LD_LIBRARY_PATH"] = ":".join(filter(None, [str(lib), env.get("LD_LIBRARY_PATH")]))
        return env

    def run(self) -> None:
        """Run the workload to its end; RunError if it, or a server under it, failed."""
        ctx = self.ctx
        manifest, run_dir, roles = ctx.manifest, ctx.run_dir, ctx.roles
        assert roles is not None
        argv, what = self.argv()
        self.report.workload_line = what
        ctx.progress.phase("workload")
        ctx.progress.message(f"running {len(roles.clients)} clients: {what}")
        expected = self.expected_bytes()
        if expected is not None:
            ctx.progress.expect(*expected)
        self.started = time.monotonic()
        io500_args = self.io500_args()
        if io500_args is not None and io500_args.ior_prefix is not None:
            from benchfs.pipeline.io500 import Io500Jobs

            status, server_failure = Io500Jobs(self, io500_args).run()
        else:
            env = self.command_env() if ctx.spec.workload == "command" else None
            status, server_failure = self.job("workload", argv, env)

        summary = self._summary(status)
        for rank in range(len(roles.clients)):
            path = run_dir.rank_result(rank)
            if path.exists():
                manifest.processes.append(
                    {
                        "role": "rank",
                        "rank": rank,
                        "node": roles.clients[rank].name,
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
        if ctx.spec.workload == "rw" and not summary.get("verified"):
            raise RunError("EIO", "workload finished but did not verify every byte")

    def expected_bytes(self) -> tuple[int, int] | None:
        """Bytes the workload will write and read in all, when its options say so: the default
        workload and the built-in IOR without arguments move run.file_size per client,
        run.repetitions times; the built-in IOR with arguments its blocks x segments x
        iterations per rank (none known under a stonewall); None for any other."""
        spec, run = self.ctx.spec, self.config["run"]
        assert self.ctx.roles is not None
        ranks = len(self.ctx.roles.clients)
        if spec.workload == "rw" or (spec.workload == "ior" and spec.workload_args is None):
            total = ranks * run["file_size"] * run["repetitions"]
            return total, total
        if spec.workload == "ior":
            from benchfs.workloads import ior

            o = ior.parse_options(
                [*workload_options("ior", spec.workload_args, run), "--registry", "-"]
            )
            if o.stonewall_s:  # a stonewall may end a phase early
                return None
            phase = ranks * o.block_size * o.segments * o.iterations
            # A checked write (-W) reads everything back once more.
            return phase * o.write, phase * (o.read + o.check_write)
        return None

    def io500_args(self) -> argparse.Namespace | None:
        """An io500 run's options (checked before anything started); with --ior-prefix its
        phases are real ior and mdtest jobs."""
        if self.ctx.spec.workload != "io500":
            return None
        from benchfs.workloads import io500

        options = workload_options("io500", self.ctx.spec.workload_args, self.config["run"])
        return io500.parse_args([*options, "--registry", "-"])

    def job(self, what: str, argv: list[str], env: dict[str, str] | None) -> tuple[int, str | None]:
        """One MPI job of the workload on the client slots, watched to its end: (exit status,
        description of a dead server or None). Its output goes to the workload's log."""
        ctx = self.ctx
        manifest, run_dir, roles = ctx.manifest, ctx.run_dir, ctx.roles
        assert roles is not None
        up_dir = run_dir.workload_dir / ("up-" + re.sub(r"[^A-Za-z0-9_.-]", "_", what))
        shutil.rmtree(up_dir, ignore_errors=True)
        up_dir.mkdir(parents=True)
        # The built-in workloads (not IO500's driver) say they are up once connected.
        by = "program" if ctx.spec.workload in ("rw", "ior", "mdtest") else "exec"
        plan = ctx.rank_plan("workload", roles.clients, {"dir": str(up_dir), "by": by})
        self.up = (up_dir, len(roles.clients))
        hosts = [n.host for n in roles.clients]
        proc, cmd = ctx.launcher.ranks(hosts, rank_command(plan, argv), run_dir.workload_log, env)
        manifest.commands.append({"what": what, "argv": cmd})
        record: dict[str, Any] = {"role": "workload", "pid": proc.pid, "argv": cmd}
        manifest.processes.append(record)
        manifest.write(run_dir)
        try:
            return self._watch(proc)
        finally:
            if proc.poll() is None:
                children = descendants(proc.pid)
                record["children"] = children
                stop_process(proc, WORKLOAD_STOP_GRACE_S, group=True)
                kill_pids(children, WORKLOAD_STOP_GRACE_S)
            record["exit_status"] = proc.returncode

    def _summary(self, status: int) -> dict[str, Any] | None:
        """The workload's summary.json; for a user command, its output parsed into rows."""
        ctx = self.ctx
        run_dir = ctx.run_dir
        summary = None
        if ctx.spec.workload == "command":
            if status == 0:
                summary = command_summary(ctx.spec.command or "", run_dir.workload_log)
                write_json_atomic(run_dir.workload_summary, summary)
        elif run_dir.workload_summary.exists():
            summary = read_json(run_dir.workload_summary)
        if summary is not None:
            self.report.summary = summary
            ctx.manifest.workload = summary
            if summary.get("bytes") is not None:
                ctx.progress.totals(summary["bytes"], summary.get("bytes_read") or 0)
        return summary

    def _watch(self, proc: subprocess.Popen[bytes]) -> tuple[int, str | None]:
        """Wait for the workload while watching the daemons and the deadlines.

        Returns (exit status, description of a dead server or None). When a server dies, the
        clients get `request_timeout_s` (plus slack) to notice and fail on their own, which is
        what a user would see on a real cluster; only then is the workload stopped.
        """
        ctx, cluster = self.ctx, self.servers.cluster
        assert cluster is not None
        manifest, spec = ctx.manifest, ctx.spec
        start = self.started  # the deadline and the fault injection span all the jobs
        # The timeout counts from the moment every rank is up (on 2 cores, 512 ranks took
        # ~414 s just to start); starting may take it and a second per rank more.
        assert self.up is not None
        up_dir, ranks = self.up
        startup_limit = start + spec.timeout_s + ranks * STARTUP_S_PER_RANK
        kill_after = spec.kill_server_after_s
        server_failure: str | None = None
        give_up_at: float | None = None
        # Here, not at the top: the telemetry reader needs pandas (the analysis extra), which
        # `benchfs start` (this pipeline without a workload) must not.
        from benchfs.telemetry import TelemetryFollower

        follower = TelemetryFollower(ctx.run_dir.telemetry_dir)
        next_progress = start
        while True:
            try:
                return proc.wait(timeout=POLL_S), server_failure
            except subprocess.TimeoutExpired:
                pass
            now = time.monotonic()
            if now >= next_progress:
                moved = follower.poll()
                ctx.progress.moved(moved["write"], moved["read"])
                next_progress = now + PROGRESS_S
            if kill_after is not None and not self.servers.killed and now - start >= kill_after:
                for victim in self.servers.kill_last(spec.kill_node):
                    manifest.event(
                        "fault-injection",
                        f"killed server {victim.server_id} (pid {victim.pid}) with SIGKILL "
                        f"{now - start:.1f} s into the workload (--kill-server-after)",
                        server_id=victim.server_id,
                        pid=victim.pid,
                    )
            if server_failure is None:
                for daemon in cluster.exited():
                    if daemon.server_id in self.servers.outlived:
                        continue
                    gone = [*self.servers.outlived, daemon.server_id]
                    if self.servers.outlives(gone):
                        self.servers.outlived.add(daemon.server_id)
                        headline = ServerExited(daemon).headline
                        note = f"{headline}; the files keep copies on the other servers"
                        manifest.event("server-died", note, server_id=daemon.server_id)
                        ctx.progress.message(note)
                        continue
                    server_failure = ServerExited(daemon).headline
                    manifest.event("server-died", server_failure, server_id=daemon.server_id)
                    ctx.progress.message(f"{server_failure}; waiting for the clients to notice")
                    slack = self.config["client"]["request_timeout_s"] + 10.0
                    give_up_at = now + slack
                    break
            if give_up_at is not None and now >= give_up_at:
                raise RunError(
                    "ETIMEDOUT",
                    f"{server_failure}, and the workload did not fail within "
                    f"client.request_timeout_s + 10 s; it was stopped",
                )
            if self.all_up is None and ranks_up(up_dir) >= ranks:
                self.all_up = now
            if self.all_up is None and now >= startup_limit:
                raise RunError(
                    "ETIMEDOUT",
                    f"{ranks - ranks_up(up_dir)} of {ranks} ranks were not up within "
                    f"{startup_limit - start:.0f} s (--timeout {spec.timeout_s} s and "
                    f"{STARTUP_S_PER_RANK:.0f} s per rank to start)",
                )
            if self.all_up is not None and now >= self.all_up + spec.timeout_s:
                raise RunError(
                    "ETIMEDOUT",
                    f"the workload did not finish within --timeout {spec.timeout_s} s "
                    f"after its {ranks} ranks were up ({self.all_up - start:.1f} s to start)",
                )


def ranks_up(up_dir: Path) -> int:
    """How many ranks said they are up (benchfs.rankexec.mark_up)."""
    try:
        return sum(1 for _ in os.scandir(up_dir))
    except OSError:
        return 0


def json_documents(text: str) -> list[str]:
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


def command_summary(command: str, log: Path) -> dict[str, Any]:
    """Rows parsed from a user command's output: fio JSON (`--output-format=json`), IOR or
    mdtest text or JSON (`-O summaryFormat=JSON`); other programs give no rows."""
    from benchfs.parsers import ParseError, parse_fio, parse_ior, parse_mdtest

    argv = shlex.split(command)
    program = Path(argv[0]).name if argv else ""
    text = log.read_text(errors="replace")
    rows: list[dict[str, Any]] = []
    summary: dict[str, Any] = {"workload": "command", "command": command, "rows": rows}
    try:
        if program == "fio":
            docs = json_documents(text)
            if not docs:
                raise ParseError(f"{log}: no fio JSON (use --output-format=json)")
            for k, doc in enumerate(docs):
                rows += [r.to_dict() for r in parse_fio(doc, f"fio rank {k}")]
        elif program == "ior":
            docs = json_documents(text)
            rows += [r.to_dict() for r in parse_ior(docs[0] if docs else text, "ior")]
        elif program == "mdtest":
            rows += [r.to_dict() for r in parse_mdtest(text, "mdtest")]
    except ParseError as e:
        summary["parse_error"] = str(e)
    for op in ("write", "read"):
        if program == "fio":
            # One row per fio job, all running at once: the aggregate is their sum.
            bws = [r["bw_mib_s"] for r in rows if r["operation"] == op]
            if bws:
                summary[f"{op}_mib_s"] = sum(bws)
        else:
            best = [
                r["bw_mib_s"]
                for r in rows
                if r["operation"] == op and r["kind"] == "summary" and "bw_mib_s" in r
            ]
            if best:
                summary[f"{op}_mib_s"] = max(best)
    return summary

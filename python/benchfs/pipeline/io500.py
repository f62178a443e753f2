"""IO500 with real IOR and mdtest: one MPI job per phase, as IO500 itself runs them.

The built-in io500 workload runs every phase inside one MPI job of Python ranks; real `ior`
and `mdtest` (`--ior-prefix`, built by contrib/ior/build-ior.sh with the BENCHFS backend) are
programs of their own, so here each phase is its own job on the client slots, in IO500's
order, with the same options (`benchfs.workloads.io500.phase_plan`). The preparation and the
find run as one-phase jobs of the built-in workload (find runs on the servers); the timestamp
is taken here. Each phase's output is parsed (IOR's summary bandwidth, mdtest's rate) into the
same result_summary.txt and summary.json as the built-in run.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any, Protocol

from benchfs.parsers import ParseError, parse_ior, parse_mdtest
from benchfs.pipeline.context import RunContext
from benchfs.results import read_json
from benchfs.workloads import io500


class JobRunner(Protocol):
    """What the phases need of the workload stage (benchfs.pipeline.workload.Workload, which
    imports this module, so it is named here by what it does)."""

    ctx: RunContext

    def job(self, what: str, argv: list[str], env: dict[str, str] | None) -> tuple[int, str | None]:
        """One MPI job on the client slots: (exit status, a dead server or None)."""
        ...

    def command_env(self) -> dict[str, str]:
        """The environment a real ior or mdtest needs to find the cluster."""
        ...


class Io500Jobs:
    """The phases of one io500 run as a sequence of jobs of the workload stage."""

    def __init__(self, workload: JobRunner, args: argparse.Namespace) -> None:
        self.workload = workload
        self.ior_prefix: Path = args.ior_prefix
        self.preset: str = args.preset
        self.run_dir = workload.ctx.run_dir
        self.out = self.run_dir.workload_dir
        self.scratch = io500.scratch_dir(self.out)
        self.results: list[io500.PhaseResult] = []
        self.errors: list[dict[str, Any]] = []
        self.timestamp_ns = 0

    def run(self) -> tuple[int, str | None]:
        """Every phase in order until one fails; (exit status, dead server or None)."""
        self.scratch.mkdir(parents=True, exist_ok=True)
        status, server_failure = 0, None
        for step in io500.phase_plan(io500.PRESETS[self.preset], self.scratch):
            if step.tool == "timestamp":
                self.timestamp_ns = time.time_ns()
                continue
            status, server_failure = self.phase(step)
            if status != 0 or server_failure is not None:
                break
        ok = status == 0 and server_failure is None
        if ok:
            self.log(io500.score_line(io500.calc_score(self.results)))
        io500.write_results(self.out, self.preset, self.ranks(), self.results, self.errors, ok)
        return status, server_failure

    def ranks(self) -> int:
        roles = self.workload.ctx.roles
        assert roles is not None
        return len(roles.clients)

    def built_in(self, phase: str) -> list[str]:
        """The built-in workload running one phase (the preparation, or find)."""
        run_dir = self.run_dir
        argv = [sys.executable, "-m", "benchfs.workloads.io500", "--preset", self.preset]
        argv += ["--phase", phase, "--newer-ns", str(self.timestamp_ns)]
        argv += ["--registry", str(run_dir.registry_dir), "--config", str(run_dir.config_path)]
        return [*argv, "--out", str(self.scratch / phase)]

    def phase(self, step: io500.Step) -> tuple[int, str | None]:
        w, log = self.workload, self.run_dir.workload_log
        if step.tool in ("prepare", "find"):
            argv, env = self.built_in(step.name), None
        else:
            argv, env = io500.real_argv(step, self.ior_prefix), w.command_env()
        offset = log.stat().st_size if log.exists() else 0
        began = time.monotonic()
        status, server_failure = w.job(f"workload {step.name}", argv, env)
        seconds = time.monotonic() - began
        if status != 0:
            self.fail(step, f"{Path(argv[0]).name} exited with status {status}")
            return status, server_failure
        if step.tool == "prepare":
            return status, server_failure
        try:
            result = self.result(step, seconds, log, offset)
        except ParseError as e:
            self.fail(step, str(e))
            return 1, server_failure
        self.results.append(result)
        self.log(io500.result_line(result))
        return status, server_failure

    def result(self, step: io500.Step, seconds: float, log: Path, offset: int) -> io500.PhaseResult:
        """The phase's score from its output: IOR's summary bandwidth in GiB/s and its mean
        time, mdtest's rate in kIOPS; find's from the built-in phase's summary."""
        noted = [line for line in text_after(log, offset).splitlines() if "ERROR" in line]
        if noted:  # mdtest reports a failed check of the data read, but exits 0
            raise ParseError(f"{step.name}: {noted[0].strip()}")
        if step.tool == "find":
            summary = read_json(self.scratch / "find" / "summary.json")
            (found,) = summary["phases"]
            return io500.PhaseResult("find", found["score"], found["seconds"])
        text = text_after(log, offset)
        source = f"{step.name} output in {log}"
        if step.tool == "ior":
            rows = [r for r in parse_ior(text, source) if r.kind == "summary"]
            row = next((r for r in rows if r.operation == step.metric), None)
            if row is None:
                raise ParseError(f"{source}: no {step.metric} summary")
            return io500.PhaseResult(step.name, row.bw_mib_s / 1024, row.seconds or seconds)
        rates = [r for r in parse_mdtest(text, source) if r.operation == step.metric]
        if not rates or rates[0].ops_s <= 0:
            raise ParseError(f"{source}: no {step.metric} rate")
        # mdtest's own time (its rate is files over it), without the job's start.
        files = self.ranks() * self.files_per_rank(step)
        return io500.PhaseResult(step.name, rates[0].ops_s / 1000, files / rates[0].ops_s)

    def files_per_rank(self, step: io500.Step) -> int:
        """What the phase worked on per rank: the count mdtest's -x file holds."""
        status = Path(step.args[step.args.index("-x") + 1])
        try:
            return int(status.read_text().split()[0])
        except (OSError, ValueError, IndexError) as e:
            raise ParseError(f"{step.name}: no file count in {status} ({e})") from None

    def fail(self, step: io500.Step, message: str) -> None:
        self.errors.append({"rank": 0, "phase": step.name, "message": message})

    def log(self, line: str) -> None:
        """A result line, into the workload's log (as the built-in run prints them) and to
        the progress display."""
        with open(self.run_dir.workload_log, "a") as f:
            f.write(line + "\n")
        self.workload.ctx.progress.message(line)


def text_after(log: Path, offset: int) -> str:
    """What a job wrote to the workload's log (from `offset` on)."""
    with open(log, "rb") as f:
        f.seek(offset)
        return f.read().decode(errors="replace")

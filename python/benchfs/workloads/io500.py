"""IO500's standard phases on BenchFS with the built-in workloads, scored as IO500 scores.

Run under mpiexec (`benchfs-run launch --workload io500 --preset ci` does):
`python -m benchfs.workloads.io500 --preset ci --registry DIR [--config FILE] [--out DIR]`.

The phases, in IO500's order (IO500/io500 at 02091cf254d8, src/phase-definitions.h), each
after a barrier, each the built-in IOR or mdtest with that phase's defining parameters
(src/phase_*.c there): ior-easy-write, mdtest-easy-write, ior-hard-write, mdtest-hard-write,
find, ior-easy-read, mdtest-easy-stat, ior-hard-read, mdtest-hard-stat, mdtest-easy-delete,
mdtest-hard-read, mdtest-hard-delete. The score is IO500's `calc_score` (src/main.c): the
geometric mean of the bandwidth phases in GiB/s, that of the metadata phases and find in
kIOPS (phases scoring 0 left out), and the square root of their product.

A score from one machine, or from a preset smaller than IO500's rules (300 s stonewalls on
real hardware), is not a list submission. docs/workloads.md describes the phases.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchfs.errors import EXIT_USAGE
from benchfs.results import write_json_atomic
from benchfs.stdio import keep_every_byte
from benchfs.workloads.steps import UsageError, agreed_step, wait_for_all

ROOT = "/io500"

# Each phase: its name, its score group ("bw" or "md"), and its unit as IO500 prints it.
PHASES: tuple[tuple[str, str], ...] = (
    ("ior-easy-write", "bw"),
    ("mdtest-easy-write", "md"),
    ("ior-hard-write", "bw"),
    ("mdtest-hard-write", "md"),
    ("find", "md"),
    ("ior-easy-read", "bw"),
    ("mdtest-easy-stat", "md"),
    ("ior-hard-read", "bw"),
    ("mdtest-hard-stat", "md"),
    ("mdtest-easy-delete", "md"),
    ("mdtest-hard-read", "md"),
    ("mdtest-hard-delete", "md"),
)
GROUP = dict(PHASES)


@dataclass(frozen=True)
class Preset:
    """How much each phase does: IO500's parameters at a size for this machine."""

    ior_easy_transfer: str
    ior_easy_block: str
    ior_hard_segments: int
    mdtest_easy_files: int
    mdtest_hard_files: int
    stonewall_s: int


PRESETS = {
    # make test: all twelve phases in well under a minute on 2 cores.
    "ci": Preset("1m", "16m", 200, 300, 150, 300),
    # make test-long: more of everything.
    "small": Preset("1m", "256m", 4000, 5000, 2000, 300),
}


@dataclass(frozen=True)
class Step:
    """One step of the run: an IO500 phase, or the preparation and timestamp around them.

    `tool` is what runs it ("ior", "mdtest", "find", "prepare", "timestamp"); `args` are its
    options as the built-in IOR and mdtest take them, which real IOR and mdtest take too
    (`real_argv` adds what only those have); `metric` is the figure that scores it (IOR's
    "write" or "read" bandwidth, mdtest's rate of that operation)."""

    name: str
    tool: str
    args: tuple[str, ...] = ()
    metric: str = ""


def phase_plan(p: Preset, scratch: Path) -> list[Step]:
    """The steps in IO500's order with IO500's defining options (src/phase_ior_easy*.c,
    phase_ior_hard*.c, phase_mdtest_easy*.c, phase_mdtest_hard*.c at 02091cf254d8): writes
    under a stonewall with wear-out that records its count in a status file under `scratch`,
    which the later phases read; reads check the data from another rank (-C)."""
    wall = str(p.stonewall_s)
    ior_easy_status = scratch / "ior-easy.stonewall"
    ior_hard_status = scratch / "ior-hard.stonewall"
    easy = ["-k", "-e", "-o", f"{ROOT}/ior-easy/ior_file_easy", "-t", p.ior_easy_transfer]
    easy += ["-b", p.ior_easy_block, "-F", "-O", f"stoneWallingStatusFile={ior_easy_status}"]
    hard = ["-k", "-e", "-o", f"{ROOT}/ior-hard/IOR_file", "-t", "47008", "-b", "47008"]
    hard += ["-s", str(p.ior_hard_segments), "-O", f"stoneWallingStatusFile={ior_hard_status}"]
    write = ["-w", "-D", wall, "-O", "stoneWallingWearOut=1"]
    read = ["-r", "-R", "-C"]
    md_easy = ["-n", str(p.mdtest_easy_files), "-u", "-w", "0", "-d", f"{ROOT}/mdtest-easy"]
    md_easy += ["-x", str(scratch / "mdtest-easy.stonewall")]
    md_hard = ["-n", str(p.mdtest_hard_files), "-w", "3901", "-d", f"{ROOT}/mdtest-hard"]
    md_hard += ["-x", str(scratch / "mdtest-hard.stonewall")]
    return [
        Step("prepare", "prepare"),
        Step("ior-easy-write", "ior", (*write, *easy), "write"),
        Step("mdtest-easy-write", "mdtest", ("-C", "-W", wall, *md_easy), "create"),
        Step("timestamp", "timestamp"),
        Step("ior-hard-write", "ior", (*write, *hard), "write"),
        Step("mdtest-hard-write", "mdtest", ("-C", "-W", wall, *md_hard), "create"),
        Step("find", "find"),
        Step("ior-easy-read", "ior", (*read, *easy), "read"),
        Step("mdtest-easy-stat", "mdtest", ("-T", *md_easy), "stat"),
        Step("ior-hard-read", "ior", (*read, *hard), "read"),
        Step("mdtest-hard-stat", "mdtest", ("-T", *md_hard), "stat"),
        Step("mdtest-easy-delete", "mdtest", ("-r", *md_easy), "remove"),
        Step("mdtest-hard-read", "mdtest", ("-E", *md_hard), "read"),
        Step("mdtest-hard-delete", "mdtest", ("-r", *md_hard), "remove"),
    ]


def real_argv(step: Step, prefix: Path) -> list[str]:
    """The command of an ior or mdtest step with real IOR and mdtest from `prefix` (built with
    contrib/ior/build-ior.sh): their BENCHFS backend, and IO500's options the built-in
    workloads do not have (both: a fixed signature in the data (-G, as IO500 passes its
    hash), so that a later execution can check what an earlier one wrote; IOR: barriers
    between open, transfers and close (-g); mdtest: files only (-F),
    at the leaves (-L), stat and read the neighbour rank's files (-N 1), mdtest-hard reads the
    3901 bytes (-e), checked against what was written (-X, which IO500 leaves out), and
    times its directory (-t))."""
    extra = ["-G", "271", "-g"] if step.tool == "ior" else ["-G", "271"]
    if step.tool == "mdtest":
        extra += ["-F", "-P", "-N", "1"]
        extra += ["-t", "-e", "3901"] if step.name.startswith("mdtest-hard") else ["-L"]
        extra += ["-X"] if step.name == "mdtest-hard-read" else []
    return [str(prefix / "bin" / step.tool), "-a", "BENCHFS", *extra, *step.args]


@dataclass(frozen=True)
class PhaseResult:
    name: str
    score: float  # GiB/s or kIOPS
    seconds: float

    @property
    def unit(self) -> str:
        return "GiB/s" if GROUP[self.name] == "bw" else "kIOPS"


@dataclass(frozen=True)
class Score:
    bandwidth_gib_s: float
    md_kiops: float
    total: float


def calc_score(results: Sequence[PhaseResult]) -> Score:
    """IO500's `calc_score`: per group the geometric mean of the phase scores above 0 (0 when
    there are none), then the square root of the product of the groups."""

    def group(g: str) -> float:
        scores = [r.score for r in results if GROUP[r.name] == g and r.score > 0]
        return math.prod(scores) ** (1 / len(scores)) if scores else 0.0

    bw, md = group("bw"), group("md")
    return Score(bw, md, math.sqrt(bw * md))


def result_line(r: PhaseResult) -> str:
    """One phase as IO500's result_summary.txt has it (src/main.c: "[RESULT]" then
    " %20s %15s %s : time %.3f seconds")."""
    return f"[RESULT] {r.name:>20} {f'{r.score:f}':>15} {r.unit} : time {r.seconds:.3f} seconds"


def score_line(s: Score) -> str:
    return (
        f"[SCORE ] Bandwidth {s.bandwidth_gib_s:f} GiB/s : IOPS {s.md_kiops:f} kiops : "
        f"TOTAL {s.total:f}"
    )


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:
        raise UsageError(message)


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = _Parser(prog="python -m benchfs.workloads.io500", allow_abbrev=False, add_help=False)
    p.add_argument("-h", "--help", action="help", help="show this help and exit")
    p.add_argument("--preset", choices=sorted(PRESETS), default="ci", help="phase sizes")
    p.add_argument("--registry", required=True, help="registry directory of the servers")
    p.add_argument("--config", help="configuration file (default: $BENCHFS_CONFIG)")
    p.add_argument("--out", type=Path, help="directory for result_summary.txt and summary.json")
    p.add_argument(
        "--ior-prefix",
        type=Path,
        help="run the IOR and mdtest phases with the real ior and mdtest in PREFIX/bin, one MPI "
        "job per phase (benchfs-run launch does; contrib/ior/build-ior.sh builds them)",
    )
    p.add_argument(
        "--phase",
        choices=["prepare", *(name for name, _ in PHASES)],
        help="run only this phase (after the preparation), as a job of its own",
    )
    p.add_argument(
        "--newer-ns",
        type=int,
        default=0,
        help="with --phase find: the timestamp (ns since the epoch) files must be newer than",
    )
    a = p.parse_args(list(argv))
    if a.ior_prefix is not None:
        for tool in ("ior", "mdtest"):
            binary = a.ior_prefix / "bin" / tool
            if not os.access(binary, os.X_OK):
                raise UsageError(
                    f"--ior-prefix {a.ior_prefix}: no executable {binary} (build IOR with "
                    "contrib/ior/build-ior.sh IOR_SOURCE PREFIX)"
                )
    return a


class Io500Rank:
    """One rank's run of every phase; every collective is reached by every rank."""

    def __init__(self, a: argparse.Namespace, mpi: Any, scratch: Path) -> None:
        self.a = a
        self.MPI = mpi
        self.comm = mpi.COMM_WORLD
        self.rank = self.comm.Get_rank()
        self.size = self.comm.Get_size()
        self.preset = PRESETS[a.preset]
        self.scratch = scratch  # phase outputs and stonewall files (rank 0's local directory)
        self.results: list[PhaseResult] = []
        self.errors: list[dict[str, Any]] = []
        self.timestamp_ns = a.newer_ns

    def common(self, phase: str) -> list[str]:
        out = ["--registry", self.a.registry, "--out", str(self.scratch / phase)]
        return out + (["--config", self.a.config] if self.a.config else [])

    def ior(self, phase: str, access: str, argv: list[str]) -> bool:
        from benchfs.workloads import ior

        opts = ior.parse_options([*argv, *self.common(phase)])
        began = time.monotonic()
        ok = ior.IorRank(opts, self.MPI).execute() == 0
        return self.record(phase, began, ok, lambda s: s[f"{access}_mib_s"] / 1024)

    def mdtest(self, phase: str, key: str, argv: list[str]) -> bool:
        from benchfs.workloads import mdtest

        a = mdtest.parse_args([*argv, *self.common(phase)])
        began = time.monotonic()
        ok = mdtest.MdtestRank(a, self.MPI).execute() == 0
        return self.record(phase, began, ok, lambda s: s["rates"][key] / 1000)

    def record(
        self, phase: str, began: float, ok: bool, score: Callable[[dict[str, Any]], float]
    ) -> bool:
        """Every rank agrees whether the phase passed; rank 0 reads its score."""
        seconds = time.monotonic() - began
        ok = bool(self.comm.allreduce(int(ok), op=self.MPI.MIN))
        if ok and self.rank == 0:
            summary = json.loads((self.scratch / phase / "summary.json").read_text())
            self.finish_phase(PhaseResult(phase, score(summary), seconds))
        if not ok:
            self.errors.append({"rank": self.rank, "phase": phase, "message": "phase failed"})
        return ok

    def finish_phase(self, r: PhaseResult) -> None:
        self.results.append(r)
        print(result_line(r), flush=True)

    def find(self) -> bool:
        """IO500's find over everything the mdtest phases made: files newer than the timestamp
        taken after the easy phases, 3901 bytes, named *01*. It runs on the servers
        (`Client.find`: every metadata owner checks the names it holds, all at once), asked by
        rank 0; the score is the names examined per second, 0 when nothing matched."""
        from benchfs import Client
        from benchfs.config import resolve_config_text

        counts = [0, 0, 0.0]
        client: list[Client] = []

        def connect() -> None:
            if self.rank == 0:
                client.append(Client(self.a.registry, config=resolve_config_text(self.a.config)))

        def search() -> None:
            if client:
                t0 = time.monotonic()
                r = client[0].find(
                    ROOT,
                    name="*01*",
                    kind="file",
                    size=(3901, 3901),
                    newer_ns=self.timestamp_ns,
                    count_only=True,
                )
                counts[:] = [r.examined, r.matched, time.monotonic() - t0]

        try:
            _, failures = agreed_step(self.comm, "io500", "find connect", connect)
            wait_for_all(self.comm)
            if not failures:
                _, failures = agreed_step(self.comm, "io500", "find", search)
        finally:
            for c in client:
                c.close()
        self.errors.extend(failures)
        if failures:
            return False
        if self.rank == 0:
            seconds = float(counts[2])
            examined, found = int(counts[0]), int(counts[1])
            print(f"find: {found} of {examined} names match", flush=True)
            score = examined / seconds / 1000 if seconds > 0 and found else 0.0
            self.finish_phase(PhaseResult("find", score, seconds))
        return True

    def prepare(self) -> bool:
        from benchfs import Client
        from benchfs.config import resolve_config_text

        def make() -> None:
            if self.rank == 0:
                with Client(self.a.registry, config=resolve_config_text(self.a.config)) as c:
                    for d in (ROOT, f"{ROOT}/ior-easy", f"{ROOT}/ior-hard"):
                        if not c.exists(d):
                            c.mkdir(d)
                self.scratch.mkdir(parents=True, exist_ok=True)

        _, failures = agreed_step(self.comm, "io500", "prepare", make)
        self.errors.extend(failures)
        return not failures

    def execute(self) -> int:
        ok = True
        for step in phase_plan(self.preset, self.scratch):
            if self.a.phase is not None and step.name not in (self.a.phase, "prepare"):
                continue
            ok = self.run_step(step)
            if not ok:
                break
        if self.rank == 0:
            self.finish(ok)
        return 0 if ok else 1

    def run_step(self, step: Step) -> bool:
        if step.tool == "prepare":
            return self.prepare()
        if step.tool == "timestamp":
            # IO500's timestamp phase: find looks for files newer than this.
            self.timestamp_ns = self.comm.bcast(time.time_ns() if self.rank == 0 else 0, root=0)
            return True
        if step.tool == "find":
            return self.find()
        if step.tool == "ior":
            return self.ior(step.name, step.metric, list(step.args))
        return self.mdtest(step.name, step.metric, list(step.args))

    def finish(self, ok: bool) -> None:
        if not ok:
            first = self.errors[0] if self.errors else {"phase": "?", "message": "?"}
            print(f"benchfs io500: FAILED in {first['phase']}", file=sys.stderr, flush=True)
        if self.a.phase is None:
            print_score(self.results, ok)
        if self.a.out is not None:
            write_results(self.a.out, self.a.preset, self.size, self.results, self.errors, ok)


def print_score(results: Sequence[PhaseResult], ok: bool) -> None:
    """The score line, after every phase passed."""
    if ok:
        print(score_line(calc_score(results)), flush=True)


def write_results(
    out: Path,
    preset: str,
    ranks: int,
    results: Sequence[PhaseResult],
    errors: Sequence[dict[str, Any]],
    ok: bool,
) -> None:
    """result_summary.txt in IO500's format, and the summary.json benchfs-run reads."""
    score = calc_score(results) if ok else None
    lines = [result_line(r) for r in results]
    if score is not None:
        lines.append(score_line(score))
    out.mkdir(parents=True, exist_ok=True)
    (out / "result_summary.txt").write_text("\n".join(lines) + "\n")
    rows: list[dict[str, Any]] = [
        {"tool": "io500", "operation": r.name, "kind": "phase", "unit": r.unit, **asdict(r)}
        for r in results
    ]
    if score is not None:
        rows.append({"tool": "io500", "operation": "score", "kind": "score", **asdict(score)})
    write_json_atomic(
        out / "summary.json",
        {
            "workload": "io500",
            "preset": preset,
            "ranks": ranks,
            "phases": [{**asdict(r), "unit": r.unit} for r in results],
            "score": None if score is None else asdict(score),
            "rows": rows,
            "write_mib_s": None,
            "read_mib_s": None,
            "verified": ok,
            "verify_requested": True,
            "errors": list(errors),
        },
    )


def main(argv: Sequence[str] | None = None) -> int:
    keep_every_byte()
    try:
        a = parse_args(sys.argv[1:] if argv is None else argv)
    except UsageError as e:
        print(f"benchfs io500: error: {e}", file=sys.stderr, flush=True)
        return EXIT_USAGE
    if a.ior_prefix is not None:
        print(
            "benchfs io500: error: --ior-prefix runs each phase as its own MPI job: run it "
            "through `benchfs-run launch --workload io500 --ior-prefix PREFIX`",
            file=sys.stderr,
            flush=True,
        )
        return EXIT_USAGE
    from mpi4py import MPI

    return Io500Rank(a, MPI, scratch_dir(a.out)).execute()


def scratch_dir(out: Path | None) -> Path:
    """Where the phases' own outputs and the stonewall status files go."""
    return (out or Path.cwd()) / "phases"


if __name__ == "__main__":
    sys.exit(main())

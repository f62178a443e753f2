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
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchfs.errors import EXIT_USAGE
from benchfs.results import write_json_atomic
from benchfs.workloads.steps import UsageError, agreed_step

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
    return p.parse_args(list(argv))


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
        self.timestamp_ns = 0

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
            self.comm.Barrier()
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
        p = self.preset
        wall = str(p.stonewall_s)
        easy = ["-t", p.ior_easy_transfer, "-b", p.ior_easy_block, "-F", "-k", "-o"]
        easy.append(f"{ROOT}/ior-easy/ior_file_easy")
        hard = ["-t", "47008", "-b", "47008", "-s", str(p.ior_hard_segments), "-k", "-o"]
        hard.append(f"{ROOT}/ior-hard/IOR_file")
        md_easy = ["-n", str(p.mdtest_easy_files), "-u", "-w", "0", "-d", f"{ROOT}/mdtest-easy"]
        md_easy += ["-x", str(self.scratch / "mdtest-easy.stonewall")]
        md_hard = ["-n", str(p.mdtest_hard_files), "-w", "3901", "-d", f"{ROOT}/mdtest-hard"]
        md_hard += ["-x", str(self.scratch / "mdtest-hard.stonewall")]

        def timestamp() -> bool:
            # IO500's timestamp phase: find looks for files newer than this.
            self.timestamp_ns = self.comm.bcast(time.time_ns() if self.rank == 0 else 0, root=0)
            return True

        steps: list[Callable[[], bool]] = [
            self.prepare,
            lambda: self.ior("ior-easy-write", "write", ["-w", "-e", *easy]),
            lambda: self.mdtest("mdtest-easy-write", "create", ["-C", "-W", wall, *md_easy]),
            timestamp,
            lambda: self.ior("ior-hard-write", "write", ["-w", "-e", *hard]),
            lambda: self.mdtest("mdtest-hard-write", "create", ["-C", "-W", wall, *md_hard]),
            self.find,
            # Read back by another rank (-C), as IO500 does with -C -Q 1.
            lambda: self.ior("ior-easy-read", "read", ["-r", "-R", "-C", *easy]),
            lambda: self.mdtest("mdtest-easy-stat", "stat", ["-T", *md_easy]),
            lambda: self.ior("ior-hard-read", "read", ["-r", "-R", "-C", *hard]),
            lambda: self.mdtest("mdtest-hard-stat", "stat", ["-T", *md_hard]),
            lambda: self.mdtest("mdtest-easy-delete", "remove", ["-r", *md_easy]),
            lambda: self.mdtest("mdtest-hard-read", "read", ["-E", *md_hard]),
            lambda: self.mdtest("mdtest-hard-delete", "remove", ["-r", *md_hard]),
        ]
        ok = True
        for step in steps:
            ok = step()
            if not ok:
                break
        if self.rank == 0:
            self.finish(ok)
        return 0 if ok else 1

    def finish(self, ok: bool) -> None:
        score = calc_score(self.results) if ok else None
        lines = [result_line(r) for r in self.results]
        if score is not None:
            lines.append(score_line(score))
            print(score_line(score), flush=True)
        else:
            first = self.errors[0] if self.errors else {"phase": "?", "message": "?"}
            print(f"benchfs io500: FAILED in {first['phase']}", file=sys.stderr, flush=True)
        if self.a.out is None:
            return
        self.a.out.mkdir(parents=True, exist_ok=True)
        (self.a.out / "result_summary.txt").write_text("\n".join(lines) + "\n")
        rows: list[dict[str, Any]] = [
            {"tool": "io500", "operation": r.name, "kind": "phase", "unit": r.unit, **asdict(r)}
            for r in self.results
        ]
        if score is not None:
            rows.append({"tool": "io500", "operation": "score", "kind": "score", **asdict(score)})
        write_json_atomic(
            self.a.out / "summary.json",
            {
                "workload": "io500",
                "preset": self.a.preset,
                "ranks": self.size,
                "phases": [{**asdict(r), "unit": r.unit} for r in self.results],
                "score": None if score is None else asdict(score),
                "rows": rows,
                "write_mib_s": None,
                "read_mib_s": None,
                "verified": ok,
                "verify_requested": True,
                "errors": self.errors,
            },
        )


def main(argv: Sequence[str] | None = None) -> int:
    try:
        a = parse_args(sys.argv[1:] if argv is None else argv)
    except UsageError as e:
        print(f"benchfs io500: error: {e}", file=sys.stderr, flush=True)
        return EXIT_USAGE
    from mpi4py import MPI

    scratch = (a.out or Path.cwd()) / "phases"
    return Io500Rank(a, MPI, scratch).execute()


if __name__ == "__main__":
    sys.exit(main())

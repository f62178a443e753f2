"""Built-in mdtest-like metadata workload: create, stat, read and remove files per rank.

Run under mpiexec: `python -m benchfs.workloads.mdtest -n 1000 [-u] [-d /mdtest] --registry
DIR`. Each rank creates `-n` files (writing `-w` bytes into each), stats them (checking the
size), reads them back (checking the bytes), and removes them, in one shared directory or, with
`-u`, one directory per rank. Every phase starts after a barrier; its rate is the files of all
ranks over the span from the first start to the last end, as mdtest reports it.

The loop is Python calling the Python API: metadata operations are round trips to the servers
(tens of microseconds each), so the interpreter is not what is measured here, unlike the IOR
workload's transfer loop, which runs in Rust. See docs/workloads.md.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from benchfs import Client
from benchfs.config import resolve_config_text
from benchfs.errors import EXIT_USAGE
from benchfs.parsers import MDTEST_OPERATIONS, RateRow
from benchfs.rankexec import mark_up
from benchfs.results import write_json_atomic
from benchfs.stdio import keep_every_byte
from benchfs.workloads.steps import UsageError, VerificationError, agreed_step, wait_for_all

PHASES = ("create", "stat", "read", "remove")
# What this workload measures, in mdtest's order and words (benchfs.parsers.MDTEST_OPERATIONS).
REPORTED = ("create", "stat", "read", "remove", "tree_create", "tree_remove")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:
        raise UsageError(message)


def _nonneg(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must not be negative")
    return value


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = _Parser(prog="python -m benchfs.workloads.mdtest", allow_abbrev=False, add_help=False)
    p.add_argument("-h", "--help", action="help", help="show this help and exit")
    p.add_argument("-n", type=_nonneg, required=True, dest="items", help="files per rank")
    p.add_argument("-u", action="store_true", dest="unique", help="unique directory per rank")
    p.add_argument("-d", default="/mdtest", dest="base", help="test directory (BenchFS path)")
    p.add_argument("-w", type=_nonneg, default=64, dest="write_bytes", help="bytes per file")
    p.add_argument("-i", type=_nonneg, default=1, dest="iterations", help="iterations")
    # Phase selection, as mdtest has it (IO500 runs each phase on its own): none given, all.
    p.add_argument("-C", action="store_true", dest="only_create", help="only create files")
    p.add_argument("-T", action="store_true", dest="only_stat", help="only stat files")
    p.add_argument("-E", action="store_true", dest="only_read", help="only read files")
    p.add_argument("-r", action="store_true", dest="only_remove", help="only remove files")
    p.add_argument(
        "-W", type=_nonneg, default=0, dest="stonewall", help="stonewall seconds for creation"
    )
    p.add_argument(
        "-x",
        type=Path,
        dest="stonewall_file",
        help="file for the number of files per rank a stonewalled creation made (written by "
        "creation, read by the other phases)",
    )
    p.add_argument("--registry", required=True, help="registry directory of the servers")
    p.add_argument("--config", help="configuration file (default: $BENCHFS_CONFIG)")
    p.add_argument("--out", type=Path, help="directory for summary.json and per-rank records")
    a = p.parse_args(list(argv))
    if a.items < 1:
        raise UsageError("-n: at least one file per rank")
    if a.iterations < 1:
        raise UsageError("-i: at least one iteration")
    if not a.base.startswith("/") or a.base == "/":
        raise UsageError(f"-d {a.base}: an absolute BenchFS directory other than /")
    a.phases = [p for p in PHASES if getattr(a, f"only_{p}")] or list(PHASES)
    if a.stonewall and "create" not in a.phases:
        raise UsageError("-W: the stonewall applies to creation (-C)")
    return a


def contents(rank: int, index: int, size: int) -> bytes:
    """What rank `rank` writes into its file `index`: text naming both, repeated."""
    unit = f"mdtest rank {rank} file {index}\n".encode()
    return (unit * (size // len(unit) + 1))[:size]


class MdtestRank:
    """One rank's run; every collective is reached by every rank (see workloads.rw)."""

    def __init__(self, a: argparse.Namespace, mpi: Any) -> None:
        self.a = a
        self.MPI = mpi
        self.comm = mpi.COMM_WORLD
        self.rank = self.comm.Get_rank()
        self.size = self.comm.Get_size()
        self.client: Client | None = None
        self.errors: list[dict[str, Any]] = []
        self.rates: dict[str, list[float]] = {}
        self.count = a.items  # files per rank the phases work on (see files_per_rank)

    def step(self, name: str, action: Callable[[], None]) -> bool:
        _, failures = agreed_step(self.comm, "mdtest", name, action)
        self.errors.extend(failures)
        return not self.errors

    def tree(self, iteration: int) -> str:
        return f"{self.a.base}/test-dir.0-{iteration}"

    def directory(self, iteration: int) -> str:
        leaf = f"mdtest_tree.{self.rank}" if self.a.unique else "mdtest_tree.0"
        return f"{self.tree(iteration)}/{leaf}"

    def path(self, iteration: int, index: int) -> str:
        return f"{self.directory(iteration)}/file.mdtest.{self.rank}.{index}"

    def timed(self, name: str, work: Callable[[], int]) -> bool:
        """Barrier, run, then the cluster-wide rate: all ranks' ops over first start..last end."""
        wtime = self.MPI.Wtime
        span = [0.0, 0.0, 0]

        def run() -> None:
            span[0] = wtime()
            span[2] = work()
            span[1] = wtime()

        wait_for_all(self.comm)
        ok = self.step(name, run)
        self.record_rate(name, ok, (span[0], span[1], int(span[2])))
        return ok

    def record_rate(self, name: str, ok: bool, span: tuple[float, float, int]) -> None:
        """Rank 0 keeps the phase's rate: all ranks' ops over first start..last end."""
        spans = self.comm.gather(span, root=0)
        if ok and self.rank == 0:
            assert spans is not None
            elapsed = max(s[1] for s in spans) - min(s[0] for s in spans)
            ops = sum(s[2] for s in spans)
            self.rates.setdefault(name, []).append(ops / elapsed if elapsed > 0 else 0.0)

    def stonewalled_create(self, make: Callable[[int, int, float | None], int]) -> bool:
        """Creation under `-W`: each rank creates until the deadline, then every rank goes on to
        the most files any rank made (mdtest's stonewall wear-out), so all ranks end with the
        same count, which rank 0 records in the `-x` file for the later phases."""
        wtime, made, span = self.MPI.Wtime, [0], [0.0, 0.0, 0]

        def until_deadline() -> None:
            span[0] = wtime()
            made[0] = make(0, self.a.items, span[0] + self.a.stonewall)

        wait_for_all(self.comm)
        ok = self.step("create", until_deadline)
        target = self.comm.allreduce(made[0], op=self.MPI.MAX) if ok else 0

        def wear_out() -> None:
            make(made[0], target, None)
            span[1], span[2] = wtime(), target

        ok = ok and self.step("create", wear_out)
        self.record_rate("create", ok, (span[0], span[1], int(span[2])))
        self.count = target
        if ok and self.rank == 0 and self.a.stonewall_file is not None:
            self.a.stonewall_file.write_text(f"{target}\n")
        return ok

    def files_per_rank(self) -> int:
        """-n, or what a stonewalled creation made (its `-x` file) for the later phases."""
        a = self.a
        if "create" not in a.phases and a.stonewall_file is not None:
            try:
                return int(a.stonewall_file.read_text().split()[0])
            except (OSError, ValueError, IndexError) as e:
                raise UsageError(f"-x {a.stonewall_file}: no file count in it ({e})") from None
        return a.items

    def iteration(self, it: int) -> bool:
        a, c = self.a, self.client
        assert c is not None
        size = a.write_bytes

        def tree_create() -> int:
            made = 0
            if self.rank == 0:
                for d in (a.base, self.tree(it)):
                    if not c.exists(d):
                        c.mkdir(d)
                        made += 1
                if not a.unique:
                    c.mkdir(self.directory(it))
                    made += 1
            return made

        def unique_dirs() -> int:
            if a.unique:
                c.mkdir(self.directory(it))
                return 1
            return 0

        def make(first: int, end: int, deadline: float | None) -> int:
            """Creates files first..end (stopping at `deadline`); the index reached."""
            for i in range(first, end):
                if deadline is not None and self.MPI.Wtime() > deadline:
                    return i
                with c.open(self.path(it, i), os.O_WRONLY | os.O_CREAT | os.O_EXCL) as f:
                    if size:
                        f.write(contents(self.rank, i, size))
            return end

        def create() -> int:
            return make(0, self.count, None)

        def stat() -> int:
            n = self.count
            for i in range(n):
                got = c.stat(self.path(it, i)).st_size
                if got != size:
                    raise VerificationError(f"{self.path(it, i)}: stat size {got}, wrote {size}")
            return n

        def read() -> int:
            n = self.count
            for i in range(n):
                with c.open(self.path(it, i)) as f:
                    data = f.read(size + 1)  # one more, to see a file that grew
                want = contents(self.rank, i, size)
                if data != want:
                    at = next(
                        (k for k, (x, y) in enumerate(zip(data, want, strict=False)) if x != y),
                        None,
                    )
                    where = f"first difference at byte {at}" if at is not None else "length"
                    raise VerificationError(
                        f"{self.path(it, i)}: read {len(data)} bytes that differ from the "
                        f"{size} written ({where})"
                    )
            return n

        def remove() -> int:
            n = self.count
            for i in range(n):
                c.unlink(self.path(it, i))
            return n

        def remove_unique() -> None:
            if a.unique:
                c.rmdir(self.directory(it))

        def remove_tree() -> None:
            if self.rank == 0:
                if not a.unique:
                    c.rmdir(self.directory(it))
                c.rmdir(self.tree(it))

        ok = True
        if "create" in a.phases:
            ok = self.timed("tree_create", tree_create) and self.step("unique dirs", unique_dirs)
        for name, work in zip(PHASES, (create, stat, read, remove), strict=True):
            if name not in a.phases:
                continue
            if name == "create" and a.stonewall:
                ok = ok and self.stonewalled_create(make)
            else:
                ok = ok and self.timed(name, work)
        if not ok or "remove" not in a.phases:
            return ok
        # Tree removal: the leaves (per rank), then the shared levels (rank 0), as one phase.
        wait_for_all(self.comm)
        t0 = self.MPI.Wtime()
        ok = self.step("tree_remove", remove_unique) and self.step("tree_remove", remove_tree)
        elapsed = self.MPI.Wtime() - t0
        if ok and self.rank == 0:
            dirs = (self.size if a.unique else 1) + 1
            self.rates.setdefault("tree_remove", []).append(dirs / elapsed if elapsed else 0.0)
        return ok

    def execute(self) -> int:
        def connect() -> None:
            self.client = Client(self.a.registry, config=resolve_config_text(self.a.config))
            mark_up()

        def count() -> None:
            if self.rank == 0:  # as mdtest: the -x file is rank 0's to read
                self.count = self.files_per_rank()

        ok = self.step("connect", connect) and self.step("file count", count)
        if ok:
            self.count = self.comm.bcast(self.count, root=0)
        for it in range(self.a.iterations):
            if not ok:
                break
            ok = self.iteration(it)
        if self.client is not None:
            self.client.close()
        if self.a.out is not None:
            self.a.out.mkdir(parents=True, exist_ok=True)
            write_json_atomic(
                self.a.out / f"rank-{self.rank}.json",
                {"rank": self.rank, "pid": os.getpid(), "host": socket.gethostname()},
            )
        if self.rank == 0:
            self.finish(ok)
        return 0 if ok else 1

    def finish(self, ok: bool) -> None:
        a = self.a
        if ok:
            print(format_summary(self.rates, self.size, a), flush=True)
        else:
            e = self.errors[0]
            print(
                f"benchfs mdtest: FAILED: rank {e['rank']} {e['phase']}: {e['message']}",
                file=sys.stderr,
                flush=True,
            )
        if a.out is not None:
            summary = {
                "workload": "mdtest",
                "ranks": self.size,
                "items_per_rank": a.items,
                "unique_dir": a.unique,
                "write_bytes": a.write_bytes,
                "iterations": a.iterations,
                "rates": {k: statistics.fmean(v) for k, v in self.rates.items()} if ok else {},
                "rate_samples": self.rates,
                "rows": [r.to_dict() for r in rate_rows(self.rates)] if ok else [],
                "write_mib_s": None,
                "read_mib_s": None,
                "bytes": a.items * a.write_bytes * self.size * a.iterations,
                "verified": ok,
                "errors": self.errors,
            }
            write_json_atomic(a.out / "summary.json", summary)


def rate_rows(rates: dict[str, list[float]]) -> list[RateRow]:
    """The summary of each operation over its iterations (mdtest's max, min, mean, std dev)."""
    return [
        RateRow(
            tool="mdtest",
            operation=key,
            kind="summary",
            ops_s=statistics.fmean(v),
            ops_max_s=max(v),
            ops_min_s=min(v),
            ops_std_s=statistics.stdev(v) if len(v) > 1 else 0.0,  # mdtest: sample std dev
            iterations=len(v),
        )
        for key in REPORTED
        if (v := rates.get(key))
    ]


def format_summary(rates: dict[str, list[float]], ranks: int, a: argparse.Namespace) -> str:
    """mdtest 4.x's "SUMMARY rate" table, line for line (hpc/ior 5fcf0ba995fd src/mdtest.c,
    summarize_results), so that what reads mdtest's output reads this too."""
    lines = [
        f"-- started with {ranks} tasks, {a.items} files per task, "
        f"{'unique directory per task' if a.unique else 'one shared directory'}, "
        f"{a.write_bytes} bytes per file --",
        "",
        f"SUMMARY rate (in ops/sec): (of {a.iterations} iterations)",
        "   Operation                     Max            Min           Mean        Std Dev",
        "   ---------                     ---            ---           ----        -------",
    ]
    for r in rate_rows(rates):
        lines.append(
            f"   {MDTEST_OPERATIONS[r.operation]:<18}     {r.ops_max_s:14.3f} {r.ops_min_s:14.3f} "
            f"{r.ops_s:14.3f} {r.ops_std_s:14.3f}"
        )
    lines.append("-- finished --")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    keep_every_byte()
    try:
        a = parse_args(sys.argv[1:] if argv is None else argv)
    except UsageError as e:
        print(f"benchfs mdtest: error: {e}", file=sys.stderr, flush=True)
        return EXIT_USAGE
    from mpi4py import MPI  # late, so that --help and option errors need no MPI runtime

    return MdtestRank(a, MPI).execute()


if __name__ == "__main__":
    sys.exit(main())

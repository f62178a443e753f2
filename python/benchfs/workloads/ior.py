"""Built-in IOR-compatible workload: IOR's options, offsets, phases and output on BenchFS.

Run under mpiexec: `python -m benchfs.workloads.ior -w -r -t 1m -b 16m -F --registry DIR`.
Ranks are coordinated with mpi4py (barriers around each timed phase, timings gathered on rank
0, errors exchanged after every step so that no rank waits in a collective another one left);
the transfer loop, its data pattern and the check run in Rust (`_core.ior_phase`), so a rank
spends no Python time per transfer. Rank 0 prints IOR's results and "Summary of all tests:"
tables (or IOR's JSON with `-O summaryFormat=JSON`); see docs/workloads.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shlex
import socket
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchfs import Client, File, _core
from benchfs.config import resolve_config_text
from benchfs.errors import EXIT_USAGE
from benchfs.rankexec import mark_up
from benchfs.results import write_json_atomic
from benchfs.spread import spread
from benchfs.stdio import keep_every_byte
from benchfs.units import KIB, MIB, parse_size
from benchfs.workloads.steps import UsageError, WorkloadError, agreed_step, wait_for_all

VERSION = "4.0.0"
"""The IOR version whose output formats this workload writes."""
API = "BENCHFS"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # argparse's own exits 2 too, but without our prefix
        raise UsageError(message)


def _size(text: str) -> int:
    """IOR sizes: 1m, 4k, 2g (binary) or plain bytes."""
    try:
        return parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must not be negative")
    return value


@dataclass
class Options:
    """IOR's parameters that this workload implements (names as in IOR's JSON)."""

    write: bool
    read: bool
    check_write: bool
    check_read: bool
    transfer_size: int
    block_size: int
    segments: int
    file_per_proc: bool
    reorder: bool
    fsync: bool
    stonewall_s: int
    wear_out: bool
    stonewall_status_file: Path | None
    iterations: int
    test_file: str
    keep_file: bool
    json_stdout: bool
    json_file: Path | None
    summary_file: Path | None
    registry: str
    config: str | None
    out: Path | None
    command_line: str = ""


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="python -m benchfs.workloads.ior",
        description=(__doc__ or "").splitlines()[0],
        add_help=False,
        allow_abbrev=False,
    )
    p.add_argument("-h", "--help", action="help", help="show this help and exit")
    p.add_argument("-w", action="store_true", dest="write", help="write file")
    p.add_argument("-r", action="store_true", dest="read", help="read existing file")
    p.add_argument(
        "-W", action="store_true", dest="check_write", help="check write: read back and verify"
    )
    p.add_argument("-R", action="store_true", dest="check_read", help="verify data on read")
    p.add_argument("-t", type=_size, default=256 * KIB, dest="transfer", help="transfer size")
    p.add_argument("-b", type=_size, default=MIB, dest="block", help="contiguous bytes per task")
    p.add_argument("-s", type=_count, default=1, dest="segments", help="segment count")
    p.add_argument("-F", action="store_true", dest="fpp", help="file per process")
    p.add_argument("-C", action="store_true", dest="reorder", help="read another task's data")
    p.add_argument("-e", action="store_true", dest="fsync", help="fsync after the write phase")
    p.add_argument("-D", type=_count, default=0, dest="deadline", help="stonewall seconds")
    p.add_argument("-i", type=_count, default=1, dest="reps", help="iterations (repetitions)")
    p.add_argument("-o", default="/testFile", dest="test_file", help="test file name")
    p.add_argument("-k", action="store_true", dest="keep", help="keep the test file(s)")
    p.add_argument(
        "-O",
        action="append",
        default=[],
        dest="extra",
        metavar="KEY=VALUE",
        help="summaryFormat=JSON (JSON instead of text on stdout), summaryFile=PATH, "
        "stoneWallingWearOut=1 (after -D, every task goes on to the most transfers any task "
        "made), stoneWallingStatusFile=PATH (a write records that count, a read reads as many)",
    )
    p.add_argument("--json", type=Path, help="also write IOR's JSON output to this file")
    p.add_argument("--registry", required=True, help="registry directory of the servers")
    p.add_argument("--config", help="configuration file (default: $BENCHFS_CONFIG)")
    p.add_argument("--out", type=Path, help="directory for summary.json and per-rank records")
    return p


def parse_options(argv: Sequence[str]) -> Options:
    """IOR's options with IOR's checks; UsageError says what is wrong."""
    a = build_parser().parse_args(list(argv))
    json_stdout = False
    summary_file: Path | None = None
    wear_out = False
    status_file: Path | None = None
    for item in a.extra:
        key, sep, value = item.partition("=")
        if not sep:
            raise UsageError(f"-O {item!r}: expected KEY=VALUE")
        if key == "summaryFormat":
            if value.lower() not in ("json", "default", "human"):
                raise UsageError(f"-O summaryFormat={value}: expected JSON or default")
            json_stdout = value.lower() == "json"
        elif key == "summaryFile":
            summary_file = Path(value)
        elif key == "stoneWallingWearOut":
            if value not in ("0", "1"):
                raise UsageError(f"-O stoneWallingWearOut={value}: expected 0 or 1")
            wear_out = value == "1"
        elif key == "stoneWallingStatusFile":
            status_file = Path(value)
        else:
            raise UsageError(
                f"-O {key}: unsupported (summaryFormat, summaryFile, stoneWallingWearOut and "
                "stoneWallingStatusFile are)"
            )
    if not (a.write or a.read or a.check_write or a.check_read):
        a.write = a.read = True  # IOR's default: write, then read
    if a.check_write and not a.write:
        raise UsageError("-W (check write) needs -w")
    if a.transfer <= 0 or a.transfer % 8:
        raise UsageError(f"-t {a.transfer}: transfer size must be a positive multiple of 8")
    if a.transfer > 1 << 30:
        raise UsageError(f"-t {a.transfer}: transfer size must not exceed 1 GiB")
    if a.block <= 0 or a.block % a.transfer:
        raise UsageError(f"-b {a.block}: block size must be a multiple of transfer size")
    if a.segments < 1:
        raise UsageError("-s: segment count must be at least 1")
    if a.reps < 1:
        raise UsageError("-i: iterations must be at least 1")
    if not a.test_file.startswith("/"):
        raise UsageError(f"-o {a.test_file}: the test file must be an absolute BenchFS path")
    # IOR's own checks of these options (src/ior.c at 5fcf0ba995fd, ValidateTests).
    if status_file is not None and not a.keep:
        raise UsageError(
            "-O stoneWallingStatusFile: only sensible when write and read run as separate "
            "executions: use -k"
        )
    if status_file is not None and not wear_out and a.write:
        raise UsageError(
            "-O stoneWallingStatusFile: a write records its count only with "
            "-O stoneWallingWearOut=1"
        )
    if wear_out and not a.deadline:
        raise UsageError("-O stoneWallingWearOut: needs a stonewall deadline (-D)")
    return Options(
        write=a.write,
        read=a.read,
        check_write=a.check_write,
        check_read=a.check_read,
        transfer_size=a.transfer,
        block_size=a.block,
        segments=a.segments,
        file_per_proc=a.fpp,
        reorder=a.reorder,
        fsync=a.fsync,
        stonewall_s=a.deadline,
        wear_out=wear_out,
        stonewall_status_file=status_file,
        iterations=a.reps,
        test_file=a.test_file,
        keep_file=a.keep,
        json_stdout=json_stdout,
        json_file=a.json,
        summary_file=summary_file,
        registry=a.registry,
        config=a.config,
        out=a.out,
        command_line=" ".join(shlex.quote(x) for x in ["ior", *argv]),
    )


def file_name(opts: Options, rank: int) -> str:
    """IOR's names: the test file, suffixed `.%08d` by rank for file per process."""
    return f"{opts.test_file}.{rank:08d}" if opts.file_per_proc else opts.test_file


@dataclass
class RankPhase:
    """One rank's timed phase (MPI.Wtime seconds) and what the Rust loop reported."""

    open_start: float = 0.0
    open_end: float = 0.0
    io_end: float = 0.0
    close_end: float = 0.0
    loop: dict[str, Any] = field(default_factory=dict)


@dataclass
class PhaseResult:
    """One phase of one iteration over all ranks, as IOR reports it."""

    access: str
    iteration: int
    bytes: int
    ops: int
    bw_mib_s: float
    iops: float
    latency_s: float
    open_s: float
    io_s: float
    close_s: float
    total_s: float
    stonewalled: bool
    stonewall_s: float | None
    stonewall_mib: float | None

    def json(self, opts: Options) -> dict[str, Any]:
        return {
            "access": self.access,
            "bwMiB": round(self.bw_mib_s, 4),
            "blockKiB": opts.block_size / KIB,
            "xferKiB": opts.transfer_size / KIB,
            "iops": round(self.iops, 4),
            "latency": self.latency_s,
            "openTime": self.open_s,
            "wrRdTime": self.io_s,
            "closeTime": self.close_s,
            "totalTime": self.total_s,
        }


def reduce_phase(access: str, iteration: int, phases: list[RankPhase]) -> PhaseResult:
    """IOR's reduction: each interval from the earliest start to the latest end over ranks;
    bandwidth is the bytes all ranks moved over the whole open-to-close span."""
    total = max(p.close_end for p in phases) - min(p.open_start for p in phases)
    moved = sum(int(p.loop["bytes"]) for p in phases)
    ops = sum(int(p.loop["ops"]) for p in phases)
    stonewalled = any(p.loop.get("stonewalled") for p in phases)
    io_s = max(p.io_end for p in phases) - min(p.open_end for p in phases)
    return PhaseResult(
        access=access,
        iteration=iteration,
        bytes=moved,
        ops=ops,
        bw_mib_s=moved / MIB / total if total > 0 else 0.0,
        iops=ops / total if total > 0 else 0.0,
        latency_s=statistics.fmean(float(p.loop["lat_mean_s"]) for p in phases),
        open_s=max(p.open_end for p in phases) - min(p.open_start for p in phases),
        io_s=io_s,
        close_s=max(p.close_end for p in phases) - min(p.io_end for p in phases),
        total_s=total,
        stonewalled=stonewalled,
        stonewall_s=max(float(p.loop.get("stonewall_seconds", p.loop["seconds"])) for p in phases)
        if stonewalled
        else None,
        stonewall_mib=sum(int(p.loop.get("stonewall_bytes", p.loop["bytes"])) for p in phases) / MIB
        if stonewalled
        else None,
    )


def write_status_file(path: Path, ops: int) -> None:
    """IOR's stonewalling status file: the transfers per task a stonewalled write made, as
    one decimal number (src/utilities.c StoreStoneWallingIterations at 5fcf0ba995fd)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(str(ops))


def read_status_file(path: Path) -> int | None:
    """The count in IOR's status file; None (read everything) with IOR's warning when it
    cannot be read."""
    try:
        ops = int(path.read_text().split()[0])
        return ops if ops > 0 else None  # 0: IOR reads everything
    except (OSError, ValueError, IndexError):
        print(
            f"WARNING: Could not read back the stonewalling status from the file! ({path})",
            file=sys.stderr,
            flush=True,
        )
        return None


def merge_loops(first: dict[str, Any], rest: dict[str, Any]) -> dict[str, Any]:
    """One rank's loop report from a stonewalled loop and its wear-out: counts add up; the
    latency quantiles are those of the larger part (the parts' samples are not kept)."""
    ops = int(first["ops"]) + int(rest["ops"])
    larger = first if int(first["ops"]) >= int(rest["ops"]) else rest
    mean = (
        (first["lat_mean_s"] * int(first["ops"]) + rest["lat_mean_s"] * int(rest["ops"])) / ops
        if ops
        else 0.0
    )
    parts = [x for x in (first, rest) if int(x["ops"])] or [first]
    return {
        **first,
        "bytes": int(first["bytes"]) + int(rest["bytes"]),
        "ops": ops,
        "seconds": first["seconds"] + rest["seconds"],
        "stonewall_seconds": first["seconds"],
        "stonewall_bytes": int(first["bytes"]),
        "lat_mean_s": mean,
        "lat_min_s": min(x["lat_min_s"] for x in parts),
        "lat_p50_s": larger["lat_p50_s"],
        "lat_p99_s": larger["lat_p99_s"],
        "lat_max_s": max(x["lat_max_s"] for x in parts),
        "fsync_s": rest["fsync_s"],
        "mismatched_words": int(first["mismatched_words"]) + int(rest["mismatched_words"]),
        "first_mismatch": first["first_mismatch"] or rest["first_mismatch"],
    }


def _summary_stats(opts: Options, tasks: int, results: list[PhaseResult], op: str) -> dict:
    rows = [r for r in results if r.access == op]
    bws = [r.bw_mib_s for r in rows]
    ops = [r.iops for r in rows]
    walls = [r.stonewall_s for r in rows if r.stonewall_s is not None]
    wall_mib = [r.stonewall_mib for r in rows if r.stonewall_mib is not None]
    return {
        "operation": op,
        "API": API,
        "TestID": 0,
        "ReferenceNumber": 0,
        "segmentCount": opts.segments,
        "blockSize": opts.block_size,
        "transferSize": opts.transfer_size,
        "numTasks": tasks,
        "tasksPerNode": tasks,
        "repetitions": opts.iterations,
        "filePerProc": int(opts.file_per_proc),
        "reorderTasks": int(opts.reorder),
        "taskPerNodeOffset": 1,
        "reorderTasksRandom": 0,
        "reorderTasksRandomSeed": 0,
        "bwMaxMIB": max(bws),
        "bwMinMIB": min(bws),
        "bwMeanMIB": statistics.fmean(bws),
        "bwStdMIB": statistics.pstdev(bws),
        "OPsMax": max(ops),
        "OPsMin": min(ops),
        "OPsMean": statistics.fmean(ops),
        "OPsSD": statistics.pstdev(ops),
        "MeanTime": statistics.fmean(r.total_s for r in rows),
        "StonewallTime": statistics.fmean(walls) if walls else None,
        "StonewallMiB": statistics.fmean(wall_mib) if wall_mib else None,
        "xsizeMiB": opts.segments * opts.block_size * tasks / MIB,
    }


def _ctime(t: float) -> str:
    return time.strftime("%a %b %d %H:%M:%S %Y", time.localtime(t))


def format_json(
    opts: Options, tasks: int, results: list[PhaseResult], began: float, finished: float
) -> dict[str, Any]:
    """IOR's `-O summaryFormat=JSON` document (IOR 4.0's keys; see src/ior-output.c)."""
    per_iteration = [
        [r.json(opts) for r in results if r.iteration == it] for it in range(opts.iterations)
    ]
    aggregate = opts.segments * opts.block_size * tasks
    return {
        "Version": VERSION,
        "Began": _ctime(began),
        "Command line": opts.command_line,
        "Machine": f"{platform.system()} {socket.gethostname()}",
        "tests": [
            {
                "TestID": 0,
                "StartTime": _ctime(began),
                "Path": opts.test_file,
                "Parameters": {
                    "testID": 0,
                    "refnum": 0,
                    "api": API,
                    "platform": f"{socket.gethostname()}({platform.system()})",
                    "testFileName": opts.test_file,
                    "deadlineForStonewall": opts.stonewall_s,
                    "nodes": 1,
                    "tasksPerNode": tasks,
                    "repetitions": opts.iterations,
                    "fsync": int(opts.fsync),
                    "readFile": int(opts.read),
                    "writeFile": int(opts.write),
                    "filePerProc": int(opts.file_per_proc),
                    "reorderTasks": int(opts.reorder),
                    "checkWrite": int(opts.check_write),
                    "checkRead": int(opts.check_read),
                    "keepFile": int(opts.keep_file),
                    "segmentCount": opts.segments,
                    "transferSize": opts.transfer_size,
                    "blockSize": opts.block_size,
                },
                "Options": {
                    "api": API,
                    "test filename": opts.test_file,
                    "access": "file-per-process" if opts.file_per_proc else "single-shared-file",
                    "type": "independent",
                    "segments": opts.segments,
                    "ordering in a file": "sequential",
                    "ordering inter file": "constant task offset"
                    if opts.reorder
                    else "no tasks offsets",
                    "nodes": 1,
                    "tasks": tasks,
                    "clients per node": tasks,
                    "repetitions": opts.iterations,
                    "xfersize": _human(opts.transfer_size),
                    "blocksize": _human(opts.block_size),
                    "aggregate filesize": _human(aggregate),
                },
                "Results": per_iteration,
            }
        ],
        "summary": [
            _summary_stats(opts, tasks, results, op)
            for op in ("write", "read")
            if any(r.access == op for r in results)
        ],
        "Finished": _ctime(finished),
    }


def _human(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.2f} {unit}"
    return f"{n} bytes"


def format_text(
    opts: Options, tasks: int, results: list[PhaseResult], began: float, finished: float
) -> str:
    """IOR's human output: banner, options, per-iteration results and the summary table."""
    aggregate = opts.segments * opts.block_size * tasks
    lines = [
        f"IOR-{VERSION}: MPI Coordinated Test of Parallel I/O (BenchFS built-in workload)",
        f"Began               : {_ctime(began)}",
        f"Command line        : {opts.command_line}",
        f"Machine             : {platform.system()} {socket.gethostname()}",
        "TestID              : 0",
        f"StartTime           : {_ctime(began)}",
        f"Path                : {opts.test_file}",
        "",
        "Options: ",
        f"api                 : {API}",
        f"test filename       : {opts.test_file}",
        "access              : "
        + ("file-per-process" if opts.file_per_proc else "single-shared-file"),
        "type                : independent",
        f"segments            : {opts.segments}",
        "ordering in a file  : sequential",
        "ordering inter file : " + ("constant task offset" if opts.reorder else "no tasks offsets"),
        "nodes               : 1",
        f"tasks               : {tasks}",
        f"clients per node    : {tasks}",
        f"repetitions         : {opts.iterations}",
        f"xfersize            : {_human(opts.transfer_size)}",
        f"blocksize           : {_human(opts.block_size)}",
        f"aggregate filesize  : {_human(aggregate)}",
    ]
    if opts.stonewall_s:
        lines.append(f"stonewallingTime    : {opts.stonewall_s}")
    lines += [
        "",
        "Results: ",
        "",
        "access    bw(MiB/s)  IOPS       Latency(s)  block(KiB) xfer(KiB)  open(s)    "
        "wr/rd(s)   close(s)   total(s)   iter",
        "------    ---------  ----       ----------  ---------- ---------  --------   "
        "--------   --------   --------   ----",
    ]
    for r in results:
        if r.stonewalled:
            lines.append(
                f"stonewalling pairs accessed: {r.ops // tasks} (mean) -- data: "
                f"{r.bytes / MIB:.2f} MiB, time: {r.stonewall_s:.3f} s"
            )
        lines.append(
            f"{r.access:<10}{r.bw_mib_s:<11.2f}{r.iops:<11.2f}{r.latency_s:<12.6f}"
            f"{opts.block_size / KIB:<11.0f}{opts.transfer_size / KIB:<11.2f}"
            f"{r.open_s:<11.6f}{r.io_s:<11.6f}{r.close_s:<11.6f}{r.total_s:<11.6f}"
            f"{r.iteration:<4}"
        )
    for op in ("write", "read"):
        best = [r.bw_mib_s for r in results if r.access == op]
        if best:
            label = f"Max {op.capitalize()}:"
            lines.append(f"{label:<11}{max(best):.2f} MiB/sec ({max(best) * MIB / 1e6:.2f} MB/sec)")
    lines += [
        "",
        "Summary of all tests:",
        f"{'Operation':<10}{'Max(MiB)':>11}{'Min(MiB)':>11}{'Mean(MiB)':>11}{'StdDev':>11}"
        f"{'Max(OPs)':>11}{'Min(OPs)':>11}{'Mean(OPs)':>11}{'StdDev':>11}{'Mean(s)':>11}"
        " Stonewall(s) Stonewall(MiB) Test# #Tasks tPN reps fPP reord reordoff reordrand seed"
        " segcnt   blksiz    xsize aggs(MiB)   API RefNum",
    ]
    for op in ("write", "read"):
        if not any(r.access == op for r in results):
            continue
        s = _summary_stats(opts, tasks, results, op)
        wall_s = "NA" if s["StonewallTime"] is None else f"{s['StonewallTime']:.2f}"
        wall_mib = "NA" if s["StonewallMiB"] is None else f"{s['StonewallMiB']:.2f}"
        lines.append(
            f"{op:<10}{s['bwMaxMIB']:>11.2f}{s['bwMinMIB']:>11.2f}{s['bwMeanMIB']:>11.2f}"
            f"{s['bwStdMIB']:>11.2f}{s['OPsMax']:>11.2f}{s['OPsMin']:>11.2f}"
            f"{s['OPsMean']:>11.2f}{s['OPsSD']:>11.2f}{s['MeanTime']:>11.5f}"
            f"{wall_s:>13} {wall_mib:>14} {0:>5} {tasks:>6} {tasks:>3} {opts.iterations:>4}"
            f" {int(opts.file_per_proc):>3} {int(opts.reorder):>5} {1:>8} {0:>9} {0:>4}"
            f" {opts.segments:>6} {opts.block_size:>8} {opts.transfer_size:>8}"
            f" {s['xsizeMiB']:>9.1f} {API:>5} {0:>6}"
        )
    lines.append(f"Finished            : {_ctime(finished)}")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the workload on MPI.COMM_WORLD; 0 only if every phase succeeded and verified."""
    keep_every_byte()
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        opts = parse_options(args)
    except UsageError as e:
        print(f"benchfs ior: error: {e}", file=sys.stderr, flush=True)
        print("usage: see `python -m benchfs.workloads.ior --help`", file=sys.stderr)
        return EXIT_USAGE
    from mpi4py import MPI  # late, so that --help and option errors need no MPI runtime

    return IorRank(opts, MPI).execute()


class IorRank:
    """One workload run on one rank; every collective is reached by every rank."""

    def __init__(self, opts: Options, mpi: Any) -> None:
        self.opts = opts
        self.MPI = mpi
        self.comm = mpi.COMM_WORLD
        self.rank = self.comm.Get_rank()
        self.size = self.comm.Get_size()
        self.errors: list[dict[str, Any]] = []
        self.client: Client | None = None
        self.results: list[PhaseResult] = []
        self.record: dict[str, Any] = {
            "rank": self.rank,
            "ranks": self.size,
            "host": socket.gethostname(),
            "node": os.environ.get("BENCHFS_NODE_NAME"),
            "pid": os.getpid(),
            "phases": [],
            "error": None,
        }

    def step(self, name: str, action: Callable[[], None]) -> bool:
        """Run `action` on every rank, then agree (allgather) whether all succeeded."""
        error, failures = agreed_step(self.comm, "ior", name, action)
        self.record["error"] = self.record["error"] or error
        self.errors.extend(failures)
        return not self.errors

    def connect(self) -> None:
        self.client = Client(self.opts.registry, config=resolve_config_text(self.opts.config))
        mark_up()

    def geometry(self, data_rank: int) -> dict[str, Any]:
        o = self.opts
        return {
            "segments": o.segments,
            "block_size": o.block_size,
            "transfer_size": o.transfer_size,
            "tasks": self.size,
            "file_per_proc": o.file_per_proc,
            "data_rank": data_rank,
        }

    def phase(
        self, access: str, iteration: int, data_rank: int, verify: bool, max_ops: int | None
    ) -> RankPhase | None:
        """One timed phase: prepare, barrier, open, Rust loop, close; None if any rank failed.

        A write under -D with -O stoneWallingWearOut=1 keeps the file open after the
        stonewall, agrees on the most transfers any rank made, and goes on to that count
        (the fsync after it), as IOR does; the phase spans both."""
        o, rank, wtime = self.opts, self.rank, self.MPI.Wtime
        out = RankPhase()
        writing = access == "write"
        wear_out = writing and o.wear_out and o.stonewall_s > 0
        path = file_name(o, data_rank)
        opened: list[File] = []

        def prepare() -> None:
            # A shared file is created (and truncated) once, before the timed open.
            assert self.client is not None
            if writing and not o.file_per_proc and rank == 0:
                self.client.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC).close()

        def loop(first_op: int, end: int | None, stonewall_s: float, fsync: bool) -> None:
            loop = _core.ior_phase(
                opened[0]._core,
                "write" if writing else "read",
                fsync=fsync,
                verify=verify,
                stonewall_s=stonewall_s,
                max_ops=end,
                first_op=first_op,
                **self.geometry(data_rank),
            )
            out.loop = merge_loops(out.loop, loop) if out.loop else loop
            out.io_end = wtime()

        def close() -> None:
            opened.pop().close()
            out.close_end = wtime()
            self.record["phases"].append({"access": access, "iteration": iteration, **out.loop})
            bad = out.loop.get("first_mismatch")
            if bad:
                raise WorkloadError(
                    f"rank {rank}: {path}: {out.loop['mismatched_words']} words of {access} "
                    f"data do not verify; first: {bad['message']}"
                )

        def run() -> None:
            assert self.client is not None
            if writing:
                flags = os.O_RDWR | os.O_CREAT | (os.O_TRUNC if o.file_per_proc else 0)
            else:
                flags = os.O_RDONLY
            out.open_start = wtime()
            opened.append(self.client.open(path, flags))
            out.open_end = wtime()
            loop(0, max_ops, float(o.stonewall_s), writing and o.fsync and not wear_out)
            if not wear_out:
                close()

        def go_on(target: int) -> None:
            loop(int(out.loop["ops"]), target, 0.0, o.fsync)
            close()

        if not self.step(f"{access} prepare", prepare):
            return None
        wait_for_all(self.comm)
        try:
            ok = self.step(access, run)
            if ok and wear_out:
                target = self.comm.allreduce(int(out.loop["ops"]), op=self.MPI.MAX)
                ok = self.step(f"{access} wear-out", lambda: go_on(target))
        finally:
            for f in opened:  # a failed step left it open; its error is already recorded
                with contextlib.suppress(OSError):
                    f.close()
        return out if ok else None

    def report(self, access: str, iteration: int, out: RankPhase) -> None:
        phases = self.comm.gather(out, root=0)
        if self.rank == 0:
            assert phases is not None
            self.results.append(reduce_phase(access, iteration, phases))

    def remove(self) -> bool:
        o = self.opts

        def run() -> None:
            assert self.client is not None
            if o.file_per_proc or self.rank == 0:
                path = file_name(o, self.rank)
                try:
                    self.client.unlink(path)
                except FileNotFoundError:
                    pass

        wait_for_all(self.comm)
        return self.step("remove", run)

    def iteration(self, it: int) -> bool:
        o, rank, size = self.opts, self.rank, self.size
        written_ops: int | None = None
        if o.write:
            out = self.phase("write", it, rank, verify=False, max_ops=None)
            if out is None:
                return False
            self.report("write", it, out)
            if o.stonewall_s:
                # Readers after a stonewalled write read only what every rank wrote.
                written_ops = self.comm.allreduce(int(out.loop["ops"]), op=self.MPI.MIN)
                if o.stonewall_status_file is not None and rank == 0:
                    write_status_file(o.stonewall_status_file, written_ops)
            if o.check_write:
                # IOR checks a write from two tasks away when reordering (-C).
                peer = (rank + 2) % size if o.reorder else rank
                if self.phase("write-check", it, peer, verify=True, max_ops=written_ops) is None:
                    return False
        if (o.read or o.check_read) and written_ops is None and o.stonewall_status_file:
            written_ops = self.comm.bcast(
                read_status_file(o.stonewall_status_file) if rank == 0 else None, root=0
            )
        if o.read or o.check_read:
            peer = (rank + 1) % size if o.reorder else rank
            out = self.phase("read", it, peer, verify=o.check_read, max_ops=written_ops)
            if out is None:
                return False
            self.report("read", it, out)
        if not o.keep_file:
            return self.remove()
        return True

    def execute(self) -> int:
        o = self.opts
        began = time.time()
        ok = self.step("connect", self.connect)
        for it in range(o.iterations):
            if not ok:
                break
            ok = self.iteration(it)
        if self.client is not None:
            try:
                self.client.close()
            except OSError as e:
                print(f"benchfs ior: rank {self.rank}: close failed: {e}", file=sys.stderr)
        finished = time.time()
        if o.out is not None:
            o.out.mkdir(parents=True, exist_ok=True)
            write_json_atomic(o.out / f"rank-{self.rank}.json", self.record)
        if self.rank == 0:
            self.finish(ok, began, finished)
        return 0 if ok else 1

    def finish(self, ok: bool, began: float, finished: float) -> None:
        """Rank 0: print and write the outputs, and the summary `benchfs-run` reads."""
        from benchfs.parsers import parse_ior_json

        o, tasks = self.opts, self.size
        rows: list[dict[str, Any]] = []
        doc: dict[str, Any] | None = None
        if ok and self.results:
            doc = format_json(o, tasks, self.results, began, finished)
            text = json.dumps(doc, indent=2) + "\n"
            if o.json_stdout:
                sys.stdout.write(text)
            else:
                sys.stdout.write(format_text(o, tasks, self.results, began, finished))
            sys.stdout.flush()
            if o.json_file is not None:
                o.json_file.parent.mkdir(parents=True, exist_ok=True)
                o.json_file.write_text(text)
            if o.summary_file is not None:  # IOR's summaryFile: what stdout got
                o.summary_file.parent.mkdir(parents=True, exist_ok=True)
                o.summary_file.write_text(
                    text if o.json_stdout else format_text(o, tasks, self.results, began, finished)
                )
            rows = [r.to_dict() for r in parse_ior_json(text, "ior workload")]
        elif not ok:
            first = self.errors[0] if self.errors else {"rank": 0, "phase": "?", "message": "?"}
            print(
                f"benchfs ior: FAILED: rank {first['rank']} {first['phase']}: {first['message']}",
                file=sys.stderr,
                flush=True,
            )
        if o.out is None:
            return

        def mean_bw(op: str) -> float | None:
            bws = [r.bw_mib_s for r in self.results if r.access == op]
            return statistics.fmean(bws) if ok and bws else None

        summary = {
            "workload": "ior",
            "command_line": o.command_line,
            "ranks": tasks,
            "file_size": o.segments * o.block_size,
            "transfer_size": o.transfer_size,
            "bytes": sum(r.bytes for r in self.results if r.access == "write"),
            "bytes_read": sum(r.bytes for r in self.results if r.access == "read"),
            "write_mib_s": mean_bw("write"),
            "read_mib_s": mean_bw("read"),
            "verified": ok and (o.check_read or o.check_write),
            "verify_requested": o.check_read or o.check_write,
            "rows": rows,
            "ior": doc,
            "errors": self.errors,
        }
        if ok and o.iterations > 1:
            summary["spread"] = {
                f"{op}_mib_s": spread(r.bw_mib_s for r in self.results if r.access == op)
                for op in ("write", "read")
                if any(r.access == op for r in self.results)
            }
        write_json_atomic(o.out / "summary.json", summary)


if __name__ == "__main__":
    sys.exit(main())

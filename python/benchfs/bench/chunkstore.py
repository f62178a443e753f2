"""The storage cases: the chunk store alone (`_core.bench_storage`) against fio.

Both tools run on the same directory with the same sizes, block size, queue depth and
direct/buffered setting. Each measurement is preceded by a page cache drop; read cases read
datasets written beforehand (untimed), write cases write a fresh file. The schedule interleaves
the repeats (see `benchfs.bench.stats.interleave`) and the summary reports medians.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchfs import _core
from benchfs.bench.stats import interleave, median, ratio
from benchfs.errors import BenchError, errno_name
from benchfs.probes.fio import fio_command, run_fio
from benchfs.probes.system import drop_caches, remove_path
from benchfs.units import KIB, MIB, format_size

__all__ = [
    "CASES",
    "CHUNK_SIZE",
    "Case",
    "CaseResult",
    "CaseSizes",
    "Measurement",
    "StorageBench",
    "check_engine",
    "run_engine",
]

CHUNK_SIZE = 4 * MIB
"""Chunk size of the engine in every storage case."""
PREP_BLOCK = 4 * MIB
PREP_DEPTH = 32
ENGINE_KEYS = ("bytes", "seconds", "mib_s", "ops", "p50_us", "p99_us")


@dataclass(frozen=True)
class Case:
    """One storage case: `pattern` in `block_size` pieces with `queue_depth` in flight."""

    name: str
    pattern: str
    block_size: int
    queue_depth: int

    @property
    def reads(self) -> bool:
        return self.pattern != "seqwrite"


def _case(pattern: str, block: str, depth: int) -> Case:
    size = {"4k": 4 * KIB, "1m": MIB, "4m": 4 * MIB}[block]
    return Case(f"{pattern}-{block}-qd{depth}", pattern, size, depth)


CASES: tuple[Case, ...] = (
    *(_case("seqwrite", b, d) for b in ("1m", "4m") for d in (1, 32)),
    *(_case("seqread", b, d) for b in ("1m", "4m") for d in (1, 32)),
    *(_case("randread", "4k", d) for d in (1, 32)),
)
"""The cases of issue 3, by their exact names, in the order they run."""


@dataclass(frozen=True)
class CaseSizes:
    """Bytes each sequential case moves, and bytes each random-read case reads."""

    seq: int
    rand: int

    def for_case(self, case: Case) -> int:
        return self.rand if case.pattern == "randread" else self.seq

    def datasets(self) -> list[int]:
        """CaseSizes of the read datasets: one for the sequential reads, one for the random ones."""
        return sorted({self.seq, self.rand})

    def disk_need(self) -> int:
        """Peak bytes on disk: both tools' write files plus both tools' read datasets."""
        return 2 * self.seq + 2 * sum(self.datasets())

    def halved(self, floor: int) -> CaseSizes:
        """Both sizes halved (rounded down to whole chunks), none below `floor`."""

        def half(v: int) -> int:
            return max(floor, v // 2 // CHUNK_SIZE * CHUNK_SIZE)

        return CaseSizes(half(self.seq), half(self.rand))

    def describe(self) -> str:
        return f"{format_size(self.seq)} per sequential case, {format_size(self.rand)} per random"


def check_size(value: int, what: str) -> None:
    """CaseSizes must be whole chunks: every block size divides them and datasets end on a chunk."""
    if value < CHUNK_SIZE or value % CHUNK_SIZE:
        raise BenchError(
            "EINVAL", f"{what} must be a positive multiple of 4 MiB (got {format_size(value)})"
        )


@dataclass(frozen=True)
class Measurement:
    """One tool's figures for one run of one case."""

    mib_s: float
    p50_us: float
    p99_us: float
    bytes: int
    seconds: float
    ops: int
    extra: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "mib_s": self.mib_s,
            "p50_us": self.p50_us,
            "p99_us": self.p99_us,
            "bytes": self.bytes,
            "seconds": self.seconds,
            "ops": self.ops,
            **self.extra,
        }


def check_engine() -> Callable[..., dict[str, Any]]:
    """The engine-alone driver, or BenchError if this build of the native module lacks it."""
    driver = getattr(_core, "bench_storage", None)
    if driver is None:
        raise BenchError(
            "ENOSYS",
            f"benchfs._core ({_core.__file__}) has no bench_storage, the engine-alone driver: "
            "rebuild it with `make build`",
        )
    return driver


def parse_engine_result(result: Any) -> Measurement:
    """Validate the driver's dict and turn it into a Measurement (BenchError if malformed)."""
    if not isinstance(result, dict):
        raise BenchError("EIO", f"bench_storage returned {type(result).__name__}, not a dict")
    values: dict[str, float] = {}
    for key, value in result.items():
        if isinstance(value, int | float) and not isinstance(value, bool):
            values[key] = float(value)
    missing = [k for k in ENGINE_KEYS if k not in values or not math.isfinite(values[k])]
    if missing:
        raise BenchError("EIO", f"bench_storage result lacks {', '.join(missing)}: {result!r}")
    extra = {k: v for k, v in values.items() if k not in ENGINE_KEYS}
    return Measurement(
        mib_s=values["mib_s"],
        p50_us=values["p50_us"],
        p99_us=values["p99_us"],
        bytes=int(values["bytes"]),
        seconds=values["seconds"],
        ops=int(values["ops"]),
        extra=extra,
    )


def run_engine(
    data_dir: Path,
    pattern: str,
    block_size: int,
    queue_depth: int,
    total_bytes: int,
    direct: bool,
    layout: str,
) -> Measurement:
    """One run of the chunk store alone (no network) in `data_dir`."""
    driver = check_engine()
    what = f"bench_storage {pattern} bs={block_size} qd={queue_depth} in {data_dir}"
    try:
        result = driver(
            str(data_dir),
            pattern,
            block_size,
            queue_depth,
            total_bytes,
            CHUNK_SIZE,
            direct,
            direct,
            layout,
        )
    except OSError as e:
        raise BenchError(errno_name(e), f"{what}: {e}") from e
    except ValueError as e:
        raise BenchError("EINVAL", f"{what}: {e}") from e
    return parse_engine_result(result)


@dataclass
class CaseResult:
    """Every repeat of one case, for both tools, and their medians."""

    case: Case
    size: int
    runs: dict[str, list[Measurement]] = field(default_factory=lambda: {"benchfs": [], "fio": []})

    def summary(self) -> dict[str, Any]:
        ours, theirs = self.runs["benchfs"], self.runs["fio"]
        ours_mib = median(m.mib_s for m in ours)
        fio_mib = median(m.mib_s for m in theirs)
        summary: dict[str, Any] = {
            "name": self.case.name,
            "benchfs_mib_s": ours_mib,
            "fio_mib_s": fio_mib,
            "ratio": ratio(ours_mib, fio_mib),
            "p50_us": median(m.p50_us for m in ours),
            "fio_p50_us": median(m.p50_us for m in theirs),
            "p99_us": median(m.p99_us for m in ours),
            "fio_p99_us": median(m.p99_us for m in theirs),
            "pattern": self.case.pattern,
            "block_size": self.case.block_size,
            "queue_depth": self.case.queue_depth,
            "bytes": self.size,
        }
        for key in ("mean_inflight", "share_depth1"):
            values = [m.extra[key] for m in ours if key in m.extra]
            if values:
                summary[f"benchfs_{key}"] = median(values)
        summary["raw"] = {tool: [m.to_json() for m in runs] for tool, runs in self.runs.items()}
        return summary


@dataclass
class StorageBench:
    """The storage cases in one scratch directory (created by the caller, emptied here)."""

    workdir: Path
    sizes: CaseSizes
    repeats: int
    direct: bool
    layout: str = "chunkfile"
    fio: str = "fio"
    cases: Sequence[Case] = CASES
    progress: Callable[[str], None] = lambda message: None
    cache_dropped: bool = True
    fio_version: str | None = None

    def _engine_dir(self, name: str) -> Path:
        return self.workdir / "engine" / name

    def _fio_file(self, name: str) -> Path:
        return self.workdir / "fio" / f"{name}.dat"

    @staticmethod
    def _dataset(size: int) -> str:
        return f"read-{format_size(size)}"

    def prepare(self) -> None:
        """Write the read datasets of both tools (untimed): the engine's with its own seqwrite."""
        (self.workdir / "engine").mkdir(parents=True, exist_ok=True)
        (self.workdir / "fio").mkdir(parents=True, exist_ok=True)
        for size in self.sizes.datasets():
            name = self._dataset(size)
            self.progress(f"writing the {format_size(size)} read datasets (untimed)")
            data_dir = self._engine_dir(name)
            data_dir.mkdir(parents=True, exist_ok=True)
            run_engine(data_dir, "seqwrite", PREP_BLOCK, PREP_DEPTH, size, self.direct, self.layout)
            argv = fio_command(
                self.fio,
                str(self._fio_file(name)),
                "seqwrite",
                PREP_BLOCK,
                PREP_DEPTH,
                size,
                self.direct,
                name="prepare",
            )
            run_fio(argv, "write")

    def measure(self, case: Case, tool: str) -> Measurement:
        """One measurement: fresh target for a write, dropped page cache, then the tool."""
        size = self.sizes.for_case(case)
        if case.reads:
            name = self._dataset(size)
        else:
            name = "write"
            target = self._engine_dir(name) if tool == "benchfs" else self._fio_file(name)
            remove_path(target)
        self.cache_dropped = drop_caches() and self.cache_dropped
        if tool == "benchfs":
            data_dir = self._engine_dir(name)
            data_dir.mkdir(parents=True, exist_ok=True)
            return run_engine(
                data_dir,
                case.pattern,
                case.block_size,
                case.queue_depth,
                size,
                self.direct,
                self.layout,
            )
        argv = fio_command(
            self.fio,
            str(self._fio_file(name)),
            case.pattern,
            case.block_size,
            case.queue_depth,
            size,
            self.direct,
            name=case.name,
        )
        result = run_fio(argv, "read" if case.reads else "write")
        self.fio_version = result.version or self.fio_version
        return Measurement(
            result.mib_s, result.p50_us, result.p99_us, result.bytes, result.seconds, result.ops
        )

    def run(self) -> list[CaseResult]:
        """Prepare, then every case R times, interleaved; results in case order."""
        results = {c.name: CaseResult(c, self.sizes.for_case(c)) for c in self.cases}
        if any(c.reads for c in self.cases):
            self.prepare()
        for step in interleave(list(self.cases), self.repeats):
            self.progress(
                f"repeat {step.repeat + 1}/{self.repeats}: {step.case.name} with {step.tool}"
            )
            m = self.measure(step.case, step.tool)
            results[step.case.name].runs[step.tool].append(m)
        for name in ("write",):
            remove_path(self._engine_dir(name))
            remove_path(self._fio_file(name))
        return list(results.values())

"""The placement study: how evenly each scheme spreads the chunks of IOR-like workloads.

Placement itself is the Rust code the servers and clients run (`benchfs._core.PlacementStudy`:
files are "created" in the workload's order, so each metadata owner hands out layouts from its
own counter, exactly as a running cluster does); this module only builds each workload's chunk
lists as numpy arrays, one batched call per synchronised step, and counts. See
docs/namespace.md for the schemes and studies/placement/ for the table.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from benchfs._core import PlacementStudy

__all__ = [
    "DEFAULT_SCHEME",
    "SCALES",
    "WORKLOADS",
    "Row",
    "Workload",
    "rows",
    "study_row",
]

DEFAULT_SCHEME = "layout"
"""The scheme BenchFS uses (stored layouts)."""

CLIENTS_PER_SERVER = 46
"""A large machine's ratio: 736 clients on 16 servers."""

SCALES = (16, 64, 256, 1024, 4096)

MDTEST_FILES = 100_000

COPIES = (2, 3)
"""The copy counts (`layout.replicas`) the default scheme is studied with besides one."""

SERVERS_PER_DOMAIN = 4
"""Servers per failure domain in the copies' rows (a node of four servers)."""

RENDEZVOUS_BUDGET = 3_000_000_000
"""Rendezvous hashing costs one hash per server per chunk: rows beyond this many hashes are
left out (reported as skipped) rather than taking hours."""


@dataclass(frozen=True)
class Step:
    """The chunks written at one synchronised step: file numbers and chunk indices."""

    files: np.ndarray
    chunks: np.ndarray


@dataclass(frozen=True)
class Workload:
    """A workload: its files' names (in creation order) and its synchronised steps."""

    name: str
    paths: Callable[[int, bool], list[str]]
    """(servers, random names) -> paths in creation order."""
    steps: Callable[[int], tuple[int, Callable[[int], Step]]]
    """servers -> (number of steps, step k -> chunks)."""


def _names(prefix: str, count: int, random_names: bool, seed: int) -> list[str]:
    if not random_names:
        return [f"{prefix}{i}" for i in range(count)]
    rng = np.random.default_rng(seed)
    words = rng.integers(0, 2**63, size=count, dtype=np.int64)
    return [f"{prefix}{w:016x}" for w in words]


def _clients(servers: int) -> int:
    return servers * CLIENTS_PER_SERVER


def _fpp(chunks_per_file: int) -> Workload:
    """File per process `/scr/testfile/N`, 2 MiB transfers over 1 MiB chunks."""

    def paths(servers: int, random_names: bool) -> list[str]:
        return _names("/scr/testfile/", _clients(servers), random_names, servers)

    def steps(servers: int) -> tuple[int, Callable[[int], Step]]:
        clients = _clients(servers)
        files = np.repeat(np.arange(clients, dtype=np.uint64), 2)
        pair = np.tile(np.arange(2, dtype=np.uint64), clients)
        return chunks_per_file // 2, lambda k: Step(files, pair + np.uint64(2 * k))

    return Workload(f"fpp-{chunks_per_file}chunks", paths, steps)


def _shared(block_chunks: int) -> Workload:
    """One shared file, per-rank blocks of `block_chunks` chunks, 2-chunk transfers (or one
    chunk when the block is one chunk)."""
    per_step = min(2, block_chunks)

    def paths(servers: int, random_names: bool) -> list[str]:
        return _names("/scr/shared.", 1, random_names, servers)

    def steps(servers: int) -> tuple[int, Callable[[int], Step]]:
        ranks = np.arange(_clients(servers), dtype=np.uint64)
        base = np.repeat(ranks * np.uint64(block_chunks), per_step)
        offset = np.tile(np.arange(per_step, dtype=np.uint64), len(ranks))
        files = np.zeros(len(base), dtype=np.uint64)
        return block_chunks // per_step, lambda k: Step(
            files, base + offset + np.uint64(per_step * k)
        )

    return Workload(f"shared-{block_chunks}chunk{'s' if block_chunks > 1 else ''}", paths, steps)


def _mdtest() -> Workload:
    """100k one-chunk files, mdtest-hard style: client r creates its i-th file at step i."""

    def paths(servers: int, random_names: bool) -> list[str]:
        clients = _clients(servers)
        if random_names:
            return _names("/mdtest/", MDTEST_FILES, True, servers)
        return [f"/mdtest/file.mdtest.{n % clients}.{n // clients}" for n in range(MDTEST_FILES)]

    def steps(servers: int) -> tuple[int, Callable[[int], Step]]:
        clients = _clients(servers)
        count = math.ceil(MDTEST_FILES / clients)

        def step(k: int) -> Step:
            files = np.arange(k * clients, min((k + 1) * clients, MDTEST_FILES), dtype=np.uint64)
            return Step(files, np.zeros(len(files), dtype=np.uint64))

        return count, step

    return Workload("mdtest-100k", paths, steps)


WORKLOADS = (
    _fpp(2),
    _fpp(4096),
    _shared(16),
    _shared(1),
    _mdtest(),
)


@dataclass
class Row:
    """One line of the study (the shape `benchfs-bench placement --json` prints)."""

    scheme: str
    default: bool
    workload: str
    names: str
    servers: int
    max_over_mean: float | None
    step_max_over_mean: float | None
    cv: float | None
    moved_fraction: float | None
    steps_sampled: int = 0
    steps_total: int = 0
    skipped: str | None = None
    replicas: int = 1
    """Copies of each chunk counted (on servers of distinct domains of SERVERS_PER_DOMAIN)."""

    def as_dict(self) -> dict[str, object]:
        return dataclasses.asdict(self)


def _sample(total: int, limit: int) -> list[int]:
    if total <= limit:
        return list(range(total))
    return sorted({round(i * (total - 1) / (limit - 1)) for i in range(limit)})


def _max_over_mean(counts: np.ndarray) -> float:
    mean = counts.mean()
    return float(counts.max() / mean) if mean > 0 else math.nan


def study_row(
    scheme: str,
    workload: Workload,
    servers: int,
    random_names: bool,
    max_steps: int,
    replicas: int = 1,
) -> Row:
    """Places every chunk of (up to `max_steps` evenly spaced) steps and counts per server;
    with `replicas` > 1 (stored layouts only) every copy counts, and no move is measured."""
    total_steps, step = workload.steps(servers)
    sampled = _sample(total_steps, max_steps)
    names = "random" if random_names else "sequential"
    row = Row(
        scheme,
        scheme == DEFAULT_SCHEME,
        workload.name,
        names,
        servers,
        None,
        None,
        None,
        None,
        len(sampled),
        total_steps,
        replicas=replicas,
    )
    lookups = sum(len(step(k).files) for k in sampled[:1]) * len(sampled)
    if scheme == "rendezvous" and lookups * servers > RENDEZVOUS_BUDGET:
        row.skipped = (
            f"rendezvous needs {lookups * servers:.2e} hashes (budget {RENDEZVOUS_BUDGET:.0e})"
        )
        return row
    study = PlacementStudy(scheme, servers, workload.paths(servers, random_names))
    if replicas > 1:
        return _copies_row(row, study, step, sampled)
    grown = study.with_servers(servers + 1)
    overall = np.zeros(servers, dtype=np.int64)
    worst_step = 0.0
    moved = placed = 0
    for k in sampled:
        s = step(k)
        out = np.empty(len(s.files), dtype=np.uint32)
        study.servers_into(s.files, s.chunks, out)
        counts = np.bincount(out, minlength=servers)
        overall += counts
        worst_step = max(worst_step, _max_over_mean(counts))
        after = np.empty_like(out)
        grown.servers_into(s.files, s.chunks, after)
        moved += int(np.count_nonzero(after != out))
        placed += len(out)
    row.max_over_mean = _max_over_mean(overall)
    row.step_max_over_mean = worst_step
    row.cv = float(overall.std() / overall.mean()) if overall.mean() > 0 else math.nan
    row.moved_fraction = moved / placed if placed else 0.0
    return row


def _copies_row(
    row: Row, study: PlacementStudy, step: Callable[[int], Step], sampled: list[int]
) -> Row:
    """`row` filled with the load of every copy, domains of SERVERS_PER_DOMAIN servers."""
    servers, replicas = row.servers, row.replicas
    domains = [f"node{i // SERVERS_PER_DOMAIN}" for i in range(servers)]
    overall = np.zeros(servers, dtype=np.int64)
    worst_step = 0.0
    for k in sampled:
        s = step(k)
        out = np.empty(len(s.files) * replicas, dtype=np.uint32)
        study.copies_into(s.files, s.chunks, replicas, domains, out)
        counts = np.bincount(out, minlength=servers)
        overall += counts
        worst_step = max(worst_step, _max_over_mean(counts))
    row.max_over_mean = _max_over_mean(overall)
    row.step_max_over_mean = worst_step
    row.cv = float(overall.std() / overall.mean()) if overall.mean() > 0 else math.nan
    return row


def rows(
    scales: tuple[int, ...] = SCALES,
    schemes: list[str] | None = None,
    max_steps: int = 32,
    on_row: Callable[[Row], None] | None = None,
) -> Iterator[Row]:
    """Every (scheme, workload, names, servers) row, default scheme first."""
    for servers in scales:
        for workload in WORKLOADS:
            for random_names in (False, True):
                for scheme in schemes or PlacementStudy.schemes():
                    row = study_row(scheme, workload, servers, random_names, max_steps)
                    if on_row is not None:
                        on_row(row)
                    yield row
                if schemes is not None and DEFAULT_SCHEME not in schemes:
                    continue
                for replicas in COPIES:
                    row = study_row(
                        DEFAULT_SCHEME, workload, servers, random_names, max_steps, replicas
                    )
                    if on_row is not None:
                        on_row(row)
                    yield row

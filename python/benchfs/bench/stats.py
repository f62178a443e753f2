"""Small statistics for the benchmarks: medians, the interleaved schedule, histogram quantiles."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

__all__ = [
    "TOOLS",
    "Bucket",
    "Step",
    "histogram_mean",
    "histogram_share",
    "interleave",
    "median",
    "ratio",
]

T = TypeVar("T")

TOOLS = ("benchfs", "fio")
"""The two tools every storage case runs, in the order of even-numbered repeats."""


@dataclass(frozen=True)
class Step(Generic[T]):
    """One measurement of the schedule: `tool` runs `case` in repeat `repeat` (from 0)."""

    repeat: int
    case: T
    tool: str


def interleave(cases: Sequence[T], repeats: int, tools: Sequence[str] = TOOLS) -> list[Step[T]]:
    """The measurement order: for each repeat, each case, every tool back to back.

    The tools run in `tools` order in even repeats and reversed in odd ones, so that neither
    always runs first (on a warmer or cooler device) and drifts hit both alike.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1 (got {repeats})")
    steps: list[Step[T]] = []
    for repeat in range(repeats):
        order = tools if repeat % 2 == 0 else tuple(reversed(tools))
        for case in cases:
            steps.extend(Step(repeat, case, tool) for tool in order)
    return steps


def median(values: Iterable[float]) -> float:
    """The median; ValueError names the problem when there is nothing to take it of."""
    data = [float(v) for v in values]
    if not data:
        raise ValueError("median of no values")
    return float(statistics.median(data))


def ratio(numerator: float, denominator: float) -> float | None:
    """numerator / denominator, or None when the denominator is not a positive number."""
    if not denominator > 0 or not math.isfinite(denominator):
        return None
    return numerator / denominator


@dataclass(frozen=True)
class Bucket:
    """Histogram bucket holding `count` values in [lo, hi] (lo == hi for an exact value)."""

    lo: float
    hi: float
    count: float


def _sorted_nonempty(buckets: Iterable[Bucket]) -> list[Bucket]:
    kept = sorted((b for b in buckets if b.count > 0), key=lambda b: (b.lo, b.hi))
    if not kept:
        raise ValueError("empty histogram")
    return kept


def histogram_mean(buckets: Iterable[Bucket]) -> float:
    """Mean of a histogram, each bucket counted at its midpoint."""
    kept = _sorted_nonempty(buckets)
    total = sum(b.count for b in kept)
    return sum(b.count * (b.lo + b.hi) / 2 for b in kept) / total


def histogram_share(buckets: Iterable[Bucket], lo: float, hi: float) -> float:
    """Share of the values in buckets lying entirely within [lo, hi]."""
    kept = _sorted_nonempty(buckets)
    total = sum(b.count for b in kept)
    return sum(b.count for b in kept if b.lo >= lo and b.hi <= hi) / total

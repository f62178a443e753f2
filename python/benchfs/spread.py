"""The spread of a figure measured more than once (iterations of a run, repetitions of a sweep
point): mean, sample standard deviation, minimum, maximum and count, one shape everywhere
(run summaries, the manifest, sweep indexes)."""

from __future__ import annotations

import statistics
from collections.abc import Iterable

__all__ = ["spread"]


def spread(values: Iterable[float | None]) -> dict[str, float | int | None] | None:
    """{"mean", "std" (None of one value), "min", "max", "n"} of the values that are not None;
    None when there are none."""
    xs = [float(v) for v in values if v is not None]
    if not xs:
        return None
    return {
        "mean": statistics.fmean(xs),
        "std": statistics.stdev(xs) if len(xs) > 1 else None,
        "min": min(xs),
        "max": max(xs),
        "n": len(xs),
    }

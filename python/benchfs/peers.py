"""Peer comparison: which of several nodes (or pairs) is worse than the others on one metric.

One rule for every judgment of nodes, the screen's and a run's (docs/diagnose.md). Per metric,
across nodes, one-sided: a node is an outlier when it is worse than the others both
statistically and materially:

- badness b = log(x) for higher-is-worse metrics (latency), -log(x) for lower-is-worse ones
  (bandwidth), so a ratio to the median becomes a difference;
- modified z-score M = 0.6745 (b - median b) / MAD, with MAD = median |b - median b| (times a
  small-sample correction for n < 10) but never less than log(1 + min_spread) (equal nodes,
  MAD = 0, flag no noise);
- flagged when M > z_threshold AND the node is at least min_worse worse than the median AND
  (for device latency) above an absolute floor;
- two nodes: the worse one is flagged when it is two_node_ratio times worse than the other;
- when up to half the nodes are slow the median may sit among them: if the MAD test flags
  nothing, the sorted values are split at their widest gap, and a worse group of at most half
  the nodes, group_ratio times worse than the better group, is flagged against that group.

The thresholds are the `[diagnose]` section of the configuration (`th.z_threshold`, ...; keys
and defaults: rust/benchfs-tools/src/config.rs, docs/config.md).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from dataclasses import dataclass

from benchfs.config import Section

__all__ = ["MetricSpec", "Outlier", "Thresholds", "common_scale", "outliers"]

EPSILON = 1e-9
MAD_TO_SIGMA = 0.6745
SMALL_SAMPLE_MAD = {3: 1.495, 4: 1.363, 5: 1.206, 6: 1.200, 7: 1.140, 8: 1.129, 9: 1.107}
"""Croux & Rousseeuw's (1992) small-sample correction of the MAD (n > 9: n / (n - 0.8)): the
MAD of a few values underestimates their spread (of 3, it is the distance to the nearer one)."""


#: The `[diagnose]` section of the configuration.
Thresholds = Section


@dataclass(frozen=True)
class MetricSpec:
    """How a metric is judged: which direction is worse, its unit, an absolute floor."""

    name: str
    label: str
    unit: str
    higher_is_worse: bool
    floor: float = 0.0
    """Values on the good side of this (below it, for higher-is-worse) are never flagged."""

    def fmt(self, value: float) -> str:
        return f"{value:.3g} {self.unit}"


@dataclass(frozen=True)
class Outlier:
    """One node (or pair) worse than its peers on one metric."""

    key: str
    spec: MetricSpec
    value: float
    reference: float
    worse: float
    """How many times worse than the reference (>= 1)."""
    z: float | None
    rule: str

    def severity(self, th: Thresholds) -> float:
        """On the common scale of every flag (`common_scale`): the robust z when the MAD rule
        found it."""
        return self.z if self.z is not None else common_scale(self.worse, th)

    def evidence(self) -> str:
        how = {
            "mad": f"M={self.z:.1f}" if self.z is not None else "MAD",
            "two-node": "two nodes: against the other",
            "group": "a slow group: against the better group's median",
        }[self.rule]
        ref = "median" if self.rule == "mad" else "reference"
        return (
            f"{self.spec.label} {self.spec.fmt(self.value)} vs {ref} "
            f"{self.spec.fmt(self.reference)} ({self.worse:.1f}x worse; {how})"
        )


def common_scale(worse: float, th: Thresholds) -> float:
    """How far out `worse` (times worse than the reference) is, as a robust z against the
    smallest spread the judgment assumes: one scale for every metric, so flags of different
    metrics (a bandwidth ratio, a latency ratio) rank against each other."""
    return MAD_TO_SIGMA * math.log(max(worse, 1.0)) / math.log1p(th.min_spread)


def _badness(x: float, spec: MetricSpec) -> float:
    v = math.log(max(x, EPSILON))
    return v if spec.higher_is_worse else -v


def _value(b: float, spec: MetricSpec) -> float:
    return math.exp(b if spec.higher_is_worse else -b)


def _floor_ok(x: float, spec: MetricSpec) -> bool:
    return x >= spec.floor if spec.higher_is_worse else True


def outliers(values: Mapping[str, float | None], spec: MetricSpec, th: Thresholds) -> list[Outlier]:
    """The keys (nodes or pairs) whose value of `spec` is an outlier on the worse side."""
    data = {k: float(v) for k, v in values.items() if v is not None and math.isfinite(v)}
    n = len(data)
    if n < 2:
        return []
    bad = {k: _badness(v, spec) for k, v in data.items()}
    floor = math.log1p(th.min_worse)
    if n == 2:
        (k1, b1), (k2, b2) = sorted(bad.items(), key=lambda kv: kv[1])
        worse = math.exp(b2 - b1)
        if worse >= th.two_node_ratio and b2 - b1 >= floor and _floor_ok(data[k2], spec):
            return [Outlier(k2, spec, data[k2], data[k1], worse, None, "two-node")]
        return []
    med = statistics.median(bad.values())
    mad = statistics.median(abs(b - med) for b in bad.values())
    mad *= SMALL_SAMPLE_MAD.get(n, n / (n - 0.8))
    scale = max(mad, math.log1p(th.min_spread))
    found = []
    for k, b in bad.items():
        z = MAD_TO_SIGMA * (b - med) / scale
        if z > th.z_threshold and b - med >= floor and _floor_ok(data[k], spec):
            found.append(Outlier(k, spec, data[k], _value(med, spec), math.exp(b - med), z, "mad"))
    if found:
        return sorted(found, key=lambda o: -o.worse)
    # Up to half the nodes slow: split at the widest gap of the sorted badness.
    ordered = sorted(bad.items(), key=lambda kv: kv[1])
    gaps = [ordered[i + 1][1] - ordered[i][1] for i in range(n - 1)]
    cut = max(range(n - 1), key=lambda i: gaps[i]) + 1
    better, worse_group = ordered[:cut], ordered[cut:]
    if len(worse_group) > n / 2:
        return []
    ref = statistics.median(b for _, b in better)
    if math.exp(statistics.median(b for _, b in worse_group) - ref) < th.group_ratio:
        return []
    return [
        Outlier(k, spec, data[k], _value(ref, spec), math.exp(b - ref), None, "group")
        for k, b in reversed(worse_group)
        if b - ref >= floor and _floor_ok(data[k], spec)
    ]

"""Judgment of a screen: which nodes are slow, of which kind, on what evidence, and which to
exclude. Each metric is compared across nodes by the peer rule (`benchfs.peers`); a node's
flags are then weighed (`grounds`) and the worst are excluded, at most a share of the nodes."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from benchfs.peers import Thresholds

__all__ = [
    "KIND_ABOVE",
    "KIND_DEVICE",
    "KIND_NETWORK",
    "Flag",
    "Thresholds",
    "Verdict",
    "decide",
    "grounds",
]

KIND_DEVICE = "slow device"
KIND_ABOVE = "slow above the device"
KIND_UNCLEAR = "slow (cause unclear)"
KIND_NETWORK = "slow network"
KIND_MD = "md resync"
KIND_HEALTH = "device health"
KIND_PROBE = "probe failed"
KIND_FULL = "scratch full"
STATE_GROUNDS = "a state wrong in itself"


@dataclass
class Flag:
    """One reason to distrust a node: what, which kind of slowness, the evidence, and whether
    it counts toward excluding the node.

    `severity` is on the common scale (`peers.common_scale`; infinite for a state that is wrong in
    itself: md resync, a health warning); `worse` is how many times worse than the peers;
    `family` is the kind of evidence (flags of one family are one piece of evidence: the
    device's service time from two rules is still one)."""

    name: str
    kind: str
    evidence: str
    severity: float = 1.0
    excludable: bool = True
    worse: float = 1.0
    family: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "flag": self.name,
            "kind": self.kind,
            "evidence": self.evidence,
            "severity": round(self.severity, 3) if math.isfinite(self.severity) else None,
            "worse": round(self.worse, 3) if math.isfinite(self.worse) else None,
            "family": self.family or self.name,
            "excludable": self.excludable,
        }


def grounds(fs: Sequence[Flag], th: Thresholds) -> str | None:
    """Why these flags exclude a node, or None when they do not: a state wrong in itself, two
    independent kinds of evidence that agree, or one overwhelming (overwhelming_ratio)."""
    counted = [f for f in fs if f.excludable]
    if any(math.isinf(f.severity) for f in counted):
        return STATE_GROUNDS
    families = sorted({f.family or f.name for f in counted})
    if len(families) >= 2:
        return f"{len(families)} kinds of evidence agree ({', '.join(families)})"
    strong = [f for f in counted if f.worse >= th.overwhelming_ratio]
    if strong:
        return f"one overwhelming ({strong[0].worse:.1f}x >= {th.overwhelming_ratio:g}x)"
    return None


@dataclass
class Verdict:
    status: str  # "ok", "flagged", "excluded"
    kind: str | None = None
    reasons: list[str] = field(default_factory=list)
    confidence: str | None = None
    """How sure the verdict is (`CONFIDENCE`); None for ok."""
    severity: float | None = None
    """The worst flag's severity on the common scale (infinite: a state wrong in itself)."""

    def to_json(self) -> dict[str, Any]:
        sev = self.severity
        return {
            "status": self.status,
            "kind": self.kind,
            "reasons": self.reasons,
            "confidence": self.confidence,
            "severity": round(sev, 3) if sev is not None and math.isfinite(sev) else None,
        }


CONFIDENCE = {
    "certain": "excluded for a state wrong in itself (md resync, a health warning, full)",
    "high": "excluded on agreeing or overwhelming evidence that a second probe repeated",
    "medium": "excluded on agreeing or overwhelming evidence not probed twice (no time left)",
    "low": "flagged: it stood out, but that is no grounds to exclude it",
}
"""The confidence labels of a verdict, and what each means."""


def kind_of(flags: Sequence[Flag]) -> str | None:
    """The node's kind of slowness: the most specific one among its flags that count (among
    all its flags when none counts)."""
    order = (KIND_HEALTH, KIND_MD, KIND_DEVICE, KIND_ABOVE, KIND_NETWORK, KIND_FULL, KIND_PROBE)
    kinds = {f.kind for f in flags if f.excludable} or {f.kind for f in flags}
    for kind in order:
        if kind in kinds:
            return kind
    return next(iter(kinds), None)


def exclusion_cap(n: int, th: Thresholds) -> int:
    """How many of `n` nodes a screen may exclude: max_exclude_share of them, but at least one
    when there are two or more nodes and the share is not zero."""
    if n < 2 or th.max_exclude_share <= 0:
        return 0
    return max(1, math.floor(th.max_exclude_share * n + 1e-9))


def decide(
    flags: Mapping[str, Sequence[Flag]], th: Thresholds, confirmed: bool = False
) -> tuple[dict[str, Verdict], list[str]]:
    """Verdicts per node and the excluded nodes (worst first, at most the cap); `confirmed`:
    the measured flags are those a second probe repeated."""
    n = len(flags)
    cap = exclusion_cap(n, th)
    why = {k: grounds(fs, th) for k, fs in flags.items()}
    candidates = sorted(
        (k for k in flags if why[k] is not None),
        key=lambda k: -max(f.severity for f in flags[k] if f.excludable),
    )
    excluded = candidates[:cap]
    verdicts: dict[str, Verdict] = {}
    for key, fs in flags.items():
        reasons = [f"{f.kind}: {f.evidence}" for f in fs]
        severity = max((f.severity for f in fs), default=None)
        if not fs:
            verdicts[key] = Verdict("ok")
        elif key in excluded:
            sure = "certain" if why[key] == STATE_GROUNDS else "high" if confirmed else "medium"
            verdicts[key] = Verdict(
                "excluded", kind_of(fs), [*reasons, f"excluded: {why[key]}"], sure, severity
            )
        else:
            kept = (
                f"kept: the cap of {cap} excluded node(s) ({th.max_exclude_share:g} of {n}) "
                "was reached"
                if key in candidates
                else "kept: one kind of evidence, not overwhelming"
                if any(f.excludable for f in fs)
                else "kept: nothing here is grounds to exclude"
            )
            verdicts[key] = Verdict("flagged", kind_of(fs), [*reasons, kept], "low", severity)
    return verdicts, excluded

"""Latency distributions judged across devices: a device whose block I/O latency has a second,
slow mode that its peers lack. One method, used by `benchfs-diagnose screen` (a flag that can
exclude the node, `benchfs.diagnose.modes`) and by `benchfs-analyze` (insight BFS-011), under
the `[diagnose]` thresholds (docs/diagnose.md, "Latency modes"):

- each device's histogram (`benchfs.probes.blocklat`, log2 buckets of microseconds) with at
  least `min_ops` I/Os is searched for a slow mode (`blocklat.slow_mode`): at least
  `mode_gap` times slower than its main mode and at least `r_await_floor_ms`, past a valley;
- its peers are the other devices of its group, each counted once (nodes of one host may
  share a device: it is no peer of itself); the reference is the median of the peers' shares
  of I/Os in the same range;
- the device is odd when its mode holds at least `mode_min_share` of its I/Os more than that
  reference; `worse` is its share over the reference (at least half of `mode_min_share`).

A device with 10% of its reads at 20 ms and the rest at 0.1 ms has a mean near 2 ms, which an
average-based rule lets pass; the histogram shows the two populations at once.
"""

from __future__ import annotations

import statistics
from collections.abc import Hashable, Mapping
from dataclasses import dataclass

from benchfs.peers import Thresholds
from benchfs.probes import blocklat

__all__ = ["ModeFinding", "find_modes"]


@dataclass(frozen=True)
class ModeFinding:
    """A slow mode found on one device, and how its peers compare there."""

    key: Hashable
    """The device as the caller names it: (host, device), or with the probe window."""
    mode: blocklat.Mode
    peer_share: float | None
    """The peers' median share in the mode's range (None: no peer to compare with)."""
    worse: float | None
    odd: bool
    """The peers lack the mode: the device is flagged."""


def find_modes(
    hists: Mapping[Hashable, blocklat.Histogram],
    groups: Mapping[Hashable, Hashable],
    th: Thresholds,
) -> list[ModeFinding]:
    """The slow modes of `hists` (one histogram per device), each against the other devices of
    its group (`groups[key]`; keys without a group form one group)."""
    judged = {k: h for k, h in hists.items() if h.total >= th.min_ops}
    out = []
    for key, h in judged.items():
        mode = blocklat.slow_mode(h, th.mode_gap, round(th.r_await_floor_ms * 1000))
        if mode is None:
            continue
        peers = [
            other.share_from(mode.lo_us)
            for k, other in judged.items()
            if k != key and groups.get(k) == groups.get(key)
        ]
        if not peers:
            out.append(ModeFinding(key, mode, None, None, False))
            continue
        reference = statistics.median(peers)
        worse = mode.share / max(reference, th.mode_min_share / 2)
        odd = mode.share >= reference + th.mode_min_share
        out.append(ModeFinding(key, mode, reference, worse, odd))
    return out

"""The screen's judgment from latency distributions: per probe window (the 4 KiB reads at one
in flight first, then the many-files reads), each device's read histogram from the kernel
(`benchfs.probes.blocklat`) is judged against its peers' (`benchfs.latencymodes`); a device
whose slow mode its peers lack flags its node: one flag per node, of its own family (the
distribution is evidence the averages lack), excluding alone when overwhelming
(`overwhelming_ratio`), with the screen's confirmation by a second probe.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from benchfs import latencymodes
from benchfs.diagnose.judge import KIND_DEVICE, Flag, Thresholds
from benchfs.peers import common_scale
from benchfs.probes import blocklat

__all__ = ["FAMILY", "WINDOWS", "Latency", "mode_flags", "summarize_windows"]

FAMILY = "device latency distribution"
WINDOWS = (
    ("rand4k", True, "4 KiB reads at 1 in flight"),
    ("workload", None, "many-files reads"),
)
"""The probe windows judged, in order: (probe, small I/Os only or any size, what it is)."""


@dataclass(frozen=True)
class Latency:
    """One device's read histogram in one probe window, as a screen keeps it."""

    node: str
    host: str
    device: str
    probe: str
    hist: blocklat.Histogram


def summarize_windows(
    samples: Sequence[blocklat.Sample],
    windows: Mapping[str, tuple[float, float]],
    devices: Sequence[str],
) -> dict[str, dict[str, list[list[int]]]]:
    """Per judged probe window, per device, the read histogram (device measure) of the
    intervals ending within the window or the second after it."""
    out: dict[str, dict[str, list[list[int]]]] = {}
    for probe, small, _what in WINDOWS:
        window = windows.get(probe)
        if window is None:
            continue
        hists = blocklat.merge(
            samples, window[0], window[1] + 1.0, "device", "read", small, devices
        )
        out[probe] = blocklat.histograms_json(hists)
    return out


def mode_flags(
    latencies: Sequence[Latency], groups: Mapping[str, Sequence[str]], th: Thresholds
) -> tuple[dict[str, list[Flag]], dict[str, list[dict[str, Any]]]]:
    """Per node, its flag (at most one: the first window where a device of it is odd, the
    rule of `benchfs.latencymodes`) and the modes found on its devices, flagged or not."""
    group_of = {n: g for g, members in groups.items() for n in members}
    nodes_of: dict[tuple[str, str], list[str]] = {}
    for x in latencies:
        nodes_of.setdefault((x.host, x.device), [])
        if x.node not in nodes_of[(x.host, x.device)]:
            nodes_of[(x.host, x.device)].append(x.node)
    flags: dict[str, list[Flag]] = {}
    found: dict[str, list[dict[str, Any]]] = {}
    for probe, _small, what in WINDOWS:
        # One histogram per device of a host: nodes of one host may share a device, which
        # is then judged once, and its mode is every such node's.
        hists = {(x.host, x.device): x.hist for x in latencies if x.probe == probe}
        groups_of = {key: group_of.get(nodes_of[key][0]) for key in hists}
        for finding in latencymodes.find_modes(hists, groups_of, th):
            host, device = cast(tuple[str, str], finding.key)
            mode = finding.mode
            for node in nodes_of[(host, device)]:
                record: dict[str, Any] = {"probe": probe, "device": device, **mode.to_json()}
                found.setdefault(node, []).append(record)
                if finding.peer_share is None or finding.worse is None:
                    record["judged"] = "no peer device to compare with"
                    continue
                record.update(
                    peer_share=round(finding.peer_share, 4), worse=round(finding.worse, 3)
                )
                if not finding.odd or node in flags:
                    continue
                flags[node] = [
                    Flag(
                        "dev_latency_mode",
                        KIND_DEVICE,
                        f"{device}: a second latency mode in {what}: {mode.describe()}; its "
                        f"peers have {finding.peer_share:.1%} of theirs there "
                        f"({finding.worse:.1f}x)",
                        common_scale(finding.worse, th),
                        worse=finding.worse,
                        family=FAMILY,
                    )
                ]
                record["flagged"] = True
    return flags, found

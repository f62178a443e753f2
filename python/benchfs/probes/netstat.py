"""The kernel's TCP counters of a node (`/proc/net/snmp` and `/proc/net/netstat`, what `nstat`
reads), taken before and after a run: how many segments the node's TCP retransmitted, how
often a retransmission timer expired (each expiry doubles the wait before the next try: 0.2 s
to tens of seconds), and why segments were dropped on arrival (a full receive queue, the
host's TCP memory under pressure). A request that takes 30 s on an idle network is often one
of these.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping

#: The counters kept (protocol, name), with what each counts; the rest of the files is not.
COUNTERS: dict[tuple[str, str], str] = {
    ("Tcp", "OutSegs"): "segments sent",
    ("Tcp", "RetransSegs"): "segments retransmitted",
    ("TcpExt", "TCPTimeouts"): "retransmission timer expiries (each doubles the next wait)",
    ("TcpExt", "TCPLostRetransmit"): "retransmissions lost again",
    ("TcpExt", "TCPRcvQDrop"): "segments dropped on arrival: no room in the receive queue",
    ("TcpExt", "PruneCalled"): "receive queues pruned for room",
    ("TcpExt", "TCPOFODrop"): "out-of-order segments dropped for room",
    ("TcpExt", "TCPMemoryPressures"): "times the host's TCP memory entered pressure",
    ("TcpExt", "TCPMemoryPressuresChrono"): "milliseconds under TCP memory pressure",
    ("TcpExt", "TCPBacklogDrop"): "segments dropped: socket backlog full",
    ("TcpExt", "ListenOverflows"): "connections refused: accept queue full",
}

#: The files a snapshot reads, in one `cat` on the node.
SOURCES = ("/proc/net/snmp", "/proc/net/netstat")


def snapshot_command() -> list[str]:
    return ["cat", *SOURCES]


def parse(text: str) -> dict[str, int]:
    """The counters of `COUNTERS` in the text of `/proc/net/snmp` and `/proc/net/netstat`
    (pairs of lines: `Proto: names...` then `Proto: values...`), as `Proto.Name`."""
    out: dict[str, int] = {}
    lines = [line.split() for line in text.splitlines() if line.strip()]
    for names, values in itertools.pairwise(lines):
        if not names or names[0] != values[0] or not names[0].endswith(":"):
            continue
        proto = names[0][:-1]
        for name, value in zip(names[1:], values[1:], strict=False):
            if (proto, name) in COUNTERS:
                try:
                    out[f"{proto}.{name}"] = int(value)
                except ValueError:
                    continue
    return out


def delta(before: Mapping[str, int], after: Mapping[str, int]) -> dict[str, int]:
    """What each counter counted between two snapshots (counters found in both)."""
    return {k: after[k] - before[k] for k in after if k in before}

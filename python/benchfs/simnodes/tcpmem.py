"""The TCP memory of nodes simulated in network namespaces.

Namespaces have their own addresses, routes and sockets, but not their own TCP memory budget:
`net.ipv4.tcp_mem` (pages: no pressure below the first figure, pressure from the second, a
hard limit at the third) exists only in the host's namespace, and it counts the socket buffers
of every namespace together. The kernel sizes it for one host (about 1.5 GiB of pressure on
24 GiB). Sixteen simulated nodes with 128 client processes on 2 cores crossed it: replies
waiting in the receive queues of client processes the scheduler had not run yet added up, the
kernel entered memory pressure, shrank every socket's receive buffer and dropped segments
already in flight (TcpExt TCPRcvQDrop, TCPMemoryPressures), and the retransmissions too
(TCPLostRetransmit); TCP's exponential retransmission backoff then held those connections for
30-60 s, past the clients' request timeout. Real nodes each have a budget of their own.

So `benchfs-run nodes --netns N` raises the host's budget to N nodes' worth, at most half the
host's memory for the hard limit, and `--remove-netns` restores it once no such nodes are
left. The value found first and the tags that raised it are kept in [`STATE`].
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterator
from pathlib import Path

TCP_MEM = Path("/proc/sys/net/ipv4/tcp_mem")
STATE = Path("/run/benchfs/tcp_mem.json")
"""`{"original": [min, pressure, max], "tags": [...]}` while simulated nodes have raised it."""

PAGE = os.sysconf("SC_PAGE_SIZE")


def read_tcp_mem() -> tuple[int, int, int]:
    low, pressure, high = (int(x) for x in TCP_MEM.read_text().split())
    return low, pressure, high


def _triple(values: list[int]) -> tuple[int, int, int]:
    low, pressure, high = values
    return int(low), int(pressure), int(high)


def _write(value: tuple[int, int, int]) -> None:
    TCP_MEM.write_text(" ".join(map(str, value)) + "\n")


def _host_pages() -> int:
    return os.sysconf("SC_PHYS_PAGES")


def budget_for(nodes: int, original: tuple[int, int, int]) -> tuple[int, int, int]:
    """`original` scaled by the node count, the hard limit kept at half the host's memory."""
    factor = min(float(nodes), _host_pages() / 2 / original[2])
    return (int(original[0] * factor), int(original[1] * factor), int(original[2] * factor))


def _gib(pages: int) -> str:
    return f"{pages * PAGE / 2**30:.1f} GiB"


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    """One update of [`STATE`] and the sysctl at a time (nodes of two tags made at once)."""
    STATE.parent.mkdir(parents=True, exist_ok=True)
    with open(STATE.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def raise_for(nodes: int, tag: str) -> str | None:
    """Gives `nodes` simulated nodes (namespaces of `tag`) N nodes' worth of TCP memory; returns
    the line to tell the user, or None if the host's budget is large enough already."""
    try:
        with _locked():
            return _raise_for(nodes, tag)
    except OSError as e:  # a host that lets us make namespaces but not set the sysctl
        return f"net.ipv4.tcp_mem left as it is ({e}): many nodes may stall on TCP memory"


def restore_after(tag: str) -> str | None:
    """Forgets that `tag`'s nodes raised the budget; once no tag is left, restores the value
    found first. Returns the line to tell the user, or None."""
    try:
        with _locked():
            return _restore_after(tag)
    except OSError as e:
        return f"net.ipv4.tcp_mem not restored ({e}); {STATE} holds the value to restore"


def _raise_for(nodes: int, tag: str) -> str | None:
    state = json.loads(STATE.read_text()) if STATE.exists() else None
    original = _triple(state["original"]) if state else read_tcp_mem()
    current = read_tcp_mem()
    wanted = budget_for(nodes, original)
    tags = sorted({*(state["tags"] if state else []), tag})
    if wanted[1] <= current[1]:
        if state:
            STATE.write_text(json.dumps({"original": list(original), "tags": tags}))
        return None
    STATE.write_text(json.dumps({"original": list(original), "tags": tags}))
    _write(wanted)
    return (
        f"net.ipv4.tcp_mem: memory pressure from {_gib(current[1])} to {_gib(wanted[1])} "
        f"(hard limit {_gib(wanted[2])}): the namespaces share this host's TCP memory, "
        f"raised for {nodes} nodes, at most half the host's memory; --remove-netns restores it"
    )


def _restore_after(tag: str) -> str | None:
    if not STATE.exists():
        return None
    state = json.loads(STATE.read_text())
    tags = [t for t in state["tags"] if t != tag]
    if tags:
        STATE.write_text(json.dumps({"original": state["original"], "tags": tags}))
        return None
    original = _triple(state["original"])
    _write(original)
    STATE.unlink()
    return f"net.ipv4.tcp_mem restored ({' '.join(map(str, original))})"

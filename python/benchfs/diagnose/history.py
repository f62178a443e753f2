"""The diagnosis history of a results root: every screen and in-run judgment appends one line
to `<results root>/diagnose-history.jsonl`, so that a node slow in every job stands out from
one bad minute (`benchfs-diagnose history`).

Each line: {"time", "source": "screen"|"judge", "path", "nodes": [{"host", "name", "status":
"ok"|"flagged"|"excluded", "kind", "severity"}]}; severity is on the judgment's common scale
for a screen and the node's share of the run's excess delay for a judgment.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

__all__ = ["HISTORY_FILE", "NodeHistory", "append", "read_history", "summarize"]

HISTORY_FILE = "diagnose-history.jsonl"


def append(root: str | os.PathLike[str], source: str, path: str, nodes: Sequence[dict]) -> None:
    """One line for one screen or judgment, appended under an exclusive lock."""
    entry = {
        "time": datetime.now(UTC).isoformat(timespec="seconds"),
        "source": source,
        "path": path,
        "nodes": list(nodes),
    }
    line = json.dumps(entry, separators=(",", ":")) + "\n"
    target = Path(root) / HISTORY_FILE
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target, "a", encoding="utf-8") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.write(line)


def screen_nodes(doc: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A screen's nodes as history entries."""
    out = []
    for n in doc["nodes"]:
        # A state wrong in itself has no finite severity (None in the screen's JSON).
        flags = [f for f in n["flags"] if f.get("excludable")]
        numeric = [f["severity"] for f in flags if f["severity"] is not None]
        out.append(
            {
                "host": n["host"],
                "name": n["name"],
                "status": n["verdict"]["status"],
                "kind": n["verdict"]["kind"],
                "severity": round(max(numeric), 2) if numeric else None,
            }
        )
    return out


def read_history(root: str | os.PathLike[str]) -> tuple[list[dict[str, Any]], list[str]]:
    """The entries, oldest first, and a note per line that could not be read (a line cut by a
    crash is skipped, not fatal)."""
    target = Path(root) / HISTORY_FILE
    if not target.exists():
        raise FileNotFoundError(
            f"no diagnosis history at {target} (screens and judgments write it)"
        )
    entries, notes = [], []
    for i, line in enumerate(target.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
            if not isinstance(entry, dict) or not isinstance(entry.get("nodes"), list):
                raise ValueError("not a history entry")
            entries.append(entry)
        except ValueError as e:
            notes.append(f"{target}:{i}: skipped ({e})")
    return entries, notes


@dataclass
class NodeHistory:
    node: str
    host: str
    seen: int = 0
    flagged: int = 0
    excluded: int = 0
    worst: float | None = None
    last_flagged: str | None = None
    kinds: dict[str, int] = field(default_factory=dict)
    recent: str = ""
    """One letter per appearance, oldest first: . ok, f flagged, X excluded."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def summarize(entries: Sequence[Mapping[str, Any]], recent: int = 20) -> list[NodeHistory]:
    """Per node (by host), how often and how badly it was flagged; most often flagged first."""
    nodes: dict[str, NodeHistory] = {}
    for entry in entries:
        for n in entry["nodes"]:
            h = nodes.setdefault(n["host"], NodeHistory(n.get("name") or n["host"], n["host"]))
            h.seen += 1
            status = n.get("status", "ok")
            h.recent = (h.recent + {"ok": ".", "excluded": "X"}.get(status, "f"))[-recent:]
            if status == "ok":
                continue
            h.flagged += 1
            h.excluded += status == "excluded"
            h.last_flagged = entry.get("time")
            if n.get("kind"):
                h.kinds[n["kind"]] = h.kinds.get(n["kind"], 0) + 1
            if n.get("severity") is not None:
                h.worst = max(h.worst or 0.0, float(n["severity"]))
    return sorted(nodes.values(), key=lambda h: (-h.flagged / max(h.seen, 1), h.host))

"""A results directory loaded for analysis: manifest, effective config, telemetry, traces, iostat.

Analysis reads only the results directory (docs/results.md). Everything optional may be
missing (client telemetry, traces, iostat captures, even the manifest of a run made by hand);
`LoadedRun.notes` says what was missing, so that every analysis can degrade to a clear note instead
of an exception.
"""

from __future__ import annotations

import json
import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from benchfs import telemetry
from benchfs.analysis import iostat as iostat_parser
from benchfs.analysis.kernel import load_kernel
from benchfs.probes.kerneltrace import HostTraceData
from benchfs.results import RunDir, read_json

__all__ = [
    "NO_CLIENT_TELEMETRY",
    "NO_IOSTAT",
    "NO_TRACE",
    "LoadedRun",
    "latest_run",
    "load_run",
    "previous_run",
]

NO_CLIENT_TELEMETRY = "no client telemetry in this run (RPC latency and retries by target need it)"
NO_TRACE = (
    "no per-operation trace in this run (telemetry.trace off): distributions and slow-op "
    "counts come from the histograms (buckets split in proportion at range edges)"
)
NO_IOSTAT = "no iostat captures in this run (iostat/<node>.json): device tables are empty"


@dataclass
class LoadedRun:
    """Everything analysis reads from one results directory."""

    path: Path
    manifest: dict[str, Any] | None
    config: dict[str, Any]
    config_text: str | None
    telemetry: telemetry.Telemetry | None
    trace: pd.DataFrame | None
    iostat: pd.DataFrame | None
    notes: list[str] = field(default_factory=list)
    kernel: dict[str, HostTraceData] = field(default_factory=dict)
    """Per host, the kernel's trace of the run (`benchfs.probes.kerneltrace`)."""
    network: pd.DataFrame | None = None
    """Per node, what its TCP counters counted during the run (`network/<node>.json`): node,
    host, netns, then one column per counter (`benchfs.probes.netstat.COUNTERS`)."""
    cache: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    """Arrays derived once from the trace (tables.trace_arrays)."""

    @property
    def run_dir(self) -> RunDir:
        return RunDir(self.path)

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def has_clients(self) -> bool:
        return self.telemetry is not None and self.telemetry.has_clients

    def servers(self) -> pd.DataFrame:
        """Every server of the run (id, node): the manifest's membership, else the telemetry's."""
        rows: dict[int, str] = {}
        for m in (self.manifest or {}).get("membership", []) or []:
            if isinstance(m, dict) and isinstance(m.get("id"), int):
                rows[m["id"]] = str(m.get("node", ""))
        if self.telemetry is not None:
            files = self.telemetry.files
            for sid, node in zip(
                files.loc[files["source"] == "server", "server"],
                files.loc[files["source"] == "server", "node"],
                strict=True,
            ):
                rows.setdefault(int(sid), str(node))
        frame = pd.DataFrame({"server": list(rows), "node": list(rows.values())})
        return frame.sort_values("server", ignore_index=True)

    def window(self) -> tuple[pd.Timestamp | None, pd.Timestamp | None]:
        """Start and end of the run (UTC): the manifest's times, else the telemetry's."""
        start = end = None
        m = self.manifest or {}
        # Schema 2 says started/finished; schema 1 (older results) started_at/finished_at.
        began = m.get("started") or m.get("started_at")
        ended = m.get("finished") or m.get("finished_at")
        if began:
            start = pd.Timestamp(began)
        if ended:
            end = pd.Timestamp(ended)
        if self.telemetry is not None and len(self.telemetry.counters):
            t = self.telemetry.counters["t"]
            start = start or t.min()
            end = end or t.max()
        return start, end

    def config_value(self, section: str, key: str, default: Any = None) -> Any:
        return self.config.get(section, {}).get(key, default)


def load_run(path: str | os.PathLike[str]) -> LoadedRun:
    """Load the results directory at `path`.

    Raises FileNotFoundError if `path` is not a results directory (not a directory, or one
    with none of manifest.json, config.toml and telemetry) and ValueError naming the file for
    a damaged file (telemetry, manifest, config, iostat capture). Missing optional parts
    become notes.
    """
    p = Path(path)
    if not p.is_dir():
        raise FileNotFoundError(f"{p}: no such results directory")
    rd = RunDir(p.resolve())
    if not (rd.manifest_path.exists() or rd.config_path.exists() or any(p.glob("*.tel"))
            or rd.telemetry_dir.is_dir()):  # fmt: skip
        raise FileNotFoundError(
            f"{p} is not a results directory: it has no manifest.json, config.toml or telemetry"
        )
    notes: list[str] = []
    manifest = read_json(rd.manifest_path) if rd.manifest_path.exists() else None
    if manifest is None:
        notes.append(f"no manifest.json in {p}: run times and membership come from telemetry")
    config_text = rd.config_path.read_text(encoding="utf-8") if rd.config_path.exists() else None
    try:
        config = tomllib.loads(config_text) if config_text is not None else {}
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"{rd.config_path}: malformed TOML: {e}") from e
    if config_text is None:
        notes.append(f"no config.toml in {p}: the run's configuration is unknown")
    tel: telemetry.Telemetry | None
    try:
        tel = telemetry.load(rd.telemetry_dir if rd.telemetry_dir.is_dir() else p)
    except FileNotFoundError:
        tel = None
        notes.append("no server telemetry in this run (telemetry/*.tel): server tables are empty")
    if tel is not None and not tel.has_clients:
        notes.append(NO_CLIENT_TELEMETRY)
    trace = telemetry.load_trace(rd.telemetry_dir) if rd.telemetry_dir.is_dir() else None
    if trace is None:
        notes.append(NO_TRACE)
    io = iostat_parser.load_dir(rd.iostat_dir) if rd.iostat_dir.is_dir() else None
    if io is None:
        notes.append(NO_IOSTAT)
    elif io["t"].isna().all():
        notes.append("iostat captures without timestamps (-t): not limited to the run's window")
    kernel, kernel_notes = load_kernel(rd.kernel_dir)
    notes.extend(kernel_notes)
    network = load_network(rd.network_dir, notes)
    return LoadedRun(rd.path, manifest, config, config_text, tel, trace, io, notes, kernel, network)


def load_network(directory: Path, notes: list[str]) -> pd.DataFrame | None:
    """The nodes' TCP counters of the run (`network/<node>.json`), or None without them; a
    damaged file is left out with a note."""
    if not directory.is_dir():
        return None
    rows = []
    for path in sorted(directory.glob("*.json")):
        try:
            record = json.loads(path.read_text())
            row = {"node": str(record["node"]), "host": str(record.get("host", "")),
                   "netns": record.get("netns") or ""}  # fmt: skip
            row.update({k: int(v) for k, v in dict(record["delta"]).items()})
        except (OSError, ValueError, KeyError, TypeError) as e:
            notes.append(f"network/{path.name} left out: {e}")
            continue
        rows.append(row)
    return pd.DataFrame(rows) if rows else None


def previous_run(path: str | os.PathLike[str]) -> Path:
    """The results directory made just before `path` under the same root (names start with
    their UTC start time); FileNotFoundError when there is none."""
    p = Path(path).resolve()
    runs = sorted(q for q in p.parent.glob("*") if (q / "manifest.json").is_file() and q < p)
    if not runs:
        raise FileNotFoundError(f"no results directory before {p.name} in {p.parent}")
    return runs[-1]


def latest_run(root: str | os.PathLike[str] = "results") -> Path:
    """The newest results directory under `root` (names start with their UTC start time)."""
    base = Path(root)
    runs = sorted(p for p in base.glob("*") if (p / "manifest.json").is_file())
    if not runs:
        raise FileNotFoundError(f"no results directory (with a manifest.json) under {base}")
    return runs[-1]

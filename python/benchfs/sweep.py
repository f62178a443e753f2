"""Parameter sweeps: expand a TOML parameter file and run every point with the pipeline.

A parameter file (`jobs/params/*.toml`, documented in docs/submit.md) lists values per
parameter; the sweep runs the cartesian product chunk size x transfer size x file size (bytes
per client) x servers x clients, each `repetitions` times, every run in its own results
directory under one sweep directory, and keeps `index.csv` and `index.json` (one row per point
and repetition) up to date after every run, so an interrupted sweep still has its index.
"""

from __future__ import annotations

import csv
import itertools
import os
import secrets
import shutil
import sys
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.table import Table

from benchfs.errors import InputError
from benchfs.results import csv_cell, write_json_atomic
from benchfs.units import format_size, parse_size

__all__ = [
    "INDEX_COLUMNS",
    "SweepError",
    "SweepOutcome",
    "SweepPlan",
    "SweepPoint",
    "load_params",
    "parse_params",
    "run_sweep",
    "sweep_table",
]

INDEX_NAME = "index.csv"
INDEX_JSON_NAME = "index.json"
INDEX_SCHEMA_VERSION = 2
"""Version of index.json's layout (benchfs/schemas/sweep-index.schema.json)."""
PARAMS_COPY = "params.toml"
MAX_CHUNK = 1 << 30
LIST_KEYS = ("chunk_size", "transfer_size", "file_size", "servers", "clients")
SIZE_KEYS = ("chunk_size", "transfer_size", "file_size")
ALIASES = {"block_size": "file_size"}
"""Keys of earlier parameter files, read as their current names."""
KEYS = {"name", "repetitions", "set", *LIST_KEYS, *ALIASES}
INDEX_COLUMNS = (
    "point",
    "repetition",
    "chunk_size",
    "transfer_size",
    "file_size",
    "servers",
    "clients",
    "outcome",
    "code",
    "write_mib_s",
    "read_mib_s",
    "verified",
    "elapsed_s",
    "results_dir",
)


class SweepError(InputError):
    """A parameter file is invalid; the message names the file and the key."""


@dataclass(frozen=True)
class SweepPoint:
    """One combination of parameters (before repetitions)."""

    index: int
    chunk_size: int
    transfer_size: int
    file_size: int
    """Bytes each client writes and reads back (the run's `run.file_size`)."""
    servers: int
    clients: int


@dataclass
class SweepPlan:
    """A validated parameter file: its points, repetitions and extra config overrides."""

    source: Path
    name: str
    points: list[SweepPoint]
    repetitions: int
    sets: list[str] = field(default_factory=list)

    def rows_preview(self) -> list[dict[str, Any]]:
        """Index rows before running (outcome "planned"), for --dry-run."""
        return [
            _row(p, rep, "planned", None, {}, None)
            for p in self.points
            for rep in range(self.repetitions)
        ]


def _values(doc: Mapping[str, Any], key: str, where: str) -> list[int]:
    raw = doc.get(key)
    if raw is None:
        raise SweepError(f"{where}: {key} is missing (give a list of values)")
    items = raw if isinstance(raw, list) else [raw]
    if not items:
        raise SweepError(f"{where}: {key} is an empty list")
    out: list[int] = []
    for item in items:
        if isinstance(item, bool):
            raise SweepError(f"{where}: {key} value {item!r} is not a number")
        if key in SIZE_KEYS:
            if not isinstance(item, int | str):
                raise SweepError(f'{where}: {key} value {item!r} is not a size like "1M"')
            try:
                value = parse_size(item)
            except ValueError as e:
                raise SweepError(f"{where}: {key}: {e}") from None
            if value < 1:
                raise SweepError(f"{where}: {key} value {item!r} must be at least 1 byte")
            if key == "chunk_size" and value > MAX_CHUNK:
                raise SweepError(f"{where}: {key} value {item!r} exceeds 1GiB")
        else:
            if not isinstance(item, int) or item < 1:
                raise SweepError(f"{where}: {key} value {item!r} must be an integer >= 1")
            value = item
        if value in out:
            raise SweepError(f"{where}: {key} repeats the value {item!r}")
        out.append(value)
    return out


def _flatten(table: Mapping[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    """`[set]` as dotted config keys: `client.x = 1` and `"client.x" = 1` mean the same."""
    out: list[tuple[str, Any]] = []
    for key, value in table.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out += _flatten(value, f"{name}.")
        else:
            out.append((name, value))
    return out


def parse_params(text: str, source: str) -> SweepPlan:
    """Validate parameter-file text and expand its points; SweepError names `source` and key."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise SweepError(f"{source}: malformed TOML: {e}") from e
    unknown = sorted(set(doc) - KEYS)
    if unknown:
        keys = ", ".join(sorted(KEYS - set(ALIASES)))
        raise SweepError(f"{source}: unknown key {unknown[0]!r} (keys: {keys})")
    for old, new in ALIASES.items():
        if old in doc:
            if new in doc:
                raise SweepError(f"{source}: give {new} or {old} (its earlier name), not both")
            doc[new] = doc.pop(old)
    values = {key: _values(doc, key, source) for key in LIST_KEYS}
    for t in values["transfer_size"]:
        for b in values["file_size"]:
            if t > b:
                raise SweepError(
                    f"{source}: transfer_size {format_size(t)} is larger than file_size "
                    f"{format_size(b)} (a client's bytes are moved in transfers of this size)"
                )
    reps = doc.get("repetitions", 1)
    if isinstance(reps, bool) or not isinstance(reps, int) or reps < 1:
        raise SweepError(f"{source}: repetitions must be an integer >= 1, not {reps!r}")
    name = doc.get("name", Path(source).stem)
    if not isinstance(name, str) or not name:
        raise SweepError(f"{source}: name must be a non-empty string")
    extra = doc.get("set", {})
    if not isinstance(extra, Mapping):
        raise SweepError(f'{source}: set must be a table of config keys ("client.x" = value)')
    sets = []
    for key, value in _flatten(extra):
        if key == "layout.chunk_size":
            raise SweepError(f"{source}: set.layout.chunk_size: sweep it with chunk_size")
        if isinstance(value, list):
            raise SweepError(f"{source}: set.{key} must be a single value, not a list")
        rendered = str(value).lower() if isinstance(value, bool) else str(value)
        sets.append(f"{key}={rendered}")
    points = [
        SweepPoint(i, *combo)
        for i, combo in enumerate(itertools.product(*(values[k] for k in LIST_KEYS)))
    ]
    return SweepPlan(Path(source), name, points, reps, sets)


def load_params(path: str | os.PathLike[str]) -> SweepPlan:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError as e:
        raise SweepError(f"parameter file {p} does not exist") from e
    except (OSError, UnicodeDecodeError) as e:
        raise SweepError(f"{p}: cannot read: {e}") from e
    return parse_params(text, str(p))


def _row(
    point: SweepPoint,
    repetition: int,
    outcome: str,
    code: str | None,
    report: Mapping[str, Any],
    results_dir: str | None,
) -> dict[str, Any]:
    return {
        "point": point.index,
        "repetition": repetition,
        "chunk_size": point.chunk_size,
        "transfer_size": point.transfer_size,
        "file_size": point.file_size,
        "servers": point.servers,
        "clients": point.clients,
        "outcome": outcome,
        "code": code,
        "write_mib_s": report.get("write_mib_s"),
        "read_mib_s": report.get("read_mib_s"),
        "verified": report.get("verified"),
        "elapsed_s": report.get("elapsed_s"),
        "results_dir": results_dir,
    }


def _write_index(sweep_dir: Path, plan: SweepPlan, rows: Sequence[Mapping[str, Any]]) -> None:
    """index.csv for spreadsheets and shell tools, index.json (typed, with a schema) for
    programs; both replaced atomically after every run."""
    path = sweep_dir / INDEX_NAME
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=INDEX_COLUMNS)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: csv_cell(row[k]) for k in INDEX_COLUMNS})
    os.replace(tmp, path)
    doc = {
        "schema_version": INDEX_SCHEMA_VERSION,
        "name": plan.name,
        "params": PARAMS_COPY,
        "repetitions": plan.repetitions,
        "set": list(plan.sets),
        "rows": [dict(r) for r in rows],
    }
    write_json_atomic(sweep_dir / INDEX_JSON_NAME, doc)


@dataclass
class SweepOutcome:
    sweep_dir: Path
    index_path: Path
    rows: list[dict[str, Any]]
    interrupted: bool = False

    @property
    def ok(self) -> bool:
        return not self.interrupted and all(r["outcome"] == "ok" for r in self.rows)


def run_sweep(
    plan: SweepPlan,
    results_root: str | os.PathLike[str],
    progress: Callable[[str], None],
    config: str | None = None,
    timeout_s: float = 300.0,
) -> SweepOutcome:
    """Run every point and repetition with the pipeline; stop early only on Ctrl-C/SIGTERM."""
    from benchfs.pipeline import Pipeline, RunSpec

    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    root = Path(results_root)
    root.mkdir(parents=True, exist_ok=True)
    sweep_dir = (root / f"{stamp}-sweep-{secrets.token_hex(3)}").absolute()
    sweep_dir.mkdir()
    shutil.copyfile(plan.source, sweep_dir / PARAMS_COPY)
    index = sweep_dir / INDEX_NAME
    outcome = SweepOutcome(sweep_dir, index, [])
    _write_index(sweep_dir, plan, outcome.rows)
    total = len(plan.points) * plan.repetitions
    done = 0
    for point in plan.points:
        for rep in range(plan.repetitions):
            done += 1
            label = (
                f"[{done}/{total}] chunk {format_size(point.chunk_size)}, transfer "
                f"{format_size(point.transfer_size)}, file {format_size(point.file_size)}, "
                f"{point.servers} servers, {point.clients} clients, repetition {rep}"
            )
            progress(label)
            spec = RunSpec(
                servers=point.servers,
                clients=point.clients,
                file_size=point.file_size,
                transfer_size=point.transfer_size,
                config=config,
                sets=[*plan.sets, f"layout.chunk_size={point.chunk_size}"],
                results_root=str(sweep_dir),
                timeout_s=timeout_s,
            )
            command = [*sys.argv, f"# point {point.index} repetition {rep}"]
            report = Pipeline(spec, command, lambda m: progress(f"  {m}")).execute()
            data = report.to_json()
            row = _row(point, rep, data["outcome"], data["code"], data, data["results_dir"])
            outcome.rows.append(row)
            _write_index(sweep_dir, plan, outcome.rows)
            if report.error is not None:
                progress(f"  {data['outcome']}: {report.error.code}: {report.error.message}")
                if report.error.code == "EINTR":
                    outcome.interrupted = True
                    return outcome
    return outcome


def sweep_table(rows: Sequence[Mapping[str, Any]]) -> Table:
    """The index as a terminal table."""
    table = Table(box=None, pad_edge=False)
    for col in ("point", "rep", "chunk", "xfer", "file", "servers", "clients", "outcome"):
        table.add_column(col, justify="right" if col != "outcome" else "left")
    table.add_column("write MiB/s", justify="right")
    table.add_column("read MiB/s", justify="right")

    def mib(v: Any) -> str:
        return "-" if v is None or v == "" else f"{float(v):.1f}"

    for r in rows:
        table.add_row(
            str(r["point"]),
            str(r["repetition"]),
            format_size(r["chunk_size"]),
            format_size(r["transfer_size"]),
            format_size(r["file_size"]),
            str(r["servers"]),
            str(r["clients"]),
            str(r["outcome"]) + (f" ({r['code']})" if r["code"] else ""),
            mib(r["write_mib_s"]),
            mib(r["read_mib_s"]),
        )
    return table

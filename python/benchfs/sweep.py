"""Parameter sweeps: expand a TOML parameter file and run every point with the pipeline.

A parameter file (documented in docs/submit.md) names axes under `[sweep]`: any `section.key`
of the configuration, the workload (with its arguments), the workload's arguments alone, the
user command, and the node and process counts; each takes a list of values. The sweep runs
their cartesian product, each point `repetitions` times, every run in its own results
directory under one sweep directory, and keeps `index.csv` and `index.json` up to date after
every run (one row per point and repetition, and per point the mean, standard deviation,
minimum and maximum of every figure), so an interrupted sweep still has its index.
"""

from __future__ import annotations

import csv
import itertools
import math
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

from benchfs.config import parse_config, resolve_config_text
from benchfs.errors import BenchfsError, InputError
from benchfs.pipeline.spec import WORKLOADS
from benchfs.results import csv_cell, write_json_atomic
from benchfs.spread import spread
from benchfs.units import format_size, shown_value

__all__ = [
    "INDEX_COLUMNS",
    "SweepError",
    "SweepOutcome",
    "SweepPlan",
    "SweepPoint",
    "aggregate",
    "index_columns",
    "load_params",
    "parse_params",
    "run_sweep",
    "sweep_table",
]

INDEX_NAME = "index.csv"
INDEX_JSON_NAME = "index.json"
POINTS_NAME = "points.csv"
INDEX_SCHEMA_VERSION = 3
"""Version of index.json's layout (benchfs/schemas/sweep-index.schema.json)."""
PARAMS_COPY = "params.toml"
RUN_AXES = (
    "workload",
    "workload_args",
    "command",
    "server_nodes",
    "servers_per_node",
    "clients_per_node",
)
"""Axes that are not configuration keys but what the run is asked to do: a workload with its
arguments ("ior -t 1m -b 16m"), the arguments alone, the command of workload "command", and
the placement on a nodes file's nodes (docs/submit.md)."""
OLD_KEYS = {
    "chunk_size": "layout.chunk_size",
    "transfer_size": "run.transfer_size",
    "file_size": "run.file_size",
    "block_size": "run.file_size",
    "servers": "run.servers",
    "clients": "run.clients",
}
"""Top-level keys of earlier parameter files, read as these axes (with a notice)."""
KEYS = {"name", "repetitions", "set", "sweep", *OLD_KEYS}
ROW_HEAD = ("point", "repetition")
ROW_TAIL = (
    "outcome",
    "code",
    "write_mib_s",
    "read_mib_s",
    "verified",
    "elapsed_s",
    "results_dir",
)
INDEX_COLUMNS = (*ROW_HEAD, *ROW_TAIL)
"""index.csv's columns around the axes (`index_columns` gives them all)."""


class SweepError(InputError):
    """A parameter file is invalid; the message names the file and the key."""


@dataclass(frozen=True)
class SweepPoint:
    """One combination of the axes' values (before repetitions)."""

    index: int
    values: dict[str, Any]
    """Axis name to value: a configuration key's value as the configuration resolved it
    (sizes in bytes), the run axes' as given."""
    raw: dict[str, str] = field(default_factory=dict, compare=False)
    """Configuration axes as overrides ("key=value"), as the file gave them."""


@dataclass
class SweepPlan:
    """A validated parameter file: its axes, points, repetitions and fixed overrides."""

    source: Path
    name: str
    axes: list[str]
    points: list[SweepPoint]
    repetitions: int
    sets: list[str] = field(default_factory=list)
    notices: list[str] = field(default_factory=list)
    """What changed in the file's vocabulary (old keys read as axes), one line each."""

    def rows_preview(self) -> list[dict[str, Any]]:
        """Index rows before running (outcome "planned"), for --dry-run."""
        return [
            _row(p, rep, "planned", None, {}, None)
            for p in self.points
            for rep in range(self.repetitions)
        ]


def _flatten(table: Mapping[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    """A table as dotted keys: `client.x = 1` and `"client.x" = 1` mean the same."""
    out: list[tuple[str, Any]] = []
    for key, value in table.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out += _flatten(value, f"{name}.")
        else:
            out.append((name, value))
    return out


def _override(key: str, value: Any) -> str:
    rendered = str(value).lower() if isinstance(value, bool) else str(value)
    return f"{key}={rendered}"


def _axis_values(source: str, where: str, raw: Any) -> list[Any]:
    items = raw if isinstance(raw, list) else [raw]
    if not items:
        raise SweepError(f"{source}: {where} is an empty list")
    seen: list[Any] = []
    for item in items:
        if isinstance(item, Mapping | list):
            raise SweepError(f"{source}: {where} value {item!r} is not a single value")
        if item in seen:
            raise SweepError(f"{source}: {where} repeats the value {item!r}")
        seen.append(item)
    return seen


def _check_run_axis(source: str, axis: str, value: Any) -> None:
    if axis in ("server_nodes", "servers_per_node", "clients_per_node"):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise SweepError(f"{source}: sweep.{axis} value {value!r} must be an integer >= 1")
    elif not isinstance(value, str) or (axis != "workload_args" and not value.strip()):
        raise SweepError(f"{source}: sweep.{axis} value {value!r} must be a string")
    if axis == "workload":
        name = value.split(maxsplit=1)[0]
        if name not in WORKLOADS:
            raise SweepError(
                f"{source}: sweep.workload value {value!r}: unknown workload {name!r} "
                f"(one of {', '.join(WORKLOADS)})"
            )


def _axes(doc: Mapping[str, Any], source: str) -> tuple[dict[str, list[Any]], list[str]]:
    """Every axis (name -> values) and the notices about old keys."""
    axes: dict[str, list[Any]] = {}
    notices: list[str] = []
    sweep = doc.get("sweep", {})
    if not isinstance(sweep, Mapping):
        raise SweepError(f'{source}: sweep must be a table of axes ("layout.chunk_size" = [...])')
    for key, raw in _flatten(sweep):
        axes[key] = _axis_values(source, f"sweep.{key}", raw)
    olds = [k for k in OLD_KEYS if k in doc]
    for old in olds:
        new = OLD_KEYS[old]
        if new in axes:
            raise SweepError(f"{source}: {old} is sweep.{new} (its earlier name): give one")
        axes[new] = _axis_values(source, old, doc[old])
    if olds:
        notices.append(
            f"{source}: the keys {', '.join(olds)} are read as the axes "
            + ", ".join(f'"{OLD_KEYS[k]}"' for k in olds)
            + " (write them under [sweep]; the old form will go)"
        )
    extra = doc.get("set", {})
    if not isinstance(extra, Mapping):
        raise SweepError(f'{source}: set must be a table of config keys ("client.x" = value)')
    for key, value in _flatten(extra):
        if isinstance(value, list):
            if key in axes:
                raise SweepError(f"{source}: {key} is swept twice (under [set] and [sweep])")
            axes[key] = _axis_values(source, f"set.{key}", value)
    return axes, notices


def parse_params(text: str, source: str) -> SweepPlan:
    """Validate parameter-file text and expand its points; SweepError names `source` and the
    key. Every point's configuration is resolved here (an unknown key, a bad value or a
    transfer larger than a file is refused before anything runs)."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise SweepError(f"{source}: malformed TOML: {e}") from e
    unknown = sorted(set(doc) - KEYS)
    if unknown:
        raise SweepError(
            f"{source}: unknown key {unknown[0]!r} (keys: name, repetitions, [sweep], [set])"
        )
    if "block_size" in doc and "file_size" in doc:
        raise SweepError(f"{source}: give file_size or block_size (its earlier name), not both")
    axes, notices = _axes(doc, source)
    if not axes:
        raise SweepError(f"{source}: nothing to sweep: name axes under [sweep]")
    reps = doc.get("repetitions", 1)
    if isinstance(reps, bool) or not isinstance(reps, int) or reps < 1:
        raise SweepError(f"{source}: repetitions must be an integer >= 1, not {reps!r}")
    name = doc.get("name", Path(source).stem)
    if not isinstance(name, str) or not name:
        raise SweepError(f"{source}: name must be a non-empty string")
    sets = [_override(k, v) for k, v in _flatten(doc.get("set", {})) if not isinstance(v, list)]
    for axis, values in axes.items():
        if axis in RUN_AXES:
            for v in values:
                _check_run_axis(source, axis, v)
        elif "." not in axis:
            raise SweepError(
                f"{source}: sweep.{axis} is neither a configuration key (section.key) nor one "
                f"of {', '.join(RUN_AXES)}"
            )
    names = list(axes)
    points = [
        _point(i, dict(zip(names, combo, strict=True)), sets, source)
        for i, combo in enumerate(itertools.product(*(axes[n] for n in names)))
    ]
    return SweepPlan(Path(source), name, names, points, reps, sets, notices)


def _point(index: int, given: dict[str, Any], sets: list[str], source: str) -> SweepPoint:
    """One point, its configuration resolved (the values as resolved) and its workload's
    arguments checked by the workload's own parser."""
    from benchfs.pipeline.workload import check_workload_options

    raw = {k: _override(k, v) for k, v in given.items() if k not in RUN_AXES}
    where = ", ".join(f"{k} = {v!r}" for k, v in given.items())
    try:
        config = parse_config(resolve_config_text(None, [*sets, *raw.values()]))
    except ValueError as e:
        raise SweepError(f"{source}: point {index} ({where}): {e}") from None
    run = config["run"]
    if run["transfer_size"] > run["file_size"]:
        raise SweepError(
            f"{source}: point {index} ({where}): transfer size "
            f"{format_size(run['transfer_size'])} is larger than file size "
            f"{format_size(run['file_size'])} (a client's bytes move in transfers of this size)"
        )
    try:
        workload, args = _workload(given)
        check_workload_options(workload, args, run)
    except SweepError as e:
        raise SweepError(f"{source}: point {index} ({where}): {e}") from None
    except BenchfsError as e:
        raise SweepError(f"{source}: point {index} ({where}): {e.message}") from None
    values = {k: given[k] if k in RUN_AXES else _lookup(config, k) for k in given}
    return SweepPoint(index, values, raw)


def _lookup(config: Mapping[str, Any], key: str) -> Any:
    section, name = key.split(".", 1)
    return config[section][name]


def _workload(values: Mapping[str, Any]) -> tuple[str, str | None]:
    """(workload, its arguments) of a point: from the workload axis ("ior -t 1m"), the
    workload_args axis, or neither ("rw")."""
    text = values.get("workload", "rw")
    name, _, args = text.partition(" ")
    extra = values.get("workload_args")
    if extra is not None and args.strip():
        raise SweepError(f"workload {text!r} has arguments and workload_args gives more")
    if extra is not None and name == "rw":
        name = "ior"  # arguments alone: of the built-in IOR, the workload that takes them
    return name, (extra if extra is not None else args.strip() or None)


def load_params(path: str | os.PathLike[str]) -> SweepPlan:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError as e:
        raise SweepError(f"parameter file {p} does not exist") from e
    except (OSError, UnicodeDecodeError) as e:
        raise SweepError(f"{p}: cannot read: {e}") from e
    return parse_params(text, str(p))


def index_columns(axes: Sequence[str]) -> tuple[str, ...]:
    """index.csv's columns: point, repetition, one per axis, then the outcome and figures."""
    return (*ROW_HEAD, *axes, *ROW_TAIL)


def _figures(report: Mapping[str, Any]) -> dict[str, float]:
    """The figures of a run that a sweep aggregates: bandwidths and metadata rates."""
    out = {
        k: float(report[k])
        for k in ("write_mib_s", "read_mib_s")
        if isinstance(report.get(k), int | float)
    }
    for r in report.get("rows") or []:
        if isinstance(r, Mapping) and isinstance(r.get("ops_s"), int | float):
            out[f"{r.get('operation')}_ops_s"] = float(r["ops_s"])
    return out


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
        "values": dict(point.values),
        "outcome": outcome,
        "code": code,
        "write_mib_s": report.get("write_mib_s"),
        "read_mib_s": report.get("read_mib_s"),
        "figures": _figures(report),
        "verified": report.get("verified"),
        "elapsed_s": report.get("elapsed_s"),
        "results_dir": results_dir,
    }


def aggregate(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per point (in order): its values, the runs and how many were ok, and per figure of the
    ok runs its mean, sample standard deviation (None of one run), minimum, maximum and n."""
    by_point: dict[int, list[Mapping[str, Any]]] = {}
    for r in rows:
        by_point.setdefault(r["point"], []).append(r)
    out = []
    for index, runs in by_point.items():
        ok = [r for r in runs if r["outcome"] == "ok"]
        names = sorted({k for r in ok for k in r["figures"]})
        stats = {name: spread(r["figures"].get(name) for r in ok) for name in names}
        out.append(
            {
                "point": index,
                "values": dict(runs[0]["values"]),
                "runs": len(runs),
                "ok": len(ok),
                "figures": stats,
            }
        )
    return out


def _write_index(sweep_dir: Path, plan: SweepPlan, rows: Sequence[Mapping[str, Any]]) -> None:
    """index.csv (one row per run) and points.csv (one per point, aggregated) for
    spreadsheets and shell tools, index.json (typed, with a schema) for programs; all
    replaced atomically after every run."""
    columns = index_columns(plan.axes)
    points = aggregate(rows)
    figures = sorted({f for p in points for f in p["figures"]})
    point_columns = ["point", *plan.axes, "runs", "ok"]
    point_columns += [f"{f}_{s}" for f in figures for s in ("mean", "std", "min", "max")]
    _write_csv(sweep_dir / INDEX_NAME, columns, [{**r, **r["values"]} for r in rows])
    _write_csv(
        sweep_dir / POINTS_NAME,
        point_columns,
        [
            {
                **p,
                **p["values"],
                **{
                    f"{f}_{s}": p["figures"].get(f, {}).get(s)
                    for f in figures
                    for s in ("mean", "std", "min", "max")
                },
            }
            for p in points
        ],
    )
    doc = {
        "schema_version": INDEX_SCHEMA_VERSION,
        "name": plan.name,
        "params": PARAMS_COPY,
        "axes": list(plan.axes),
        "repetitions": plan.repetitions,
        "set": list(plan.sets),
        "rows": [dict(r) for r in rows],
        "points": points,
    }
    write_json_atomic(sweep_dir / INDEX_JSON_NAME, doc)


def _write_csv(path: Path, columns: Sequence[str], rows: Sequence[Mapping[str, Any]]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(columns), extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: csv_cell(row.get(k)) for k in columns})
    os.replace(tmp, path)


@dataclass
class SweepOutcome:
    sweep_dir: Path
    index_path: Path
    rows: list[dict[str, Any]]
    interrupted: bool = False

    @property
    def ok(self) -> bool:
        return not self.interrupted and all(r["outcome"] == "ok" for r in self.rows)


def _describe(values: Mapping[str, Any]) -> str:
    return ", ".join(f"{k} {_show(k, v)}" for k, v in values.items())


def _show(key: str, value: Any) -> str:
    return str(shown_value(key, value))


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
        workload, args = _workload(point.values)
        for rep in range(plan.repetitions):
            done += 1
            progress(f"[{done}/{total}] {_describe(point.values)}, repetition {rep}")
            spec = RunSpec(
                config=config,
                sets=[*plan.sets, *point.raw.values()],
                results_root=str(sweep_dir),
                timeout_s=timeout_s,
                workload=workload,
                workload_args=args,
                command=point.values.get("command"),
                server_nodes=point.values.get("server_nodes"),
                servers_per_node=point.values.get("servers_per_node"),
                clients_per_node=point.values.get("clients_per_node"),
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


def sweep_table(axes: Sequence[str], rows: Sequence[Mapping[str, Any]]) -> Table:
    """The index as a terminal table."""
    table = Table(box=None, pad_edge=False)
    for col in ("point", "rep", *axes, "outcome"):
        table.add_column(col, justify="left" if col in ("outcome", *RUN_AXES) else "right")
    table.add_column("write MiB/s", justify="right")
    table.add_column("read MiB/s", justify="right")

    def mib(v: Any) -> str:
        return (
            "-"
            if v is None or v == "" or (isinstance(v, float) and math.isnan(v))
            else (f"{float(v):.1f}")
        )

    for r in rows:
        table.add_row(
            str(r["point"]),
            str(r["repetition"]),
            *(_show(a, r["values"].get(a)) for a in axes),
            str(r["outcome"]) + (f" ({r['code']})" if r["code"] else ""),
            mib(r["write_mib_s"]),
            mib(r["read_mib_s"]),
        )
    return table

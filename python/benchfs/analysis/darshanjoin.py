"""The application's operations (Darshan's DXT trace) lined up with the servers' (a run's
per-operation trace) on one clock: per phase what the application did, and for each slow
operation the servers that served it with their queue and service time.

- **Clock.** Darshan stamps each operation in seconds since its process started (the
  CLOCK_REALTIME read at MPI_Init, or at a non-MPI program's start, kept as the log's
  `start_ns`; an MPI log keeps the earliest rank's). The servers stamp each request's arrival in
  Unix ns. Both read the same clock on one host; across hosts they differ by the hosts' clock
  offset. `alignment` measures the agreement from the operations themselves: a read's server
  time lies inside the call, so every traced read bounds the offset between the two clocks.
- **Names.** The trace names files by id, Darshan by path. The servers note each file's path
  beside their traces (`server-*.names`); a Darshan path is matched to the BenchFS path it ends
  with (the mount's or the interposition prefix's part is the rest).
- **Matching.** Each server request goes to the application operation on the same file and
  chunk, of the same kind, that started last before the request arrived. It arrived during the
  call ("in call"), or after the call returned: write-behind bytes sent while the rank was
  flushing and closing the file ("at flush", given to the flush, which waited for them) or
  before ("behind"); a read fetched ahead goes to the read that wanted it, which may have
  waited for it ("ahead").
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from benchfs.analysis.appinsights import evaluate_app, posix_frame
from benchfs.analysis.darshanlog import DarshanLog, read_log
from benchfs.analysis.insights import Insight
from benchfs.analysis.run import LoadedRun
from benchfs.analysis.thresholds import Thresholds
from benchfs.errors import AnalyzeError
from benchfs.telemetry import load_names

__all__ = ["DarshanAnalysis", "analyze_darshan", "find_logs", "server_depth"]

SLOW_FLOOR_MS = 1.0
"""An application operation is never slow under this: below it a call's time is the kernel's
and the client's, not a server's."""
DEFAULT_CHUNK = 4 << 20
GENERATION_BITS = np.uint64(0x7FFF << 48)
"""A file's chunks are kept under its id with the generation of its chunks in bits 48-62 of
the id's low half (`Attr::data_id`, rust/benchfs-core/src/namespace.rs: a small file's bytes
moved into chunks get a new generation); the trace records that id, the names the file's."""


@dataclass
class DarshanAnalysis:
    """One or more Darshan logs, their insights, and (with a run) their join with its servers."""

    logs: list[DarshanLog]
    ops: pd.DataFrame
    """Every traced read and write, and per file a rank wrote its flush (from the last write
    to the close: `_flushes`): op_id, log, rank, host, path, op, offset, length, start_ns, end_ns,
    t_s (seconds since the first log's start), dur_ms, slow."""
    posix: pd.DataFrame
    insights: list[Insight]
    tables: dict[str, pd.DataFrame]
    """phases, slow_ops, by_server, alignment, write_behind (the last four need a run)."""
    matched: pd.DataFrame | None = None
    """The servers' requests given to an application operation (the run's trace rows, with
    op_id and relation)."""
    run: LoadedRun | None = None
    notes: list[str] = field(default_factory=list)

    def insights_table(self) -> pd.DataFrame:
        """The insights as one table, with the Drishti codes each answers to."""
        return pd.DataFrame(
            [
                {
                    "id": i.id,
                    "title": i.title,
                    "drishti": " ".join(i.drishti),
                    "fired": i.fired,
                    "evaluated": i.evaluated,
                    "evidence": " | ".join(i.evidence),
                    "reason": i.reason,
                }
                for i in self.insights
            ]
        )

    def write_csv(self, directory: str | os.PathLike[str]) -> list[Path]:
        """Every table as `<directory>/darshan_<name>.csv`, and darshan_insights.csv."""
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        paths = []
        for name, frame in {**self.tables, "insights": self.insights_table()}.items():
            path = d / f"darshan_{name}.csv"
            frame.to_csv(path, index=False, float_format="%.6g")
            paths.append(path)
        return paths

    @property
    def start_ns(self) -> int:
        return min(log.start_ns for log in self.logs)

    def summary(self) -> dict[str, Any]:
        first = self.logs[0]
        data = self.ops[self.ops["op"] != "flush"]
        return {
            "logs": [log.path for log in self.logs],
            "exe": first.exe,
            "nprocs": sum(log.nprocs for log in self.logs),
            "run_time_s": (max(x.end_ns for x in self.logs) - self.start_ns) / 1e9,
            "library": first.library,
            "modules": sorted({m for log in self.logs for m in log.modules}),
            "reads": int((data["op"] == "read").sum()),
            "writes": int((data["op"] == "write").sum()),
            "bytes_read": int(data.loc[data["op"] == "read", "length"].sum()),
            "bytes_written": int(data.loc[data["op"] == "write", "length"].sum()),
            "slow_ops": int(self.ops["slow"].sum()),
            "joined": self.matched is not None,
            "matched_requests": 0 if self.matched is None else len(self.matched),
        }


def find_logs(paths: Iterable[str | os.PathLike[str]]) -> list[Path]:
    """The Darshan logs named: files as given, directories for their `*.darshan` files."""
    found: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            found.extend(sorted(p.glob("*.darshan")))
        else:
            found.append(p)
    return found


def _ops_frame(logs: Sequence[DarshanLog], posix: pd.DataFrame) -> pd.DataFrame:
    t0 = min(log.start_ns for log in logs)
    parts = []
    for n, log in enumerate(logs):
        if not log.ops:
            continue
        f = pd.DataFrame([op.__dict__ for op in log.ops])
        # An MPI-IO call's bytes are traced again as the POSIX calls beneath it: keep the
        # POSIX ones, which are what reached BenchFS, where a file has both.
        posix_files = set(f.loc[f["module"] == "POSIX", "path"])
        f = f[(f["module"] == "POSIX") | ~f["path"].isin(posix_files)]
        f["log"] = n
        f["start_ns"] = log.start_ns + np.round(f["start_s"] * 1e9).astype(np.int64)
        f["end_ns"] = log.start_ns + np.round(f["end_s"] * 1e9).astype(np.int64)
        parts.append(f.drop(columns=["start_s", "end_s"]))
    flushes = _flushes(pd.concat(parts, ignore_index=True) if parts else None, posix)
    if flushes is not None:
        parts.append(flushes)
    cols = ["log", "rank", "host", "path", "op", "module", "offset", "length", "start_ns", "end_ns"]
    if not parts:
        ops = pd.DataFrame({c: pd.Series(dtype="int64") for c in cols})
        ops[["host", "path", "op", "module"]] = ops[["host", "path", "op", "module"]].astype(object)
    else:
        ops = pd.concat(parts, ignore_index=True)[cols]
    ops = ops.sort_values(["start_ns", "log", "rank"], kind="stable", ignore_index=True)
    ops.insert(0, "op_id", np.arange(len(ops)))
    ops["t_s"] = (ops["start_ns"] - t0) / 1e9
    ops["dur_ms"] = (ops["end_ns"] - ops["start_ns"]) / 1e6
    return ops


def _flushes(data: pd.DataFrame | None, posix: pd.DataFrame) -> pd.DataFrame | None:
    """Per file a rank wrote, the time from its last write to its close ("flush": the fsync
    and close that wait for the bytes written behind). It ends at the file's first close's
    start when that came after the last write, or at its close's end when the rank opened the
    file once (Darshan keeps a file's first close start and last close end)."""
    if data is None or data.empty or posix.empty or "POSIX_F_CLOSE_END_TIMESTAMP" not in posix:
        return None
    writes = data[data["op"] == "write"]
    last = writes.groupby(["log", "rank", "path"])["end_ns"].max().rename("start_ns")
    rec = posix[posix["rank"] >= 0].set_index(["log", "rank", "path"])
    f = rec.join(last, how="inner")
    if f.empty:
        return None
    to_ns = lambda col: f["log_start_ns"] + np.round(f[col] * 1e9)  # noqa: E731
    close_start, close_end = (
        to_ns("POSIX_F_CLOSE_START_TIMESTAMP"),
        to_ns("POSIX_F_CLOSE_END_TIMESTAMP"),
    )
    end = np.where(f["POSIX_OPENS"] == 1, close_end, close_start)
    f = f.assign(end_ns=end.astype(np.int64))
    f = f[(f["POSIX_F_CLOSE_END_TIMESTAMP"] > 0) & (f["end_ns"] > f["start_ns"])].reset_index()
    if f.empty:
        return None
    return pd.DataFrame(
        {
            "rank": f["rank"].astype(int),
            "host": "",
            "path": f["path"],
            "op": "flush",
            "module": "POSIX",
            "offset": 0,
            "length": 0,
            "log": f["log"].astype(int),
            "start_ns": f["start_ns"].astype(np.int64),
            "end_ns": f["end_ns"],
        }
    )


def _mark_slow(ops: pd.DataFrame, factor: float) -> None:
    """`slow`: at least `factor` x the median time of the operations of its kind and size
    (power-of-two classes; a flush: of the writes), and at least SLOW_FLOOR_MS."""
    size_class = np.floor(np.log2(ops["length"].clip(lower=1))).astype(int)
    median = ops.groupby([ops["op"], size_class])["dur_ms"].transform("median")
    writes = ops.loc[ops["op"] == "write", "dur_ms"]
    if len(writes):
        median = median.where(ops["op"] != "flush", writes.median())
    ops["slow"] = (ops["dur_ms"] >= factor * median) & (ops["dur_ms"] >= SLOW_FLOOR_MS)


def map_paths(app_paths: Iterable[str], names: pd.DataFrame) -> pd.DataFrame:
    """Each application path with the BenchFS file it is: the BenchFS path it ends with (at a
    `/`), the longest when several do. Columns: path, fs_path, file_hi, file_lo."""
    by_base: dict[str, list[tuple[str, int, int]]] = {}
    for row in names.itertuples(index=False):
        base = row.path.rsplit("/", 1)[-1]
        by_base.setdefault(base, []).append((row.path, int(row.file_hi), int(row.file_lo)))
    rows = []
    for path in sorted(set(app_paths)):
        best = None
        for fs_path, hi, lo in by_base.get(path.rsplit("/", 1)[-1], []):
            tail = fs_path if fs_path.startswith("/") else "/" + fs_path
            if (path == tail or path.endswith(tail)) and (
                best is None or len(fs_path) > len(best[0])
            ):
                best = (fs_path, hi, lo)
        if best is not None:
            rows.append((path, *best))
    return pd.DataFrame(rows, columns=["path", "fs_path", "file_hi", "file_lo"]).astype(
        {"file_hi": np.uint64, "file_lo": np.uint64}
    )


def _join(ops: pd.DataFrame, trace: pd.DataFrame, files: pd.DataFrame, chunk: int) -> pd.DataFrame:
    """The trace's data requests on the application's files, each with the application
    operation it served (op_id) and how (relation)."""
    code = {(int(r.file_hi), int(r.file_lo)): i for i, r in enumerate(files.itertuples())}
    path_code = {r.path: code[(int(r.file_hi), int(r.file_lo))] for r in files.itertuples()}
    data = ops[ops["op"].isin(["read", "write"]) & ops["path"].isin(path_code)]
    # One row per chunk an operation touched.
    first = data["offset"].to_numpy() // chunk
    last = (data["offset"].to_numpy() + np.maximum(data["length"].to_numpy(), 1) - 1) // chunk
    n = (last - first + 1).astype(np.int64)
    rows = np.repeat(np.arange(len(data)), n)
    within = np.arange(n.sum()) - np.repeat(np.cumsum(n) - n, n)
    kind = (data["op"].to_numpy() == "read").astype(np.int64)
    fcode = data["path"].map(path_code).to_numpy().astype(np.int64)
    app = pd.DataFrame(
        {
            "key": ((fcode[rows] << 41) | ((first[rows] + within) << 1) | kind[rows]),
            "at": data["start_ns"].to_numpy()[rows],
            "op_id": data["op_id"].to_numpy()[rows],
        }
    ).sort_values("at", kind="stable")
    codes = files[["file_hi", "file_lo"]].drop_duplicates().reset_index(drop=True)
    codes["fcode"] = [
        code[(int(h), int(lo))] for h, lo in zip(codes["file_hi"], codes["file_lo"], strict=True)
    ]
    t = trace[trace["op"].isin(["write", "read"])]
    t = t.assign(file_lo=t["file_lo"].to_numpy() & ~GENERATION_BITS).merge(
        codes, on=["file_hi", "file_lo"]
    )
    t["key"] = (
        (t["fcode"].to_numpy().astype(np.int64) << 41)
        | (t["chunk"].to_numpy().astype(np.int64) << 1)
        | (t["op"].astype(str).to_numpy() == "read").astype(np.int64)
    )
    t = t.drop(columns=["fcode"])
    t["at"] = t["t"].astype("int64")
    t = t.sort_values("at", kind="stable")
    m = pd.merge_asof(t, app, on="at", by="key", direction="backward")
    o = ops.set_index("op_id")
    end = o["end_ns"].reindex(m["op_id"]).to_numpy()  # NaN where no operation started before
    is_read = m["op"].astype(str).to_numpy() == "read"
    m["relation"] = np.where(
        m["at"].to_numpy() <= end, "in call", np.where(is_read, "ahead", "behind")
    )
    # A read fetched ahead is the next read's on its chunk: that call may have waited for it.
    ahead = is_read & (m["relation"].to_numpy() == "ahead")
    if ahead.any():
        later = pd.merge_asof(
            m.loc[ahead, ["at", "key"]].reset_index(), app, on="at", by="key", direction="forward"
        ).set_index("index")
        found = later["op_id"].dropna()
        m.loc[found.index, "op_id"] = found.to_numpy()
    m = m.dropna(subset=["op_id"]).astype({"op_id": np.int64})
    _give_to_flushes(m, ops)
    # Calls none of whose chunks saw a request: served from a cache or inline in the metadata.
    served = app["key"].isin(t["key"]).groupby(app["op_id"]).any()
    m.attrs["unserved"] = int((~served).sum())
    return m.drop(columns=["key"]).reset_index(drop=True)


def _give_to_flushes(m: pd.DataFrame, ops: pd.DataFrame) -> None:
    """Write-behind requests that arrived while the rank that wrote them was flushing and
    closing the file are the flush's: it waited for them."""
    flushes = ops[ops["op"] == "flush"].rename(columns={"op_id": "flush_id"})
    if flushes.empty or m.empty:
        return
    info = ops.set_index("op_id")[["log", "rank", "path"]]
    behind = m.index[m["relation"] == "behind"]
    who = info.reindex(m.loc[behind, "op_id"]).reset_index(drop=True)
    who["row"], who["at"] = behind, m.loc[behind, "at"].to_numpy()
    joined = who.merge(
        flushes[["log", "rank", "path", "flush_id", "start_ns", "end_ns"]],
        on=["log", "rank", "path"],
    )
    hit = joined[(joined["at"] >= joined["start_ns"]) & (joined["at"] <= joined["end_ns"])]
    m.loc[hit["row"], "op_id"] = hit["flush_id"].to_numpy()
    m.loc[hit["row"], "relation"] = "at flush"


def _sequential(ops: pd.DataFrame) -> pd.Series:
    """Whether each read or write started at or after the end of the rank's previous one on
    the file (Darshan's "sequential")."""
    o = ops.sort_values(["log", "rank", "path", "op", "start_ns"], kind="stable")
    prev_end = (
        (o["offset"] + o["length"]).groupby([o["log"], o["rank"], o["path"], o["op"]]).shift()
    )
    return (o["offset"] >= prev_end).reindex(ops.index).fillna(True)


def phases(
    da_ops: pd.DataFrame,
    th: Thresholds,
    trace: pd.DataFrame | None,
    posix: pd.DataFrame,
    t0_ns: int,
) -> pd.DataFrame:
    """The application's phases: runs of reads or of writes in time order (a run of fewer than
    max(3, 1%) operations joins the one before). Per phase its sizes, sequential share, files
    shared by ranks, files first opened in it, and with the servers' trace their requests,
    metadata requests and times."""
    ops = da_ops[da_ops["op"].isin(["read", "write"])].sort_values("start_ns", kind="stable")
    if ops.empty:
        return pd.DataFrame()
    kinds = ops["op"].to_numpy()
    run_id = np.concatenate([[0], np.cumsum(kinds[1:] != kinds[:-1])])
    sizes = np.bincount(run_id)
    small = max(3, int(0.01 * len(ops)))
    run_kind = kinds[np.flatnonzero(np.diff(run_id, prepend=-1))]
    label = np.zeros(len(sizes), dtype=np.int64)
    current, current_kind = 0, run_kind[0]
    for r in range(1, len(sizes)):
        if sizes[r] >= small and run_kind[r] != current_kind:
            current, current_kind = current + 1, run_kind[r]
        label[r] = current
    ops = ops.assign(phase=label[run_id], sequential=_sequential(da_ops).reindex(ops.index))
    rows = []
    previous_end = -math.inf
    for n, (_, p) in enumerate(ops.groupby("phase", sort=True), start=1):
        start, end = int(p["start_ns"].min()), int(p["end_ns"].max())
        ranks_per_file = p.groupby("path")["rank"].nunique()
        kind = p["op"].mode().iloc[0]
        row: dict[str, Any] = {
            "phase": n,
            "kind": kind,
            "start_s": (start - t0_ns) / 1e9,
            "end_s": (end - t0_ns) / 1e9,
            "ranks": int(p["rank"].nunique()),
            "ops": len(p),
            "bytes": int(p["length"].sum()),
            "median_bytes": float(p["length"].median()),
            "small_share": float((p["length"] < th.app_small_bytes).mean()),
            "sequential_share": float(p["sequential"].mean()),
            "files": int(p["path"].nunique()),
            "shared_files": int((ranks_per_file > 1).sum()),
            "opens": 0,
        }
        if not posix.empty and "POSIX_F_OPEN_START_TIMESTAMP" in posix.columns:
            # Files first opened since the previous phase ended: opened for this one.
            opened = posix["log_start_ns"] + posix["POSIX_F_OPEN_START_TIMESTAMP"] * 1e9
            own = (posix["rank"] >= 0) & (posix["POSIX_OPENS"] > 0)
            row["opens"] = int(((opened > previous_end) & (opened <= end) & own).sum())
        previous_end = end
        if trace is not None:
            t = trace["t"].astype("int64")
            inside = trace[(t >= start) & (t <= end)]
            data = inside[inside["op"].isin(["read", "write"])]
            row["server_requests"] = len(data)
            row["server_meta_requests"] = int((inside["op"] == "meta").sum())
            row["server_queue_p50_ms"] = _q(data["queue_ns"], 0.5)
            row["server_service_p50_ms"] = _q(data["device_ns"], 0.5)
            row["server_total_p99_ms"] = _q(data["total_ns"], 0.99)
        rows.append(row)
    return pd.DataFrame(rows)


def _q(ns: pd.Series, q: float) -> float:
    return float(ns.quantile(q)) / 1e6 if len(ns) else math.nan


def _slow_ops(
    ops: pd.DataFrame, matched: pd.DataFrame | None, servers: pd.DataFrame, limit: int = 50
) -> pd.DataFrame:
    """The slow application operations (slowest first) and the servers that held them: the
    requests of the same rank on the same file that were at a server while the call ran (its
    own, and those fetched ahead or sent behind for its neighbours, which a call can queue
    behind). `held_by` is the server of the one that overlapped the call longest."""
    slow = ops[ops["slow"]].sort_values("dur_ms", ascending=False).head(limit)
    cols = ["op_id", "log", "rank", "path", "op", "offset", "length", "t_s", "dur_ms"]
    out = slow[cols].reset_index(drop=True)
    if matched is None or matched.empty:
        return out
    node = dict(zip(servers["server"], servers["node"], strict=True))
    info = ops.set_index("op_id")[["log", "rank", "path"]]
    owner = info.reindex(matched["op_id"]).reset_index(drop=True)
    m = pd.concat([matched.reset_index(drop=True), owner], axis=1)
    done = m["at"] + m["total_ns"].astype(np.int64)
    by_owner = m.groupby(["log", "rank", "path"]).indices
    per = {}
    for op in slow.itertuples():
        rows = by_owner.get((op.log, op.rank, op.path))
        if rows is None:
            continue
        g = m.iloc[rows]
        overlap = (np.minimum(done.iloc[rows], op.end_ns) - np.maximum(g["at"], op.start_ns)).clip(
            lower=0
        )
        g = g[(overlap > 0) | (g["op_id"] == op.op_id)]
        if g.empty:
            continue
        overlap = overlap.loc[g.index]
        worst = g.loc[overlap.idxmax()]
        per[op.op_id] = {
            "servers": ", ".join(f"{s} ({node.get(s, '?')})" for s in sorted(g["server"].unique())),
            "held_by": int(worst["server"]) if overlap.max() > 0 else None,
            "requests": len(g),
            "waited_ms": float(overlap.max()) / 1e6,
            "server_queue_ms": float(worst["queue_ns"]) / 1e6,
            "server_service_ms": float(worst["device_ns"]) / 1e6,
            "server_total_ms": float(worst["total_ns"]) / 1e6,
            "relation": str(worst["relation"]),
        }
    extra = pd.DataFrame.from_dict(per, orient="index")
    return out.merge(extra, left_on="op_id", right_index=True, how="left")


def _by_server(ops: pd.DataFrame, matched: pd.DataFrame, slow: pd.DataFrame) -> pd.DataFrame:
    """Per server: the application operations it served, the slow ones it held (`_slow_ops`),
    and its queue and service time for the application's requests."""
    held = slow["held_by"].dropna().astype(int).value_counts() if "held_by" in slow else {}
    slow_ids = set(ops.loc[ops["slow"], "op_id"])
    rows = []
    for server, g in matched.groupby("server"):
        served = g["op_id"].unique()
        rows.append(
            {
                "server": int(server),
                "node": str(g["node"].iloc[0]),
                "app_ops": len(served),
                "slow_app_ops": int(sum(i in slow_ids for i in served)),
                "slow_held": int(held.get(int(server), 0)),
                "requests": len(g),
                "queue_p50_ms": _q(g["queue_ns"], 0.5),
                "queue_p99_ms": _q(g["queue_ns"], 0.99),
                "service_p50_ms": _q(g["device_ns"], 0.5),
                "service_p99_ms": _q(g["device_ns"], 0.99),
                "in_call_share": float((g["relation"] == "in call").mean()),
            }
        )
    return pd.DataFrame(rows)


def _alignment(ops: pd.DataFrame, matched: pd.DataFrame) -> pd.DataFrame:
    """Per log and rank, what the matched requests say about the offset between the
    application's clock and the servers': a request that arrived during a call bounds it from
    above (it cannot arrive before the call started); a read's first answered request bounds it
    from below (the call returned after it; later ones may be fetches ahead). `offset_lo_ms`..
    `offset_hi_ms` holds every offset consistent with both; 0 in it means the two clocks agree
    to within that (`within_ms`)."""
    inc = matched[matched["relation"] == "in call"]
    if inc.empty:
        return pd.DataFrame()
    o = ops.set_index("op_id")
    f = pd.DataFrame(
        {
            "op_id": inc["op_id"].to_numpy(),
            "log": o["log"].reindex(inc["op_id"]).to_numpy(),
            "rank": o["rank"].reindex(inc["op_id"]).to_numpy(),
            "read": inc["op"].astype(str).to_numpy() == "read",
            "lead_ms": (inc["at"].to_numpy() - o["start_ns"].reindex(inc["op_id"]).to_numpy())
            / 1e6,
            "done": inc["at"].to_numpy() + inc["total_ns"].to_numpy().astype(np.int64),
        }
    )
    first_done = f[f["read"]].groupby("op_id")["done"].min()
    tail = ((first_done - o["end_ns"].reindex(first_done.index)) / 1e6).rename("tail_ms")
    per_op = f.groupby("op_id").agg(
        log=("log", "first"),
        rank=("rank", "first"),
        requests=("lead_ms", "size"),
        lead_ms=("lead_ms", "min"),
    )
    per_op = per_op.join(tail)
    out = (
        per_op.groupby(["log", "rank"])
        .agg(
            requests=("requests", "sum"),
            offset_hi_ms=("lead_ms", "min"),
            offset_lo_ms=("tail_ms", "max"),
        )
        .reset_index()
    )
    out["agree"] = (out["offset_hi_ms"] >= 0) & ~(out["offset_lo_ms"] > 0)
    out["within_ms"] = np.maximum(
        out["offset_hi_ms"], -out["offset_lo_ms"]
    )  # NaN: one side unknown
    return out[["log", "rank", "requests", "offset_lo_ms", "offset_hi_ms", "within_ms", "agree"]]


def _write_behind(ops: pd.DataFrame, matched: pd.DataFrame) -> pd.DataFrame:
    """Per file and server: the application's write requests by when they reached the server
    (during the write call, behind it, or during the flush, which waited for them), and their
    server time."""
    w = matched[matched["op"].astype(str) == "write"]
    if w.empty:
        return pd.DataFrame()
    path = ops.set_index("op_id")["path"].reindex(w["op_id"]).to_numpy()
    g = w.assign(path=path).groupby(["path", "server", "relation"])
    out = g.agg(requests=("bytes", "size"), bytes=("bytes", "sum"), server_ms=("total_ns", "sum"))
    out["server_ms"] = out["server_ms"] / 1e6
    return out.reset_index()


def slow_ops_by_server(slow: pd.DataFrame, by_server: pd.DataFrame, th: Thresholds) -> Insight:
    """APP-007: the application's slow operations were held by one server."""
    i = Insight(
        "APP-007",
        "Slow application operations held by one server",
        "high",
        False,
        True,
        f"application operations {th.app_slow_factor:g} x slower than the median of their "
        f"kind and size (insights.app_slow_factor, and over {SLOW_FLOOR_MS:g} ms): at least 2, "
        "and one server's request was the longest for two thirds of them",
        recommendation="One server held the application up: see its node's devices and "
        "network in the servers' tables (per_node, slow_nodes) and screen it "
        "(benchfs-diagnose); excluding it moves its share to the others.",
    )
    if "held_by" not in slow.columns or by_server.empty:
        i.evaluated, i.reason = False, "no server trace joined with the log"
        return i
    held = slow["held_by"].dropna().astype(int)
    i.data = {"slow_ops": len(slow), "joined": len(held)}
    if len(held) < 2:
        return i
    top, count = held.value_counts().index[0], int(held.value_counts().iloc[0])
    i.data.update({"server": int(top), "held": count})
    if count * 3 < len(held) * 2:
        return i
    i.fired = True
    row = by_server[by_server["server"] == top].iloc[0]
    mine = slow[slow["held_by"] == top]
    i.evidence = [
        f"server {top} ({row['node']}) held {count} of {len(held)} slow operations that waited "
        f"for a server (the slowest {slow['dur_ms'].max():.1f} ms; kinds: "
        f"{', '.join(sorted(mine['op'].unique()))})",
        f"the requests they waited for: service {mine['server_service_ms'].median():.2f} ms and "
        f"queue {mine['server_queue_ms'].median():.2f} ms (medians); the calls waited "
        f"{mine['waited_ms'].median():.1f} ms for them",
        f"server {top}'s service time for all the application's requests: median "
        f"{row['service_p50_ms']:.2f} ms, p99 {row['service_p99_ms']:.2f} ms",
    ]
    rest = by_server[by_server["server"] != top]
    if len(rest):
        i.evidence.append(
            f"the other servers' p99 service time: {rest['service_p99_ms'].median():.2f} ms"
        )
    return i


def server_depth(trace: pd.DataFrame, t0_ns: int, points: int = 600) -> pd.DataFrame:
    """Per server, the requests it held (arrived, not yet answered) over time, sampled at
    `points` instants: t_s (since t0_ns), server, depth."""
    data = trace[trace["op"].isin(["read", "write", "fsync", "meta"])]
    if data.empty:
        return pd.DataFrame(columns=["t_s", "server", "depth"])
    arrive = data["t"].astype("int64").to_numpy()
    leave = arrive + data["total_ns"].to_numpy().astype(np.int64)
    grid = np.linspace(arrive.min(), leave.max(), points)
    rows = []
    for server in sorted(data["server"].unique()):
        sel = data["server"].to_numpy() == server
        a, b = np.sort(arrive[sel]), np.sort(leave[sel])
        depth = np.searchsorted(a, grid, side="right") - np.searchsorted(b, grid, side="right")
        rows.append(
            pd.DataFrame({"t_s": (grid - t0_ns) / 1e9, "server": int(server), "depth": depth})
        )
    return pd.concat(rows, ignore_index=True)


def _per_log_insights(
    logs: Sequence[DarshanLog], posix: pd.DataFrame, th: Thresholds
) -> list[Insight]:
    """The application insights of each log (Drishti reads one log at a time: ranks of
    different programs are not compared), merged: one fires where it fires for any log, its
    evidence named by program when there are several."""
    if len(logs) == 1 or posix.empty:
        return evaluate_app(posix, th)
    merged: list[Insight] | None = None
    for n, log in enumerate(logs):
        verdicts = evaluate_app(posix[posix["log"] == n], th)
        program = Path(log.exe.split(" ", 1)[0]).name or f"log {n}"
        if merged is None:
            merged = [replace(i, evidence=[]) for i in verdicts]
        for into, v in zip(merged, verdicts, strict=True):
            into.fired |= v.fired
            into.evaluated |= v.evaluated
            into.evidence += [f"{program} (log {n}): {e}" for e in v.evidence]
            if v.fired:
                into.data[f"log {n}"] = v.data
    assert merged is not None
    for i in merged:
        if i.evaluated:
            i.reason = ""
    return merged


def analyze_darshan(
    logs: Sequence[str | os.PathLike[str] | DarshanLog],
    thresholds: Thresholds,
    run: LoadedRun | None = None,
) -> DarshanAnalysis:
    """Read `logs`, judge the application's I/O and, with `run`, join it with the servers'."""
    read = [x if isinstance(x, DarshanLog) else read_log(x) for x in logs]
    if not read:
        raise AnalyzeError("ENOENT", "no Darshan log given")
    notes: list[str] = []
    frames = []
    for n, log in enumerate(read):
        f = posix_frame(log.posix)
        if not f.empty:
            frames.append(f.assign(log=n, log_start_ns=log.start_ns))
    posix = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    if not any(log.ops for log in read):
        notes.append(
            "no DXT trace in the logs (DXT_ENABLE_IO_TRACE was not set): the "
            "operations' tables are empty, the insights use Darshan's counters"
        )
    ops = _ops_frame(read, posix)
    if run is not None and not posix.empty:
        # With --via preload the BenchFS client in the program writes its telemetry into the
        # run's directory, and Darshan sees those writes too: they are not the program's.
        own = str(run.path) + "/"
        ours = posix["path"].str.startswith(own)
        if ours.any():
            notes.append(
                f"{int(ours.sum())} records of files in the run's own directory (the "
                "BenchFS client's telemetry) left out"
            )
            posix = posix[~ours].reset_index(drop=True)
            ops = ops[~ops["path"].str.startswith(own)].reset_index(drop=True)
            ops["op_id"] = np.arange(len(ops))
    _mark_slow(ops, thresholds.app_slow_factor)
    insights = _per_log_insights(read, posix, thresholds)
    t0 = min(log.start_ns for log in read)
    trace = run.trace if run is not None else None
    tables: dict[str, pd.DataFrame] = {}
    matched = None
    if run is not None and trace is None:
        notes.append(
            "the run has no per-operation trace (telemetry.trace off): the "
            "application's operations cannot be given to servers"
        )
    if run is not None and trace is not None:
        names = load_names(run.run_dir.telemetry_dir)
        files = map_paths(ops["path"], names)
        if files.empty:
            notes.append(
                "none of the log's files is named in the run's traces (server-*.names): "
                "was the log made on this run's cluster?"
            )
        chunk = int(run.config_value("layout", "chunk_size", DEFAULT_CHUNK) or DEFAULT_CHUNK)
        matched = _join(ops, trace, files, chunk)
        unserved = matched.attrs.get("unserved", 0)
        if unserved:
            notes.append(
                f"{unserved:,} reads and writes on BenchFS files reached no server: served "
                "from a cache, kept inline in the metadata, or their trace records dropped"
            )
    servers = run.servers() if run is not None else pd.DataFrame(columns=["server", "node"])
    tables["phases"] = phases(ops, thresholds, trace, posix, t0)
    tables["slow_ops"] = _slow_ops(ops, matched, servers)
    if matched is not None:
        tables["by_server"] = _by_server(ops, matched, tables["slow_ops"])
        tables["alignment"] = _alignment(ops, matched)
        tables["write_behind"] = _write_behind(ops, matched)
        insights.append(slow_ops_by_server(tables["slow_ops"], tables["by_server"], thresholds))
    else:
        empty = pd.DataFrame()
        insights.append(slow_ops_by_server(tables["slow_ops"], empty, thresholds))
    return DarshanAnalysis(read, ops, posix, insights, tables, matched, run, notes)

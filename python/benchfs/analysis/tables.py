"""The standard analyses of a loaded run: one DataFrame each, every one CSV-ready.

Server figures come from the telemetry snapshots (docs/telemetry.md); where a run also has
per-operation traces, distributions and slow-operation counts are computed exactly from them
instead. Histogram buckets that straddle a range edge (100 us, 5-8, ...) are split in
proportion to the integer values they cover on each side; means are always exact (sums).

Every function returns a DataFrame (empty, with its columns, when the run lacks what it needs;
`LoadedRun.notes` then says why) and never raises for a missing part.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from benchfs.analysis.iostat import is_member_device
from benchfs.analysis.run import LoadedRun
from benchfs.analysis.thresholds import Thresholds
from benchfs.slownodes import COLUMNS as SLOW_NODE_COLUMNS
from benchfs.slownodes import judge_nodes
from benchfs.telemetry import Telemetry, histogram_quantile

__all__ = [
    "DATA_OPS",
    "DEPTH_RANGES",
    "OP_TIME_RANGES",
    "bandwidth",
    "bimodal",
    "io_depth",
    "iostat_devices",
    "op_time_distribution",
    "op_time_stages",
    "per_node",
    "placement",
    "placement_summary",
    "range_shares",
    "rpc_by_target",
    "rpc_timeseries",
    "slow_nodes",
    "timeseries",
    "trace_arrays",
]

DATA_OPS = ("write", "read")
INF = math.inf
MS = 1e6
MIB = 1 << 20
OP_TIME_RANGES: tuple[tuple[str, float, float], ...] = (
    ("0-100us", 0, 100e3),
    ("100-500us", 100e3, 500e3),
    ("0.5-1ms", 500e3, 1e6),
    ("1-5ms", 1e6, 5e6),
    ("5-10ms", 5e6, 10e6),
    ("10-50ms", 10e6, 50e6),
    ("50-100ms", 50e6, 100e6),
    (">100ms", 100e6, INF),
)
"""Op-time ranges, in ns, each [lo, hi)."""
DEPTH_RANGES: tuple[tuple[str, float, float], ...] = (
    ("1", 1, 2),
    ("2-4", 2, 5),
    ("5-8", 5, 9),
    ("9-16", 9, 17),
    ("17-32", 17, 33),
    ("33-64", 33, 65),
    ("65-128", 65, 129),
    (">128", 129, INF),
)
"""io_depth ranges, each [lo, hi)."""


# ---------------------------------------------------------------------------------------------
# Trace helpers: numpy arrays with integer codes, derived once per run


@dataclass(frozen=True)
class TraceArrays:
    """The trace's columns as numpy arrays; `op` is 0 write, 1 read, 2 anything else."""

    nodes: list[str]
    node: np.ndarray
    op: np.ndarray
    t_ns: np.ndarray
    total_ns: np.ndarray
    device_ns: np.ndarray
    queue_ns: np.ndarray


def trace_arrays(run: LoadedRun) -> TraceArrays | None:
    """The run's trace as arrays (None without one); cached on the run."""
    tr = run.trace
    if tr is None or len(tr) == 0:
        return None
    if "trace" not in run.cache:
        ops = tr["op"].cat
        lut = np.full(len(ops.categories), 2, dtype=np.int8)
        for code, name in enumerate(ops.categories):
            if name in DATA_OPS:
                lut[code] = DATA_OPS.index(name)
        run.cache["trace"] = TraceArrays(
            nodes=[str(n) for n in tr["node"].cat.categories],
            node=tr["node"].cat.codes.to_numpy().astype(np.int64),
            op=lut[ops.codes.to_numpy()],
            t_ns=pd.DatetimeIndex(tr["t"]).asi8,
            total_ns=tr["total_ns"].to_numpy(),
            device_ns=tr["device_ns"].to_numpy(),
            queue_ns=tr["queue_ns"].to_numpy(),
        )
    return run.cache["trace"]


def _values(ta: TraceArrays, metric: str) -> np.ndarray:
    return {"total_ns": ta.total_ns, "device_ns": ta.device_ns, "queue_wait_ns": ta.queue_ns}[
        metric
    ]


# ---------------------------------------------------------------------------------------------
# Histogram helpers


def _fractions(lo: np.ndarray, hi: np.ndarray, a: float, b: float) -> np.ndarray:
    """Share of each bucket [lo, hi] (inclusive integers) that lies in [a, b)."""
    lo_f = lo.astype(np.float64)
    hi_f = hi.astype(np.float64) + 1.0
    overlap = np.clip(np.minimum(hi_f, b) - np.maximum(lo_f, a), 0.0, None)
    return overlap / (hi_f - lo_f)


def range_shares(
    lo: np.ndarray, hi: np.ndarray, counts: np.ndarray, ranges: Sequence[tuple[str, float, float]]
) -> np.ndarray:
    """Counts of histogram buckets [lo, hi] in each range (proportional split at range edges)."""
    c = counts.astype(np.float64)
    return np.array([(c * _fractions(lo, hi, a, b)).sum() for _, a, b in ranges])


def _exact_ranges(values: np.ndarray, ranges: Sequence[tuple[str, float, float]]) -> np.ndarray:
    edges = np.array([a for _, a, _ in ranges] + [INF])
    index = np.searchsorted(edges, values, side="right") - 1
    return np.bincount(index[index >= 0], minlength=len(ranges))[: len(ranges)].astype(float)


def bimodal(shares: Sequence[float], mode_share: float) -> bool:
    """Two ranges holding at least `mode_share` each, separated by a range holding less than
    half the smaller of them: two populations, not one spread-out one."""
    s = list(shares)
    for i in range(len(s)):
        for j in range(i + 2, len(s)):
            if s[i] >= mode_share and s[j] >= mode_share:
                if min(s[i + 1 : j]) < 0.5 * min(s[i], s[j]):
                    return True
    return False


def _latest_hist(run: LoadedRun, metric: str, ops: Sequence[str] | None) -> pd.DataFrame:
    """The whole-run buckets of a server histogram (last snapshot of every writer)."""
    tel = run.telemetry
    if tel is None:
        return pd.DataFrame(columns=["node", "server", "op", "bucket", "bucket_lo", "bucket_hi"])
    h = tel.latest_histograms()
    h = h[h["metric"] == metric]
    if ops is not None:
        h = h[h["op"].isin(list(ops))]
    return h


def _latest_stat(
    run: LoadedRun, name: str, ops: Sequence[str] | None, by: Sequence[str]
) -> pd.Series:
    """A counter (or histogram statistic) summed per group over the last snapshots."""
    tel = run.telemetry
    if tel is None:
        return pd.Series(dtype=np.int64)
    c = tel.latest_counters()
    c = c[c["metric"] == name]
    if ops is not None:
        c = c[c["op"].isin(list(ops))]
    if not by:
        return pd.Series({"all": int(c["value"].sum())})
    return c.groupby(list(by), observed=True)["value"].sum()


def _merged_quantiles(h: pd.DataFrame, qs: Sequence[float], vmin: int, vmax: int) -> list[float]:
    merged = h.groupby("bucket")["count"].sum().sort_index()
    return [
        float(histogram_quantile(merged.index.to_numpy(), merged.to_numpy(), q, vmin, vmax))
        for q in qs
    ]


def _extremes(run: LoadedRun, metric: str, ops: Sequence[str], by: str | None) -> pd.DataFrame:
    """min (over non-empty writers) and max of a histogram, per group."""
    tel = run.telemetry
    assert tel is not None
    c = tel.latest_counters()
    c = c[c["op"].isin(list(ops))]
    mx = c[c["metric"] == f"{metric}.max"]
    mn = c[c["metric"] == f"{metric}.min"]
    count = c[c["metric"] == f"{metric}.count"]
    keys = ["server", "worker", "op"]
    mn = mn.merge(count[[*keys, "value"]].rename(columns={"value": "n"}), on=keys)
    mn = mn[mn["n"] > 0]
    group = [by] if by else []
    if not group:
        return pd.DataFrame(
            {"vmin": [int(mn["value"].min()) if len(mn) else 0], "vmax": [int(mx["value"].max())]},
            index=["all"],
        )
    out = pd.DataFrame(
        {
            "vmin": mn.groupby(group, observed=True)["value"].min(),
            "vmax": mx.groupby(group, observed=True)["value"].max(),
        }
    )
    return out.fillna(0).astype(np.int64)


# ---------------------------------------------------------------------------------------------
# io_depth


def io_depth(run: LoadedRun) -> pd.DataFrame:
    """Device queue depth (`inflight_at_submit`) per node and overall.

    Columns: node ("all" for the whole run), submits, mean (exact), share_depth1, p50, max,
    one share column per DEPTH_RANGES label, mean_batch (SQEs per io_uring_enter) and
    share_batch1.
    """
    labels = [label for label, _, _ in DEPTH_RANGES]
    columns = ["node", "submits", "mean", "share_depth1", "p50", "max", *labels]
    columns += ["mean_batch", "share_batch1"]
    h = _latest_hist(run, "inflight_at_submit", None)
    if run.telemetry is None or h.empty:
        return pd.DataFrame(columns=columns)
    batch = _latest_hist(run, "submit_batch", None)
    sums = _latest_stat(run, "inflight_at_submit.sum", None, ["node"])
    bsums = _latest_stat(run, "submit_batch.sum", None, ["node"])
    ext = _extremes(run, "inflight_at_submit", [""], "node")
    rows: list[dict[str, Any]] = []
    groups = [(str(n), g) for n, g in h.groupby("node", observed=True)] + [("all", h)]
    for node, g in groups:
        n = int(g["count"].sum())
        if n == 0:
            continue
        lo, hi, cnt = g["bucket_lo"].to_numpy(), g["bucket_hi"].to_numpy(), g["count"].to_numpy()
        shares = range_shares(lo, hi, cnt, DEPTH_RANGES) / n
        total = int(sums.sum()) if node == "all" else int(sums.get(node, 0))
        vmax = int(ext["vmax"].max()) if node == "all" else int(ext.loc[node, "vmax"])
        vmin = int(ext["vmin"].min()) if node == "all" else int(ext.loc[node, "vmin"])
        bg = batch if node == "all" else batch[batch["node"] == node]
        bn = int(bg["count"].sum())
        btotal = int(bsums.sum()) if node == "all" else int(bsums.get(node, 0))
        b1 = int(bg.loc[bg["bucket_lo"] == 1, "count"].sum())
        rows.append(
            {
                "node": node,
                "submits": n,
                "mean": total / n,
                "share_depth1": float(cnt[lo == 1].sum()) / n,
                "p50": _merged_quantiles(g, [0.5], vmin, vmax)[0],
                "max": vmax,
                **dict(zip(labels, shares, strict=True)),
                "mean_batch": btotal / bn if bn else math.nan,
                "share_batch1": b1 / bn if bn else math.nan,
            }
        )
    return pd.DataFrame(rows, columns=columns)


# ---------------------------------------------------------------------------------------------
# Op-time distribution


STAGES = {
    "to send": "call_send_ns",
    "server queue": "call_queue_ns",
    "server service": "call_service_ns",
    "transport": "call_transport_ns",
    "client other": "call_other_ns",
    "buffered": "call_buffered_ns",
}
"""The stages of a data call (column name: client histogram; see `op_time_stages`)."""


def op_time_stages(tel: Telemetry | None) -> pd.DataFrame:
    """The p50 of a data call (`call_ns`, at the client) split into named stages, per data op.

    Every call is split at the client along its critical request (its chunk request answered
    last): from when that request could have been sent to its send (a window slot, a
    connection on first use, and the client's own time: on an oversubscribed node, its wait for
    a core), its time in the server's queue and the rest
    of its time there (both from the server's reply), its transport (its reply time less the
    server's: the network both ways and both event loops), and the rest of the call (before that
    request could be sent, and after its answer: the client library, and the call's other
    requests, such as an open's lookup). A call that sent no request (served from read-ahead, or
    left to write-behind) is all "buffered". Every call records every stage (0 for those it did
    not have) and its stages add up to its time, so their means add up to the mean call exactly
    (`mean_<stage>_share`). The p50s do not add exactly: the attributed share is the sum of the
    p50s of every stage but "client other" over the call's p50 (`unattributed_ms` is the rest,
    which "client other" and the p50s' inexact sum share).
    Columns: op, calls, call_p50_ms, one column per STAGES name (p50, ms), unattributed_ms,
    attributed_share, mean_<stage>_share. Empty without client telemetry that has the stages.
    """
    columns = ["op", "calls", "call_p50_ms", *STAGES, "unattributed_ms", "attributed_share"]
    columns += [f"mean_{name.replace(' ', '_')}_share" for name in STAGES]
    if tel is None or not tel.has_clients:
        return pd.DataFrame(columns=columns)
    c = tel.latest_counters("client")
    if not (c["metric"] == "call_send_ns.count").any():
        return pd.DataFrame(columns=columns)
    rows = []
    for op in DATA_OPS:

        def stat(metric: str, name: str, op: str = op) -> float:
            return float(c[(c["metric"] == f"{metric}.{name}") & (c["op"] == op)]["value"].sum())

        n = int(stat("call_send_ns", "count"))
        if n == 0:
            continue
        call = float(tel.quantile("call_ns", op, 0.5, source="client")) / MS
        p50 = {k: float(tel.quantile(m, op, 0.5, source="client")) / MS for k, m in STAGES.items()}
        sums = {k: stat(m, "sum") for k, m in STAGES.items()}
        whole = sum(sums.values())
        attributed = sum(v for k, v in p50.items() if k != "client other")
        rows.append(
            {
                "op": op,
                "calls": n,
                "call_p50_ms": call,
                **p50,
                "unattributed_ms": call - attributed,
                "attributed_share": attributed / call if call > 0 else math.nan,
                **{
                    f"mean_{k.replace(' ', '_')}_share": v / whole if whole else math.nan
                    for k, v in sums.items()
                },
            }
        )
    return pd.DataFrame(rows, columns=columns)


def op_time_distribution(
    run: LoadedRun, mode_share: float, metric: str = "total_ns"
) -> pd.DataFrame:
    """Server op times in fixed ranges, per data op and for both together.

    Columns: op ("write", "read", "all"), ops, one share column per OP_TIME_RANGES label,
    mean_ms (exact), p50_ms, p99_ms, mean_over_median, bimodal (see `bimodal`), source
    ("trace": exact; "histogram": proportional split at range edges). `metric` is total_ns
    (arrival to reply), device_ns or queue_wait_ns.
    """
    labels = [label for label, _, _ in OP_TIME_RANGES]
    columns = ["op", "ops", *labels, "mean_ms", "p50_ms", "p99_ms", "mean_over_median"]
    columns += ["bimodal", "source"]
    rows: list[dict[str, Any]] = []
    ta = trace_arrays(run)
    if ta is not None:
        values = _values(ta, metric)
        for op in (*DATA_OPS, "all"):
            v = values[ta.op < 2] if op == "all" else values[ta.op == DATA_OPS.index(op)]
            if len(v) == 0:
                continue
            shares = _exact_ranges(v, OP_TIME_RANGES) / len(v)
            p50, p99 = np.quantile(v, [0.5, 0.99])
            mean = float(v.mean())
            rows.append(
                {
                    "op": op,
                    "ops": len(v),
                    **dict(zip(labels, shares, strict=True)),
                    "mean_ms": mean / MS,
                    "p50_ms": p50 / MS,
                    "p99_ms": p99 / MS,
                    "mean_over_median": mean / p50 if p50 else math.nan,
                    "bimodal": bimodal(shares, mode_share),
                    "source": "trace",
                }
            )
        return pd.DataFrame(rows, columns=columns)
    if run.telemetry is None:
        return pd.DataFrame(columns=columns)
    h = _latest_hist(run, metric, DATA_OPS)
    sums = _latest_stat(run, f"{metric}.sum", DATA_OPS, ["op"])
    ext = _extremes(run, metric, DATA_OPS, "op")
    for op in (*DATA_OPS, "all"):
        g = h if op == "all" else h[h["op"] == op]
        n = int(g["count"].sum())
        if n == 0:
            continue
        shares = (
            range_shares(
                g["bucket_lo"].to_numpy(),
                g["bucket_hi"].to_numpy(),
                g["count"].to_numpy(),
                OP_TIME_RANGES,
            )
            / n
        )
        total = float(sums.sum()) if op == "all" else float(sums.get(op, 0))
        e = ext if op == "all" else ext.loc[[op]]
        p50, p99 = _merged_quantiles(g, [0.5, 0.99], int(e["vmin"].min()), int(e["vmax"].max()))
        mean = total / n
        rows.append(
            {
                "op": op,
                "ops": n,
                **dict(zip(labels, shares, strict=True)),
                "mean_ms": mean / MS,
                "p50_ms": p50 / MS,
                "p99_ms": p99 / MS,
                "mean_over_median": mean / p50 if p50 else math.nan,
                "bimodal": bimodal(shares, mode_share),
                "source": "histogram",
            }
        )
    return pd.DataFrame(rows, columns=columns)


# ---------------------------------------------------------------------------------------------
# Per node


PER_NODE_COLUMNS = [
    "node",
    "servers",
    "ops",
    "slow_ops",
    "slow_pct",
    "mean_ms",
    "p50_ms",
    "p99_ms",
    "read_ops",
    "read_mean_ms",
    "write_ops",
    "write_mean_ms",
    "read_write_ratio",
    "source",
]


def per_node(run: LoadedRun, slow_ms: float, metric: str = "total_ns") -> pd.DataFrame:
    """The per-node table over data operations (reads and writes).

    Columns: node, servers (ids), ops, slow_ops (op time above `slow_ms`), slow_pct, mean_ms,
    p50_ms, p99_ms, read_ops, read_mean_ms, write_ops, write_mean_ms, read_write_ratio (mean
    read time / mean write time), source. Sorted by mean op time, slowest first. Which nodes
    slowed the run, and their share of its delay, is the judgment's (`slow_nodes`).
    """
    slow_ns = slow_ms * MS
    servers = run.servers()
    ids = servers.groupby("node")["server"].apply(lambda s: " ".join(map(str, sorted(s))))
    ta = trace_arrays(run)
    rows: list[dict[str, Any]] = []
    if ta is not None:
        data = ta.op < 2
        v = _values(ta, metric)[data].astype(np.float64)
        nc, oc = ta.node[data], ta.op[data].astype(np.int64)
        k = len(ta.nodes)
        n = np.bincount(nc, minlength=k)
        total = np.bincount(nc, weights=v, minlength=k)
        slow = np.bincount(nc, weights=v > slow_ns, minlength=k)
        rw_n = np.bincount(nc * 2 + oc, minlength=2 * k)
        rw_sum = np.bincount(nc * 2 + oc, weights=v, minlength=2 * k)
        order = np.argsort(nc, kind="stable")
        ends = np.cumsum(n)
        for code, node in enumerate(ta.nodes):
            if n[code] == 0:
                continue
            part = v[order[ends[code] - n[code] : ends[code]]]
            p50, p99 = np.quantile(part, [0.5, 0.99])
            by_op = pd.DataFrame(
                {"count": rw_n[2 * code : 2 * code + 2], "mean": rw_sum[2 * code : 2 * code + 2]},
                index=pd.MultiIndex.from_tuples([(node, "write"), (node, "read")]),
            )
            by_op["mean"] = by_op["mean"] / by_op["count"].replace(0, np.nan)
            by_op = by_op[by_op["count"] > 0]
            rows.append(
                {
                    "node": node,
                    "ops": int(n[code]),
                    "slow_ops": int(slow[code]),
                    "mean_ms": total[code] / n[code] / MS,
                    "p50_ms": p50 / MS,
                    "p99_ms": p99 / MS,
                    **_rw(by_op, node),
                    "source": "trace",
                }
            )
    elif run.telemetry is not None:
        h = _latest_hist(run, metric, DATA_OPS)
        if h.empty:
            return pd.DataFrame(columns=PER_NODE_COLUMNS)
        ext = _extremes(run, metric, DATA_OPS, "node")
        sums = _latest_stat(run, f"{metric}.sum", DATA_OPS, ["node", "op"])
        counts = _latest_stat(run, f"{metric}.count", DATA_OPS, ["node", "op"])
        by_op = pd.DataFrame({"count": counts, "mean": sums / counts.replace(0, np.nan)})
        lo, hi = h["bucket_lo"].to_numpy(), h["bucket_hi"].to_numpy()
        h = h.assign(slow=h["count"].to_numpy() * _fractions(lo, hi, slow_ns, INF))
        for node, g in h.groupby("node", observed=True):
            node = str(node)
            n = int(g["count"].sum())
            if n == 0:
                continue
            p50, p99 = _merged_quantiles(
                g, [0.5, 0.99], int(ext.loc[node, "vmin"]), int(ext.loc[node, "vmax"])
            )
            rows.append(
                {
                    "node": node,
                    "ops": n,
                    "slow_ops": float(g["slow"].sum()),
                    "mean_ms": float(sums.loc[node].sum()) / n / MS,
                    "p50_ms": p50 / MS,
                    "p99_ms": p99 / MS,
                    **_rw(by_op, node),
                    "source": "histogram",
                }
            )
    if not rows:
        return pd.DataFrame(columns=PER_NODE_COLUMNS)
    out = pd.DataFrame(rows)
    out["servers"] = out["node"].map(ids).fillna("")
    out["slow_pct"] = 100.0 * out["slow_ops"] / out["ops"]
    out = out.sort_values("mean_ms", ascending=False, ignore_index=True)
    return out[PER_NODE_COLUMNS]


def slow_nodes(run: LoadedRun, judgment: Thresholds) -> pd.DataFrame:
    """The judgment of the run (`benchfs.slownodes.judge_nodes`, under the `[diagnose]`
    thresholds): per node and op, mean op time, delay and its share, whether the node stood
    out and was judged slow, on what grounds, and since when. Empty without server telemetry."""
    if run.telemetry is None:
        return pd.DataFrame(columns=SLOW_NODE_COLUMNS)
    return judge_nodes(run.telemetry, judgment)


def _rw(by_op: pd.DataFrame, node: str) -> dict[str, Any]:
    """read/write counts, means (ms) and their ratio for one node of a (node, op) frame."""
    out: dict[str, Any] = {}
    for op in ("read", "write"):
        key = (node, op)
        present = key in by_op.index
        out[f"{op}_ops"] = int(by_op.loc[key, "count"]) if present else 0
        mean = float(by_op.loc[key, "mean"]) / MS if present else math.nan
        out[f"{op}_mean_ms"] = mean
    w, r = out["write_mean_ms"], out["read_mean_ms"]
    out["read_write_ratio"] = r / w if w and not math.isnan(w) and not math.isnan(r) else math.nan
    return out


# ---------------------------------------------------------------------------------------------
# Time series


TIMESERIES_COLUMNS = ["node", "t_s", "ops", "slow_ops", "slow_pct", "mean_ms", "source"]


def _interval_s(run: LoadedRun, interval_s: float | None) -> float:
    if interval_s:
        return float(interval_s)
    ms = run.config_value("telemetry", "interval_ms", 1000)
    return max(float(ms) / 1000.0, 0.1)


def _t0(run: LoadedRun) -> pd.Timestamp | None:
    start, _ = run.window()
    if run.trace is not None and len(run.trace):
        first = run.trace["t"].min()
        start = first if start is None else min(start, first)
    return start


BANDWIDTH_COLUMNS = ["node", "t_s", "write_mib_s", "read_mib_s"]


def bandwidth(run: LoadedRun, interval_s: float | None = None) -> pd.DataFrame:
    """Per node and interval, and in total (node "all"): MiB/s written and read, from the
    servers' byte counters (each snapshot's bytes since the writer's previous one, put in the
    interval it was taken in). `t_s` is the interval's start since the run started."""
    t0 = _t0(run)
    if run.telemetry is None or t0 is None:
        return pd.DataFrame(columns=BANDWIDTH_COLUMNS)
    step = _interval_s(run, interval_s)
    r = run.telemetry.rates()
    r = r[(r["metric"] == "bytes") & r["op"].isin(DATA_OPS)]
    if r.empty:
        return pd.DataFrame(columns=BANDWIDTH_COLUMNS)
    rel = (pd.DatetimeIndex(r["t"]).asi8 - t0.value) / 1e9
    frame = pd.DataFrame(
        {
            "node": r["node"].astype(str).to_numpy(),
            "t_s": np.floor(np.clip(rel, 0, None) / step) * step,
            "op": r["op"].astype(str).to_numpy(),
            "mib_s": r["delta"].to_numpy() / MIB / step,
        }
    )
    per_node = frame.pivot_table(
        index=["node", "t_s"], columns="op", values="mib_s", aggfunc="sum", fill_value=0.0
    )
    total = per_node.groupby(level="t_s").sum()
    total.index = pd.MultiIndex.from_product([["all"], total.index], names=["node", "t_s"])
    out = pd.concat([per_node, total]).reset_index()
    for op in DATA_OPS:
        out[f"{op}_mib_s"] = out[op] if op in out else 0.0
    return out[BANDWIDTH_COLUMNS].sort_values(["node", "t_s"], ignore_index=True)


def timeseries(
    run: LoadedRun, slow_ms: float, interval_s: float | None = None, metric: str = "total_ns"
) -> pd.DataFrame:
    """Per node and interval: ops, slow ops (above `slow_ms`), slow_pct, mean op time.

    `t_s` is the interval's start in seconds since the run started. From traces (by arrival
    time) when the run has them, else from the differences of successive snapshots (an
    interval then holds the operations completed since the writer's previous snapshot).
    """
    step = _interval_s(run, interval_s)
    slow_ns = slow_ms * MS
    t0 = _t0(run)
    ta = trace_arrays(run)
    if ta is not None and t0 is not None:
        data = ta.op < 2
        v = _values(ta, metric)[data].astype(np.float64)
        nc = ta.node[data]
        b = np.floor(np.clip((ta.t_ns[data] - t0.value) / 1e9, 0, None) / step).astype(np.int64)
        nb = int(b.max()) + 1 if len(b) else 1
        key = nc * nb + b
        size = len(ta.nodes) * nb
        count = np.bincount(key, minlength=size)
        present = np.flatnonzero(count)
        out = pd.DataFrame(
            {
                "node": np.array(ta.nodes, dtype=object)[present // nb],
                "t_s": (present % nb) * step,
                "ops": count[present],
                "slow_ops": np.bincount(key, weights=v > slow_ns, minlength=size)[present],
                "mean_ms": np.bincount(key, weights=v, minlength=size)[present]
                / count[present]
                / MS,
            }
        )
        out["source"] = "trace"
    elif run.telemetry is not None and t0 is not None:
        tel = run.telemetry
        h = tel.histograms
        h = h[(h["metric"] == metric) & h["op"].isin(DATA_OPS)]
        if h.empty:
            return pd.DataFrame(columns=TIMESERIES_COLUMNS)
        keys = ["server", "worker", "op", "bucket"]
        h = h.sort_values([*keys, "t"], ignore_index=True)
        count = h["count"].to_numpy()
        same = np.zeros(len(h), dtype=bool)  # same series as the previous row
        same[1:] = True
        for k in keys:
            col = h[k].cat.codes.to_numpy() if hasattr(h[k], "cat") else h[k].to_numpy()
            same[1:] &= col[1:] == col[:-1]
        prev = np.concatenate(([0], count[:-1]))
        delta = np.where(same & (count >= prev), count - prev, count)
        slow = delta * _fractions(
            h["bucket_lo"].to_numpy(), h["bucket_hi"].to_numpy(), slow_ns, INF
        )
        rel = (pd.DatetimeIndex(h["t"]).asi8 - t0.value) / 1e9
        hist = pd.DataFrame(
            {
                "node": h["node"].astype(str).to_numpy(),
                "t_s": np.floor(np.clip(rel, 0, None) / step) * step,
                "ops": delta,
                "slow_ops": slow,
            }
        )
        r = tel.rates()
        r = r[r["metric"].isin([f"{metric}.sum"]) & r["op"].isin(DATA_OPS)]
        rel_r = (pd.DatetimeIndex(r["t"]).asi8 - t0.value) / 1e9
        sums = (
            pd.DataFrame(
                {
                    "node": r["node"].astype(str).to_numpy(),
                    "t_s": np.floor(np.clip(rel_r, 0, None) / step) * step,
                    "sum": r["delta"].to_numpy(),
                }
            )
            .groupby(["node", "t_s"])["sum"]
            .sum()
        )
        out = hist.groupby(["node", "t_s"])[["ops", "slow_ops"]].sum()
        out = out[out["ops"] > 0]
        out["mean_ms"] = sums.reindex(out.index).to_numpy() / out["ops"].to_numpy() / MS
        out = out.reset_index()
        out["source"] = "histogram"
    else:
        return pd.DataFrame(columns=TIMESERIES_COLUMNS)
    out["slow_pct"] = 100.0 * out["slow_ops"] / out["ops"]
    return out[TIMESERIES_COLUMNS].sort_values(["node", "t_s"], ignore_index=True)


# ---------------------------------------------------------------------------------------------
# Placement


PLACEMENT_COLUMNS = [
    "server",
    "node",
    "write_bytes",
    "write_ops",
    "read_bytes",
    "read_ops",
    "chunks",
    "bytes_share",
    "client_requests",
]


def placement(run: LoadedRun) -> pd.DataFrame:
    """Bytes and chunks per server (every member of the run, idle ones included).

    Columns: server, node, write_bytes, write_ops, read_bytes, read_ops, chunks (distinct
    chunks written, from traces; NaN without), bytes_share (of all bytes written),
    client_requests (requests the clients sent it, from client telemetry; NaN without).
    """
    servers = run.servers()
    if servers.empty:
        return pd.DataFrame(columns=PLACEMENT_COLUMNS)
    out = servers.copy()
    for op in DATA_OPS:
        for metric, col in (("bytes", f"{op}_bytes"), ("ops", f"{op}_ops")):
            s = _latest_stat(run, metric, [op], ["server"])
            out[col] = out["server"].map(s).fillna(0).astype(np.int64)
    ta = trace_arrays(run)
    if ta is not None:
        assert run.trace is not None
        out["chunks"] = out["server"].map(_distinct_chunks(run.trace, ta.op == 0)).fillna(0)
    else:
        out["chunks"] = math.nan
    total = out["write_bytes"].sum()
    out["bytes_share"] = out["write_bytes"] / total if total else 0.0
    if run.has_clients:
        assert run.telemetry is not None
        c = run.telemetry.latest_counters("client")
        req = c[c["metric"] == "requests"].groupby("target")["value"].sum()
        out["client_requests"] = out["server"].map(req).fillna(0)
    else:
        out["client_requests"] = math.nan
    return out[PLACEMENT_COLUMNS]


def _distinct_chunks(trace: pd.DataFrame, writes: np.ndarray) -> pd.Series:
    """Distinct (file, chunk) written per server, exactly: every key column is factorised and
    the codes combined into one integer (hashing the rows when the product would overflow)."""
    cols = [trace[c].to_numpy()[writes] for c in ("server", "file_hi", "file_lo", "chunk")]
    key = np.zeros(len(cols[0]), dtype=np.int64)
    total = 1
    servers: np.ndarray | None = None
    for col in cols:
        codes, uniques = pd.factorize(col, sort=False)
        if total * max(len(uniques), 1) >= 2**62:
            rows = pd.DataFrame(dict(zip("shlc", cols, strict=True))).drop_duplicates()
            return rows.groupby("s").size()
        key = key * len(uniques) + codes
        total *= max(len(uniques), 1)
        if servers is None:
            servers = uniques
    if servers is None or len(key) == 0:
        return pd.Series(dtype=np.int64)
    per_server = total // max(len(servers), 1)
    counts = np.bincount(pd.unique(key) // per_server, minlength=len(servers))
    return pd.Series(counts, index=servers.astype(np.int64))


def _balance(values: pd.Series) -> tuple[float, float]:
    v = values.astype(np.float64).to_numpy()
    mean = v.mean() if len(v) else 0.0
    if mean <= 0:
        return math.nan, math.nan
    return float(v.max() / mean), float(v.std() / mean)


def placement_summary(table: pd.DataFrame) -> dict[str, Any]:
    """max/mean and coefficient of variation of bytes, ops and chunks across servers."""
    out: dict[str, Any] = {"servers": len(table)}
    for col in ("write_bytes", "write_ops", "read_bytes", "chunks", "client_requests"):
        if col in table and table[col].notna().all() and len(table):
            out[f"{col}_max_over_mean"], out[f"{col}_cv"] = _balance(table[col])
        else:
            out[f"{col}_max_over_mean"] = out[f"{col}_cv"] = math.nan
    used = table["write_bytes"] > 0 if len(table) else pd.Series(dtype=bool)
    out["unused_servers"] = [int(s) for s in table.loc[~used, "server"]] if used.any() else []
    return out


# ---------------------------------------------------------------------------------------------
# RPC by target (client telemetry)


RPC_COLUMNS = [
    "target",
    "node",
    "requests",
    "retries",
    "retry_pct",
    "timeouts",
    "busy",
    "errors",
    "bytes",
    "mean_ms",
    "p50_ms",
    "p99_ms",
]


def rpc_by_target(run: LoadedRun) -> pd.DataFrame:
    """Client-side RPC figures per target server (empty without client telemetry).

    Columns: target, node, requests (attempts), retries, retry_pct, timeouts, busy (EAGAIN
    replies), errors, bytes, mean_ms, p50_ms, p99_ms (one attempt: send to reply).
    """
    if not run.has_clients:
        return pd.DataFrame(columns=RPC_COLUMNS)
    tel = run.telemetry
    assert tel is not None
    c = tel.latest_counters("client")
    c = c[c["target"] >= 0]
    per = c.pivot_table(
        index="target", columns="metric", values="value", aggfunc="sum", observed=True
    )
    per.columns = [str(x) for x in per.columns]
    h = tel.latest_histograms("client")
    h = h[h["metric"] == "rpc_ns"]
    mins = c[c["metric"] == "rpc_ns.min"]
    counts = c[c["metric"] == "rpc_ns.count"][["client", "worker", "op", "target", "value"]]
    mins = mins.merge(
        counts.rename(columns={"value": "n"}), on=["client", "worker", "op", "target"]
    )
    mins = mins[mins["n"] > 0].groupby("target")["value"].min()
    maxs = c[c["metric"] == "rpc_ns.max"].groupby("target")["value"].max()
    nodes = run.servers().set_index("server")["node"]
    rows = []
    for target, row in per.iterrows():
        g = h[h["target"] == target]
        n = float(row.get("rpc_ns.count", 0))
        p50, p99 = (
            _merged_quantiles(g, [0.5, 0.99], int(mins.get(target, 0)), int(maxs.get(target, 0)))
            if len(g)
            else (math.nan, math.nan)
        )
        requests = float(row.get("requests", 0))
        rows.append(
            {
                "target": int(target),
                "node": str(nodes.get(target, "")),
                "requests": int(requests),
                "retries": int(row.get("retries", 0)),
                "retry_pct": 100.0 * row.get("retries", 0) / requests if requests else math.nan,
                "timeouts": int(row.get("timeouts", 0)),
                "busy": int(row.get("busy", 0)),
                "errors": int(row.get("errors", 0)),
                "bytes": int(row.get("bytes", 0)),
                "mean_ms": float(row.get("rpc_ns.sum", 0)) / n / MS if n else math.nan,
                "p50_ms": p50 / MS,
                "p99_ms": p99 / MS,
            }
        )
    return pd.DataFrame(rows, columns=RPC_COLUMNS).sort_values("target", ignore_index=True)


RPC_TS_COLUMNS = ["t_s", "target", "requests", "retries", "timeouts", "mean_ms"]


def rpc_timeseries(run: LoadedRun, interval_s: float | None = None) -> pd.DataFrame:
    """Per interval and target: requests, retries, timeouts and mean RPC time (client side)."""
    t0 = _t0(run)
    if not run.has_clients or t0 is None:
        return pd.DataFrame(columns=RPC_TS_COLUMNS)
    assert run.telemetry is not None
    step = _interval_s(run, interval_s)
    r = run.telemetry.rates("client")
    r = r[r["target"] >= 0]
    rel = (pd.DatetimeIndex(r["t"]).asi8 - t0.value) / 1e9
    frame = pd.DataFrame(
        {
            "t_s": np.floor(np.clip(rel, 0, None) / step) * step,
            "target": r["target"].to_numpy(),
            "metric": r["metric"].astype(str).to_numpy(),
            "delta": r["delta"].to_numpy(),
        }
    )
    wide = frame.pivot_table(
        index=["t_s", "target"], columns="metric", values="delta", aggfunc="sum"
    ).fillna(0)
    out = pd.DataFrame(index=wide.index)
    for col in ("requests", "retries", "timeouts"):
        out[col] = wide[col] if col in wide else 0
    n = wide["rpc_ns.count"] if "rpc_ns.count" in wide else 0
    total = wide["rpc_ns.sum"] if "rpc_ns.sum" in wide else 0
    with np.errstate(divide="ignore", invalid="ignore"):
        out["mean_ms"] = np.where(n > 0, total / np.where(n > 0, n, 1) / MS, np.nan)
    return out.reset_index()[RPC_TS_COLUMNS]


# ---------------------------------------------------------------------------------------------
# iostat


IOSTAT_COLUMNS = [
    "node",
    "device",
    "member",
    "samples",
    "r_s",
    "w_s",
    "rkB_s",
    "wkB_s",
    "r_await_mean",
    "r_await_max",
    "w_await_mean",
    "w_await_max",
    "aqu_sz_mean",
    "aqu_sz_max",
    "util_mean",
]


def iostat_devices(run: LoadedRun, active_only: bool = True) -> pd.DataFrame:
    """Per node and device during the run: rates, await (mean over active samples), queue.

    Only samples inside the run's time window count; await means are over samples where the
    device did that kind of I/O (r/s > 0 for r_await), as people read them. With
    `active_only`, devices that did no I/O in the window are left out. `member` is False for
    md/dm/loop devices.
    """
    io = run.iostat
    if io is None or io.empty:
        return pd.DataFrame(columns=IOSTAT_COLUMNS)
    start, end = run.window()
    d = io
    if start is not None and end is not None and d["t"].notna().any():
        slack = pd.Timedelta(seconds=1)
        d = d[(d["t"] >= start - slack) & (d["t"] <= end + slack)]
    rows = []
    for (node, device), g in d.groupby(["node", "device"]):
        reads, writes = g[g["r_s"] > 0], g[g["w_s"] > 0]
        if active_only and reads.empty and writes.empty:
            continue
        rows.append(
            {
                "node": node,
                "device": device,
                "member": is_member_device(str(device)),
                "samples": len(g),
                "r_s": g["r_s"].mean(),
                "w_s": g["w_s"].mean(),
                "rkB_s": g["rkB_s"].mean(),
                "wkB_s": g["wkB_s"].mean(),
                "r_await_mean": reads["r_await"].mean() if len(reads) else math.nan,
                "r_await_max": reads["r_await"].max() if len(reads) else math.nan,
                "w_await_mean": writes["w_await"].mean() if len(writes) else math.nan,
                "w_await_max": writes["w_await"].max() if len(writes) else math.nan,
                "aqu_sz_mean": g["aqu_sz"].mean(),
                "aqu_sz_max": g["aqu_sz"].max(),
                "util_mean": g["util"].mean(),
            }
        )
    return pd.DataFrame(rows, columns=IOSTAT_COLUMNS)

"""Export per-operation trace records as Chrome trace JSON (open it in Perfetto or chrome://tracing).

Operations overlap on a server worker, so each is an async slice ("b"/"e" events with the
record's index as id) on the track of its server (process) and worker (thread), with a nested
"device" slice from submission to completion; queue time is the gap before it. Args carry the
file id (hex), chunk, bytes and the three durations.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

__all__ = ["DEFAULT_LIMIT", "chrome_trace", "write_chrome_trace"]

DEFAULT_LIMIT = 200_000
"""Operations exported at most (the earliest); a browser struggles beyond a few hundred MB."""


def chrome_trace(trace: pd.DataFrame, limit: int = DEFAULT_LIMIT) -> dict[str, Any]:
    """The Trace Event Format object for the earliest `limit` operations of `trace`."""
    d = trace.sort_values("t", kind="stable").head(limit)
    t0 = int(pd.DatetimeIndex(d["t"]).asi8.min()) if len(d) else 0
    start_us = (pd.DatetimeIndex(d["t"]).asi8 - t0) / 1000.0
    total_us = d["total_ns"].to_numpy() / 1000.0
    queue_us = d["queue_ns"].to_numpy() / 1000.0
    device_us = d["device_ns"].to_numpy() / 1000.0
    events: list[dict[str, Any]] = []
    servers = d.drop_duplicates("server")[["server", "node"]]
    for server, node in zip(servers["server"], servers["node"], strict=True):
        events.append(
            {
                "name": "process_name",
                "ph": "M",
                "pid": int(server),
                "tid": 0,
                "args": {"name": f"server {server} ({node})"},
            }
        )
    files = [f"{hi:016x}{lo:016x}" for hi, lo in zip(d["file_hi"], d["file_lo"], strict=True)]
    cols = zip(
        range(len(d)),
        d["op"].astype(str),
        d["server"],
        d["worker"],
        start_us,
        total_us,
        queue_us,
        device_us,
        files,
        d["chunk"],
        d["bytes"],
        d["error"],
        strict=True,
    )
    for k, op, server, worker, ts, dur, q, dev, file_id, chunk, nbytes, err in cols:
        common = {"cat": "benchfs", "id": k, "pid": int(server), "tid": int(worker)}
        args = {
            "file": file_id,
            "chunk": int(chunk),
            "bytes": int(nbytes),
            "queue_us": round(q, 3),
            "device_us": round(dev, 3),
            "total_us": round(dur, 3),
            "error": bool(err),
        }
        events.append({**common, "name": op, "ph": "b", "ts": round(ts, 3), "args": args})
        if dev > 0:
            d0 = ts + q
            events.append({**common, "name": "device", "ph": "b", "ts": round(d0, 3)})
            events.append({**common, "name": "device", "ph": "e", "ts": round(d0 + dev, 3)})
        events.append({**common, "name": op, "ph": "e", "ts": round(ts + dur, 3)})
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {
            "exported_ops": len(d),
            "trace_ops": len(trace),
            "t0_unix_ns": t0,
            "truncated": bool(len(trace) > len(d)),
        },
    }


def write_chrome_trace(
    trace: pd.DataFrame, path: str | os.PathLike[str], limit: int = DEFAULT_LIMIT
) -> dict[str, Any]:
    """Write the Chrome trace of `trace` to `path`; returns its `otherData` summary."""
    obj = chrome_trace(trace, limit)
    Path(path).write_text(json.dumps(obj, separators=(",", ":"), default=_default))
    return obj["otherData"]


def _default(o: Any) -> Any:
    if isinstance(o, np.generic):
        return o.item()
    raise TypeError(type(o).__name__)

"""In-run judgment: from a run's server telemetry and iostat captures, which nodes were slow,
since when, on which device, what share of the run's delay they caused, and whether the
pre-run screen had flagged them (a slow node may pass a screen and slow down later).

Which nodes, since when and their share of the delay are the one judgment of a run
(`benchfs.slownodes`, also behind benchfs-analyze's BFS-003). This adds:

- Device: the node's iostat capture (`RunDir.iostat_capture`): the device with the highest
  request-weighted r_await, and its ratio to the node's other devices; from it the kind.
- The exclusion list (`excluded.txt`/`excluded.json`, as a screen writes) of the nodes
  judged slow, and the history entry.
"""

from __future__ import annotations

import csv
import io
import math
import statistics
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from benchfs import telemetry
from benchfs.diagnose import history
from benchfs.diagnose.judge import (
    KIND_ABOVE,
    KIND_DEVICE,
    KIND_UNCLEAR,
    Thresholds,
    exclusion_cap,
)
from benchfs.errors import DiagnoseError, ParseError
from benchfs.nodes import Exclusion, load_nodes, write_exclusions
from benchfs.probes import iostat
from benchfs.results import RunDir, read_json, write_json_atomic, write_text_atomic
from benchfs.slownodes import OPS, judge_nodes, slow_node_names

__all__ = ["judge_run"]


def _devices(run: RunDir, node: str) -> tuple[dict[str, Any] | None, str | None]:
    path = run.iostat_capture(node)
    if not path.exists():
        return None, None
    try:
        samples = iostat.read_iostat(path, partial=True)
    except ParseError as e:
        return None, str(e)
    stats = {d: s for d, s in iostat.summarize(samples).items() if s.r_s > 0 or s.w_s > 0}
    if not stats:
        return None, f"{path}: no device activity"
    worst = max(stats.values(), key=lambda s: s.r_await)
    others = [s.r_await for s in stats.values() if s.device != worst.device and s.r_s > 0]
    return {
        "device": worst.device,
        "r_await_ms": worst.r_await,
        "aqu_sz": worst.aqu_sz,
        "util_pct": worst.util,
        "twin_ratio": worst.r_await / max(min(others), 1e-3) if others else None,
        "devices": {d: s.to_json() for d, s in stats.items()},
    }, None


def _screen_flags(run: RunDir, screen: Path | None) -> dict[str, str] | None:
    path = screen or (run.prerun_screen if run.prerun_screen.exists() else None)
    if path is None:
        return None
    if path.is_dir():
        path = path / "screen.json"
    doc = read_json(path)
    out = {}
    for n in doc.get("nodes", []):
        status = n.get("verdict", {}).get("status", "ok")
        out[n.get("name") or n.get("host")] = status
        out.setdefault(n.get("host"), status)
    return out


def judge_run(run_dir: str | Path, th: Thresholds, screen: Path | None = None) -> dict[str, Any]:
    """Judge one results directory; writes `diagnose/judge.json` and `judge.csv` there."""
    run = RunDir(Path(run_dir))
    try:
        tel = telemetry.load(run.path)
    except FileNotFoundError as e:
        raise DiagnoseError("ENOENT", f"{run.path}: no telemetry to judge ({e})") from e
    except ValueError as e:
        raise DiagnoseError("EIO", str(e)) from e
    screened = _screen_flags(run, screen)
    table = judge_nodes(tel, th)
    nodes: dict[str, dict[str, Any]] = {}
    for row in table.sort_values(["node", "op"]).to_dict("records"):
        op = row["op"]
        entry = nodes.setdefault(row["node"], {"node": row["node"], "flags": []})
        entry[f"{op}_mean_ms"] = row["mean_ms"]
        entry[f"{op}_ops"] = row["ops"]
        entry[f"{op}_delay_share"] = row["delay_share"]
        if row["outlier"]:
            entry["flags"].append(
                {
                    "node": row["node"],
                    "op": op,
                    "evidence": row["evidence"],
                    "slow": bool(row["slow"]),
                    "grounds": row["grounds"],
                    "onset_s": None if math.isnan(row["onset_s"]) else row["onset_s"],
                    "onset_utc": row["onset_utc"],
                    "how": row["how"],
                    "persist_pct": None if math.isnan(row["persist_pct"]) else row["persist_pct"],
                    "delay_share": row["delay_share"],
                }
            )
    med_await = []
    for n, entry in nodes.items():
        dev, problem = _devices(run, n)
        entry["device"] = dev
        if problem:
            entry["iostat_problem"] = problem
        if dev:
            med_await.append(dev["r_await_ms"])
    dev_median = statistics.median(med_await) if med_await else None
    for entry in nodes.values():
        dev = entry["device"]
        if not entry["flags"]:
            entry["kind"] = None
        elif dev is None:
            entry["kind"] = KIND_UNCLEAR
        else:
            app = max(entry.get(f"{f['op']}_mean_ms", 0.0) for f in entry["flags"])
            device_slow = dev["r_await_ms"] >= th.r_await_ms or (
                dev_median is not None
                and dev["r_await_ms"] >= th.r_await_floor_ms
                and dev["r_await_ms"] >= (1 + th.min_worse) * max(dev_median, 1e-3) * 2
            )
            if device_slow or (dev["twin_ratio"] or 0) >= th.member_ratio:
                entry["kind"] = KIND_DEVICE
            elif app >= th.above_device_ratio * max(dev["r_await_ms"], 1e-3):
                entry["kind"] = KIND_ABOVE
            else:
                entry["kind"] = KIND_UNCLEAR
        if screened is None:
            entry["screen"] = "not screened"
        else:
            entry["screen"] = screened.get(entry["node"], "not in the screen")
    flagged = sorted(n for n, e in nodes.items() if e["flags"])
    slow = slow_node_names(table)
    shares = {op: sum(nodes[n].get(f"{op}_delay_share", 0.0) for n in slow) for op in OPS}
    doc = {
        "run": str(run.path),
        "nodes": sorted(nodes.values(), key=lambda e: e["node"]),
        "slow": slow,
        "flagged": flagged,
        "slow_delay_share": shares,
        "missed_by_screen": [
            n for n in slow if screened is not None and screened.get(n, "ok") == "ok"
        ],
        "thresholds": th.to_dict(),
    }
    run.diagnose_dir.mkdir(exist_ok=True)
    write_json_atomic(run.judge_json, doc)
    write_text_atomic(run.judge_csv, judge_csv(doc))
    hosts = _hosts(run)
    excluded = run_exclusions(doc, th, hosts)
    write_exclusions(run.diagnose_dir, excluded)
    gone = {e.host for e in excluded}

    def entry(e: Mapping[str, Any]) -> dict[str, Any]:
        host = hosts.get(e["node"], e["node"])
        status = "excluded" if host in gone else "flagged" if e["flags"] else "ok"
        share = max(e.get(f"{op}_delay_share", 0.0) for op in OPS)
        return {
            "host": host,
            "name": e["node"],
            "status": status,
            "kind": e.get("kind"),
            "severity": round(share, 3) if e["flags"] else None,
        }

    history.append(run.path.parent, "judge", str(run.path), [entry(e) for e in doc["nodes"]])
    return doc


def _hosts(run: RunDir) -> dict[str, str]:
    """Node name to host, from the run's nodes file (none: names stand for hosts)."""
    return {n.name: n.host for n in load_nodes(run.nodes_path)} if run.nodes_path.exists() else {}


def run_exclusions(
    doc: Mapping[str, Any], th: Thresholds, hosts: Mapping[str, str]
) -> list[Exclusion]:
    """The nodes judged slow as the screen's exclusions (excluded.txt / excluded.json, by
    host), most delay first, at most the screen's cap; each reason says what was slow, since
    when (wall clock), on what grounds and its share of the run's excess delay."""
    entries = {e["node"]: e for e in doc["nodes"]}
    chosen = doc["slow"][: exclusion_cap(len(entries), th)]
    out = []
    for n in chosen:
        e = entries[n]
        reasons = [
            f"{e.get('kind') or KIND_UNCLEAR}: {f['op']}: {f['evidence']}; {f['how']}; "
            f"{f['grounds']}; {f['delay_share']:.0%} of the run's excess {f['op']} delay"
            for f in e["flags"]
            if f["slow"]
        ]
        out.append(Exclusion(hosts.get(n, n), tuple(reasons)))
    return out


def judge_csv(doc: Mapping[str, Any]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    cols = ["node", "kind", "screen", "read_mean_ms", "read_delay_share", "write_mean_ms"]
    cols += ["write_delay_share", "device", "r_await_ms", "onset_s", "evidence"]
    w.writerow(cols)
    for e in doc["nodes"]:
        dev = e.get("device") or {}
        onset = next((f["onset_s"] for f in e["flags"] if f["onset_s"] is not None), None)
        w.writerow(
            [
                e["node"],
                e.get("kind") or "",
                e.get("screen", ""),
                *(
                    "" if e.get(k) is None else f"{e[k]:.6g}"
                    for k in ("read_mean_ms", "read_delay_share", "write_mean_ms")
                ),
                "" if e.get("write_delay_share") is None else f"{e['write_delay_share']:.6g}",
                dev.get("device", ""),
                "" if dev.get("r_await_ms") is None else f"{dev['r_await_ms']:.6g}",
                "" if onset is None else f"{onset:g}",
                " | ".join(f"{f['op']}: {f['evidence']}; {f['how']}" for f in e["flags"]),
            ]
        )
    return buf.getvalue()

"""io_depth study (issue 9, item 6): the seeds' timer experiment reproduced on this machine.

The seeds raised io_uring's `wait_submit_timeout` from 1 us to 10 ms to batch submissions:
mean io_depth rose 4.6x while the median I/O became 31x slower and throughput did not move.
This study runs real `benchfs-run launch` workloads under the default submission policy
(`storage.submit_policy = "immediate"`) and under the experimental timer-gated one at several
timeouts, analyses each run's telemetry with `benchfs.analysis`, and writes the table of
device depth vs op latency vs throughput (results.json, results.md) beside this file.

    .venv/bin/python studies/iodepth/run.py [--timers-us 100,1000,10000,50000] [--file-size 32M]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchfs import analysis

HERE = Path(__file__).resolve().parent


def benchfs_run() -> list[str]:
    beside = Path(sys.executable).parent / "benchfs-run"
    return [str(beside)] if beside.exists() else [sys.executable, "-m", "benchfs.cli.run"]


def one_run(root: Path, args: argparse.Namespace, overrides: list[str]) -> dict[str, Any]:
    argv = [
        *benchfs_run(), "local", "--servers", str(args.servers), "--clients", str(args.clients),
        "--file-size", args.file_size, "--transfer-size", args.transfer_size,
        "--set", f"layout.chunk_size={args.chunk_size}", "--set", "telemetry.interval_ms=250",
        "--results-root", str(root), "--json",
        *(x for o in overrides for x in ("--set", o)),
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("BENCHFS_")}
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=900)
    if done.returncode != 0:
        raise SystemExit(f"benchfs-run failed ({' '.join(overrides)}):\n{done.stderr[-2000:]}")
    out = json.loads(done.stdout)
    a = analysis.analyze(out["results_dir"])
    depth = a.tables.io_depth.set_index("node").loc["all"]
    times = a.tables.op_time.set_index("op")
    device = a.tables.device_time.set_index("op")
    return {
        "write_mib_s": out["write_mib_s"],
        "read_mib_s": out["read_mib_s"],
        "mean_depth": float(depth["mean"]),
        "share_depth1": float(depth["share_depth1"]),
        "mean_batch": float(depth["mean_batch"]),
        "write_p50_ms": float(times.loc["write", "p50_ms"]),
        "read_p50_ms": float(times.loc["read", "p50_ms"]),
        "read_p99_ms": float(times.loc["read", "p99_ms"]),
        "read_device_p50_ms": float(device.loc["read", "p50_ms"]),
        "insights": [i.id for i in a.fired],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timers-us", default="100,1000,10000,50000")
    parser.add_argument("--servers", type=int, default=2)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--file-size", default="32M")
    parser.add_argument("--transfer-size", default="1M")
    parser.add_argument("--chunk-size", type=int, default=1 << 18)
    args = parser.parse_args()
    cases: list[tuple[str, list[str]]] = [("immediate", [])]
    for us in (int(x) for x in args.timers_us.split(",")):
        cases.append(
            (f"timer {us} us", ["storage.submit_policy=timer", f"storage.submit_timer_us={us}"])
        )
    started = time.monotonic()
    rows = []
    root = Path(tempfile.mkdtemp(prefix="benchfs-iodepth-"))
    try:
        for label, overrides in cases:
            print(f"iodepth: {label}", file=sys.stderr)
            rows.append({"policy": label, **one_run(root, args, overrides)})
    finally:
        shutil.rmtree(root, ignore_errors=True)
    elapsed = time.monotonic() - started
    settings = {k: getattr(args, k) for k in ("servers", "clients", "file_size", "transfer_size")}
    settings["chunk_size"] = args.chunk_size
    (HERE / "results.json").write_text(json.dumps({"settings": settings, "rows": rows}, indent=1))
    lines = [
        "# io_depth study: immediate vs timer-gated submission",
        "",
        f"Regenerate: `.venv/bin/python studies/iodepth/run.py --timers-us {args.timers_us}` "
        f"({elapsed:.0f} s here; {args.servers} servers, {args.clients} clients x "
        f"{args.file_size} in {args.transfer_size} transfers, {args.chunk_size} B chunks; a "
        "shared 2-core development machine, so read the ratios, not the absolute figures).",
        "Depth is `inflight_at_submit` over all servers (the device's queue, what the seeds "
        "called io_depth); batch is SQEs per `io_uring_enter` (what they measured); op times "
        "are the servers' arrival-to-reply times.",
        "",
        "| policy | write MiB/s | read MiB/s | mean depth | depth-1 share | SQEs/enter | "
        "write p50 ms | read p50 ms | read p99 ms | read device p50 ms | insights |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for r in rows:
        lines.append(
            f"| {r['policy']} | {r['write_mib_s']:.1f} | {r['read_mib_s']:.1f} | "
            f"{r['mean_depth']:.2f} | {100 * r['share_depth1']:.1f}% | {r['mean_batch']:.2f} | "
            f"{r['write_p50_ms']:.2f} | {r['read_p50_ms']:.2f} | {r['read_p99_ms']:.2f} | "
            f"{r['read_device_p50_ms']:.2f} | {' '.join(r['insights']) or '-'} |"
        )
    (HERE / "results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()

"""Placement study (issue 5): chunk balance of every scheme on the seeds' workloads.

Drives the servers' own placement code through `benchfs._core.PlacementStudy` (via
`benchfs.placement`) for 16, 64, 256, 1024 and 4096 servers with 46 clients per server, and
writes results.json (the rows `benchfs-bench placement --json` prints) and results.md beside
this file.

    .venv/bin/python studies/placement/run.py [--max-steps 32]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from benchfs import placement

HERE = Path(__file__).resolve().parent


def fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--max-steps", type=int, default=32)
    args = parser.parse_args()
    started = time.monotonic()
    rows = [r.as_dict() for r in placement.rows(max_steps=args.max_steps)]
    elapsed = time.monotonic() - started
    (HERE / "results.json").write_text(json.dumps({"rows": rows}, indent=1) + "\n")
    lines = [
        "# Placement study",
        "",
        f"Regenerate: `.venv/bin/python studies/placement/run.py --max-steps {args.max_steps}`"
        f" ({elapsed:.0f} s here). Chunks per server: max/mean over the whole run and at the",
        "worst synchronised step (every client on its k-th transfer), coefficient of variation,",
        "and the fraction of chunks that move when one server is added. `*` marks the default;",
        "`x2` and `x3` count every copy of `layout.replicas` 2 and 3 (nodes of four servers).",
        f"Steps are sampled (at most {args.max_steps}, evenly spaced) where a workload has more.",
        "",
        "| servers | workload | names | scheme | max/mean | step max/mean | CV | moved |",
        "| ---: | --- | --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        copies = f" x{r['replicas']}" if r["replicas"] > 1 else ""
        scheme = r["scheme"] + copies + (" *" if r["default"] else "")
        moved = "skipped" if r["skipped"] else fmt(r["moved_fraction"])
        lines.append(
            f"| {r['servers']} | {r['workload']} | {r['names']} | {scheme} | "
            f"{fmt(r['max_over_mean'])} | {fmt(r['step_max_over_mean'])} | {fmt(r['cv'])} | "
            f"{moved} |"
        )
    skipped = sorted({r["skipped"] for r in rows if r["skipped"]})
    if skipped:
        lines += ["", "Skipped rows: " + "; ".join(skipped)]
    (HERE / "results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()

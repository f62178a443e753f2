"""`benchfs-bench find`: a find run on the servers against pfind's method, side by side.

One local cluster holds `files` empty files in `dirs` directories. Both sides count the names
matching IO500's find pattern (`*01*`) under the root, and must agree:

- `walk` (the reference, pfind's method: a readdir, then a stat per entry) from `clients`
  clients at once (one `benchfs.Client` each, on its own thread; every call releases the GIL),
  each taking every `clients`-th directory;
- `find` (BenchFS's): one `Client.find(count_only=True)` from one client, which every metadata
  owner evaluates over the names it holds.

Repeats interleave the two (alternating which goes first); the report gives medians and the
ratio of the walk's time to the find's (target: at least 10x).
"""

from __future__ import annotations

import fnmatch
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from benchfs import Client
from benchfs.bench.cluster import BenchCluster, on_threads
from benchfs.bench.render import fmt, print_lines_and_targets, report_table
from benchfs.bench.stats import interleave, median, ratio

PATTERN = "*01*"
TARGET = 10.0
"""The find at least this many times faster than the walk."""


@dataclass(frozen=True)
class FindSettings:
    servers: int = 4
    clients: int = 4
    files: int = 100_000
    dirs: int = 100
    repeats: int = 3

    @classmethod
    def quick(cls) -> FindSettings:
        return cls(servers=2, clients=2, files=2_000, dirs=10, repeats=1)


def run_find(root: Path, settings: FindSettings, benchfsd: str) -> dict[str, Any]:
    """Fills a cluster, then times both sides `repeats` times (interleaved)."""
    cluster = BenchCluster(
        root / "cluster", "find", settings.servers, ["storage.durability=memory"], benchfsd
    )
    dirs = [f"/tree/d{k:03d}" for k in range(settings.dirs)]
    per_dir = settings.files // settings.dirs
    cluster.start()
    try:
        config = cluster.config_text()
        clients = [Client(str(cluster.registry), config=config) for _ in range(settings.clients)]
        try:
            clients[0].mkdir("/tree")
            for d in dirs:
                clients[0].mkdir(d)

            def fill(c: Client, i: int) -> None:
                for d in dirs[i :: settings.clients]:
                    for n in range(per_dir):
                        c.open(f"{d}/f{n:06d}", "w").close()

            on_threads(clients, fill)

            def walk(c: Client, i: int) -> tuple[int, int]:
                examined = found = 0
                for d in dirs[i :: settings.clients]:
                    for name in c.listdir(d):
                        c.stat(f"{d}/{name}")
                        examined += 1
                        found += fnmatch.fnmatchcase(name, PATTERN)
                return examined, found

            samples: dict[str, list[float]] = {"walk": [], "find": []}
            counts: dict[str, tuple[int, int]] = {}
            for step in interleave(["tree"], settings.repeats, ("walk", "find")):
                if step.tool == "walk":
                    elapsed, parts = on_threads(clients, walk)
                    counts["walk"] = (sum(p[0] for p in parts), sum(p[1] for p in parts))
                else:
                    t0 = time.perf_counter()
                    r = clients[0].find("/tree", name=PATTERN, kind="file", count_only=True)
                    elapsed = time.perf_counter() - t0
                    counts["find"] = (r.examined, r.matched)
                samples[step.tool].append(elapsed)
        finally:
            for c in clients:
                c.close()
    finally:
        cluster.stop()
    files = per_dir * settings.dirs
    if counts["walk"][1] != counts["find"][1] or counts["walk"][0] != files:
        raise OSError(f"the walk counted {counts['walk']}, the find {counts['find']}")
    walk_s, find_s = median(samples["walk"]), median(samples["find"])
    r = ratio(walk_s, find_s)
    return {
        "cases": [
            {"name": tool, "seconds": median(s), "samples": s, "names_per_s": files / median(s)}
            for tool, s in samples.items()
        ],
        "matched": counts["find"][1],
        "targets": [
            {
                "target": f"find >= {TARGET:g}x faster than the walk",
                "ratio": r,
                "met": None if r is None else r >= TARGET,
            }
        ],
        "servers": settings.servers,
        "clients": settings.clients,
        "files": files,
        "dirs": settings.dirs,
        "repeats": settings.repeats,
        "data_dir": str(root),
    }


def render(console: Console, report: dict[str, Any]) -> None:
    """Both sides' time and rate, for people."""
    table = report_table(
        f"benchfs-bench find: {report['files']} files in {report['dirs']} directories, "
        f"{report['servers']} servers, median of {report['repeats']}",
        ["seconds", "names/s"],
    )
    for c in report["cases"]:
        label = "find (servers)" if c["name"] == "find" else f"walk ({report['clients']} clients)"
        table.add_row(label, fmt(c["seconds"], 3), fmt(c["names_per_s"], 0))
    console.print(table)
    r = report["targets"][0]["ratio"]
    lines = [
        ("matched", f"{report['matched']} names match {PATTERN!r} on both sides"),
        ("ratio", f"the walk takes {fmt(r, 1)}x the find's time"),
    ]
    print_lines_and_targets(console, lines, report["targets"])

"""`benchfs-bench meta`: create, stat and unlink throughput of the metadata service, and of
symbolic links (made, read, followed by stat, removed), per durability mode
(`storage.durability`), side by side in one run.

Several clients (one `benchfs.Client` each, on its own thread; every call releases the GIL)
each work in their own directory on a local cluster whose servers keep their data (and their
metadata store) under the scratch directory. Each phase starts on a barrier and ends when the
last client finishes, so ops/s is the whole cluster's rate for that phase. Create is
`open(O_CREAT | O_EXCL)` + `close` (two metadata requests: the parent's entry and the inode);
unlink is one request to the inode's owner plus one to the parent's (no data to free: the
files are empty). A link to each file is made beside it (`symlink`: the parent's entry and the
link), read (`readlink`: one request), followed (`stat-link`: stat of the link's path, which
the client resolves: a lookup that finds the link, its target, the target's attributes) and
removed (`unlink-link`). Locks (kept in memory by the worker chosen from the file's id, so
the durability mode does not touch them): each file opened beforehand, then an exclusive lock
on each (`lock`) and its release (`unlock`); and all clients taking and releasing one
exclusive lock on one shared file in turn (`lock-contended`: a take and a release per
operation, the takes waiting for each other). Modes run in turn, in reversed order every
other repeat, and the report gives medians; `memory` (no store) is the reference the
persisted modes are compared with. `none-x2` is `none` with two copies of the metadata (and of
the data: `layout.replicas=2`): every change is also handed to the next server's copy before
it is answered, so its cost is its ratio to `none`.

Small files, as mdtest's "hard" phases make them (IO500's `-w 3901 -e 3901`): each created,
given 3,901 bytes and closed (`write-small`), opened, read whole and closed (`read-small`), and
removed (`unlink-small`). `none` keeps them inline (the default `layout.inline_max`: their
bytes with their names); `none-chunkfile` gives each a chunk file (`layout.inline_max=0`) and
`none-packed` a slot of the packed layout (`layout.inline_max=0`, `storage.layout=packed`,
4 KiB slots: one per file), so the ratios of `none` to them are what keeping small files with
their names gains.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from benchfs import Client
from benchfs.bench.cluster import BenchCluster, on_threads
from benchfs.bench.render import fmt, print_lines_and_targets, report_table
from benchfs.bench.stats import interleave, median, ratio
from benchfs.client import File

PHASES = (
    "create", "stat", "symlink", "readlink", "stat-link", "unlink-link",
    "lock", "unlock", "lock-contended", "unlink", "write-small", "read-small", "unlink-small",
)  # fmt: skip
SMALL_PHASES = ("write-small", "read-small", "unlink-small")
SMALL = 3901
"""Bytes per small file (mdtest-hard's `-w 3901 -e 3901` in IO500)."""
CONTENDED = 200
"""Lock-and-release rounds per client in `lock-contended`."""
COPIES = "none-x2"
"""The mode with two copies of the metadata (durability `none`, `layout.replicas=2`)."""
CHUNKFILE = "none-chunkfile"
"""`none` with every file in chunk files (no inline files)."""
PACKED = "none-packed"
"""`none` with every file in the packed layout's slots (no inline files)."""
MODES = ("memory", "none", "fsync", "close", COPIES, CHUNKFILE, PACKED)
TARGETS = (
    ("none", "memory", ("create", "unlink"), 0.95),
    ("fsync", "none", ("create", "unlink"), 0.5),
    (COPIES, "none", ("create",), 0.6),
    (COPIES, "none", ("stat",), 0.9),
    ("none", CHUNKFILE, ("write-small", "read-small"), 1.5),
    ("none", PACKED, ("write-small", "read-small"), 1.0),
)
"""(mode, against, phases, floor): each phase's rate in `mode` at least `floor` times its rate in
`against` (the default mode against no store; a synced store against the default; two copies
of the metadata against one; small files inline against chunk files and packed slots)."""


def mode_overrides(mode: str) -> list[str]:
    """The configuration of a mode: a durability, and for `none-x2` two copies."""
    if mode == COPIES:
        return ["storage.durability=none", "layout.replicas=2"]
    if mode == CHUNKFILE:
        return ["storage.durability=none", "layout.inline_max=0"]
    if mode == PACKED:
        return [
            "storage.durability=none",
            "layout.inline_max=0",
            "storage.layout=packed",
            "layout.chunk_size=4096",
        ]
    return [f"storage.durability={mode}"]


@dataclass(frozen=True)
class MetaSettings:
    servers: int = 4
    clients: int = 4
    files: int = 10_000
    """Files in total, split evenly over the clients."""
    modes: tuple[str, ...] = MODES
    repeats: int = 3

    @classmethod
    def quick(cls) -> MetaSettings:
        return cls(servers=2, clients=2, files=400, repeats=1)


def _one_run(root: Path, settings: MetaSettings, benchfsd: str, mode: str) -> list[float]:
    """One cluster in `mode`: the phases' rates (ops/s), in PHASES' order."""
    cluster = BenchCluster(root, "meta", settings.servers, mode_overrides(mode), benchfsd)
    per_client = settings.files // settings.clients
    cluster.start()
    try:
        config = cluster.config_text()
        clients = [Client(str(cluster.registry), config=config) for _ in range(settings.clients)]
        try:
            for i in range(settings.clients):
                clients[0].mkdir(f"/c{i}")

            def create(c: Client, i: int) -> None:
                for n in range(per_client):
                    c.open(f"/c{i}/f{n}", os.O_RDWR | os.O_CREAT | os.O_EXCL).close()

            def stat(c: Client, i: int) -> None:
                for n in range(per_client):
                    c.stat(f"/c{i}/f{n}")

            def unlink(c: Client, i: int) -> None:
                for n in range(per_client):
                    c.unlink(f"/c{i}/f{n}")

            def symlink(c: Client, i: int) -> None:
                for n in range(per_client):
                    c.symlink(f"f{n}", f"/c{i}/l{n}")

            def readlink(c: Client, i: int) -> None:
                for n in range(per_client):
                    c.readlink(f"/c{i}/l{n}")

            def stat_link(c: Client, i: int) -> None:
                for n in range(per_client):
                    c.stat(f"/c{i}/l{n}")

            def unlink_link(c: Client, i: int) -> None:
                for n in range(per_client):
                    c.unlink(f"/c{i}/l{n}")

            opened: dict[int, list[File]] = {}

            def lock(c: Client, i: int) -> None:
                for f in opened[i]:
                    f.lock(wait=False)

            def unlock(c: Client, i: int) -> None:
                for f in opened[i]:
                    f.unlock()

            shared = clients[0].open("/shared-lock", "w")
            shared.close()

            def contended(c: Client, i: int) -> None:
                with c.open("/shared-lock", "r+") as f:
                    for _ in range(CONTENDED):
                        f.lock()
                        f.unlock()

            small = bytes(range(256)) * (SMALL // 256) + bytes(SMALL % 256)

            def write_small(c: Client, i: int) -> None:
                for n in range(per_client):
                    with c.open(f"/c{i}/s{n}", "xb") as f:
                        f.write(small)

            def read_small(c: Client, i: int) -> None:
                for n in range(per_client):
                    with c.open(f"/c{i}/s{n}", "rb") as f:
                        if f.read() != small:
                            raise OSError(f"/c{i}/s{n} does not read back as written")

            def unlink_small(c: Client, i: int) -> None:
                for n in range(per_client):
                    c.unlink(f"/c{i}/s{n}")

            rates = []
            work_of = {
                "create": create, "stat": stat, "symlink": symlink, "readlink": readlink,
                "stat-link": stat_link, "unlink-link": unlink_link, "lock": lock,
                "unlock": unlock, "lock-contended": contended, "unlink": unlink,
                "write-small": write_small, "read-small": read_small, "unlink-small": unlink_small,
            }  # fmt: skip
            for phase in PHASES:
                if phase == "lock":  # the files opened first, outside the timing
                    for i, c in enumerate(clients):
                        opened[i] = [c.open(f"/c{i}/f{n}", "r+") for n in range(per_client)]
                ops = CONTENDED if phase == "lock-contended" else per_client
                rates.append(ops * settings.clients / on_threads(clients, work_of[phase])[0])
                if phase == "unlock":  # closed outside the timing
                    for files in opened.values():
                        for f in files:
                            f.close()
                    opened.clear()
            clients[0].unlink("/shared-lock")
            left = sum(len(clients[0].readdir(f"/c{i}")) for i in range(settings.clients))
            if left:
                raise OSError(f"{left} entries left after unlink")
        finally:
            for c in clients:
                c.close()
    finally:
        cluster.stop()
    return rates


def run_meta(root: Path, settings: MetaSettings, benchfsd: str) -> dict[str, Any]:
    """Runs every mode `repeats` times (interleaved); returns the report body."""
    samples: dict[str, list[list[float]]] = {m: [] for m in settings.modes}
    for step in interleave(list(settings.modes), settings.repeats, ("meta",)):
        mode = step.case
        work = root / f"{mode}-{len(samples[mode])}"
        samples[mode].append(_one_run(work, settings, benchfsd, mode))
    cases = []
    for mode in settings.modes:
        for i, phase in enumerate(PHASES):
            rates = [s[i] for s in samples[mode]]
            cases.append({"mode": mode, "name": phase, "ops_s": median(rates), "samples": rates})
    rate = {(c["mode"], c["name"]): c["ops_s"] for c in cases}
    targets = []
    for mode, against, phases, floor in TARGETS:
        if mode not in settings.modes or against not in settings.modes:
            continue
        for phase in phases:
            r = ratio(rate[(mode, phase)], rate[(against, phase)])
            targets.append({
                "target": f"{phase} in {mode} >= {floor}x {against}",
                "ratio": r,
                "met": None if r is None else r >= floor,
            })  # fmt: skip
    return {
        "cases": cases,
        "targets": targets,
        "servers": settings.servers,
        "clients": settings.clients,
        "files": settings.files // settings.clients * settings.clients,
        "repeats": settings.repeats,
        "data_dir": str(root),
    }


def render(console: Console, report: dict[str, Any]) -> None:
    """The phases' throughput per durability mode, for people."""
    by = {(c["mode"], c["name"]): c["ops_s"] for c in report["cases"]}
    modes = list(dict.fromkeys(c["mode"] for c in report["cases"]))
    names, small = PHASES[: -len(SMALL_PHASES)], SMALL_PHASES
    for title, phases in (("names", names), (f"small files of {SMALL} bytes", small)):
        table = report_table(
            f"benchfs-bench meta, {title}: {report['files']} files, {report['clients']} "
            f"clients, {report['servers']} servers, median of {report['repeats']}",
            [f"{p}/s" for p in phases],
        )
        for mode in modes:
            table.add_row(mode, *(fmt(by[(mode, p)], 0) for p in phases))
        console.print(table)
    print_lines_and_targets(console, [], report["targets"])

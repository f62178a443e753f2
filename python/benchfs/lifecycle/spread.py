"""Staging across the job's nodes (`benchfs stage-in --nodes`): one copying process on each
client node, started through the job's launcher (local processes, mpiexec or srun; on a node
in a network namespace, in that namespace), each with its own clients and threads, each
copying its share of the files. Shares are made largest file first, each file to the node
with the fewest bytes so far. The process that listed the tree makes the directories and the
links and writes the one manifest, which names the node that copied each file.

The local side must be a directory every node sees at the same path (a parallel file system;
nodes in network namespaces share this host's).

    python -m benchfs.lifecycle.spread PLAN RESULT     # one node's share (run by the above)
"""

from __future__ import annotations

import dataclasses
import heapq
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchfs.client import Client
from benchfs.cluster import child_env
from benchfs.errors import JobError, LaunchError
from benchfs.launch import Launcher, make_launcher
from benchfs.lifecycle.stage import BenchfsSide, Copied, Entry, LocalSide, copy_files
from benchfs.lifecycle.state import JobState
from benchfs.nodes import Node
from benchfs.procs import descendants, kill_pids, stop_process, tail
from benchfs.results import read_json, write_json_atomic

PLAN_FORMAT = "benchfs-stage-share"
SHARE_STOP_GRACE_S = 5.0
"""How long an interrupted share has to stop before it is killed."""


def shares(todo: list[Entry], nodes: list[str]) -> dict[str, list[Entry]]:
    """The files of each node: largest first, each to the node with the fewest bytes so far
    (ties: the earlier node)."""
    heap = [(0, i, name) for i, name in enumerate(nodes)]
    out: dict[str, list[Entry]] = {name: [] for name in nodes}
    for e in sorted(todo, key=lambda e: (-e.size, e.path)):
        load, i, name = heapq.heappop(heap)
        out[name].append(e)
        heapq.heappush(heap, (load + e.size, i, name))
    return out


def _launcher(state: JobState) -> Launcher:
    try:
        return make_launcher(state.launcher, state.mpiexec)
    except LaunchError as e:
        raise JobError(e.code, f"staging across nodes needs the job's launcher: {e.message}") from e


@dataclass
class NodeCopier:
    """Copies a list of files with one process per node (a `stage.Copier`)."""

    state: JobState
    direction: str
    local_root: Path
    benchfs_root: str
    threads: int
    say: Callable[[str], None]
    check: str = "received"
    """What the servers' checksums cover when staging in (`stage.CHECKS`)."""

    def __call__(self, todo: list[Entry]) -> Copied:
        launcher, nodes = _launcher(self.state), self.state.client_nodes()
        work = Path(self.state.run_dir) / "staging" / f"shares-{time.strftime('%Y%m%dT%H%M%S')}"
        work.mkdir(parents=True, exist_ok=True)
        by_node = shares(todo, [n.name for n in nodes])
        started: list[tuple[Node, subprocess.Popen[bytes], Path, Path]] = []
        try:
            for node in nodes:
                share = by_node[node.name]
                if not share:
                    continue
                plan, result, log = (
                    work / f"{node.name}.{what}" for what in ("plan.json", "json", "log")
                )
                write_json_atomic(
                    plan,
                    {
                        "format": PLAN_FORMAT,
                        "direction": self.direction,
                        "local": str(self.local_root),
                        "benchfs": self.benchfs_root,
                        "registry": self.state.registry,
                        "config": self.state.config,
                        "threads": self.threads,
                        "check": self.check,
                        "files": [dataclasses.asdict(e) for e in share],
                    },
                )
                argv = [sys.executable, "-m", "benchfs.lifecycle.spread", str(plan), str(result)]
                env = child_env(node.name)
                if node.netns:  # it runs in its node's namespace already
                    env.pop("BENCHFS_NETNS", None)
                proc, _ = launcher.spawn(node, argv, log, env)
                started.append((node, proc, result, log))
                size = sum(e.size for e in share)
                self.say(f"{node.name}: copying {len(share)} files ({size / (1 << 20):.1f} MiB)")
            for _, proc, _, _ in started:
                proc.wait()
        finally:  # interrupted (Ctrl-C): the shares run in sessions of their own, stop them
            for _, proc, _, _ in started:
                if proc.poll() is None:
                    children = descendants(proc.pid)
                    stop_process(proc, SHARE_STOP_GRACE_S, sig=launcher.interrupt_signal)
                    kill_pids(children, SHARE_STOP_GRACE_S)
        copied = Copied()
        for node, proc, result, log in started:
            code = proc.returncode
            if code == 0 and result.exists():
                done = read_json(result)
                for record in done["records"].values():
                    record["node"] = node.name
                copied.merge(Copied(done["records"], done["errors"], done["fsync_seconds"]))
                continue
            why = f"the copy on {node.name} exited with status {code}; see {log}: {tail(log, 3)}"
            copied.errors.extend(f"{e.path}: not staged: {why}" for e in by_node[node.name])
        return copied


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _share(plan_path: Path, result: Path) -> int:
    plan = read_json(plan_path)
    if plan.get("format") != PLAN_FORMAT:
        print(f"{plan_path}: not a staging share", file=sys.stderr)
        return 2
    config = Path(plan["config"]).read_text()
    bfs = BenchfsSide(
        plan["benchfs"], lambda: Client(plan["registry"], config), plan.get("check", "received")
    )
    local = LocalSide(Path(plan["local"]))
    src, dst = (local, bfs) if plan["direction"] == "in" else (bfs, local)
    entries = [Entry(**e) for e in plan["files"]]
    try:
        copied = copy_files(src, dst, entries, plan["threads"], _to_stderr)
    finally:
        bfs.close()
    summary: dict[str, Any] = {
        "records": copied.records,
        "errors": copied.errors,
        "fsync_seconds": copied.fsync_seconds,
    }
    write_json_atomic(result, summary)
    return 0


if __name__ == "__main__":
    sys.exit(_share(Path(sys.argv[1]), Path(sys.argv[2])))

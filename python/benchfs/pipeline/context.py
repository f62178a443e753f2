"""What every stage of a run shares: the request, the launcher, the results directory and its
manifest, the progress sink, the node roles, and the node operations built on them (job
directories, short commands on a node, CPU pinning, rank plans)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchfs.errors import RunError, errno_name
from benchfs.launch import Launcher, this_host
from benchfs.native import PRELOAD_LIBRARY
from benchfs.nodes import Node
from benchfs.pipeline.roles import NodeRoles
from benchfs.pipeline.spec import ProgressSink, RunSpec
from benchfs.results import Manifest, RunDir, write_json_atomic

NODE_COMMAND_TIMEOUT_S = 120.0
"""Bound of one short command on a node (create or delete its job directory, mount waits)."""


def files_are_here(node: Node, launcher: str) -> bool:
    """True when `node`'s files are this process's files: no prefix or namespace, and the
    local launcher or the node is this host. Then its job directory is made and removed here,
    which also works while a cancelled Slurm job can no longer start steps."""
    if node.prefix or node.netns:
        return False
    return launcher == "local" or node.host.split(".", 1)[0] == this_host()


@dataclass
class RunContext:
    """One run's shared state, made once its results directory exists."""

    spec: RunSpec
    launcher: Launcher
    run_dir: RunDir
    manifest: Manifest
    progress: ProgressSink
    roles: NodeRoles | None = None
    """Known after the screen (if any); every stage that starts processes needs it."""
    mounted: bool = False
    """A FUSE mount runs on every client node (the ranks are told where)."""

    def job_dir(self, node: Node) -> Path:
        """The node-local directory of this run on `node` (servers' data, mount point)."""
        return Path(node.scratch) / f"benchfs-{self.run_dir.run_id}-{node.name}"

    def mountpoint(self, node: Node) -> Path:
        """Where the FUSE mount of `node` goes: `spec.mount_point` (the same path on every
        host; for a node in a network namespace, which shares this host's directories with
        the other such nodes, its subdirectory named after the node) or a directory in the
        node's job directory."""
        if self.spec.mount_point:
            if node.netns:
                return Path(self.spec.mount_point) / node.name
            return Path(self.spec.mount_point)
        return self.job_dir(node) / "mnt"

    def on_node(self, node: Node, argv: Sequence[str], what: str) -> None:
        """Run a short command on `node` through the launcher; RunError says what failed."""
        try:
            done = self.launcher.run(node, argv, NODE_COMMAND_TIMEOUT_S)
        except subprocess.TimeoutExpired as e:
            raise RunError("ETIMEDOUT", f"{what} on {node.name} took over {e.timeout} s") from e
        except OSError as e:
            raise RunError(errno_name(e), f"{what} on {node.name}: {e}") from e
        if done.returncode != 0:
            raise RunError(
                "EIO", f"{what} on {node.name} failed: {(done.stderr or done.stdout).strip()}"
            )

    def here(self, node: Node) -> bool:
        return files_are_here(node, self.launcher.name)

    def cpus(self, node: Node, index: int) -> list[int] | None:
        """CPU of the index-th process on a node with --pin-cpus (servers first, then ranks),
        assuming nodes have this host's CPU count."""
        if not self.spec.pin_cpus:
            return None
        count = os.cpu_count() or 1
        return [index % count]

    def rank_plan(self, name: str, nodes: Sequence[Node], up: dict[str, str] | None = None) -> Path:
        """Write the per-rank plan of benchfs.rankexec: rank i runs as nodes[i]. Before the
        roles are known (the screen) there is no pinning and no mount. `up`: where and when
        ranks say they are up (benchfs.rankexec.mark_up)."""
        per_node_servers: dict[str, int] = {}
        if self.roles is not None:
            for _, node in self.roles.servers:
                per_node_servers[node.name] = per_node_servers.get(node.name, 0) + 1
        seen: dict[str, int] = {}
        ranks = []
        for node in nodes:
            index = per_node_servers.get(node.name, 0) + seen.get(node.name, 0)
            seen[node.name] = seen.get(node.name, 0) + 1
            preload = self.spec.workload == "command" and self.spec.via == "preload"
            mount = self.mountpoint(node) if self.mounted or preload else None
            ranks.append(
                {
                    "node": node.name,
                    "host": node.host,
                    "prefix": list(node.prefix),
                    "netns": node.netns,
                    "cpus": self.cpus(node, index) if self.roles is not None else None,
                    "mount": None if mount is None else str(mount),
                    "preload": str(PRELOAD_LIBRARY) if preload else None,
                    "darshan": self.darshan_env(),
                }
            )
        path = self.run_dir.path / f"{name}.ranks.json"
        write_json_atomic(path, {"ranks": ranks, **({"up": up} if up else {})})
        return path

    def darshan_env(self) -> dict[str, str] | None:
        """With --darshan, what a traced command's ranks get (benchfs.rankexec applies it)."""
        if self.spec.darshan is None or self.spec.workload != "command":
            return None
        logs = self.run_dir.path / "darshan"
        logs.mkdir(exist_ok=True)
        return {
            "LD_PRELOAD": str(Path(self.spec.darshan) / "lib" / "libdarshan.so"),
            "DXT_ENABLE_IO_TRACE": "1",
            "DARSHAN_LOGPATH": str(logs),
        }

    def node_records(self) -> list[dict[str, Any]]:
        """The manifest's `nodes`: each node that runs something, with its servers and ranks."""
        assert self.roles is not None
        roles = self.roles
        return [
            {
                "name": node.name,
                "host": node.host,
                "scratch": node.scratch,
                "devices": list(node.devices),
                "prefix": list(node.prefix),
                "netns": node.netns,
                "servers": [sid for sid, n in roles.servers if n.name == node.name],
                "ranks": [r for r, n in enumerate(roles.clients) if n.name == node.name],
            }
            for node in roles.nodes()
        ]

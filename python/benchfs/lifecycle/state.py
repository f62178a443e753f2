"""The job file (job.json in the job's results directory): what `benchfs start` left running
and how to reach it, so that `status`, `stage-in`, `stage-out` and `stop` work from any shell
of the job (they find the directory through $BENCHFS_JOB_DIR or --job)."""

from __future__ import annotations

import dataclasses
import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchfs.errors import JobError
from benchfs.nodes import Node, load_nodes
from benchfs.procs import ProcessRef
from benchfs.results import RunDir, read_json, read_versioned, write_json_atomic

JOB_FILE = "job.json"
ENV_FILE = "benchfs.env"
JOB_DIR_ENV = "BENCHFS_JOB_DIR"
JOB_FORMAT = "benchfs-job"
JOB_VERSION = 1


@dataclass
class JobState:
    """A started job. `processes` are the records of the run manifest (role, node, pid, log,
    ...) plus `start` (the pid's start time) and `children` ([pid, start] pairs found under a
    launcher process), all on `host`, the host where `start` ran."""

    run_dir: str
    host: str
    launcher: str
    mpiexec: str | None
    servers: int
    registry: str
    config: str
    mount_point: str | None
    keep_data: bool
    exports: dict[str, str]
    processes: list[dict[str, Any]] = field(default_factory=list)
    started: str = ""
    stopped: str | None = None

    @property
    def path(self) -> Path:
        return Path(self.run_dir) / JOB_FILE

    def save(self) -> None:
        write_json_atomic(
            self.path, {"format": JOB_FORMAT, "version": JOB_VERSION, **dataclasses.asdict(self)}
        )

    @classmethod
    def load(cls, job_dir: Path) -> JobState:
        path = job_dir / JOB_FILE
        if not path.exists():
            raise JobError("ENOENT", f"{job_dir} is not a started job (no {JOB_FILE})")
        try:
            return cls(**read_versioned(path, JOB_FORMAT, JOB_VERSION))
        except (ValueError, TypeError) as e:
            raise JobError("EINVAL", f"{path}: unreadable job file: {e}") from e

    def refs(self, role: str) -> list[tuple[dict[str, Any], list[ProcessRef]]]:
        """Per process of `role`: its record and the processes to stop for it (the launcher
        process first, then what ran under it)."""
        out = []
        for p in self.processes:
            if p.get("role") != role:
                continue
            refs = [ProcessRef(p["pid"], p["start"])] if p.get("start") is not None else []
            refs += [ProcessRef(pid, start) for pid, start in p.get("children", [])]
            out.append((p, refs))
        return out

    def client_nodes(self) -> list[Node]:
        """The nodes the job's clients run on (every node if the record marks none)."""
        run_dir = RunDir(Path(self.run_dir))
        nodes = {n.name: n for n in load_nodes(run_dir.nodes_path)}
        recorded = read_json(run_dir.manifest_path).get("nodes") or []
        names = [r["name"] for r in recorded if r.get("ranks")] or [r["name"] for r in recorded]
        return [nodes[name] for name in names if name in nodes] or list(nodes.values())

    def use_network(self) -> None:
        """This process's clients connect from the job's network: on nodes in network
        namespaces, which this host is not part of, from the first client node's
        (`BENCHFS_NETNS`, unless already set)."""
        if os.environ.get("BENCHFS_NETNS"):
            return
        netns = next((n.netns for n in self.client_nodes() if n.netns), "")
        if netns:
            os.environ["BENCHFS_NETNS"] = netns

    def env_text(self) -> str:
        """The `export` lines of the job (what `eval "$(benchfs start ...)"` applies)."""
        return "".join(f"export {k}={shlex.quote(v)}\n" for k, v in self.exports.items())


def find_job(job: str | os.PathLike[str] | None) -> Path:
    """The job directory: `job`, else $BENCHFS_JOB_DIR."""
    where = job if job is not None else os.environ.get(JOB_DIR_ENV)
    if not where:
        raise JobError(
            "EINVAL",
            f'which job? pass --job DIR or set {JOB_DIR_ENV} (eval "$(benchfs start ...)" sets it)',
            2,
        )
    path = Path(where)
    if not path.is_dir():
        raise JobError("ENOENT", f"job directory {path} does not exist")
    return path

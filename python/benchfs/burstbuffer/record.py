"""A burst-buffer job's directory, `ROOT/JOBID/` on a file system the controller and the job's
nodes share, and its record (`bb.json`), which each phase reads and updates: Slurm runs the
phases as separate processes, may run one twice (after a restart of slurmctld) and passes
them nothing but the job's id.

    bb.json        the record: user, nodes, what each phase did
    logs/          start.log, stage-in.log, stage-out.log, teardown.log, phases.log
    nodes.toml     the job's nodes (docs/nodes.md)
    benchfs.env    what `benchfs start` exported
    excluded.txt   nodes the screen found slow (no server on them), one per line
    run            link to the BenchFS job directory (BENCHFS_JOB_DIR)
    mount          link to the batch node's mount, on nodes sharing one host
    staging/       the staging manifests, owned by the job's user
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchfs.errors import JobError
from benchfs.results import read_versioned, utc_now, write_json_atomic

RECORD = "bb.json"
FORMAT = "benchfs-burst-buffer"
VERSION = 1


@dataclass
class BurstBufferJob:
    """What the phases of one Slurm job did so far. `data` is where the job's node-local
    data stands: "none" (nothing started), "live", "deleted" or "kept" (the path in
    `kept_at`)."""

    job_id: str
    uid: int | None = None
    gid: int | None = None
    user: str = ""
    nodes: list[str] = field(default_factory=list)
    batch_host: str = ""
    worker: list[int] | None = None
    run_dir: str | None = None
    servers: int = 0
    started: bool = False
    staged_in: bool = False
    ended: str | None = None
    exit_code: str | None = None
    staged_out: bool = False
    data: str = "none"
    kept_at: list[str] = field(default_factory=list)
    torn_down: str | None = None
    history: list[dict[str, Any]] = field(default_factory=list)

    def note(self, phase: str, ok: bool, message: str) -> None:
        self.history.append({"phase": phase, "time": utc_now(), "ok": ok, "message": message})


def job_dir(root: str | os.PathLike[str], job_id: str) -> Path:
    if not job_id.isdigit():
        raise JobError("EINVAL", f"job id {job_id!r} is not a Slurm job number", 2)
    return Path(root) / job_id


def load(directory: Path, job_id: str) -> BurstBufferJob:
    path = directory / RECORD
    if not path.exists():
        return BurstBufferJob(job_id=job_id)
    try:
        return BurstBufferJob(**read_versioned(path, FORMAT, VERSION))
    except (ValueError, TypeError) as e:
        raise JobError("EINVAL", f"{path}: unreadable record: {e}") from e


def save(directory: Path, job: BurstBufferJob) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    write_json_atomic(
        directory / RECORD, {"format": FORMAT, "version": VERSION, **dataclasses.asdict(job)}
    )


def jobs(root: str | os.PathLike[str]) -> list[BurstBufferJob]:
    """Every job recorded under `root`, in job-number order (unreadable records skipped)."""
    found = []
    base = Path(root)
    if not base.is_dir():
        return []
    for entry in sorted((p for p in base.iterdir() if p.name.isdigit()), key=lambda p: int(p.name)):
        try:
            found.append(load(entry, entry.name))
        except JobError:
            continue
    return found

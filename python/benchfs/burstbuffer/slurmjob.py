"""What Slurm says about a job, through `scontrol` (Slurm 22.05 passes the burst buffer's
pre-run, post-run and data-out phases only the job's id: its nodes, user and outcome come
from here; the phases run on the controller's host as SlurmUser, where this is allowed)."""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass

from benchfs.errors import JobError

SCONTROL_TIMEOUT_S = 30.0


def _scontrol(*args: str) -> str:
    exe = shutil.which("scontrol") or "/usr/bin/scontrol"
    try:
        done = subprocess.run(
            [exe, *args],
            capture_output=True,
            text=True,
            timeout=SCONTROL_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise JobError("EIO", f"scontrol {' '.join(args)}: {e}") from e
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip().splitlines()
        raise JobError("EIO", f"scontrol {' '.join(args)}: {said[-1] if said else 'failed'}")
    return done.stdout


@dataclass(frozen=True)
class SlurmJob:
    job_id: str
    state: str
    exit_code: str
    nodes: tuple[str, ...]
    batch_host: str
    user: str
    uid: int
    gid: int


def _field(text: str, name: str) -> str:
    found = re.search(rf"(?:^|\s){name}=(\S*)", text)
    return found.group(1) if found else ""


def _id(text: str, name: str) -> tuple[str, int]:
    """`UserId=alice(1000)` -> ("alice", 1000)."""
    found = re.search(rf"(?:^|\s){name}=([^(\s]*)\((\d+)\)", text)
    if not found:
        raise JobError("EIO", f"scontrol show job: no {name}")
    return found.group(1), int(found.group(2))


def show_job(job_id: str) -> SlurmJob:
    """The job's state, exit code, nodes (expanded, in order), batch host and user."""
    text = _scontrol("show", "job", "-o", job_id)
    node_list = _field(text, "NodeList")
    nodes: tuple[str, ...] = ()
    if node_list and node_list != "(null)":
        nodes = tuple(_scontrol("show", "hostnames", node_list).split())
    user, uid = _id(text, "UserId")
    _group, gid = _id(text, "GroupId")
    return SlurmJob(
        job_id=job_id,
        state=_field(text, "JobState"),
        exit_code=_field(text, "ExitCode"),
        nodes=nodes,
        batch_host=_field(text, "BatchHost"),
        user=user,
        uid=uid,
        gid=gid,
    )

"""The phases of a burst-buffer job, as `burst_buffer.lua` calls them (one process each, on
the controller's host, as SlurmUser; each may run twice). Every phase returns a one-line
message for Slurm's record of the job, or raises a BenchfsError whose message Slurm shows
(`scontrol show job`'s Reason and SystemComment).

Where Slurm 22.05 runs what (its burst_buffer/lua plugin, burst_buffer_lua.c at
slurm-22-05-8-1), and which timeout of burst_buffer.conf covers it:
  setup, data-in   job pending, no nodes            OtherTimeout, StageInTimeout
  pre-run          nodes allocated, script not run  OtherTimeout (start + stage-in)
  post-run         the job ended, however           OtherTimeout
  data-out         after post-run                   StageOutTimeout
  teardown         after data-out, or on a cancel   OtherTimeout
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import pwd
import shlex
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from benchfs.burstbuffer import record
from benchfs.burstbuffer.record import BurstBufferJob
from benchfs.burstbuffer.slurmjob import show_job
from benchfs.errors import BenchfsError, JobError
from benchfs.lifecycle.state import JOB_FILE, JobState
from benchfs.nodes import from_hostnames, load_nodes, write_nodes
from benchfs.procs import ProcessRef, stop_refs
from benchfs.results import read_json, utc_now
from benchfs.submit import find_benchfs_run

WORKER_STOP_GRACE_S = 60.0
"""How long teardown lets an interrupted pre-run worker stop what it started."""

OWN_NETWORK = "/proc/self/ns/net"
"""BENCHFS_NETNS for staging: connect from where the process is (the controller's host is on
the nodes' network), which a user without the right to enter another namespace can."""


@dataclass(frozen=True)
class Site:
    """The site's settings (benchfs_bb.conf, passed on by the Lua script)."""

    root: Path
    launcher: str = "local"
    nodes_file: str | None = None
    scratch: str | None = None
    shared_host: bool = False


@dataclass(frozen=True)
class Directives:
    """The job's `#BB_LUA` directives, as the Lua script read and checked them."""

    servers_per_node: int = 1
    mount: str | None = None
    stage_in: tuple[tuple[str, str], ...] = ()
    stage_out: tuple[tuple[str, str], ...] = ()
    sets: tuple[str, ...] = ()
    screen: str | None = None


class Phase:
    """One phase of one job: its directory, its record, its logs."""

    def __init__(self, site: Site, job_id: str, directives: Directives) -> None:
        self.site = site
        self.job_id = job_id
        self.directives = directives
        self.dir = record.job_dir(site.root, job_id)
        self.job = record.load(self.dir, job_id)
        self.logs = self.dir / "logs"

    def save(self) -> None:
        record.save(self.dir, self.job)

    def log(self, name: str) -> IO[bytes]:
        self.logs.mkdir(parents=True, exist_ok=True)
        out = open(self.logs / name, "ab")
        out.write(f"--- {utc_now()} job {self.job_id}\n".encode())
        out.flush()
        return out

    @property
    def run_link(self) -> Path:
        return self.dir / "run"

    def user_name(self) -> str:
        return self.job.user or str(self.job.uid)

    def staging(self, direction: str, source: str, destination: str, k: int) -> list[str]:
        """The command that copies one tree in or out as the job's user (`benchfs bb stage`,
        which becomes the user once Python is loaded: the user may not read the interpreter's
        directory, only its own files)."""
        if self.job.uid is None or self.job.gid is None:
            raise JobError("EINVAL", f"job {self.job_id}: its user is not known (no setup)")
        argv = [find_benchfs_run("benchfs"), "bb", "stage", direction, source, destination]
        argv += [
            "--job",
            str(self.run_link),
            "--uid",
            str(self.job.uid),
            "--gid",
            str(self.job.gid),
        ]
        return [*argv, "--manifest", str(self.dir / "staging" / f"{direction}-{k}.json")]

    def run_logged(
        self, argv: Sequence[str], log_name: str, stdout: IO[bytes] | None = None
    ) -> subprocess.Popen[bytes]:
        """Start `argv` with its output in logs/LOG_NAME (stdout to `stdout` if given)."""
        log = self.log(log_name)
        log.write(("$ " + shlex.join(argv) + "\n").encode())
        log.flush()
        try:
            return subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=stdout or log,
                stderr=log,
                cwd="/",
            )
        finally:
            log.close()

    def last_line(self, log_name: str, prefix: str = "") -> str:
        """The log's last line (that starts with `prefix`)."""
        try:
            lines = (self.logs / log_name).read_text(errors="replace").strip().splitlines()
        except OSError:
            return ""
        lines = [line for line in lines if line.startswith(prefix)]
        return lines[-1] if lines else ""


# ---- pending: setup and data-in ----


def setup(phase: Phase, uid: int, gid: int) -> str:
    """The job's directory and record, with its user (the only phase Slurm tells who). A job
    Slurm requeued (a node failed) starts a new record; the last one's directory is kept
    as JOBID.1, JOBID.2, ..."""
    if phase.job.torn_down is not None:
        earlier = next(
            phase.dir.with_name(f"{phase.job_id}.{k}")
            for k in range(1, 1000)
            if not phase.dir.with_name(f"{phase.job_id}.{k}").exists()
        )
        phase.dir.rename(earlier)
        phase.job = BurstBufferJob(job_id=phase.job_id)
    job = phase.job
    job.uid, job.gid = uid, gid
    with contextlib.suppress(KeyError):
        job.user = pwd.getpwuid(uid).pw_name
    phase.dir.mkdir(parents=True, exist_ok=True)
    os.chmod(phase.dir, 0o755)
    staging = phase.dir / "staging"
    staging.mkdir(exist_ok=True)
    os.chown(staging, uid, gid)
    phase.save()
    return f"burst buffer for {phase.user_name()} in {phase.dir}"


def _user_can(phase: Phase, test: str, path: str) -> bool:
    """Whether the shell test `test` on `path` passes as the job's user."""
    job = phase.job
    if job.uid is None or job.gid is None:
        raise JobError("EINVAL", f"job {phase.job_id}: its user is not known (no setup)")
    done = subprocess.run(
        ["sh", "-c", test, "sh", path],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=60,
        check=False,
        cwd="/",
        user=job.uid,
        group=job.gid,
        extra_groups=user_groups(job.uid, job.gid),
    )
    return done.returncode == 0


def user_groups(uid: int, gid: int) -> list[int]:
    """The user's groups, as a login would give them."""
    try:
        return os.getgrouplist(pwd.getpwuid(uid).pw_name, gid)
    except KeyError:
        return [gid]


def become_user(uid: int, gid: int) -> None:
    """Drop this (root) process to the user: every file access from here on is the user's."""
    os.setgroups(user_groups(uid, gid))
    os.setgid(gid)
    os.setuid(uid)
    os.umask(0o022)
    os.environ["BENCHFS_NETNS"] = OWN_NETWORK


READABLE = 'test -r "$1" && { test ! -d "$1" || test -x "$1"; }'
WRITABLE_PARENT = (
    'd="$1"; while [ ! -e "$d" ]; do d=$(dirname "$d"); done; test -d "$d" -a -w "$d" -a -x "$d"'
)


def data_in(phase: Phase) -> str:
    """While the job waits for nodes: each stage-in source readable and each stage-out
    destination creatable by the job's user, so that a job that cannot stage waits held
    with the reason, not after its nodes were allocated."""
    for source, _ in phase.directives.stage_in:
        if not _user_can(phase, READABLE, source):
            raise JobError(
                "EACCES",
                f"stage_in source {source} does not exist or user {phase.user_name()} "
                "cannot read it",
            )
    for _, destination in phase.directives.stage_out:
        if not _user_can(phase, WRITABLE_PARENT, destination):
            raise JobError(
                "EACCES",
                f"stage_out destination {destination}: user {phase.user_name()} cannot create it",
            )
    count = len(phase.directives.stage_in) + len(phase.directives.stage_out)
    return f"{count} staging paths checked as {phase.user_name()}"


# ---- pre-run: start and stage in ----


def _job_nodes(phase: Phase, names: Sequence[str]) -> None:
    """nodes.toml: the site's entries for the job's nodes, or one node per host."""
    if phase.site.nodes_file:
        known = {n.name: n for n in load_nodes(phase.site.nodes_file)}
        missing = [name for name in names if name not in known]
        if missing:
            raise JobError(
                "ENOENT",
                f"node {missing[0]} of job {phase.job_id} is not in the site's nodes file "
                f"{phase.site.nodes_file}",
            )
        nodes = [known[name] for name in names]
    else:
        nodes = from_hostnames(names, phase.site.scratch or "/tmp")
    write_nodes(phase.dir / "nodes.toml", nodes)


def pre_run(phase: Phase, argv: Sequence[str]) -> str:
    """Start BenchFS on the job's nodes and stage in, in a worker of its own session: Slurm
    kills this process's group when the job is cancelled meanwhile, and the worker must
    then stop what it started itself (teardown tells it to)."""
    job = phase.job
    if job.started and job.torn_down is None:
        return f"BenchFS was started already ({job.servers} servers)"
    worker = _worker(job)
    if worker is None:
        facts = show_job(phase.job_id)
        if not facts.nodes:
            raise JobError("EINVAL", f"job {phase.job_id} has no nodes yet")
        job.nodes, job.batch_host = list(facts.nodes), facts.batch_host
        if job.uid is None:
            job.uid, job.gid, job.user = facts.uid, facts.gid, facts.user
        _job_nodes(phase, facts.nodes)
        job.history = [h for h in job.history if h["phase"] in ("setup", "data-in")]
        phase.save()  # the worker reads it
        log = phase.log("pre-run.log")
        proc = subprocess.Popen(
            [*argv, "--worker"],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
            cwd="/",
        )
        log.close()
        ref = ProcessRef.of(proc.pid)
        job.worker = None if ref is None else [ref.pid, ref.start]
        phase.save()  # at once: a teardown must find the worker (it records itself too)
        status = proc.wait()
    else:
        while worker.alive():
            time.sleep(0.2)
        status = 0
    done = record.load(phase.dir, phase.job_id)
    if status != 0 or not done.started:
        raise JobError(
            "EIO", phase.last_line("pre-run.log") or f"the pre-run worker exited {status}"
        )
    return f"BenchFS up on {', '.join(done.nodes)}: {done.servers} servers, input staged in"


class _Forward:
    """SIGTERM to the worker goes to the command it runs (benchfs start stops what it
    started; a staging copy stops), then the worker stops."""

    def __init__(self) -> None:
        self.child: subprocess.Popen[bytes] | None = None
        self.terminated = False
        signal.signal(signal.SIGTERM, self.handle)

    def handle(self, signum: int, _frame: object) -> None:
        self.terminated = True
        if self.child is not None and self.child.poll() is None:
            self.child.send_signal(signum)

    def wait(self, child: subprocess.Popen[bytes]) -> int:
        self.child = child
        if self.terminated:
            child.send_signal(signal.SIGTERM)
        status = child.wait()
        self.child = None
        return status

    def check(self) -> None:
        """Stop here if told to (what was started is recorded by then)."""
        if self.terminated:
            raise JobError("EINTR", "the pre-run was stopped (the job was cancelled)")


def pre_run_worker(phase: Phase) -> str:
    """Start and stage in. Stopped by teardown (SIGTERM), or by the death of the pre-run that
    waits for it (a cancel kills that; Slurm's flush of the job's scripts may then kill the
    teardown it queued too): then this worker stops what it started itself."""
    forward = _Forward()
    _term_when_parent_dies()
    try:
        return _start_and_stage(phase, forward)
    except JobError:
        if forward.terminated and phase.job.torn_down is None:
            teardown(phase, hurry=True)
        raise


def _term_when_parent_dies() -> None:
    """SIGTERM to this process when the one that started it exits (prctl PR_SET_PDEATHSIG)."""
    parent = os.getppid()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGTERM, 0, 0, 0)  # 1: PR_SET_PDEATHSIG
    if os.getppid() != parent:  # it died before the call
        os.kill(os.getpid(), signal.SIGTERM)


def _start_and_stage(phase: Phase, forward: _Forward) -> str:
    job, directives = phase.job, phase.directives
    me = ProcessRef.of(os.getpid())
    job.worker = None if me is None else [me.pid, me.start]
    phase.save()
    benchfs = find_benchfs_run("benchfs")
    start = [benchfs, "start", "--nodes-file", str(phase.dir / "nodes.toml")]
    start += ["--servers-per-node", str(directives.servers_per_node), "--clients-per-node", "1"]
    start += ["--launcher", phase.site.launcher, "--results-root", str(phase.dir)]
    for setting in directives.sets:
        start += ["--set", setting]
    if directives.mount:
        start += ["--mount", directives.mount, "--mount-owner", str(job.uid)]
    if directives.screen:
        start += ["--screen", "--screen-keeps-clients"]
        if directives.screen == "quick":
            start += ["--screen-args", "--quick"]
    with open(phase.dir / "benchfs.env", "wb") as exports:
        status = forward.wait(phase.run_logged(start, "start.log", stdout=exports))
    forward.check()
    if status != 0:
        raise JobError("EIO", f"benchfs start failed: {phase.last_line('start.log')}")
    state = JobState.load(Path(_exported(phase.dir / "benchfs.env", "BENCHFS_JOB_DIR")))
    job.run_dir, job.servers, job.data = state.run_dir, state.servers, "live"
    phase.save()
    _replace_link(phase.run_link, state.run_dir)
    # The job's user reads the registry (its staging and its programs connect to the servers).
    # Its clients write telemetry beside the servers'.
    os.chown(Path(state.run_dir) / "telemetry", job.uid or 0, job.gid or 0)
    registry = Path(state.registry)
    for path, mode in [(registry, 0o750), *((p, 0o640) for p in registry.iterdir())]:
        os.chown(path, -1, job.gid if job.gid is not None else -1)
        os.chmod(path, mode)
    if phase.site.shared_host and directives.mount and state.mount_point:
        batch = Path(directives.mount) / (job.batch_host or job.nodes[0])
        _replace_link(phase.dir / "mount", str(batch))
    excluded = read_json(Path(state.run_dir) / "manifest.json").get("excluded") or []
    (phase.dir / "excluded.txt").write_text("".join(f"{e['host']}\n" for e in excluded))
    for k, (source, destination) in enumerate(directives.stage_in):
        argv = phase.staging("in", source, destination, k)
        status = forward.wait(phase.run_logged(argv, "stage-in.log"))
        forward.check()
        if status != 0:
            raise JobError("EIO", f"stage_in {source}: {phase.last_line('stage-in.log')}")
    job.started, job.staged_in = True, True
    phase.save()
    return f"started {job.servers} servers; staged in {len(directives.stage_in)} trees"


def _exported(env_file: Path, name: str) -> str:
    for line in env_file.read_text().splitlines():
        words = shlex.split(line)
        if len(words) == 2 and words[0] == "export" and words[1].startswith(name + "="):
            return words[1].split("=", 1)[1]
    raise JobError("EIO", f"{env_file}: benchfs start exported no {name}")


def _replace_link(link: Path, target: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        link.unlink()
    link.symlink_to(target)


def _worker(job: BurstBufferJob) -> ProcessRef | None:
    if job.worker is None:
        return None
    ref = ProcessRef(job.worker[0], job.worker[1])
    return ref if ref.alive() else None


# ---- the job ended: post-run, data-out ----


def post_run(phase: Phase) -> str:
    """Record how the job ended (post-run runs whether it succeeded, failed, was cancelled
    or lost a node)."""
    facts = show_job(phase.job_id)
    phase.job.ended, phase.job.exit_code = facts.state, facts.exit_code
    phase.save()
    return f"job ended with exit code {facts.exit_code} (status:signal)"


def data_out(phase: Phase) -> str:
    job = phase.job
    if not job.started:
        return "nothing to stage out: BenchFS was not started"
    if job.staged_out:
        return "staged out already"
    for k, (source, destination) in enumerate(phase.directives.stage_out):
        argv = phase.staging("out", source, destination, k)
        if phase.run_logged(argv, "stage-out.log").wait() != 0:
            raise JobError("EIO", f"stage_out {source}: {phase.last_line('stage-out.log')}")
    job.staged_out = True
    phase.save()
    return f"staged out {len(phase.directives.stage_out)} trees"


# ---- teardown ----


def teardown(phase: Phase, hurry: bool) -> str:
    """Stop a pre-run still at work, stop BenchFS, delete its node-local data only when no
    output can be lost: the stage-out succeeded, there was none to do, or the job's script
    never ran (the data is then only copies of the staged-in sources)."""
    job = phase.job
    if job.torn_down is not None:
        return f"torn down already at {job.torn_down}"
    worker = _worker(job)
    if worker is not None and worker.pid != os.getpid():
        stop_refs([worker], signal.SIGTERM, WORKER_STOP_GRACE_S)
        job = phase.job = record.load(phase.dir, phase.job_id)
    message = "nothing was running"
    # Every BenchFS job started here, recorded or not (a start that ended as the worker was
    # stopped wrote its job file, not yet the record).
    started = [p.parent for p in sorted(phase.dir.glob(f"*-local-*/{JOB_FILE}"))]
    for run_dir in (r for r in started if JobState.load(r).stopped is None):
        nothing_lost = job.staged_out or not phase.directives.stage_out or job.ended is None
        keep = not nothing_lost
        argv = [find_benchfs_run("benchfs"), "stop", "--job", str(run_dir)]
        argv.append("--keep-data" if keep else "--delete-data")
        status = phase.run_logged(argv, "teardown.log").wait()
        state = JobState.load(run_dir)
        if state.stopped is None:
            raise JobError("EIO", f"benchfs stop failed: {phase.last_line('teardown.log')}")
        scratch = read_json(run_dir / "manifest.json").get("scratch_dirs") or {}
        job.data = "kept" if keep else "deleted"
        job.kept_at = sorted(scratch.values()) if keep else []
        message = f"BenchFS stopped; node-local data {job.data}"
        if keep:
            message += " (the stage-out did not succeed): " + ", ".join(job.kept_at)
        if status != 0:
            message += f"; {phase.last_line('teardown.log', 'benchfs: ')}"
    with contextlib.suppress(FileNotFoundError):
        (phase.dir / "mount").unlink()
    job.torn_down = utc_now()
    phase.save()
    return message + (" (hurry)" if hurry else "")


# ---- status ----


def _state(job: BurstBufferJob) -> str:
    if job.torn_down is not None:
        return "torn-down"
    if job.staged_out:
        return "staged-out"
    if job.ended is not None:
        return "ended"
    if job.started:
        return "running"
    if job.worker is not None:
        return "starting"
    return "pending"


def status(site: Site, job_id: str) -> str:
    """`scontrol show bbstat`: one line per job (or one job's record in full)."""
    rows = [j for j in record.jobs(site.root) if job_id in ("all", j.job_id)]
    if job_id != "all" and not rows:
        raise JobError("ENOENT", f"no BenchFS burst buffer for job {job_id}")
    lines = [f"{'JobId':<8} {'User':<10} {'State':<11} {'Servers':>7}  {'Data':<8} Nodes"]
    for j in rows:
        lines.append(
            f"{j.job_id:<8} {j.user or '-':<10} {_state(j):<11} {j.servers:>7}  {j.data:<8} "
            f"{','.join(j.nodes) or '-'}"
        )
    if job_id != "all":
        j = rows[0]
        lines.append(f"directory {record.job_dir(site.root, j.job_id)}")
        if j.kept_at:
            lines.append("data kept at " + ", ".join(j.kept_at))
        lines += [
            f"{h['time']} {h['phase']:<9} {'ok' if h['ok'] else 'FAILED'}  {h['message']}"
            for h in j.history
        ]
    return "\n".join(lines)


def run_phase(name: str, phase: Phase, action: Any) -> tuple[bool, str]:
    """Run one phase; (ok, its one line), noted in the record and logs/phases.log."""
    try:
        ok, message = True, action()
    except BenchfsError as e:
        ok, message = False, e.message
    except OSError as e:
        ok, message = False, f"{e.strerror or e}: {e.filename or ''}".rstrip(": ")
    message = " ".join(message.split())
    with contextlib.suppress(BenchfsError):
        phase.job = record.load(phase.dir, phase.job_id)
    phase.job.note(name, ok, message)
    phase.save()
    with phase.log("phases.log") as log:
        log.write(f"{name}: {'ok' if ok else 'FAILED'}: {message}\n".encode())
    return ok, message


__all__ = [
    "Directives",
    "Phase",
    "Site",
    "data_in",
    "data_out",
    "post_run",
    "pre_run",
    "pre_run_worker",
    "run_phase",
    "setup",
    "status",
    "teardown",
]

"""BenchFS as Slurm's burst buffer, with real Slurm (Debian's 22.05 and its burst_buffer/lua
plugin): two slurmd nodes, each in its own network and UTS namespace, the controller in a
third namespace (none of the job's nodes), jobs submitted by an ordinary user (Slurm refuses
burst buffers to root). The jobs' directives are read by our burst_buffer.lua; BenchFS
servers start on the job's nodes, the job reads its staged input through its mount and writes
its output, which is staged out after it, checked file by file."""

from __future__ import annotations

import hashlib
import os
import pwd
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from benchfs.burstbuffer import LUA_SCRIPT
from benchfs.nodes import write_nodes
from benchfs.simnodes import NODES_SUBNET, netns_nodes, remove_netns_nodes
from benchfs.submit import find_benchfs_run
from slurm_local import NamespacedSlurm, missing_binaries

USER = "nobody"

pytestmark = [
    pytest.mark.skipif(bool(missing_binaries()), reason="Slurm is not installed"),
    pytest.mark.skipif(
        os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("nsenter") is None,
        reason="network namespaces need root, ip and nsenter",
    ),
]


@dataclass
class BurstBufferSlurm:
    slurm: NamespacedSlurm
    shared: Path
    root: Path
    work: Path
    mount: Path
    uid: int
    gid: int

    def submit(self, body: str, directives: list[str], nodes: int = 2) -> tuple[str, str]:
        """(job id, script path) of a job of `nodes` nodes with `#BB_LUA` directives."""
        script = self.work / f"job-{time.monotonic_ns()}.sh"
        lines = ["#!/bin/bash", f"#SBATCH --nodes={nodes}", f"#SBATCH --output={self.work}/%j.out"]
        lines += [f"#BB_LUA {d}" for d in directives]
        script.write_text("\n".join([*lines, body, ""]))
        os.chown(script, self.uid, self.gid)
        done = self.slurm.as_user(USER, "sbatch", "--parsable", f"--chdir={self.work}", str(script))
        assert done.returncode == 0, done.stderr
        return done.stdout.strip().split(";")[0], str(script)

    def show(self, job_id: str) -> str:
        return self.slurm.run("scontrol", "show", "job", job_id).stdout

    def field(self, job_id: str, name: str) -> str:
        found = re.search(rf"\b{name}=(\S*)", self.show(job_id))
        return found.group(1) if found else ""

    def wait_for(self, what: str, ready: object, timeout: float) -> None:
        assert callable(ready)
        deadline = time.monotonic() + timeout
        while not ready():
            if time.monotonic() > deadline:
                pytest.fail(f"timed out waiting for {what}:\n{self.slurm.logs()}")
            time.sleep(0.3)

    def record_dir(self, job_id: str) -> Path:
        return self.root / job_id

    def torn_down(self, job_id: str, timeout: float = 90) -> str:
        """Waits until the job's burst buffer is torn down; `scontrol show bbstat JOB`."""
        self.wait_for(
            f"job {job_id}'s teardown",
            lambda: (
                "teardown  ok" in self.bbstat(job_id)
                and self.field(job_id, "BurstBufferState") in ("complete", "")
            ),
            timeout,
        )
        return self.bbstat(job_id)

    def bbstat(self, job_id: str = "") -> str:
        done = self.slurm.run("scontrol", "show", "bbstat", *([job_id] if job_id else []))
        return done.stdout


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _benchfs_processes(tag: str) -> list[str]:
    """Live benchfsd / benchfs-mount command lines that name `tag` (the site's directory)."""
    out = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True, check=True).stdout
    return [
        line
        for line in out.splitlines()
        if tag in line and ("benchfsd" in line or "benchfs-mount" in line)
    ]


@pytest.fixture(scope="module")
def bb() -> Iterator[BurstBufferSlurm]:
    shared = Path(tempfile.mkdtemp(prefix="benchfs-bb-", dir="/tmp"))
    os.chmod(shared, 0o755)
    user = pwd.getpwnam(USER)
    tag = f"bb{os.getpid() % 100000}"
    nodes = netns_nodes(3, shared / "scratch", tag=tag)
    cluster: NamespacedSlurm | None = None
    try:
        write_nodes(shared / "site-nodes.toml", nodes[:2])
        root, work, mount = shared / "jobs", shared / "work", shared / "mnt"
        for d in (root, work, mount):
            d.mkdir()
            os.chmod(d, 0o755)
        os.chown(work, user.pw_uid, user.pw_gid)
        base = shared / "slurm"
        base.mkdir()
        (base / "burst_buffer.lua").symlink_to(LUA_SCRIPT)
        (base / "benchfs_bb.conf").write_text(
            f"benchfs = {find_benchfs_run('benchfs')}\n"
            f"root = {root}\n"
            f"nodes_file = {shared / 'site-nodes.toml'}\n"
            "launcher = local\n"
            "shared_host = yes\n"
        )
        (base / "burst_buffer.conf").write_text(
            "Flags=TeardownFailure\nOtherTimeout=120\nStageInTimeout=120\nStageOutTimeout=120\n"
        )
        compute = {
            n.name: (n.netns or "", f"10.{NODES_SUBNET}.0.{i}") for i, n in enumerate(nodes[:2], 1)
        }
        controller = (nodes[2].netns or "", f"10.{NODES_SUBNET}.0.3")
        cluster = NamespacedSlurm(
            base,
            compute,
            controller,
            extra=[
                "BurstBufferType=burst_buffer/lua",
                "DebugFlags=BurstBuffer",
                # A job whose stage-in ended starts at the next scheduling pass (every 60 s
                # by default).
                "SchedulerParameters=sched_interval=1",
            ],
        )
        cluster.start(timeout=60)
        yield BurstBufferSlurm(cluster, shared, root, work, mount, user.pw_uid, user.pw_gid)
    finally:
        if cluster is not None:
            cluster.stop()
            assert not cluster.leftover()
        remove_netns_nodes(tag)
        subprocess.run(["umount", "-l", *map(str, mount.glob("*"))], capture_output=True)
        if not os.environ.get("BENCHFS_KEEP_BB"):
            shutil.rmtree(shared, ignore_errors=True)


def test_a_job_runs_against_its_burst_buffer_and_its_output_is_staged_out(
    bb: BurstBufferSlurm,
) -> None:
    source = bb.work / "input"
    (source / "sub").mkdir(parents=True)
    (source / "a.bin").write_bytes(os.urandom(3 << 20) + b"tail")
    (source / "sub" / "small.txt").write_text("small file\n")
    subprocess.run(["chown", "-R", f"{bb.uid}:{bb.gid}", str(source)], check=True)
    out = bb.work / "results"
    go = bb.work / "go"
    body = f"""set -e
env | grep ^BENCHFS_ | sort > {bb.work}/env-$SLURM_JOB_ID
hostname > {bb.work}/host-$SLURM_JOB_ID
cmp "$BENCHFS_MOUNT/input/a.bin" {source}/a.bin
cmp "$BENCHFS_MOUNT/input/sub/small.txt" {source}/sub/small.txt
mkdir "$BENCHFS_MOUNT/output"
cat "$BENCHFS_MOUNT/input/a.bin" "$BENCHFS_MOUNT/input/a.bin" > "$BENCHFS_MOUNT/output/double.bin"
echo "written by $(id -un) on $(hostname)" > "$BENCHFS_MOUNT/output/note.txt"
for i in $(seq 600); do [ -e {go} ] && break; sleep 0.1; done
"""
    job, _ = bb.submit(
        body,
        [
            "servers_per_node 1",
            f"mount {bb.mount}",
            f"stage_in {source} /input",
            f"stage_out /output {out}",
            "set layout.chunk_size=1M",
        ],
    )
    bb.wait_for("the job to run", lambda: bb.field(job, "JobState") == "RUNNING"
                and bb.field(job, "BurstBufferState") == "running", 120)  # fmt: skip
    squeue = bb.slurm.run("squeue", "-j", job, "-h", "-O", "JobID,State,BurstBufferState").stdout
    assert squeue.split()[1:] == ["RUNNING", "running"], squeue
    listing = bb.bbstat()
    assert re.search(rf"^{job}\s+{USER}\s+running\s+2\s+live\s+n1,n2$", listing, re.M), listing
    go.touch()
    bb.wait_for("the job to end", lambda: bb.field(job, "JobState") == "COMPLETED", 120)
    status = bb.torn_down(job)
    assert re.search(rf"^{job}\s+{USER}\s+torn-down\s+2\s+deleted", status, re.M), status

    assert (bb.work / f"host-{job}").read_text().strip() == "n1"
    env = dict(line.split("=", 1) for line in (bb.work / f"env-{job}").read_text().splitlines())
    assert env["BENCHFS_BB_DIR"] == str(bb.record_dir(job))
    assert env["BENCHFS_MOUNT"] == str(bb.record_dir(job) / "mount")
    assert (out / "double.bin").read_bytes() == (source / "a.bin").read_bytes() * 2
    assert (out / "note.txt").read_text() == f"written by {USER} on n1\n"
    assert (out / "double.bin").stat().st_uid == bb.uid
    logs = bb.record_dir(job) / "logs"
    assert "stage-in" in (logs / "stage-in.log").read_text()
    assert "stage-out" in (logs / "stage-out.log").read_text()
    assert not _benchfs_processes(str(bb.shared))
    scratch = [p for p in (bb.shared / "scratch").rglob("*") if p.is_dir() and job in p.name]
    assert not scratch, scratch


def test_a_bad_directive_is_refused_by_sbatch_in_one_line(bb: BurstBufferSlurm) -> None:
    cases = {
        "colour blue": "line 3: unknown directive 'colour'",
        "servers_per_node many": "servers_per_node takes a whole number from 1 to 16, not 'many'",
        "stage_in relative /in": "stage_in: 'relative' is not an absolute path",
        "set storage.layout=packed": "'storage.layout' is not a key a job may set",
        "set layout.chunk_size=big": "layout.chunk_size takes a size such as 4M or 65536",
        "capacity=1G pool=x": "capacity= and pool= are not used",
    }
    for directive, expected in cases.items():
        script = bb.work / "bad.sh"
        script.write_text(f"#!/bin/bash\n#SBATCH --nodes=1\n#BB_LUA {directive}\ntrue\n")
        os.chown(script, bb.uid, bb.gid)
        done = bb.slurm.as_user(USER, "sbatch", f"--chdir={bb.work}", str(script))
        assert done.returncode != 0
        said = [line for line in done.stderr.splitlines() if "burst_buffer/lua:" in line]
        assert len(said) == 1 and expected in said[0], done.stderr

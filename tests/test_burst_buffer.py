"""BenchFS as Slurm's burst buffer, with real Slurm (Debian's 22.05 and its burst_buffer/lua
plugin): two slurmd nodes, each in its own network and UTS namespace, the controller in a
third namespace (none of the job's nodes), jobs submitted by an ordinary user (Slurm refuses
burst buffers to root). The jobs' directives are read by our burst_buffer.lua; BenchFS
servers start on the job's nodes, the job reads its staged input through its mount and writes
its output, which is staged out after it, checked file by file."""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from benchfs.burstbuffer import LUA_SCRIPT
from benchfs.config import parse_config, resolve_config_text
from benchfs.nodes import write_nodes
from benchfs.simnodes import NODES_SUBNET, namespace_pids, netns_nodes, remove_netns_nodes
from benchfs.submit import find_benchfs_run
from doc_examples import ROOT, examples
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

    def submit(
        self, body: str, directives: list[str], nodes: int = 2, sbatch: tuple[str, ...] = ()
    ) -> tuple[str, str]:
        """(job id, script path) of a job of `nodes` nodes with `#BB_LUA` directives."""
        script = self.work / f"job-{time.monotonic_ns()}.sh"
        lines = ["#!/bin/bash", f"#SBATCH --nodes={nodes}", f"#SBATCH --output={self.work}/%j.out"]
        lines += [f"#SBATCH {option}" for option in sbatch]
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
        """Waits until the job's burst buffer is torn down; `scontrol show bbstat JOB`. (The
        record is polled: each `bbstat` starts a Python process, too many for a poll.)"""
        record = self.record_dir(job_id) / "bb.json"

        def done() -> bool:
            try:
                torn = json.loads(record.read_text()).get("torn_down")
            except (OSError, ValueError):
                return False
            return torn is not None and self.field(job_id, "BurstBufferState") in ("complete", "")

        self.wait_for(f"job {job_id}'s teardown", done, timeout)
        return self.bbstat(job_id)

    def assert_nothing_left(self) -> None:
        """No server or mount of any job runs, no job's data is on the nodes."""
        assert not _benchfs_processes(str(self.shared))
        data = [p for p in (self.shared / "scratch").glob("*/*")]
        assert not data, data
        assert not [m for m in self.mount.glob("*") if os.path.ismount(m)]

    def input_tree(self, name: str, size: int) -> Path:
        """A tree of the job's user: a file of `size` random bytes and a small one."""
        source = self.work / name
        (source / "sub").mkdir(parents=True)
        (source / "a.bin").write_bytes(os.urandom(size) + b"tail")
        (source / "sub" / "small.txt").write_text("small file\n")
        subprocess.run(["chown", "-R", f"{self.uid}:{self.gid}", str(source)], check=True)
        return source

    def bbstat(self, job_id: str = "") -> str:
        done = self.slurm.run("scontrol", "show", "bbstat", *([job_id] if job_id else []))
        return done.stdout


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
        # The plugin refuses every burst buffer until it has loaded its pools once.
        cluster._wait(
            lambda: "Name=lua" in cluster.run("scontrol", "show", "burst").stdout,
            30,
            "the burst buffer plugin to load",
        )
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
    source = bb.input_tree("input", 3 << 20)
    out = bb.work / "results"
    go = bb.work / "go"
    body = f"""set -e
env | grep ^BENCHFS_ | sort > {bb.work}/env-$SLURM_JOB_ID
test -f "$BENCHFS_CONFIG" && test -d "$BENCHFS_REGISTRY" && test -f "$BENCHFS_JOB_DIR/job.json"
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
    assert f"{source}" in (logs / "stage-in.log").read_text()
    assert "checksums" in (logs / "stage-in.log").read_text()
    assert "checksums" in (logs / "stage-out.log").read_text()
    bb.assert_nothing_left()


def test_a_bad_directive_is_refused_by_sbatch_in_one_line(bb: BurstBufferSlurm) -> None:
    cases = {
        "colour blue": "line 3: unknown directive 'colour'",
        "servers_per_node many": "servers_per_node takes a whole number from 1 to 16, not 'many'",
        "stage_in relative /in": "stage_in: 'relative' is not an absolute path",
        "set storage.layout=packed": "'storage.layout' is not a key a job may set",
        "set layout.chunk_size=big": "layout.chunk_size takes a size such as 4M or 65536",
        "pool=fast": "capacity= and pool= are not used",
    }
    for directive, expected in cases.items():
        script = bb.work / "bad.sh"
        script.write_text(f"#!/bin/bash\n#SBATCH --nodes=1\n#BB_LUA {directive}\ntrue\n")
        os.chown(script, bb.uid, bb.gid)
        done = bb.slurm.as_user(USER, "sbatch", f"--chdir={bb.work}", str(script))
        assert done.returncode != 0
        said = [line for line in done.stderr.splitlines() if "burst_buffer/lua:" in line]
        assert len(said) == 1 and expected in said[0], (directive, done.stderr)


def test_a_failed_job_is_staged_out_and_torn_down(bb: BurstBufferSlurm) -> None:
    out = bb.work / "failed-out"
    body = """mkdir "$BENCHFS_MOUNT/out"
echo partial > "$BENCHFS_MOUNT/out/partial.txt"
exit 3
"""
    job, _ = bb.submit(body, [f"mount {bb.mount}", f"stage_out /out {out}"], nodes=1)
    bb.wait_for("the job to fail", lambda: bb.field(job, "JobState") == "FAILED", 120)
    assert bb.field(job, "ExitCode") == "3:0"
    status = bb.torn_down(job)
    assert "exit code 3:0" in status, status
    assert re.search(rf"^{job}.*torn-down\s+1\s+deleted", status, re.M), status
    assert (out / "partial.txt").read_text() == "partial\n"
    bb.assert_nothing_left()


def test_a_job_cancelled_while_staging_in_is_torn_down(bb: BurstBufferSlurm) -> None:
    source = bb.work / "big-input"
    source.mkdir()
    with open(source / "zeros.bin", "wb") as f:
        f.truncate(2 << 30)  # sparse: made at once, still seconds to stage
    os.chown(source / "zeros.bin", bb.uid, bb.gid)
    job, _ = bb.submit("true", [f"mount {bb.mount}", f"stage_in {source} /in"])
    log = bb.record_dir(job) / "logs" / "stage-in.log"
    bb.wait_for("the stage-in to begin", lambda: log.exists(), 120)
    assert bb.field(job, "BurstBufferState") == "pre-run"
    done = bb.slurm.as_user(USER, "scancel", job)
    assert done.returncode == 0, done.stderr
    status = bb.torn_down(job)
    assert re.search(rf"^{job}.*torn-down\s+2\s+deleted", status, re.M), status
    assert "pre-run-worker FAILED  the pre-run was stopped" in status, status
    assert bb.field(job, "JobState") == "CANCELLED"
    bb.assert_nothing_left()
    shutil.rmtree(source)


def test_a_source_the_user_cannot_read_holds_the_job_with_the_reason(
    bb: BurstBufferSlurm,
) -> None:
    secret = bb.work / "secret"
    secret.mkdir(mode=0o700)  # root's
    job, _ = bb.submit("true", [f"stage_in {secret} /in"], nodes=1)
    bb.wait_for("the job to be held", lambda: "cannot_read" in bb.field(job, "Reason"), 60)
    reason = bb.field(job, "Reason")
    assert f"stage_in_source_{secret}_does_not_exist_or_user_{USER}_cannot_read_it" in reason
    assert bb.field(job, "JobState") == "PENDING"
    bb.slurm.as_user(USER, "scancel", job)
    bb.torn_down(job)
    assert not (bb.record_dir(job) / "run").exists()


def test_data_is_kept_when_the_stage_out_fails(bb: BurstBufferSlurm) -> None:
    """The job never made the directory it asked to stage out: the stage-out fails, Slurm
    (Flags=TeardownFailure) tears down, and the node-local data stays, its place named."""
    out = bb.work / "never-out"
    job, _ = bb.submit('echo kept > "$BENCHFS_MOUNT/elsewhere"', [f"mount {bb.mount}",
                       f"stage_out /out {out}"], nodes=1)  # fmt: skip
    status = bb.torn_down(job)
    assert "data-out  FAILED  stage_out /out: benchfs: error ENOENT" in status, status
    assert re.search(rf"^{job}.*torn-down\s+1\s+kept", status, re.M), status
    kept = re.search(r"^data kept at (\S+)$", status, re.M)
    assert kept and Path(kept.group(1)).is_dir(), status
    assert not _benchfs_processes(str(bb.shared))
    shutil.rmtree(kept.group(1))
    bb.assert_nothing_left()


@pytest.mark.long
def test_a_job_cancelled_while_running_is_staged_out_and_torn_down(bb: BurstBufferSlurm) -> None:
    out = bb.work / "cancelled-out"
    body = """mkdir "$BENCHFS_MOUNT/out"
seq 100000 > "$BENCHFS_MOUNT/out/numbers"
sleep 600
"""
    job, _ = bb.submit(body, [f"mount {bb.mount}", f"stage_out /out {out}"])
    bb.wait_for("the job to run", lambda: bb.field(job, "BurstBufferState") == "running", 120)
    time.sleep(2)  # its first lines
    assert bb.slurm.as_user(USER, "scancel", job).returncode == 0
    status = bb.torn_down(job)
    assert re.search(rf"^{job}.*torn-down\s+2\s+deleted", status, re.M), status
    assert (out / "numbers").read_text() == "".join(f"{i}\n" for i in range(1, 100001))
    assert bb.field(job, "JobState") == "CANCELLED"
    bb.assert_nothing_left()


@pytest.mark.long
def test_with_two_copies_a_node_that_dies_mid_job_loses_nothing(bb: BurstBufferSlurm) -> None:
    """Every process of node n2 (its slurmd, its BenchFS server) is killed while the job
    runs on n1 and n2; Slurm is told the node is down, as its SlurmdTimeout would after a
    while: the job ends (NODE_FAIL), and everything it wrote stages out from the copies."""
    out = bb.work / "survived-out"
    source = bb.input_tree("copies-input", 8 << 20)
    body = """mkdir "$BENCHFS_MOUNT/out"
for i in 1 2 3 4; do cp "$BENCHFS_MOUNT/in/a.bin" "$BENCHFS_MOUNT/out/copy$i"; done
touch "$BENCHFS_MOUNT/out/done"
sleep 600
"""
    directives = [f"mount {bb.mount}", f"stage_in {source} /in", f"stage_out /out {out}"]
    job, _ = bb.submit(
        body, [*directives, "replicas 2", "set layout.chunk_size=1M"], sbatch=("--no-requeue",)
    )
    done = bb.record_dir(job) / "mount" / "out" / "done"
    bb.wait_for("the job's output", lambda: done.exists(), 120)
    ns2 = bb.slurm.compute["n2"][0]
    for pid in namespace_pids(ns2):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    bb.slurm.run("scontrol", "update", "nodename=n2", "state=down", "reason=killed")
    try:
        bb.wait_for("the job to end", lambda: bb.field(job, "JobState") == "NODE_FAIL", 60)
        status = bb.torn_down(job)
        assert "data-out  ok" in status, status
        assert re.search(rf"^{job}.*torn-down\s+2\s+deleted", status, re.M), status
        for i in range(1, 5):
            assert (out / f"copy{i}").read_bytes() == (source / "a.bin").read_bytes()
        assert not _benchfs_processes(str(bb.shared))
    finally:
        bb.slurm.start_node("n2", ns2)
        bb.slurm.run("scontrol", "update", "nodename=n2", "state=resume")
        bb.slurm.wait_idle(60)
    bb.assert_nothing_left()


def test_benchfs_run_submit_bb_lua_renders_a_job_slurm_stages(bb: BurstBufferSlurm) -> None:
    """docs/burst-buffer.md's `benchfs-run submit --bb-lua` (rendered with --dry-run here:
    Slurm refuses burst buffers to root, so the user submits the script)."""
    source = bb.input_tree("submit-input", 1 << 20)
    out = bb.work / "submit-out"
    rendered = subprocess.run(
        [find_benchfs_run("benchfs-run"), "submit", "--scheduler", "slurm", "--nodes", "2",
         "--bb-lua", "--dry-run", "--results-root", str(bb.work / "submitted"),
         "--stage-in", str(source), "--stage-out", str(out),
         "--run", 'cp -r "$BENCHFS_MOUNT/sub" "$BENCHFS_MOUNT/copied"',
         "--", "--mount", str(bb.mount), "--servers-per-node", "1", "--set", "layout.replicas=2"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert f"#BB_LUA stage_in {source} /\n#BB_LUA stage_out / {out}\n" in rendered
    assert "#BB_LUA replicas 2\n" in rendered
    job_dir = Path(re.search(r"#SBATCH --output=(\S+)/job-%j.out", rendered).group(1))
    job_dir.mkdir(parents=True)
    subprocess.run(["chown", "-R", f"{bb.uid}:{bb.gid}", str(bb.work / "submitted")], check=True)
    script = job_dir / "job.sh"
    script.write_text(rendered)
    done = bb.slurm.as_user(USER, "sbatch", "--parsable", str(script))
    assert done.returncode == 0, done.stderr
    job = done.stdout.strip()
    bb.wait_for("the job to end", lambda: bb.field(job, "JobState") == "COMPLETED", 120)
    bb.torn_down(job)
    assert (out / "a.bin").read_bytes() == (source / "a.bin").read_bytes()
    assert (out / "copied" / "small.txt").read_text() == "small file\n"
    assert "command exited with status 0" in (job_dir / f"job-{job}.out").read_text()
    bb.assert_nothing_left()


@pytest.mark.long
def test_a_screened_job_names_its_slow_nodes_in_a_file(bb: BurstBufferSlurm) -> None:
    """`screen quick`: benchfs-diagnose screens the job's nodes before the start (two healthy
    nodes here: none is slow); the job's environment names the file of slow nodes."""
    body = 'cat "$BENCHFS_EXCLUDED_FILE" > excluded-$SLURM_JOB_ID; ls "$BENCHFS_MOUNT"'
    job, _ = bb.submit(body, [f"mount {bb.mount}", "screen quick"])
    bb.wait_for("the job to end", lambda: bb.field(job, "JobState") == "COMPLETED", 300)
    bb.torn_down(job)
    assert (bb.work / f"excluded-{job}").read_text() == ""
    run = next(bb.record_dir(job).glob("*-local-*"))
    assert (run / "diagnose").is_dir()
    bb.assert_nothing_left()


def test_the_keys_a_job_may_set_are_the_configurations_layout_and_client_keys() -> None:
    """burst_buffer.lua checks `set KEY=VALUE` itself (inside slurmctld, no Python): its table
    of keys and kinds must be the configuration's layout.* and client.* keys."""
    table = dict(re.findall(r'\["((?:layout|client)\.\w+)"\] = "(\w+)"', LUA_SCRIPT.read_text()))
    config = parse_config(resolve_config_text(environment=False))
    assert set(table) == {f"{s}.{k}" for s in ("layout", "client") for k in config[s]}
    sample = {"size": "16K", "int": "1", "float": "1.5", "string": "/x"}
    for key, kind in table.items():
        resolve_config_text(overrides=[f"{key}={sample[kind]}"], environment=False)


def test_the_job_of_the_manual_runs(bb: BurstBufferSlurm) -> None:
    """docs/burst-buffer.md's job script, its paths made this test's."""
    doc = examples(ROOT / "docs" / "burst-buffer.md")[0]
    assert doc.code.startswith("#!/bin/bash\n#SBATCH --nodes=2\n#BB_LUA"), doc.code
    source, results = bb.work / "manual-in", bb.work / "manual-results"
    source.mkdir()
    words = [f"word{i:05d}" for i in range(20000)]
    (source / "words.txt").write_text("\n".join(reversed(words)) + "\n")
    subprocess.run(["chown", "-R", f"{bb.uid}:{bb.gid}", str(source)], check=True)
    script = bb.work / "manual.sh"
    text = doc.code.replace("/home/me/input", str(source)).replace("/home/me/results", str(results))
    script.write_text(text.replace("/tmp/bfs", str(bb.mount)))
    os.chown(script, bb.uid, bb.gid)
    done = bb.slurm.as_user(USER, "sbatch", "--parsable", f"--chdir={bb.work}", str(script))
    assert done.returncode == 0, done.stderr
    job = done.stdout.strip()
    bb.wait_for("the job to end", lambda: bb.field(job, "JobState") == "COMPLETED", 120)
    bb.torn_down(job)
    assert (results / "sorted.txt").read_text() == "\n".join(words) + "\n"
    bb.assert_nothing_left()

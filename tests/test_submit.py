"""`benchfs-run submit`: a real job on a real one-node Slurm; PBS and NQSV scripts by property."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from benchfs.errors import SubmitError
from benchfs.mount import is_mounted
from benchfs.nodes import Exclusion, load_nodes, write_exclusions
from benchfs.results import read_json
from benchfs.submit import JobSpec, format_time_limit, parse_job_id, parse_time_limit, render
from conftest import alive, benchfs_run_command
from slurm_local import LocalSlurm, missing_binaries


def run_cli(
    args: list[str], env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        benchfs_run_command() + args,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


@pytest.fixture
def slurm(tmp_path: Path) -> Iterator[LocalSlurm]:
    """A one-node Slurm on this machine; checks that no daemon it started outlives the test."""
    missing = missing_binaries()
    if missing:
        pytest.skip(f"Slurm is not installed (missing {', '.join(missing)}; scripts/bootstrap)")
    cluster = LocalSlurm(tmp_path / "slurm")
    with cluster:
        yield cluster
    assert cluster.leftover() == [], "a Slurm daemon outlived the test"


@pytest.mark.timeout(90)
def test_submit_runs_a_real_slurm_job(slurm: LocalSlurm, tmp_path: Path) -> None:
    start = time.monotonic()
    results = tmp_path / "results"
    result = run_cli(
        [
            "submit",
            "--scheduler",
            "slurm",
            "--nodes",
            "1",
            "--time-limit",
            "5",
            "--partition",
            "debug",
            "--results-root",
            str(results),
            "--",
            "--servers",
            "2",
            "--clients",
            "2",
            "--file-size",
            "1M",
            "--transfer-size",
            "64k",
            "--set",
            "layout.chunk_size=65536",
            "--timeout",
            "40",
        ],
        env=slurm.env(),
    )
    assert result.returncode == 0, result.stdout + result.stderr
    job_id = re.search(r"^job\s+(\d+)$", result.stdout, re.M)
    job_dir = re.search(r"^results\s+(\S+)$", result.stdout, re.M)
    assert job_id and job_dir, result.stdout
    job_dir_path = Path(job_dir.group(1))
    assert job_dir_path.parent == results
    submitted = read_json(job_dir_path / "submit.json")
    assert submitted["job_id"] == job_id.group(1) and submitted["scheduler"] == "slurm"
    script = (job_dir_path / "job.sh").read_text()
    assert "#SBATCH --nodes=1" in script and "#SBATCH --time=00:05:00" in script
    assert "#SBATCH --partition=debug" in script

    state, code = slurm.wait_job(job_id.group(1), timeout=60)
    output = "\n".join(p.read_text() for p in job_dir_path.glob("job-*.out"))
    assert (state, code) == ("COMPLETED", "0:0"), output + slurm.logs()

    # Inside the allocation: the nodes file of the allocation, then the pipeline's results.
    nodes = load_nodes(job_dir_path / "nodes.toml")
    assert [n.host for n in nodes] == [slurm.host]
    runs = sorted(job_dir_path.glob("*-srun-*"))
    assert len(runs) == 1, output
    manifest = read_json(runs[0] / "manifest.json")
    assert manifest["outcome"]["status"] == "ok", manifest["outcome"]
    assert manifest["workload"]["verified"] is True
    assert manifest["workload"]["bytes"] == 2 * (1 << 20)
    assert f"job {job_id.group(1)}" in output
    # The pipeline ran through srun: servers and the workload were job steps on the node.
    assert manifest["launcher"]["name"] == "srun"
    assert manifest["nodes"][0]["host"] == slurm.host
    servers = [p for p in manifest["processes"] if p["role"] == "benchfsd"]
    assert len(servers) == 2 and all(p["argv"][0].endswith("srun") for p in servers)
    workload = next(c for c in manifest["commands"] if c["what"] == "workload")
    assert workload["argv"][0].endswith("srun") and "--mpi=pmix" in workload["argv"]
    assert (runs[0] / "iostat" / f"{slurm.host}.json").exists()
    # The run stopped every process it started (inside the job, so checked here).
    assert alive([p["pid"] for p in manifest["processes"]]) == []
    assert time.monotonic() - start < 60


@pytest.mark.timeout(60)
def test_submit_failing_job_is_reported_by_slurm(slurm: LocalSlurm, tmp_path: Path) -> None:
    """A pipeline that fails (an unknown config key) makes the job fail, not pass silently."""
    result = run_cli(
        [
            "submit",
            "--scheduler",
            "slurm",
            "--nodes",
            "1",
            "--results-root",
            str(tmp_path / "results"),
            "--",
            "--set",
            "client.no_such_key=1",
        ],
        env=slurm.env(),
    )
    assert result.returncode == 0, result.stderr
    job_id = re.search(r"^job\s+(\d+)$", result.stdout, re.M)
    assert job_id
    state, code = slurm.wait_job(job_id.group(1), timeout=40)
    assert state == "FAILED" and code != "0:0"


def test_submit_without_a_scheduler_fails_clearly(tmp_path: Path) -> None:
    env = {"PATH": "/nonexistent"}
    result = run_cli(
        ["submit", "--scheduler", "pbs", "--nodes", "2", "--results-root", str(tmp_path)],
        env=env,
    )
    assert result.returncode == 1
    assert "qsub not found on PATH" in result.stderr


def render_script(tmp_path: Path, scheduler: str, **kw: object) -> str:
    spec = JobSpec(
        scheduler=scheduler,
        nodes=int(kw.pop("nodes", 4)),  # type: ignore[call-overload]
        pipeline_args=["--servers", "2", "--file-size", "64M"],
        job_dir=tmp_path / "job",
        benchfs_run="/opt/bench fs/bin/benchfs-run",
        **kw,  # type: ignore[arg-type]
    )
    return render(spec)


def bash_n(script: str, tmp_path: Path) -> None:
    path = tmp_path / "check.sh"
    path.write_text(script)
    out = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr


def nodefile_part(script: str) -> str:
    """The node-file builder exactly as rendered into the script."""
    match = re.search(r"^# >>> nodefile.*?^# <<< nodefile$", script, re.S | re.M)
    assert match, "the script has no node-file section"
    return match.group(0)


EXCLUDED = [Exclusion("bnode002", ("slow nvme1n1",)), Exclusion("bnode004.cluster", ())]


@pytest.mark.parametrize("scheduler", ["pbs", "nqsv"])
def test_pbs_and_nqsv_scripts_by_property(tmp_path: Path, scheduler: str) -> None:
    script = render_script(
        tmp_path,
        scheduler,
        nodes=4,
        time_limit_s=parse_time_limit("1:30:00"),
        queue="bigq",
        account="proj42",
        excluded=EXCLUDED,
    )
    bash_n(script, tmp_path)
    directives = [line for line in script.splitlines() if line.startswith("#PBS")]
    if scheduler == "pbs":
        # One chunk per host, the hosts the job's alone (openpbs doc/man1/pbs_resources.7B).
        assert "#PBS -l select=4" in directives
        assert "#PBS -l place=scatter:excl" in directives
        assert "#PBS -l walltime=01:30:00" in directives
    else:
        # ExaWorks psij-python src/psij/executors/batch/nqsv/nqsv.mustache: --exclusive,
        # -b nodes, --cpunum-lhost per node.
        assert "#PBS -b 4" in directives and "#PBS --exclusive" in directives
        assert "#PBS -l elapstim_req=01:30:00" in directives
    assert "#PBS -q bigq" in directives and "#PBS -A proj42" in directives
    assert "#PBS -V" in directives  # the submitting environment, as sbatch passes it
    # Directives come before the first command, or the scheduler ignores them.
    first_command = next(
        i for i, line in enumerate(script.splitlines()) if line and not line.startswith("#")
    )
    last_directive = max(i for i, line in enumerate(script.splitlines()) if line.startswith("#PBS"))
    assert last_directive < first_command
    # The absolute benchfs-run of render time, quoted (its path has a space).
    assert "BENCHFS_RUN='/opt/bench fs/bin/benchfs-run'" in script
    assert "trap " in script

    # Run the script's own node-file builder against a fake $PBS_NODEFILE (PBS repeats a host
    # once per slot; a host may be written fully qualified).
    fake = tmp_path / "PBS_NODEFILE"
    hosts = ["bnode001", "bnode001", "bnode002", "bnode003.cluster", "bnode004", "bnode004"]
    fake.write_text("\n".join(hosts) + "\n")
    helper = tmp_path / "helper.sh"
    helper.write_text(nodefile_part(script))
    excluded_words = re.search(r"^EXCLUDED_HOSTS=\((.*)\)$", script, re.M)
    assert excluded_words and excluded_words.group(1) == "bnode002 bnode004.cluster"
    out = subprocess.run(
        [
            "bash",
            "-c",
            f"source {helper}; EXCLUDED_HOSTS=({excluded_words.group(1)}); "
            f'benchfs_filter_nodefile "$PBS_NODEFILE" {tmp_path}/filtered "${{EXCLUDED_HOSTS[@]}}"',
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "PBS_NODEFILE": str(fake)},
        check=False,
    )
    assert out.returncode == 0, out.stderr
    kept = (tmp_path / "filtered").read_text().split()
    assert kept == ["bnode001", "bnode001", "bnode003.cluster"]

    # Every host excluded: the builder fails with a message instead of an empty node file.
    fake.write_text("bnode002\nbnode002\n")
    out = subprocess.run(
        ["bash", "-c", f"source {helper}; benchfs_filter_nodefile {fake} {tmp_path}/f2 bnode002"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 1 and "every host" in out.stderr


def test_slurm_script_by_property(tmp_path: Path) -> None:
    script = render_script(
        tmp_path,
        "slurm",
        nodes=3,
        time_limit_s=parse_time_limit("2h"),
        queue="short",
        account="proj42",
        excluded=EXCLUDED,
        extra_directives=["--ntasks-per-node=2"],
    )
    bash_n(script, tmp_path)
    for directive in (
        "#SBATCH --nodes=3",
        "#SBATCH --time=02:00:00",
        "#SBATCH --partition=short",
        "#SBATCH --account=proj42",
        "#SBATCH --exclude=bnode002,bnode004.cluster",
        "#SBATCH --ntasks-per-node=2",
        f"#SBATCH --output={tmp_path / 'job'}/job-%j.out",
    ):
        assert directive in script.splitlines()
    pipeline = [line for line in script.splitlines() if line.startswith('"${PIPELINE[@]}"')]
    assert pipeline == ['"${PIPELINE[@]}" --servers 2 --file-size 64M --results-root "$JOB_DIR" &']


def test_dry_run_prints_and_submits_nothing(tmp_path: Path) -> None:
    write_exclusions(tmp_path, EXCLUDED)
    result = run_cli(
        [
            "submit",
            "--scheduler",
            "slurm",
            "--nodes",
            "2",
            "--exclude-from",
            str(tmp_path / "excluded.json"),
            "--results-root",
            str(tmp_path / "res"),
            "--dry-run",
            "--",
            "--clients",
            "4",
        ]
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("#!/bin/bash\n")
    assert "#SBATCH --exclude=bnode002,bnode004.cluster" in result.stdout
    assert not (tmp_path / "res").exists()
    beside = Path(benchfs_run_command()[0])
    assert f"BENCHFS_RUN={beside}" in result.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--time-limit", "soon"], "invalid time limit 'soon'"),
        (["--queue", "a b"], "--queue/--partition 'a b'"),
        (["--", "--servers", "zero"], "launch arguments after `--`"),
        (["--run", "true", "--", "--file-size", "1M"], "start arguments after `--`"),
        (["--stage-in", "/x", "--", "--servers", "2"], "--stage-in and --stage-out go with --run"),
        (["--run", "true", "--stage-nodes"], "--stage-nodes goes with --stage-in or --stage-out"),
        (["--", "--results-root", "/x"], "give --results-root to `submit`"),
        (["--", "--help"], "benchfs-run launch --help"),
    ],
)
def test_submit_bad_input_is_a_clear_usage_error(
    tmp_path: Path, args: list[str], message: str
) -> None:
    result = run_cli(
        ["submit", "--scheduler", "slurm", "--nodes", "1", "--dry-run", *args],
    )
    assert result.returncode == 2, result.stdout + result.stderr
    assert message in result.stderr


def test_exclusion_file_errors_name_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "excluded.json"
    bad.write_text(json.dumps({"host": "x"}))
    result = run_cli(
        ["submit", "--scheduler", "pbs", "--nodes", "1", "--dry-run", "--exclude-from", str(bad)]
    )
    assert result.returncode == 2
    assert str(bad) in result.stderr


def test_time_limits_and_job_ids() -> None:
    assert parse_time_limit("90") == 5400
    assert parse_time_limit("30s") == 30
    assert parse_time_limit("1:30:00") == 5400
    assert parse_time_limit("2-03:00:00") == 2 * 86400 + 3 * 3600
    assert format_time_limit(2 * 86400 + 61) == "48:01:01"
    for bad in ("", "0", "1:2:3:4", "x5", "-5"):
        with pytest.raises(ValueError, match="invalid time limit"):
            parse_time_limit(bad)
    assert parse_job_id("slurm", "1234;cluster\n") == "1234"
    assert parse_job_id("pbs", "5678.pbs-server\n") == "5678.pbs-server"
    assert parse_job_id("nqsv", "Request 541890.nqsv submitted to queue: gpu.\n") == "541890.nqsv"
    with pytest.raises(SubmitError, match="no job id"):
        parse_job_id("nqsv", "qsub: error\n")


def test_nodes_from_allocation_applies_exclusions(tmp_path: Path) -> None:
    nodefile = tmp_path / "nodefile"
    nodefile.write_text("h1\nh1\nh2\nh3\n")
    env = {"PBS_NODEFILE": str(nodefile), "SLURM_JOB_NODELIST": "", "SLURM_NODELIST": ""}
    result = run_cli(["nodes", "--from-allocation", "--scratch", "/scr", "--exclude", "h2"], env)
    assert result.returncode == 0, result.stderr
    assert re.findall(r'^host = "(\S+)"$', result.stdout, re.M) == ["h1", "h3"]
    result = run_cli(
        ["nodes", "--from-allocation", "--exclude", "h1", "--exclude", "h2", "--exclude", "h3"],
        env,
    )
    assert result.returncode == 1 and "every node of the allocation is excluded" in result.stderr
    result = run_cli(["nodes", "--from-allocation"], {"PBS_NODEFILE": "", "SLURM_JOB_NODELIST": ""})
    assert result.returncode == 2 and "no allocation found" in result.stderr


@pytest.mark.timeout(90)
def test_cancelled_job_tears_down_the_pipeline(slurm: LocalSlurm, tmp_path: Path) -> None:
    """scancel: the script's trap and the pipeline stop every process and delete the data."""
    result = run_cli(
        [
            "submit",
            "--scheduler",
            "slurm",
            "--nodes",
            "1",
            "--results-root",
            str(tmp_path / "results"),
            "--",
            "--servers",
            "2",
            "--clients",
            "2",
            "--file-size",
            "4G",
            "--transfer-size",
            "1M",
        ],
        env=slurm.env(),
    )
    assert result.returncode == 0, result.stderr
    job_id = re.search(r"^job\s+(\d+)$", result.stdout, re.M).group(1)  # type: ignore[union-attr]
    job_dir = Path(re.search(r"^results\s+(\S+)$", result.stdout, re.M).group(1))  # type: ignore[union-attr]

    # Wait (bounded) until the workload runs, then cancel the job as a user would.
    deadline = time.monotonic() + 40
    manifest_path = None
    while time.monotonic() < deadline:
        found = list(job_dir.glob("*-srun-*/manifest.json"))
        if found:
            manifest_path = found[0]
            try:
                manifest = read_json(manifest_path)
            except ValueError:
                manifest = {}
            if any(p.get("role") == "workload" for p in manifest.get("processes", [])):
                break
        time.sleep(0.2)
    else:
        pytest.fail(f"the workload never started:\n{slurm.logs()}")
    assert manifest_path is not None
    time.sleep(1.0)
    assert slurm.run("scancel", job_id).returncode == 0
    state, _ = slurm.wait_job(job_id, timeout=40)
    assert state == "CANCELLED"

    manifest = read_json(manifest_path)
    output = "\n".join(p.read_text() for p in job_dir.glob("job-*.out"))
    assert manifest["outcome"]["status"] == "interrupted", output
    assert "benchfs job: terminated; stopping the pipeline" in output
    assert manifest["finished"] is not None, output
    started = [p["pid"] for p in manifest["processes"]] + [
        c for p in manifest["processes"] for c in p.get("children", [])
    ]
    assert alive(started) == []
    assert manifest["scratch_dirs"]
    left = [d for d in manifest["scratch_dirs"].values() if Path(d).exists()]
    assert left == [], "node-local data left behind"


@pytest.mark.timeout(120)
def test_submit_runs_a_burst_buffer_job(slurm: LocalSlurm, tmp_path: Path) -> None:
    """`submit --run`: inside a real Slurm allocation, `benchfs start` (servers and the mount
    as job steps), stage-in, the user's command on the mount, stage-out, `benchfs stop`; the
    stagings on the client nodes (`--stage-nodes`: a copying job step)."""
    data = tmp_path / "input"
    data.mkdir()
    (data / "words.txt").write_text("pear\napple\nfig\n")
    out = tmp_path / "output"
    mount = tmp_path / "mnt"
    results = tmp_path / "results"
    result = run_cli(
        [
            "submit", "--scheduler", "slurm", "--nodes", "1", "--time-limit", "5",
            "--partition", "debug", "--results-root", str(results),
            "--run", 'sort "$BENCHFS_MOUNT/words.txt" > "$BENCHFS_MOUNT/sorted.txt"',
            "--stage-in", str(data), "--stage-out", str(out), "--stage-nodes",
            "--", "--servers", "2", "--mount", str(mount), "--set", "layout.chunk_size=65536",
        ],
        env=slurm.env(),
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    job_id = re.search(r"^job\s+(\d+)$", result.stdout, re.M)
    job_dir = re.search(r"^results\s+(\S+)$", result.stdout, re.M)
    assert job_id and job_dir, result.stdout
    state, code = slurm.wait_job(job_id.group(1), timeout=90)
    job_path = Path(job_dir.group(1))
    output = "\n".join(p.read_text() for p in job_path.glob("job-*.out"))
    assert (state, code) == ("COMPLETED", "0:0"), output + slurm.logs()
    assert (out / "sorted.txt").read_text() == "apple\nfig\npear\n", output
    assert (out / "words.txt").read_text() == (data / "words.txt").read_text()
    runs = sorted(job_path.glob("*-srun-*"))
    assert len(runs) == 1, output
    manifest = read_json(runs[0] / "manifest.json")
    assert manifest["outcome"]["status"] == "ok", manifest["outcome"]
    job = read_json(runs[0] / "job.json")
    assert job["stopped"] and job["launcher"] == "srun"
    roles = sorted(p["role"] for p in job["processes"])
    assert roles == ["benchfs-mount", "benchfsd", "benchfsd", "iostat"], roles
    assert alive([p["pid"] for p in job["processes"]]) == []
    assert not is_mounted(mount)


def test_exclusions_are_matched_to_the_schedulers_names() -> None:
    """A known name stays; a fully-qualified or short name matching one node becomes it; an
    unknown or ambiguous one is left out with a note naming it; unasked, all stay."""
    from benchfs.nodes import Exclusion
    from benchfs.submit import check_exclusions

    known = ["bnode001", "bnode002", "gpu01.a", "gpu01.b"]
    asked = [
        Exclusion("bnode001", ("slow",)),
        Exclusion("bnode002.cluster.example"),
        Exclusion("gpu01"),
        Exclusion("ghost"),
    ]
    kept, notes = check_exclusions(asked, known)
    assert [e.host for e in kept] == ["bnode001", "bnode002"]
    assert kept[0].reasons == ("slow",)
    assert notes == [
        "excluded host bnode002.cluster.example is the scheduler's node bnode002",
        "excluded host gpu01 matches several nodes (gpu01.a, gpu01.b): left out of the exclusions",
        "excluded host ghost is not a node of the scheduler: left out",
    ]
    kept, notes = check_exclusions(asked, None)
    assert kept == asked and "not checked" in notes[0]


@pytest.mark.timeout(90)
def test_unknown_excluded_names_do_not_fail_a_slurm_submission(
    slurm: LocalSlurm, tmp_path: Path
) -> None:
    """sbatch rejects a whole job for one unknown --exclude name ("Invalid node name
    specified"): checked against the real Slurm first, the unknown ones are left out, named,
    and the job is accepted."""
    excluded = tmp_path / "excluded.txt"
    excluded.write_text("no-such-node\nbad.cluster.example\n")
    result = run_cli(
        ["submit", "--scheduler", "slurm", "--nodes", "1", "--exclude-from", str(excluded),
         "--results-root", str(tmp_path / "results"), "--", "--servers", "1", "--clients", "1"],
        env=slurm.env(),
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "excluded host no-such-node is not a node of the scheduler" in result.stderr
    assert "excluded host bad.cluster.example is not a node of the scheduler" in result.stderr
    job_id = re.search(r"^job\s+(\d+)$", result.stdout, re.M)
    job_dir = re.search(r"^results\s+(\S+)$", result.stdout, re.M)
    assert job_id and job_dir
    assert "#SBATCH --exclude" not in (Path(job_dir.group(1)) / "job.sh").read_text()
    assert slurm.run("scancel", job_id.group(1)).returncode == 0
    slurm.wait_job(job_id.group(1), timeout=40)


@pytest.mark.parametrize(
    ("scheduler", "line"),
    [("pbs", "#PBS -l select=4:ncpus=16:mpiprocs=16"), ("nqsv", "#PBS --cpunum-lhost=16")],
)
def test_cpus_per_node(tmp_path: Path, scheduler: str, line: str) -> None:
    """PBS: ncpus and mpiprocs per chunk (mpiprocs=P lists the host P times in PBS_NODEFILE,
    which the nodes file takes once); NQSV: --cpunum-lhost."""
    script = render_script(tmp_path, scheduler, cpus_per_node=16)
    bash_n(script, tmp_path)
    assert line in script.splitlines()


@pytest.mark.parametrize(
    ("scheduler", "directive", "key"),
    [
        ("slurm", "--nodes=8", "--nodes"),
        ("slurm", "--output=/x/y", "--output"),
        ("pbs", "-l select=2:ncpus=4", "-l select"),
        ("pbs", "-l place=pack", "-l place"),
        ("nqsv", "-b 8", "-b"),
        ("nqsv", "--cpunum-lhost=4", "--cpunum-lhost"),
        ("pbs", "-q other", "-q"),
    ],
)
def test_a_directive_duplicating_ours_is_refused(
    tmp_path: Path, scheduler: str, directive: str, key: str
) -> None:
    with pytest.raises(SubmitError, match=f"sets {key}, which the job script sets already"):
        render_script(tmp_path, scheduler, queue="q1", extra_directives=[directive])
    # One the script does not set is kept.
    other = "--mail-type=END" if scheduler == "slurm" else "-m abe"
    assert other in render_script(tmp_path, scheduler, extra_directives=[other])

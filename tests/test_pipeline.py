"""The benchfs-run pipeline across launchers and simulated nodes (python/benchfs/pipeline.py).

Simulated nodes are nodes-file entries on this host, each with its own scratch directory; the
tests check what a user would: data verified, the excluded node untouched, processes gone,
node-local data deleted, the manifest complete.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from benchfs.errors import RunError
from benchfs.launch import this_host
from benchfs.mpi import find_mpich
from benchfs.nodes import Exclusion, Node, write_exclusions, write_nodes
from benchfs.pipeline import Pipeline, RunSpec, apply_exclusions, plan_roles
from benchfs.pipeline.stages import Stage
from benchfs.rankexec import rank_argv, rank_from_env
from benchfs.results import read_json
from benchfs.telemetry import TelemetryFollower
from conftest import alive, benchfs_run_command, interrupt_once_the_workload_runs
from tel_writer import TelWriter

MIB = 1 << 20


def run_cli(args: list[str], cwd: Path, timeout: float = 150) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        benchfs_run_command() + args, capture_output=True, text=True, timeout=timeout, cwd=cwd
    )


def started_pids(manifest: dict[str, Any]) -> list[int]:
    return [p["pid"] for p in manifest["processes"]] + [
        c for p in manifest["processes"] for c in p.get("children", [])
    ]


def sim_nodes(
    tmp_path: Path,
    count: int,
    host: str | None = None,
    prefixes: dict[int, tuple[str, ...]] | None = None,
) -> tuple[Path, list[Node]]:
    """`count` simulated nodes with their own scratch; hosts are labels unless `host` is given
    (mpiexec needs a real host name to place processes); node i runs under prefixes[i]."""
    nodes = []
    for i in range(1, count + 1):
        scratch = tmp_path / f"scratch-n{i}"
        scratch.mkdir()
        prefix = (prefixes or {}).get(i, ())
        nodes.append(Node(f"n{i}", host or f"sim{i}", str(scratch), prefix=prefix))
    path = tmp_path / "nodes.toml"
    write_nodes(path, nodes)
    return path, nodes


def nodes_named(*names: str) -> list[Node]:
    return [Node(n, f"h-{n}", "/scratch") for n in names]


# Node roles and exclusions.


def test_roles_share_nodes_by_default_and_separates_with_server_nodes() -> None:
    nodes = nodes_named("a", "b", "c", "d")
    shared = plan_roles(nodes, None, None)
    assert [(sid, n.name) for sid, n in shared.servers] == [(0, "a"), (1, "b"), (2, "c"), (3, "d")]
    assert [n.name for n in shared.clients] == ["a", "b", "c", "d"]

    split = plan_roles(nodes, None, None, server_nodes=1, servers_per_node=3, clients_per_node=2)
    assert [(sid, n.name) for sid, n in split.servers] == [(0, "a"), (1, "a"), (2, "a")]
    assert [n.name for n in split.clients] == ["b", "b", "c", "c", "d", "d"]
    assert [n.name for n in split.nodes()] == ["a", "b", "c", "d"]

    totals = plan_roles(nodes, 3, 5, server_nodes=2)
    assert [n.name for _, n in totals.servers] == ["a", "b", "a"]
    # Clients in blocks: a node's ranks are consecutive.
    assert [n.name for n in totals.clients] == ["c", "c", "c", "d", "d"]

    # A screened allocation: the slow nodes (c, d, placed last) run clients only.
    kept = plan_roles(nodes, None, None, server_nodes=2, clients_on_all=True)
    assert [n.name for _, n in kept.servers] == ["a", "b"]
    assert [n.name for n in kept.clients] == ["a", "b", "c", "d"]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"server_nodes": 5}, "the run has 4 nodes"),
        ({"server_nodes": 0}, "the run has 4 nodes"),
        ({"servers": 2, "servers_per_node": 1}, "not both"),
        ({"clients": 2, "clients_per_node": 1}, "not both"),
        ({"servers": 0}, "at least one server"),
    ],
)
def test_roles_reject_what_does_not_fit(kwargs: dict[str, int], message: str) -> None:
    args = {"servers": None, "clients": None, **kwargs}
    with pytest.raises(ValueError, match=message):
        plan_roles(nodes_named("a", "b", "c", "d"), **args)


def test_roles_need_nodes() -> None:
    with pytest.raises(ValueError, match="no nodes"):
        plan_roles([], None, None)


@pytest.mark.parametrize(
    ("workload", "args", "expected"),
    [
        ("rw", None, (48 * MIB, 48 * MIB)),  # run.file_size x repetitions per client
        ("ior", None, (48 * MIB, 48 * MIB)),
        ("ior", "-w -r -t 64k -b 1m -s 4 -i 2", (2 * 8 * MIB, 2 * 8 * MIB)),
        ("ior", "-w -W -t 64k -b 1m", (2 * MIB, 2 * MIB)),  # a checked write reads back
        ("ior", "-r -b 2m -t 1m -k", (0, 4 * MIB)),
        ("ior", "-w -b 2m -t 1m -D 5", None),  # a stonewall may end the phase early
        ("mdtest", None, None),
        ("command", "true", None),
    ],
)
def test_the_workloads_total_bytes_are_known_from_its_options(
    workload: str, args: str | None, expected: tuple[int, int] | None
) -> None:
    """The progress's share done and time left rest on these totals (2 client ranks)."""
    from types import SimpleNamespace

    from benchfs.pipeline.workload import Workload

    roles = SimpleNamespace(clients=["c0", "c1"])
    spec = SimpleNamespace(workload=workload, workload_args=args)
    run = {"file_size": 8 * MIB, "transfer_size": MIB, "repetitions": 3 if args is None else 1}
    ctx = SimpleNamespace(spec=spec, roles=roles)
    stage = Workload(ctx, {"run": run}, None, None)  # type: ignore[arg-type]
    assert stage.expected_bytes() == expected


def test_exclusions_match_host_short_host_or_node_name() -> None:
    nodes = [
        Node("n1", "bnode001.cluster", "/s"),
        Node("n2", "bnode002", "/s"),
        Node("n3", "bnode003", "/s"),
    ]
    excluded = [Exclusion("bnode001", ("fio read 120 MiB/s",)), Exclusion("n3")]
    kept, removed = apply_exclusions(nodes, excluded)
    assert [n.name for n in kept] == ["n2"]
    assert removed == [
        {"host": "bnode001.cluster", "node": "n1", "reasons": ["fio read 120 MiB/s"]},
        {"host": "bnode003", "node": "n3", "reasons": []},
    ]


def test_rankexec_finds_the_rank_and_fills_placeholders() -> None:
    assert rank_from_env({"OMPI_COMM_WORLD_RANK": "3"}) == 3
    assert rank_from_env({"PMI_RANK": "1", "SLURM_PROCID": "7"}) == 1
    assert rank_from_env({"SLURM_PROCID": "7"}) == 7
    with pytest.raises(ValueError, match="no rank"):
        rank_from_env({"PMI_RANK": "x"})
    entry = {"node": "n2", "prefix": ["ip", "netns", "exec", "n2"], "mount": "/mnt/b"}
    argv = rank_argv(entry, ["fio", "--directory={mount}/r{rank}", "--name={node}"], 5)
    assert argv == ["ip", "netns", "exec", "n2", "fio", "--directory=/mnt/b/r5", "--name=n2"]


def test_telemetry_follower_reads_only_complete_snapshots(tmp_path: Path) -> None:
    a = TelWriter(tmp_path / "server-0-w0.tel", "server", 0, "n1")
    b = TelWriter(tmp_path / "server-1-w0.tel", "server", 1, "n2")
    TelWriter(tmp_path / "client-9-w0.tel", "client", 9, "n1", targets=[0, 1])
    (tmp_path / "server-2-w0.tel").write_bytes(b"BFSTEL")  # being created: skipped
    follower = TelemetryFollower(tmp_path)
    assert follower.poll() == {"write": 0, "read": 0}
    a.add("bytes", 1000, op="write")
    a.snapshot(1)
    b.add("bytes", 500, op="read")
    b.snapshot(1)
    assert follower.poll() == {"write": 1000, "read": 500}
    a.add("bytes", 24, op="write")
    a.snapshot(2)
    # A torn snapshot at the end (records without their end marker) is not counted yet.
    a.add("bytes", 1000, op="write")
    a.snapshot(3)
    data = a.path.read_bytes()
    a.path.write_bytes(data[:-64])
    assert follower.poll() == {"write": 1024, "read": 500}
    with open(a.path, "ab") as f:
        f.write(data[-64:])
    assert follower.poll() == {"write": 2024, "read": 500}


# Runs.


@pytest.mark.timeout(150)
def test_exclusion_removes_a_simulated_node(tmp_path: Path) -> None:
    # n3's processes run under a command prefix (as under `ip netns exec` or a cgroup).
    nodes_file, nodes = sim_nodes(tmp_path, 3, prefixes={3: ("nice", "-n", "1")})
    write_exclusions(tmp_path, [Exclusion("sim2", ("fio randread 12 MiB/s < 50% of median",))])
    result = run_cli(
        [
            "launch",
            f"--nodes-file={nodes_file}",
            f"--exclude-from={tmp_path / 'excluded.json'}",
            "--clients-per-node=2",
            "--file-size=2M",
            "--transfer-size=256K",
            "--pin-cpus",
            f"--results-root={tmp_path / 'results'}",
        ],
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    # Not a terminal: plain progress lines, phase by phase.
    assert "phase workload" in result.stderr and "excluded n2 (sim2)" in result.stderr
    assert "excluded   sim2" in result.stdout
    (run_dir,) = (tmp_path / "results").iterdir()
    manifest = read_json(run_dir / "manifest.json")
    assert manifest["outcome"]["status"] == "ok"
    assert manifest["workload"]["verified"] is True
    assert manifest["excluded"] == [
        {"host": "sim2", "node": "n2", "reasons": ["fio randread 12 MiB/s < 50% of median"]}
    ]
    assert [n["name"] for n in manifest["nodes"]] == ["n1", "n3"]
    assert sorted(m["node"] for m in manifest["membership"]) == ["n1", "n3"]
    ranks = json.loads((run_dir / "workload.ranks.json").read_text())["ranks"]
    assert [r["node"] for r in ranks] == ["n1", "n1", "n3", "n3"]
    assert all(r["cpus"] is not None for r in ranks)
    servers = [p for p in manifest["processes"] if p["role"] == "benchfsd"]
    assert [p["argv"][0] for p in servers] == ["taskset", "nice"]
    assert servers[1]["argv"][3] == "taskset"
    assert sorted(p.name for p in (run_dir / "iostat").iterdir()) == ["n1.json", "n3.json"]
    # The excluded node was never touched; the others' job data is gone.
    assert list(Path(nodes[1].scratch).iterdir()) == []
    assert sorted(manifest["scratch_dirs"]) == ["n1", "n3"]
    for node in (nodes[0], nodes[2]):
        assert list(Path(node.scratch).iterdir()) == []
    assert alive(started_pids(manifest)) == []


def mpiexec_cases() -> list[Any]:
    cases: list[Any] = [pytest.param(None, id="openmpi")]
    try:
        cases.append(pytest.param(find_mpich(), id="mpich"))
    except FileNotFoundError as e:
        cases.append(pytest.param(None, id="mpich", marks=pytest.mark.skip(reason=str(e))))
    return cases


@pytest.mark.timeout(200)
@pytest.mark.parametrize("mpiexec", mpiexec_cases())
def test_mpiexec_launcher_on_separate_server_and_client_nodes(
    tmp_path: Path, mpiexec: str | None
) -> None:
    nodes_file, nodes = sim_nodes(tmp_path, 3, host=this_host())
    args = [
        "launch",
        "--launcher=mpiexec",
        f"--nodes-file={nodes_file}",
        "--server-nodes=2",
        "--clients-per-node=2",
        "--workload=ior",
        "--ior-args=-w -r -R -F -C -t 256k -b 2m",
        f"--results-root={tmp_path / 'results'}",
        "--no-analysis",
        "--json",
    ]
    if mpiexec:
        args.append(f"--mpiexec={mpiexec}")
    result = run_cli(args, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert (report["launcher"], report["nodes"], report["servers"], report["clients"]) == (
        "mpiexec",
        3,
        2,
        2,
    )
    assert report["verified"] is True
    manifest = read_json(Path(report["results_dir"]) / "manifest.json")
    assert manifest["launcher"]["mpi"] == ("mpich" if mpiexec else "openmpi")
    assert sorted(m["node"] for m in manifest["membership"]) == ["n1", "n2"]
    servers = [p for p in manifest["processes"] if p["role"] == "benchfsd"]
    assert all("mpiexec" in p["argv"][0] for p in servers)
    assert all(p["exit_status"] is not None for p in servers)
    for node in nodes:
        assert list(Path(node.scratch).iterdir()) == [], f"data left on {node.name}"
    assert alive(started_pids(manifest)) == []


@pytest.mark.timeout(150)
def test_ctrl_c_with_mpiexec_leaves_no_process_and_no_data(tmp_path: Path) -> None:
    nodes_file, nodes = sim_nodes(tmp_path, 2, host=this_host())
    results = tmp_path / "results"
    args = ["local", "--launcher=mpiexec", f"--nodes-file={nodes_file}", "--file-size=4G"]
    proc = subprocess.Popen(
        [*benchfs_run_command(), *args, f"--results-root={results}", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )
    _, out, err = interrupt_once_the_workload_runs(proc, results, delay_s=1.0)
    assert proc.returncode == 130, out + err
    report = json.loads(out)
    assert report["code"] == "EINTR"
    manifest = read_json(Path(report["results_dir"]) / "manifest.json")
    assert manifest["outcome"]["status"] == "interrupted"
    assert alive(started_pids(manifest)) == []
    for node in nodes:
        assert list(Path(node.scratch).iterdir()) == [], f"data left on {node.name}"


@pytest.mark.timeout(150)
def test_user_command_fio_through_the_mount(tmp_path: Path) -> None:
    fio = (
        "fio --name=job --directory={mount} --rw=write --bs=256k --size=8m --ioengine=psync "
        "--verify=crc32c --do_verify=1 --output-format=json"
    )
    result = run_cli(
        [
            "launch",
            "--servers=2",
            "--clients=1",
            "--workload=command",
            f"--command={fio}",
            f"--results-root={tmp_path / 'results'}",
            "--no-analysis",
            "--json",
        ],
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["workload"] == "command" and report["write_mib_s"] > 0
    summary = read_json(Path(report["results_dir"]) / "workload" / "summary.json")
    (write,) = [r for r in summary["rows"] if r["operation"] == "write"]
    assert write["tool"] == "fio" and write["bytes"] == 8 << 20
    manifest = read_json(Path(report["results_dir"]) / "manifest.json")
    (mount,) = [p for p in manifest["processes"] if p["role"] == "benchfs-mount"]
    assert mount["exit_status"] == 0
    assert not os.path.ismount(mount["mountpoint"])
    assert alive(started_pids(manifest)) == []


def test_bad_pipeline_input_is_a_usage_error(tmp_path: Path) -> None:
    nodes_file, _ = sim_nodes(tmp_path, 2)
    cases = [
        (
            ["--exclude-from", str(tmp_path / "missing.json"), f"--nodes-file={nodes_file}"],
            "missing",
        ),
        (["--server-nodes=3", f"--nodes-file={nodes_file}"], "the run has 2 nodes"),
        (["--workload=command"], "--command"),
        (["--launcher=srun"], "Slurm allocation"),
        (["--servers-per-node=2"], "--nodes-file"),
    ]
    for args, message in cases:
        result = run_cli(["launch", f"--results-root={tmp_path / 'r'}", *args], cwd=tmp_path)
        assert result.returncode == 2, (args, result.stdout + result.stderr)
        assert message in result.stderr, (args, result.stderr)


@pytest.mark.timeout(200)
def test_screen_first_then_run_on_the_nodes_it_kept(tmp_path: Path) -> None:
    """--screen runs benchfs-diagnose on the nodes; the run uses exactly the nodes it kept
    (on one shared disk the screen may well call one of them slow: either way it must agree)."""
    nodes_file, nodes = sim_nodes(tmp_path, 2)
    result = run_cli(
        [
            "launch",
            f"--nodes-file={nodes_file}",
            "--screen",
            # One shared disk under two nodes' probes is slow for both: no absolute flag. A 2 s
            # workload probe: what the screen measures is not what this test checks.
            "--screen-args=--quick --seconds 2 --no-network --set diagnose.r_await_ms=100000",
            "--file-size=1M",
            f"--results-root={tmp_path / 'results'}",
            "--no-analysis",
            "--json",
        ],
        cwd=tmp_path,
        timeout=180,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    run_dir = Path(json.loads(result.stdout)["results_dir"])
    manifest = read_json(run_dir / "manifest.json")
    screen = read_json(run_dir / "diagnose" / "screen.json")
    assert sorted(n["name"] for n in screen["nodes"]) == ["n1", "n2"]
    excluded_hosts = {e["host"] for e in screen["excluded"]}
    assert {e["host"] for e in manifest["excluded"]} == excluded_hosts
    used = {n["name"] for n in manifest["nodes"]}
    assert used == {n.name for n in nodes if n.host not in excluded_hosts}
    assert manifest["timings_s"]["screen"] > 0
    assert any(c["what"] == "screen" for c in manifest["commands"])
    assert alive(started_pids(manifest)) == []
    for node in nodes:
        assert list(Path(node.scratch).iterdir()) == [], f"data left on {node.name}"


@pytest.mark.timeout(150)
def test_server_crash_under_mpiexec_fails_cleanly(tmp_path: Path) -> None:
    """A server SIGKILLed mid-run (with the mpiexec that launched it): the run fails with
    EHOSTDOWN, and still stops everything and deletes every node's data."""
    nodes_file, nodes = sim_nodes(tmp_path, 2, host=this_host())
    result = run_cli(
        [
            "launch",
            "--launcher=mpiexec",
            f"--nodes-file={nodes_file}",
            "--file-size=1G",
            "--set=client.request_timeout_s=2.0",
            "--kill-server-after=1.0",
            f"--results-root={tmp_path / 'results'}",
            "--json",
        ],
        cwd=tmp_path,
    )
    assert result.returncode == 1, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["code"] == "EHOSTDOWN", report
    manifest = read_json(Path(report["results_dir"]) / "manifest.json")
    assert [e["kind"] for e in manifest["events"]][:2] == ["fault-injection", "server-died"]
    assert alive(started_pids(manifest)) == []
    for node in nodes:
        assert list(Path(node.scratch).iterdir()) == [], f"data left on {node.name}"


def test_teardown_stops_every_started_stage_in_reverse_and_keeps_the_first_error() -> None:
    """A stage whose stop fails (or raises) does not keep the stages under it running."""
    stopped: list[str] = []

    class Step(Stage):
        def __init__(self, name: str, error: RunError | None = None, bug: bool = False) -> None:
            self.phase, self.error, self.bug = name, error, bug

        def start(self) -> None: ...

        def stop(self) -> RunError | None:
            stopped.append(self.phase)
            if self.bug:
                raise RuntimeError("a bug in a stop")
            return self.error

    pipeline = Pipeline(RunSpec(), ["benchfs-run", "launch"])
    pipeline.started = [
        Step("job_dirs", RunError("EIO", "could not remove /x")),
        Step("iostat"),
        Step("servers", RunError("EIO", "server 1 did not stop cleanly")),
        Step("mount", bug=True),
    ]
    pipeline._teardown()
    assert stopped == ["mount", "servers", "iostat", "job_dirs"]
    assert pipeline.started == []
    error = pipeline.report.error
    assert error is not None and error.message.startswith("stopping mount: RuntimeError")


def test_a_signal_after_a_child_failed_still_makes_the_run_interrupted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """scancel signals the srun steps and the pipeline at about the same time, in no set
    order: the workload's step may die first, and its failure be seen before the pipeline's
    own SIGTERM, which then comes during the teardown. The first signal decides: the run is
    interrupted (exit 130), and the failure seen first is kept as an event."""

    class LateSignal(Stage):
        phase = "servers"

        def start(self) -> None: ...

        def stop(self) -> RunError | None:
            os.kill(os.getpid(), signal.SIGTERM)  # the scheduler's, to the batch step
            return None

    pipeline = Pipeline(RunSpec(), ["benchfs-run", "launch"])

    def run() -> None:
        pipeline.started.append(LateSignal())
        raise RunError("EIO", "workload failed (exit status 143): rank 0 write: terminated")

    monkeypatch.setattr(pipeline, "_pipeline", run)
    previous = signal.getsignal(signal.SIGTERM)
    report = pipeline.execute()
    assert report.error is not None and report.error.code == "EINTR", report.error
    assert report.exit_code == 130
    assert signal.getsignal(signal.SIGTERM) is previous  # handlers restored


def test_a_run_gets_about_20_telemetry_samples_unless_the_interval_was_set() -> None:
    """The default interval (1 s) is replaced by one giving ~20 snapshots over the expected
    length (bytes at 1 GiB/s), 100 ms to 1 s; 250 ms when the length cannot be told; a set
    interval is kept."""
    from benchfs.config import load_config
    from benchfs.pipeline.run import telemetry_interval_ms

    def interval(spec: RunSpec, *sets: str) -> int | None:
        return telemetry_interval_ms(load_config(None, list(sets), environment=False), spec)

    assert interval(RunSpec()) == 100  # 2 x 2 x 64 MiB: a fraction of a second
    assert interval(RunSpec(), "run.file_size=1G", "run.clients=4") == 400  # 8 GiB: 8 s
    assert interval(RunSpec(), "run.file_size=64G") == 1000
    assert interval(RunSpec(workload="ior", workload_args="-t 1m -b 1g")) == 250
    assert interval(RunSpec(workload="mdtest")) == 250
    assert interval(RunSpec(), "telemetry.interval_ms=500") is None

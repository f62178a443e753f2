"""Darshan logs read with PyDarshan (benchfs.analysis.darshanlog): logs made by real Darshan
3.4.7 from programs on a BenchFS mount (tests/data/darshan/README.md names the commands), bad
logs refused in one line, and, where Darshan is built (contrib/darshan/build-darshan.sh and
BENCHFS_DARSHAN_PREFIX), a fresh log of a program through a mount."""

from __future__ import annotations

import csv as csvreader
import json
import os
import re
import shutil
import subprocess
import sys
from collections import Counter
from itertools import pairwise
from pathlib import Path

import jsonschema
import nbformat
import pytest
from click.testing import CliRunner
from nbclient import NotebookClient

from benchfs.analysis import analyze
from benchfs.analysis.appinsights import DRISHTI_CODES
from benchfs.analysis.darshanjoin import analyze_darshan
from benchfs.analysis.darshanlog import read_log
from benchfs.analysis.plots import darshan_timeline_figure
from benchfs.analysis.report import render_html, to_json
from benchfs.analysis.thresholds import resolve_thresholds
from benchfs.cli.analyze import main as analyze_cli
from benchfs.errors import AnalyzeError
from benchfs.telemetry import load_names
from conftest import benchfs_run_command
from darshan_runs import make_run
from test_lifecycle import BIN, exports

DATA = Path(__file__).parent / "data" / "darshan"
PREFIX = os.environ.get("BENCHFS_DARSHAN_PREFIX")  # read before the suite clears BENCHFS_*
IOR_PREFIX = os.environ.get("BENCHFS_IOR_PREFIX")
SOURCE = os.environ.get("BENCHFS_DARSHAN_SOURCE")  # a clone at darshan-3.4.7 (make test-long)


def test_the_ior_log_has_every_read_and_write_of_both_ranks() -> None:
    log = read_log(DATA / "ior-posix-mount.darshan")
    assert (log.format, log.library, log.nprocs) == ("3.41", "3.4.7", 2)
    assert log.exe.split()[1:7] == ["-a", "POSIX", "-t", "64k", "-b", "1m"]
    assert "DXT_POSIX" in log.modules
    assert log.files == ("/tmp/dk/mnt/ior.dat.00000000", "/tmp/dk/mnt/ior.dat.00000001")
    counts = Counter((op.rank, op.op, op.length) for op in log.ops)
    assert counts == {(r, o, 65536): 16 for r in (0, 1) for o in ("write", "read")}
    for rank in (0, 1):
        writes = [op for op in log.ops if op.rank == rank and op.op == "write"]
        assert [op.offset for op in writes] == [i * 65536 for i in range(16)]
        reads = [op for op in log.ops if op.rank == rank and op.op == "read"]
        assert max(w.end_s for w in writes) <= min(r.start_s for r in reads)
    assert all(0 <= op.start_s <= op.end_s <= log.run_time_s + 1 for op in log.ops)


def test_the_planted_log_shows_one_rank_writing_small_blocks_at_random() -> None:
    log = read_log(DATA / "planted-small-random.darshan")
    mine = [op for op in log.ops if op.path.endswith("planted.0") and op.op == "write"]
    assert len(mine) == 2000 and {op.length for op in mine} == {512}
    offsets = [op.offset for op in mine]
    assert sum(b != a + 512 for a, b in pairwise(offsets)) > 1900
    other = [op for op in log.ops if op.path.endswith("planted.1") and op.op == "write"]
    assert [op.offset for op in other] == [i << 20 for i in range(8)]


def test_bad_logs_get_one_line(tmp_path: Path) -> None:
    whole = (DATA / "ior-posix-mount.darshan").read_bytes()
    truncated = tmp_path / "truncated.darshan"
    truncated.write_bytes(whole[:1500])
    other = tmp_path / "other.darshan"
    other.write_bytes(b"3.21" + whole[4:])
    text = tmp_path / "text.darshan"
    text.write_text("not a log\n")
    cases = {
        truncated: "the Darshan reader crashed",
        other: "a Darshan log of format 3.21; this reader reads 3.41",
        text: "not a Darshan log",
        tmp_path / "missing.darshan": "No such file or directory",
    }
    for path, said in cases.items():
        with pytest.raises(AnalyzeError) as e:
            read_log(path)
        assert said in e.value.message and "\n" not in e.value.message, e.value.message
        assert str(path) in e.value.message


@pytest.mark.skipif(
    not PREFIX,
    reason="real Darshan not built: run contrib/darshan/build-darshan.sh DARSHAN_SOURCE PREFIX, "
    "then set BENCHFS_DARSHAN_PREFIX=PREFIX",
)
def test_real_darshan_traces_a_program_through_the_mount(tmp_path: Path) -> None:
    prefix = Path(str(PREFIX))
    mount, logs = tmp_path / "mnt", tmp_path / "logs"
    mount.mkdir()
    logs.mkdir()
    start = subprocess.run(
        [BIN / "benchfs", "start", "--servers", "2", "--mount", str(mount),
         "--results-root", str(tmp_path)],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    env = {**os.environ, **exports(start.stdout)}
    try:
        program = "dd if=/dev/zero of=$0/out bs=4096 count=100 status=none"
        subprocess.run(
            ["sh", "-c", program, str(mount)],
            env={
                **env,
                "LD_PRELOAD": str(prefix / "lib" / "libdarshan.so"),
                "DARSHAN_ENABLE_NONMPI": "1",
                "DXT_ENABLE_IO_TRACE": "1",
                "DARSHAN_LOGPATH": str(logs),
            },
            check=True,
            timeout=60,
        )
    finally:
        subprocess.run([BIN / "benchfs", "stop"], env=env, capture_output=True, timeout=120)
    made = [read_log(p) for p in logs.glob("*.darshan")]
    dd = next(log for log in made if log.exe.startswith("dd "))
    writes = [op for op in dd.ops if op.path == str(mount / "out") and op.op == "write"]
    assert [(op.offset, op.length) for op in writes] == [(i * 4096, 4096) for i in range(100)]


def test_launch_refuses_darshan_where_it_would_see_nothing(tmp_path: Path) -> None:
    cases = {
        ("--workload", "rw"): "--darshan traces a program of yours",
        ("--workload", "command", "--command", "true", "--via", "capi"): "--darshan traces",
    }
    for args, said in cases.items():
        done = subprocess.run(
            [*benchfs_run_command(), "launch", "--darshan", str(tmp_path), *args,
             "--results-root", str(tmp_path / "results")],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert done.returncode == 2, done.stderr
        lines = [line for line in done.stderr.splitlines() if "error" in line]
        assert len(lines) == 1 and said in lines[0], done.stderr
    assert not (tmp_path / "results").exists()
    missing = subprocess.run(
        [*benchfs_run_command(), "launch", "--darshan", str(tmp_path), "--workload", "command",
         "--command", "true", "--results-root", str(tmp_path / "results")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert f"--darshan {tmp_path}: no lib/libdarshan.so" in missing.stderr


@pytest.mark.skipif(not PREFIX, reason="real Darshan not built (BENCHFS_DARSHAN_PREFIX)")
@pytest.mark.parametrize("via", ["mount", "preload"])
def test_launch_traces_a_command_with_darshan(tmp_path: Path, via: str) -> None:
    done = subprocess.run(
        [*benchfs_run_command(), "launch", "--darshan", str(PREFIX), "--workload", "command",
         "--via", via, "--clients", "2", "--results-root", str(tmp_path),
         "--command", "dd if=/dev/zero of={mount}/out.{rank} bs=4096 count=50 status=none"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    run = next(tmp_path.glob("*-local-*"))
    logs = [read_log(p) for p in (run / "darshan").glob("*.darshan")]
    assert len(logs) == 2  # dd has no MPI: one log per process
    for log in logs:
        out = log.exe.split("of=")[1].split()[0]
        writes = [(op.offset, op.length) for op in log.ops if op.path == out and op.op == "write"]
        assert writes == [(i * 4096, 4096) for i in range(50)]
    # The join: each dd's 50 writes reached the servers; with --via preload the client's own
    # telemetry writes (into the run's directory) are not counted as the program's.
    da = analyze(run).darshan
    assert da is not None and da.matched is not None
    assert not da.posix["path"].str.startswith(str(run.resolve())).any()
    assert int(da.matched.loc[da.matched["op"] == "write", "bytes"].sum()) == 2 * 50 * 4096
    assert (via == "preload") == any("BenchFS client's telemetry" in n for n in da.notes)


# --- The application's view: insights, the join with the servers, reports -------------------

RUN = DATA / "slow-server-run"  # tests/darshan_runs.py made it (the README names the command)
SCHEMA = Path(__file__).parent.parent / "python" / "benchfs" / "schemas" / "report.schema.json"
CODE = re.compile(r"\[([PMS]\d\d)\]")


def _drishti(log: Path, out: Path) -> set[str]:
    """The codes Drishti 0.8 (drishti-io, requirements-dev.txt) flags on `log`."""
    out.mkdir()
    done = subprocess.run(
        [str(Path(sys.executable).parent / "drishti"), "--issues", "--code", "--csv",
         "--export_dir", str(out), str(log)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    (csv,) = out.glob("*.csv")
    rows = list(csvreader.DictReader(csv.open()))
    return {code for code, flag in rows[0].items() if flag == "True"}


@pytest.mark.parametrize(
    "log",
    [DATA / "ior-posix-mount.darshan", DATA / "ior-mpiio-mount.darshan",
     DATA / "planted-small-random.darshan", next((RUN / "darshan").glob("*.darshan"))],
    ids=["ior", "ior-mpiio", "planted", "slow-server-ior"],
)  # fmt: skip
def test_the_insights_flag_what_drishti_flags(log: Path, tmp_path: Path) -> None:
    theirs = _drishti(log, tmp_path / "drishti")
    da = analyze_darshan([log], resolve_thresholds())
    ours = {code for i in da.insights for e in i.evidence for code in CODE.findall(e)}
    mapped = {code for codes in DRISHTI_CODES.values() for code in codes}
    assert ours == theirs & mapped, (sorted(ours), sorted(theirs))
    for i in da.insights:
        if i.drishti:
            assert i.fired == bool(set(i.drishti) & theirs), i.id
    if log.name.startswith("planted"):
        # The planted pattern: one rank's 2,000 random 512-byte writes.
        small = next(i for i in da.insights if i.id == "APP-001")
        assert small.fired and "2,000" in small.evidence[0] and "planted.0" in small.evidence[0]
        assert "P06" in theirs


def test_the_thresholds_are_settings(tmp_path: Path) -> None:
    log = DATA / "planted-small-random.darshan"
    strict = resolve_thresholds(overrides=["insights.app_small_count=5000"])
    small = next(i for i in analyze_darshan([log], strict).insights if i.id == "APP-001")
    assert not small.fired and small.evaluated


def test_the_join_names_the_planted_slow_server() -> None:
    a = analyze(RUN)
    da = a.darshan
    assert da is not None and da.matched is not None
    nodes = dict(zip(a.run.servers()["server"], a.run.servers()["node"], strict=True))
    slow_server = next(s for s, n in nodes.items() if n == "b")
    held = next(i for i in da.insights if i.id == "APP-007")
    assert held.fired, held
    assert held.evidence[0].startswith(f"server {slow_server} (b) held"), held.evidence
    by = da.tables["by_server"].set_index("server")
    assert by.loc[slow_server, "slow_held"] >= 2
    assert by.loc[slow_server, "service_p99_ms"] > 3 * by.drop(slow_server)["service_p99_ms"].max()
    slow = da.tables["slow_ops"].dropna(subset=["held_by"])
    assert (slow["held_by"] == slow_server).mean() >= 2 / 3
    # Every byte written reached a server, in 1 MiB requests (the mount sends each write's bytes
    # behind it), and a rank's fsync and close waited for the slow server's.
    wb = da.tables["write_behind"]
    assert (wb["requests"].sum(), wb["bytes"].sum()) == (16, 16 << 20), wb
    flushes = da.ops[da.ops["op"] == "flush"]
    assert len(flushes) == 2
    held_flushes = slow[(slow["op"] == "flush") & (slow["held_by"] == slow_server)]
    assert len(held_flushes) >= 1, slow
    # Both ranks' clocks agree with the servers': a request reached its server within 1 ms of
    # its call's start, and no read returned before its first request was answered.
    al = da.tables["alignment"]
    assert al["agree"].all() and (al["offset_hi_ms"] < 1).all(), al
    assert (al["within_ms"] < 20).all(), al
    # Two phases, writes then reads, each rank on its own file.
    ph = da.tables["phases"]
    assert list(ph["kind"]) == ["write", "read"] and list(ph["ranks"]) == [2, 2]
    assert list(ph["ops"]) == [16, 16] and (ph["shared_files"] == 0).all()
    assert (ph["server_requests"] > 0).all()


def test_the_report_shows_the_application_beside_the_servers(tmp_path: Path) -> None:
    a = analyze(RUN)
    page = render_html(a)
    assert 'id="darshan"' in page and "APP-007" in page
    assert 'operations above the servers" src="data:image/png' in page
    report = to_json(a)
    jsonschema.validate(report, json.loads(SCHEMA.read_text()))
    assert report["darshan"]["summary"]["joined"] is True
    assert {i["id"] for i in report["darshan"]["insights"]} == {f"APP-00{n}" for n in range(1, 8)}
    paths = a.write_csv(tmp_path)
    assert tmp_path / "darshan_slow_ops.csv" in paths and tmp_path / "darshan_insights.csv" in paths
    fig = darshan_timeline_figure(a.darshan)
    assert fig is not None and len(fig.axes) == 2


def test_analyze_cli_reads_logs_made_elsewhere(tmp_path: Path) -> None:
    cli = [str(Path(sys.executable).parent / "benchfs-analyze")]
    planted = str(DATA / "planted-small-random.darshan")
    done = subprocess.run([*cli, "--darshan", planted], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "APP-001 Small requests [Drishti P05, P06]" in done.stdout
    assert "2,000), planted.1" in done.stdout
    # The rest in this process (the same command, without a Python start each).
    runner = CliRunner()
    as_json = runner.invoke(
        analyze_cli,
        ["--darshan", planted, "--json", "--csv", str(tmp_path / "csv"), "--html",
         str(tmp_path / "r.html")],
    )  # fmt: skip
    assert as_json.exit_code == 0, as_json.output
    data = json.loads(as_json.stdout)
    assert data["darshan"]["summary"]["joined"] is False
    assert (tmp_path / "csv" / "darshan_phases.csv").is_file()
    assert "APP-001" in (tmp_path / "r.html").read_text()
    # With the run it was made on: joined.
    log = next((RUN / "darshan").glob("*.darshan"))
    joined = runner.invoke(analyze_cli, [str(RUN), "--darshan", str(log), "--json"])
    assert joined.exit_code == 0, joined.output
    assert json.loads(joined.stdout)["darshan"]["summary"]["matched_requests"] > 0
    bad = tmp_path / "bad.darshan"
    bad.write_text("nope\n")
    for args, said in {
        ("--darshan", str(bad)): "not a Darshan log",
        ("--darshan", planted, "--save"): "--save needs a RESULTS_DIR",
        (): "give a RESULTS_DIR, or Darshan logs with --darshan",
    }.items():
        refused = runner.invoke(analyze_cli, list(args))
        assert refused.exit_code != 0, refused.output
        # An exit with one line, not an exception (CliRunner would keep its traceback).
        assert refused.exception is None or isinstance(refused.exception, SystemExit)
        lines = [line for line in refused.stderr.splitlines() if line.strip()]
        assert said in refused.stderr, refused.stderr
        assert len([line for line in lines if "rror" in line]) == 1, refused.stderr


def test_names_files_are_read_past_a_torn_line(tmp_path: Path) -> None:
    (tmp_path / "server-0-w0.names").write_text(
        '{"format":"benchfs-names","version":1}\n'
        '{"t_ns":1,"file":"00000000000000010000000000000002","path":"/a"}\n'
        '{"t_ns":2,"file":"00000000000000010000000000000002","path":"/a"}\n'
        '{"t_ns":3,"file":"000000000000000100000000000'
    )
    names = load_names(tmp_path)
    assert list(names["path"]) == ["/a"]
    assert (int(names["file_hi"][0]), int(names["file_lo"][0])) == (1, 2)


def test_the_darshan_notebook_runs(tmp_path: Path) -> None:
    nb = nbformat.read(Path(__file__).parent.parent / "notebooks" / "darshan.ipynb", as_version=4)
    (params,) = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    params.source = params.source.replace("RESULTS_DIR = None", f"RESULTS_DIR = {str(RUN)!r}")
    NotebookClient(nb, timeout=120, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path)}}).execute()  # fmt: skip
    code = [c for c in nb.cells if c.cell_type == "code"]
    for cell in code:
        assert not any(o.get("output_type") == "error" for o in cell.outputs), cell.source
    figure = next(c for c in code if "darshan_timeline_figure" in c.source)
    assert any("image/png" in o.get("data", {}) for o in figure.outputs)
    insights = next(c for c in code if "insights_table" in c.source)
    assert "APP-007" in json.dumps(insights.outputs)


@pytest.mark.serial
@pytest.mark.skipif(
    not (PREFIX and IOR_PREFIX and os.geteuid() == 0),
    reason="needs real Darshan and IOR built (BENCHFS_DARSHAN_PREFIX, BENCHFS_IOR_PREFIX) and "
    "root (loop devices)",
)
def test_a_fresh_run_with_a_slow_server_names_it(tmp_path: Path) -> None:
    run = make_run(tmp_path, Path(str(PREFIX)), Path(str(IOR_PREFIX)))
    a = analyze(run)
    assert a.darshan is not None
    held = next(i for i in a.darshan.insights if i.id == "APP-007")
    assert held.fired and "(b) held" in held.evidence[0], held.evidence
    assert a.darshan.tables["alignment"]["agree"].all()


def test_build_darshan_refuses_what_is_not_darshan(tmp_path: Path) -> None:
    script = Path(__file__).parent.parent / "contrib" / "darshan" / "build-darshan.sh"
    done = subprocess.run([script, str(tmp_path), str(tmp_path / "prefix")],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 1
    assert done.stderr.strip() == (
        f"build-darshan: {tmp_path} is not a Darshan source tree "
        "(no darshan-runtime/lib/darshan-core.c)"
    )
    usage = subprocess.run([script], capture_output=True, text=True, timeout=60)
    assert usage.returncode == 2 and usage.stderr.startswith("usage:")


@pytest.mark.long
@pytest.mark.skipif(
    not SOURCE,
    reason="Darshan's sources not here: clone github.com/darshan-hpc/darshan at darshan-3.4.7 "
    "and set BENCHFS_DARSHAN_SOURCE to it",
)
def test_darshan_built_from_its_sources_traces_a_run(tmp_path: Path) -> None:
    script = Path(__file__).parent.parent / "contrib" / "darshan" / "build-darshan.sh"
    source = tmp_path / "src"
    # A copy: the build writes into its source tree (./prepare.sh, build-benchfs/).
    shutil.copytree(str(SOURCE), source, ignore=shutil.ignore_patterns("build-benchfs"))
    built = subprocess.run([script, str(source), str(tmp_path / "prefix")],
                           capture_output=True, text=True, timeout=1800)  # fmt: skip
    assert built.returncode == 0, built.stderr[-3000:]
    assert f"export BENCHFS_DARSHAN_PREFIX={tmp_path / 'prefix'}" in built.stdout
    done = subprocess.run(
        [*benchfs_run_command(), "launch", "--darshan", str(tmp_path / "prefix"), "--workload",
         "command", "--via", "mount", "--clients", "1", "--results-root", str(tmp_path / "runs"),
         "--command", "dd if=/dev/zero of={mount}/out bs=1M count=8 status=none"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    run = next((tmp_path / "runs").glob("*-local-*"))
    a = analyze(run)
    assert a.darshan is not None and a.darshan.matched is not None
    writes = a.darshan.ops[a.darshan.ops["op"] == "write"]
    assert len(writes) == 8 and writes["length"].eq(1 << 20).all()
    assert a.darshan.matched["bytes"].sum() == 8 << 20


def test_mpi_io_calls_give_way_to_the_posix_calls_beneath() -> None:
    log = read_log(DATA / "ior-mpiio-mount.darshan")
    assert {"DXT_MPIIO", "DXT_POSIX"} <= set(log.modules)
    assert {op.module for op in log.ops} == {"MPIIO", "POSIX"}
    da = analyze_darshan([log], resolve_thresholds())
    shared = da.ops[da.ops["path"].str.endswith("/shared.dat") & (da.ops["op"] != "flush")]
    assert set(shared["module"]) == {"POSIX"}
    # IOR -t 1m -b 4m, two ranks: four 1 MiB writes and reads each, once (not twice).
    counts = shared.groupby(["rank", "op"]).size().to_dict()
    assert counts == {(r, o): 4 for r in (0, 1) for o in ("read", "write")}, counts

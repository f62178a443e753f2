"""`benchfs-run launch` end to end: real daemons, real mpiexec, a complete results directory."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from benchfs import __version__, schemas
from benchfs.config import config_hash, parse_config
from benchfs.results import read_json
from conftest import alive, benchfs_run_command


def run_cli(
    args: list[str], cwd: Path, env: dict[str, str] | None = None, timeout: float = 100
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        benchfs_run_command() + args,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env={**os.environ, **(env or {})},
    )


def started_pids(manifest: dict[str, Any]) -> list[int]:
    return [p["pid"] for p in manifest["processes"]] + [
        c for p in manifest["processes"] for c in p.get("children", [])
    ]


@pytest.mark.timeout(120)
def test_local_json_end_to_end(tmp_path: Path) -> None:
    result = run_cli(
        [
            "launch",
            "--servers",
            "3",
            "--clients",
            "2",
            "--file-size",
            "3MiB",
            "--transfer-size",
            "100k",
            "--set",
            "client.chunk_size=64K",  # the old name, as README examples once wrote it
            "--json",
        ],
        cwd=tmp_path,
        # The environment loses to --set, and BENCHFS_RESULTS picks the results root.
        env={"BENCHFS_CLIENT_CHUNK_SIZE": "1M", "BENCHFS_RESULTS": str(tmp_path / "res")},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    renamed = [
        line for line in result.stderr.splitlines() if "now called layout.chunk_size" in line
    ]
    assert len(renamed) == 1, result.stderr  # one notice, however often the old name appears
    report = json.loads(result.stdout)
    schemas.check(report, schemas.RUN_SUMMARY, "benchfs-run --json")
    assert report["outcome"] == "ok"
    assert report["verified"] is True
    assert report["write_mib_s"] > 0 and report["read_mib_s"] > 0
    assert report["bytes"] == 2 * 3 * 2**20
    assert (report["servers"], report["clients"]) == (3, 2)
    assert report["transfer_size"] == 100 * 1024

    run_dir = Path(report["results_dir"])
    assert run_dir.parent == tmp_path / "res"
    assert re.fullmatch(r"\d{8}T\d{6}Z-local-[0-9a-f]{6}", run_dir.name)
    text = (run_dir / "config.toml").read_text()
    config = parse_config(text)
    assert config["layout"]["chunk_size"] == 65536
    assert config["run"]["servers"] == 3
    assert config["cluster"]["expected_servers"] == 3
    assert config["cluster"]["registry_dir"] == str(run_dir / "registry")
    # Servers write their telemetry into the results directory.
    assert config["telemetry"]["dir"] == str(run_dir / "telemetry")
    assert report["telemetry_files"] == len(list((run_dir / "telemetry").glob("*.tel")))

    manifest = read_json(run_dir / "manifest.json")
    schemas.check(manifest, schemas.MANIFEST, run_dir / "manifest.json")
    assert manifest["outcome"] == {"status": "ok", "code": None, "message": None, "exit_code": 0}
    assert manifest["versions"]["benchfs"] == __version__
    assert set(manifest["versions"]) >= {"benchfs", "ucx", "mpi", "kernel", "fio", "sysstat"}
    assert manifest["versions"]["fio"].startswith("fio-")
    assert manifest["config_hash"] == config_hash(text)
    assert manifest["config"]["run"]["servers"] == 3
    assert manifest["mode"] == "local"
    assert manifest["excluded"] == []
    assert [m["id"] for m in manifest["membership"]] == [0, 1, 2]
    assert [m["node"] for m in manifest["membership"]] == ["local-0", "local-1", "local-2"]
    assert {"start_servers", "wait_servers", "workload", "total"} <= set(manifest["timings_s"])
    assert manifest["workload"]["verified"] is True
    own = manifest["commands"][0]
    assert own["what"] == "benchfs-run"
    assert any(arg.endswith("benchfs-run") or arg == "launch" for arg in own["argv"])
    assert [c["what"] for c in manifest["commands"][1:]] == ["workload", "analysis"]
    # iostat ran on every node, into the documented place, and was stopped.
    captures = [p for p in manifest["processes"] if p["role"] == "iostat"]
    assert sorted(p["node"] for p in captures) == ["local-0", "local-1", "local-2"]
    assert all((run_dir / "iostat" / f"{p['node']}.json").exists() for p in captures)
    assert all(p["exit_status"] is not None for p in captures)
    assert manifest["analysis"]["exit_status"] == 0
    assert (run_dir / "analysis" / "report.html").exists()
    daemons = [p for p in manifest["processes"] if p["role"] == "benchfsd"]
    assert [d["exit_status"] for d in daemons] == [0, 0, 0]
    assert alive(started_pids(manifest)) == []

    for i in range(3):
        assert (run_dir / "servers" / f"server-{i}.log").exists()
    summary = read_json(run_dir / "workload" / "summary.json")
    assert summary["verified"] is True and summary["errors"] == []
    assert {read_json(run_dir / "workload" / f"rank-{r}.json")["rank"] for r in range(2)} == {0, 1}
    # Clean shutdown removed every registry entry; the data directories are gone.
    assert list((run_dir / "registry").iterdir()) == []
    assert manifest["data_kept"] is False
    assert sorted(manifest["scratch_dirs"]) == ["local-0", "local-1", "local-2"]
    assert not any(Path(d).exists() for d in manifest["scratch_dirs"].values())


@pytest.mark.timeout(120)
def test_local_table_output_and_keep_data(tmp_path: Path) -> None:
    scratch = tmp_path / "scratch"
    result = run_cli(
        [
            "launch",
            "--file-size=1M",
            "--transfer-size=64K",
            "--keep-data",
            f"--set=run.scratch_dir={scratch}",
            f"--results-root={tmp_path / 'results'}",
        ],
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "every byte" in result.stdout
    assert "MiB/s" in result.stdout
    (run_dir,) = (tmp_path / "results").iterdir()
    assert str(run_dir) in result.stdout.replace("\n", "")
    manifest = read_json(run_dir / "manifest.json")
    assert manifest["data_kept"] is True
    kept = [Path(manifest["scratch_dirs"][f"local-{i}"]) for i in range(2)]
    assert all(k.parent == scratch for k in kept)
    assert [sorted(p.name for p in k.iterdir()) for k in kept] == [["server-0"], ["server-1"]]


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--set", "client.nope=1"], "client.nope"),
        (["--set", "layout.chunk_size=huge"], "chunk_size"),
        (["--config", "does-not-exist.toml"], "does-not-exist.toml"),
        (["--clients", "100000"], "100002 processes on host"),
        (["--servers", "2000"], "at most 1024 per host"),
        (["--workload", "ior", "--ior-args", "-t 1m -b 3m -Z"], "--ior-args: unrecognized"),
        (["--workload", "mdtest", "--mdtest-args", "-n 0"], "--mdtest-args: -n: at least one"),
    ],
)
def test_local_bad_config_exits_2_with_a_clear_message(
    tmp_path: Path, args: list[str], needle: str
) -> None:
    result = run_cli(["local", f"--results-root={tmp_path / 'r'}", *args], cwd=tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "EINVAL" in result.stderr and needle in result.stderr
    assert not (tmp_path / "r").exists()  # nothing was started, so nothing was recorded


@pytest.mark.timeout(60)
def test_local_bad_size_is_a_usage_error(tmp_path: Path) -> None:
    result = run_cli(["launch", "--file-size", "12 parsecs"], cwd=tmp_path)
    assert result.returncode == 2
    assert "invalid size" in result.stderr


@pytest.mark.timeout(60)
def test_unusable_scratch_dir_fails_cleanly(tmp_path: Path) -> None:
    """A failure before the servers run is still recorded, with an errno-like code."""
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    result = run_cli(
        [
            "launch",
            f"--set=run.scratch_dir={blocker}",
            f"--results-root={tmp_path / 'results'}",
            "--json",
        ],
        cwd=tmp_path,
    )
    assert result.returncode == 1, result.stdout + result.stderr
    report = json.loads(result.stdout)
    schemas.check(report, schemas.RUN_SUMMARY, "benchfs-run --json")
    assert report["outcome"] == "failed"
    assert report["code"] == "ENOTDIR"
    assert str(blocker) in report["message"]
    manifest = read_json(Path(report["results_dir"]) / "manifest.json")
    schemas.check(manifest, schemas.MANIFEST, "manifest.json")
    assert manifest["outcome"]["code"] == "ENOTDIR"
    assert manifest["processes"] == []


@pytest.mark.long
@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    "args",
    [
        [],  # the defaults, as `make demo` runs them
        ["--servers=4", "--clients=4", "--file-size=256M", "--transfer-size=4M"],
        ["--servers=3", "--clients=3", "--file-size=100M", "--transfer-size=999999"],
    ],
)
def test_local_larger_runs_verify(tmp_path: Path, args: list[str]) -> None:
    result = run_cli(
        ["launch", *args, f"--results-root={tmp_path}", "--json"], cwd=tmp_path, timeout=500
    )
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["verified"] is True
    manifest = read_json(Path(report["results_dir"]) / "manifest.json")
    assert alive(started_pids(manifest)) == []


def test_tables_are_not_cut_off_a_terminal() -> None:
    """In a pipe or a Slurm log, every command's console is full width: rich's 80 columns
    would cut cells to `10…`."""
    code = (
        "from rich.table import Table\n"
        "from benchfs.cli.consoles import console\n"
        "t = Table('node', 'evidence')\n"
        "t.add_row('local-12345678', 'r_await ' + '1234567890' * 20)\n"
        "console().print(t)\n"
        "console(stderr=True).print(t)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    for stream in (done.stdout, done.stderr):
        assert "…" not in stream and "local-12345678" in stream
        assert "1234567890" * 20 in stream


def test_the_summary_says_what_ran_and_what_was_checked(tmp_path: Path) -> None:
    """An IOR run without -W/-R says its own command line and "not requested"; one server is
    not "1 servers"; an interrupted run says so; values line up, the results path too."""
    from rich.console import Console

    from benchfs.cli.run import _print_report
    from benchfs.errors import RunError
    from benchfs.pipeline import RunReport
    from benchfs.results import create_run_dir

    def shown(report: RunReport) -> list[str]:
        out = Console(record=True, width=200)
        _print_report(out, report)
        return [line.rstrip() for line in out.export_text().splitlines()]

    config = {"run": {"servers": 1, "clients": 1, "file_size": 1 << 20, "transfer_size": 4096}}
    ior = RunReport(config=config, nodes=1, workload="ior", workload_line="ior -t 1m -b 256m")
    ior.summary = {"workload": "ior", "write_mib_s": 10.0, "read_mib_s": 20.0,
                   "verified": False, "verify_requested": False}  # fmt: skip
    ior.run_dir = create_run_dir(tmp_path, "local")
    lines = shown(ior)
    assert "cluster   1 server, 1 client on 1 node (local)" in lines
    assert "workload  ior -t 1m -b 256m" in lines and "verified  not requested" in lines
    assert lines[-1] == f"results   {ior.run_dir.path}"
    stopped = RunReport(config=config, workload="rw")
    stopped.error = RunError("EINTR", "interrupted (Ctrl-C)", 130)
    lines = shown(stopped)
    assert lines[0] == "outcome   interrupted (EINTR)" and "workload  rw (not run)" in lines


def test_help_shows_the_defaults() -> None:
    result = run_cli(["launch", "--help"], cwd=Path.cwd())
    text = " ".join(result.stdout.split())
    shown = ["[default: 2, run.servers]", "[default: 2, run.clients]"]
    shown += ["[default: 64MiB, run.file_size]", "[default: 1MiB, run.transfer_size]"]
    for default in shown:
        assert default in text, text


def test_local_is_the_same_command_as_launch() -> None:
    """`local`, the command's name before other launchers, still works: same options."""
    launch = run_cli(["launch", "--help"], cwd=Path.cwd()).stdout
    local = run_cli(["local", "--help"], cwd=Path.cwd()).stdout
    assert local.split("Options:")[1] == launch.split("Options:")[1]
    listing = run_cli(["--help"], cwd=Path.cwd()).stdout
    assert "launch" in listing and "The same as `launch`." in listing


def test_plain_progress_names_its_bandwidth_and_ends_on_the_workloads_totals() -> None:
    """Plain lines (logs, batch jobs) say their bandwidth is the current one and end on the
    workload's own byte counts, not on the servers' lagging telemetry."""
    from rich.console import Console

    from benchfs.cli.progress import PlainProgress

    out = Console(record=True, width=300)
    p = PlainProgress(out)
    p.phase("workload")
    p.moved(0, 0)
    p.moved(128 << 20, 0)
    p.totals(1 << 30, 1 << 30)
    text = out.export_text()
    assert "written 128MiB, read 0B; now" in text and "MiB/s writing" in text and "(last " in text
    assert "workload moved 1GiB written, 1GiB read" in text
    assert (p.rates.written, p.rates.read) == (1 << 30, 1 << 30)


@pytest.mark.timeout(120)
def test_live_panel_on_a_real_terminal(tmp_path: Path) -> None:
    """On a terminal (a pty, its output rendered by the pyte terminal emulator) the live panel
    shows the workload's phase and bytes while the run goes on, is gone at the end, and the
    screen ends on the summary with the workload's own totals."""
    import fcntl
    import pty
    import select
    import struct
    import termios
    import time

    import pyte

    cols, rows = 120, 50
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
    env = {**os.environ, "TERM": "xterm-256color"}
    env.pop("COLUMNS", None)
    proc = subprocess.Popen(
        [*benchfs_run_command(), "launch", "--file-size", "128M", "--results-root", str(tmp_path)],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env=env,
        start_new_session=True,
    )
    os.close(slave)
    screen = pyte.Screen(cols, rows)
    stream = pyte.ByteStream(screen)
    panels: list[str] = []
    deadline = time.monotonic() + 100
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 1.0)
        if not ready:
            if proc.poll() is not None:
                break
            continue
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: every writer of the pty is gone
            break
        if not data:
            break
        stream.feed(data)
        shown = "\n".join(screen.display)
        if re.search(r"^phase\s+\w+\s+elapsed", shown, re.M):
            panels.append(shown)
    os.close(master)
    assert proc.wait(timeout=30) == 0
    final = "\n".join(line.rstrip() for line in screen.display)
    assert any(re.search(r"^phase\s+workload\s", p, re.M) for p in panels), panels[-1:]
    # 2 clients x 128 MiB: the bytes so far of the known total, and the share done.
    moving = r"^written\s+\d+(\.\d+)?[KMG]iB of 256MiB\s+\d+\.\d MiB/s"
    assert any(re.search(moving, p, re.M) for p in panels), panels[-1:]
    assert any(re.search(r"^progress\s+\d+% done", p, re.M) for p in panels), panels[-1:]
    # The panel is transient: the final screen holds the messages and the summary only.
    assert not re.search(r"^phase\s+\w+\s+elapsed", final, re.M), final
    # Its last frame shows the workload's own totals, not the servers' lagging telemetry. (A
    # read of the pty can end inside a redraw: the last frame counted is the last one whole.)
    whole = [p for p in panels if re.search(r"^written\s", p, re.M)]
    assert re.search(r"^written\s+256MiB\s.*\sread\s+256MiB\s", whole[-1], re.M), whole[-1]
    assert re.search(r"^outcome\s+ok$", final, re.M)
    assert re.search(r"^verified\s+every byte \(256MiB\)$", final, re.M), final
    assert "Traceback" not in final


@pytest.mark.timeout(120)
def test_repetitions_give_the_spread_of_every_figure(tmp_path: Path) -> None:
    """The default workload three times over: each iteration writes, reads back and verifies
    every byte; the summary (--json, the table, the manifest) gives the mean with its standard
    deviation, minimum, maximum and count. The built-in IOR gets -i; its arguments given with
    repetitions are one clear usage error."""
    result = run_cli(
        ["launch", "--repetitions", "3", "--file-size", "2M", "--transfer-size", "512K", "--json",
         "--no-analysis", "--results-root", str(tmp_path / "res")],
        cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    schemas.check(data, schemas.RUN_SUMMARY, "launch --json")
    assert data["verified"] and data["bytes"] == 3 * 2 * (2 << 20)
    for key in ("write_mib_s", "read_mib_s"):
        s = data["spread"][key]
        assert s["n"] == 3 and s["min"] <= s["mean"] <= s["max"] and s["std"] is not None
        assert data[key] == pytest.approx(s["mean"])
    manifest = read_json(Path(data["results_dir"]) / "manifest.json")
    assert manifest["workload"]["spread"] == data["spread"]
    assert manifest["workload"]["repetitions"] == 3
    from benchfs.analysis import analyze

    summary = analyze(data["results_dir"]).summary()  # benchfs-analyze's summary too
    assert summary["iterations"] == 3
    assert summary["write_mib_s_std"] == pytest.approx(data["spread"]["write_mib_s"]["std"])
    table = run_cli(
        ["launch", "--repetitions", "2", "--file-size", "1M", "--no-analysis", "--results-root",
         str(tmp_path / "res")],
        cwd=tmp_path,
    )  # fmt: skip
    assert table.returncode == 0, table.stderr
    assert re.search(r"write\s+[\d.]+ MiB/s \(mean of 2: ± [\d.]+, min [\d.]+, max", table.stdout)
    ior = run_cli(
        ["launch", "--workload", "ior", "--ior-args", "-t 1m -b 1m", "--repetitions", "2",
         "--results-root", str(tmp_path / "res")],
        cwd=tmp_path,
    )  # fmt: skip
    assert ior.returncode == 2 and "give -i 2 among the ior arguments" in ior.stderr


def test_progress_gives_the_share_done_and_the_time_left_when_the_total_is_known() -> None:
    """With the expected bytes known (the default workload), the lines say how much of the
    total moved, the share done and the time left at the pace so far; the live panel too."""
    import time

    from rich.console import Console

    from benchfs.cli.progress import LiveProgress, PlainProgress

    out = Console(record=True, width=300)
    p = PlainProgress(out)
    p.phase("workload")
    p.expect(1 << 30, 1 << 30)
    p.moved(0, 0)
    time.sleep(0.2)
    p.moved(512 << 20, 0)
    text = out.export_text()
    assert "written 512MiB of 1GiB, read 0B of 1GiB (25% done, about " in text, text
    eta = float(re.search(r"about (\d+) s left", text).group(1))  # type: ignore[union-attr]
    assert eta <= 5  # 25% in ~0.2 s: about 0.6 s left
    live = LiveProgress(Console(record=True, width=200, force_terminal=True))
    live.expect(4 << 20, 4 << 20)
    live.moved(2 << 20, 0)
    rendered = Console(record=True, width=200)
    rendered.print(live._render())
    live.close()
    panel = rendered.export_text()
    assert "2MiB of 4MiB" in panel and "25% done" in panel

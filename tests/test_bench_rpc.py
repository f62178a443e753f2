"""`benchfs-bench rpc`: the ucx_perftest parser, the schedule and summaries, the client driver,
and the command end to end."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from benchfs import Client
from benchfs.bench import rpc
from benchfs.bench.rpc import (
    CASE_NAMES,
    PEAK_WINDOWS,
    TOOLS,
    TRANSPORTS,
    Case,
    RpcSettings,
    summarize_case,
    summarize_overload,
)
from benchfs.bench.stats import interleave
from benchfs.clients.calls import Driver
from benchfs.errors import ProbeError
from benchfs.probes.perftest import (
    PerftestError,
    find_perftest,
    free_port,
    listening,
    parse_perftest_output,
    perftest_command,
    run_perftest,
)
from benchfs.probes.system import filesystem_type
from benchfs.procs import stop_process
from benchfs.units import MIB
from conftest import InProcessCluster, rendered


def perftest_or_none() -> str | None:
    """BenchFS's own ucx_perftest (beside the UCX it loads; scripts/bootstrap installs it)."""
    try:
        return find_perftest()
    except ProbeError:
        return None


PERFTEST = perftest_or_none()
needs_perftest = pytest.mark.skipif(PERFTEST is None, reason="ucx_perftest is not installed")

# Verbatim ucx_perftest 1.13 output (each row split over source lines).
LAT_OUTPUT = (
    "+--------------+--------------+------------------------------+------------------"
    "---+-----------------------+\n"
    "|              |              |        latency (usec)        |   bandwidth (MB/s"
    ")  |  message rate (msg/s) |\n"
    "+--------------+--------------+----------+---------+---------+----------+-------"
    "---+-----------+-----------+\n"
    "|    Stage     | # iterations | 50.0%ile | average | overall |  average |  overa"
    "ll |  average  |  overall  |\n"
    "+--------------+--------------+----------+---------+---------+----------+-------"
    "---+-----------+-----------+\n"
    "[thread 0]              2819      8.709   177.820   177.820       21.97      21."
    "97        5624        5624\n"
    "Final:                 20000      7.562    16.232    75.500      240.65      51."
    "74       61607       13245\n"
)

BW_OUTPUT = (
    "+--------------+--------------+------------------------------+------------------"
    "---+-----------------------+\n"
    "|              |              |       overhead (usec)        |   bandwidth (MB/s"
    ")  |  message rate (msg/s) |\n"
    "+--------------+--------------+----------+---------+---------+----------+-------"
    "---+-----------+-----------+\n"
    "|    Stage     | # iterations | 50.0%ile | average | overall |  average |  overa"
    "ll |  average  |  overall  |\n"
    "+--------------+--------------+----------+---------+---------+----------+-------"
    "---+-----------+-----------+\n"
    "Final:                   200      7.407  1235.601  1235.601     3237.29    3237."
    "29         809         809\n"
)


# The ucx_perftest parser


def test_parse_latency_output_by_column_name() -> None:
    result = parse_perftest_output(LAT_OUTPUT, "ucx_perftest -t ucp_am_lat")
    assert result.iterations == 20000
    assert result.percentile == (50.0, 7.562)
    assert result.latency_us == 75.5  # overall, not the last interval's average
    assert result.mib_s == 51.74
    assert result.msg_rate == 13245


def test_parse_bandwidth_output_by_column_name() -> None:
    result = parse_perftest_output(BW_OUTPUT, "ucx_perftest -t ucp_am_bw")
    assert result.mib_s == 3237.29
    assert result.percentile == (50.0, 7.407)  # an "overhead" percentile in bandwidth tests
    # "MB/s" is MiB/s: 809 messages of 4 MiB per second.
    assert abs(result.mib_s - result.msg_rate * 4 * MIB / MIB) / result.mib_s < 0.01
    with pytest.raises(PerftestError, match=r"ucx_perftest -t ucp_am_bw.*latency \(usec\)"):
        _ = result.latency_us


def test_columns_are_found_by_name_not_position() -> None:
    """A header with the groups in another order still yields the right values."""
    text = """\
|              |              |   bandwidth (MB/s)  |        latency (usec)        |
|    Stage     | # iterations |  average |  overall | 99.0%ile | average | overall |
Final:                   100       1.00       2.00       30.0      40.0      50.0
"""
    result = parse_perftest_output(text, "cmd")
    assert result.mib_s == 2.0
    assert result.percentile == (99.0, 30.0)
    assert result.latency_us == 50.0


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", "printed nothing"),
        ("Final: 1 2 3\n", "no table header"),
        (LAT_OUTPUT.replace("Final:", "Interim:"), "no `Final:` row"),
        (LAT_OUTPUT.replace("      13245\n", "\n"), "7 values for 8 columns"),
        (LAT_OUTPUT.replace("240.65", "n/a"), "not a number"),
        (
            LAT_OUTPUT.replace("|    Stage     |", "|   Stage   |  "),
            "lies under no column group",
        ),
        (
            LAT_OUTPUT.replace("Stage     | # iterations", "Phase     | # iterations").replace(
                "|              |              |", "|              | Stage iterat |"
            ),
            "no table header",
        ),
    ],
)
def test_malformed_output_names_the_command(text: str, expected: str) -> None:
    with pytest.raises(PerftestError, match=expected) as info:
        parse_perftest_output(text, "UCX_TLS=tcp ucx_perftest 127.0.0.1 -t ucp_am_lat")
    assert "ucx_perftest 127.0.0.1 -t ucp_am_lat" in info.value.message
    assert info.value.code == "EPROTO"


def run_pair(tls: str, test: str, size: int, iterations: int) -> tuple[str, str]:
    """Run a responder and an initiator by hand; return the initiator's output and command."""
    assert PERFTEST is not None
    port = free_port()
    env = {**os.environ, "UCX_TLS": tls}
    responder = subprocess.Popen(
        [PERFTEST, "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 10
        while not listening(port):
            assert responder.poll() is None and time.monotonic() < deadline
            time.sleep(0.01)
        argv = perftest_command(PERFTEST, port, test, size, iterations, 10)
        out = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=30)
        assert out.returncode == 0, out.stderr
        return out.stdout, " ".join(argv)
    finally:
        stop_process(responder, 5.0, group=True, sig=None)


@needs_perftest
@pytest.mark.timeout(60)
def test_parse_real_perftest_output() -> None:
    text, command = run_pair("tcp", "ucp_am_lat", 8, 200)
    lat = parse_perftest_output(text, command)
    assert lat.iterations == 200
    rank, one_way = lat.percentile
    assert rank == 50.0 and one_way > 0 and lat.latency_us > 0
    text, command = run_pair("tcp", "ucp_am_bw", 65536, 200)
    bw = parse_perftest_output(text, command)
    assert bw.iterations == 200 and bw.mib_s > 0
    # ucx_perftest's "MB/s" is 2^20 bytes per second.
    assert abs(bw.mib_s - bw.msg_rate * 65536 / MIB) / bw.mib_s < 0.05


@needs_perftest
@pytest.mark.timeout(60)
def test_run_perftest_runs_both_sides_and_leaves_nothing(tmp_path: Path) -> None:
    for tls in ("tcp", "shm,self"):
        result = run_perftest("ucp_am_lat", 4096, 500, 50, tls, tmp_path, 30.0)
        assert result.percentile[1] > 0
        assert f"UCX_TLS={tls} " in result.command
    assert list(tmp_path.iterdir()) == []  # the responder's log is removed


@needs_perftest
@pytest.mark.timeout(60)
def test_failing_perftest_is_named(tmp_path: Path) -> None:
    with pytest.raises(PerftestError, match=r"ucp_no_such_test.*exited with status"):
        run_perftest("ucp_no_such_test", 8, 10, 1, "tcp", tmp_path, 10.0)


# Cases, schedule, summaries


def test_cases_have_the_issue_names() -> None:
    assert CASE_NAMES == (
        "write-4m", "read-4m", "rtt-null", "rtt-null-rust", "rtt-write-4k", "rtt-read-4k"
    )  # fmt: skip
    assert [t.name for t in TRANSPORTS] == ["tcp", "shm"]
    tcp, shm = TRANSPORTS
    assert tcp.peer_error_handling and not shm.peer_error_handling
    assert "network.peer_error_handling=false" in shm.overrides()
    by_name = {name: Case(tcp, name) for name in CASE_NAMES}
    assert by_name["write-4m"].perftest == ("ucp_am_bw", 4 * MIB)
    assert by_name["rtt-null"].perftest == by_name["rtt-null-rust"].perftest == ("ucp_am_lat", 8)
    assert by_name["rtt-read-4k"].perftest == ("ucp_am_lat", 4096)
    ops = ["write", "read", "null", "null-rust", "write", "read"]
    assert [by_name[n].op for n in CASE_NAMES] == ops
    assert by_name["rtt-null"].server_op == by_name["rtt-null-rust"].server_op == "meta"
    # ucx_perftest as BenchFS runs UCX: -e where BenchFS detects failed peers, its protocols.
    assert by_name["write-4m"].perftest_as_benchfs(False) == (["-e"], {"UCX_PROTO_ENABLE": "n"})
    assert Case(shm, "read-4m").perftest_as_benchfs(True) == ([], {"UCX_PROTO_ENABLE": "y"})


def test_schedule_interleaves_benchfs_and_perftest() -> None:
    cases = [Case(t, n) for t in TRANSPORTS for n in CASE_NAMES]
    steps = interleave(cases, 3, tools=TOOLS)
    assert len(steps) == 3 * len(cases) * len(TOOLS)
    first = [(s.case.name, s.tool) for s in steps[:6]]
    assert first == [
        ("write-4m", "benchfs"),
        ("write-4m", "ucx_perftest"),
        ("write-4m", "ucx_perftest_as_benchfs"),
        ("write-4m", "benchfs_discard"),
        ("write-4m", "copy"),
        ("read-4m", "benchfs"),
    ]
    second = [s.tool for s in steps if s.repeat == 1][:5]
    assert second == list(reversed(TOOLS))


def server(p50: float) -> dict[str, float]:
    return {"p50_us": p50, "device_p50_us": p50 / 2}


def test_bandwidth_case_summary_is_medians_and_their_ratio() -> None:
    mode = "-e, UCX_PROTO_ENABLE=n"
    runs = {
        "benchfs": [{"mib_s": v, "server": server(9)} for v in (100.0, 300.0, 200.0)],
        "ucx_perftest": [{"mib_s": v} for v in (1000.0, 250.0, 400.0)],
        "ucx_perftest_as_benchfs": [{"mib_s": v, "mode": mode} for v in (250.0, 150.0, 350.0)],
        "benchfs_discard": [{"mib_s": v, "server": server(4)} for v in (225.0, 200.0, 240.0)],
        "copy": [{"mib_s": v} for v in (250.0, 900.0, 100.0)],
    }
    row = summarize_case(Case(TRANSPORTS[0], "write-4m"), runs)
    assert (row["mib_s"], row["perftest_mib_s"], row["ratio"]) == (200.0, 400.0, 0.5)
    assert (row["perftest_as_benchfs_mib_s"], row["ratio_as_benchfs"]) == (250.0, 0.8)
    assert row["perftest_as_benchfs"] == mode
    # Keeping nothing: the protocol alone against ucx_perftest as BenchFS runs UCX.
    assert (row["discard_mib_s"], row["ratio_discard_as_benchfs"]) == (225.0, 0.9)
    # Storing: against the transport and the store's copy in series, 1/(1/250 + 1/250).
    assert (row["copy_mib_s"], row["storing_limit_mib_s"]) == (250.0, 125.0)
    assert row["ratio_storing_limit"] == 1.6
    assert row["spread_mib_s"] == {
        "benchfs": [100.0, 300.0],
        "ucx_perftest": [250.0, 1000.0],
        "ucx_perftest_as_benchfs": [150.0, 350.0],
        "benchfs_discard": [200.0, 240.0],
        "copy": [100.0, 900.0],
    }
    assert row["p50_us"] is None and row["p99_us"] is None and row["perftest_us"] is None
    assert row["server_p50_us"] == 9 and row["raw"]["benchfs"] == runs["benchfs"]


def test_round_trip_case_summary_converts_nothing_twice() -> None:
    ours = [{"p50_us": p, "p99_us": 3 * p, "server": server(1)} for p in (20.0, 10.0, 30.0)]
    theirs = [
        {"rtt_p50_us": r, "rtt_p99_us": None, "rtt_sleep_p50_us": 70.0} for r in (8.0, 4.0, 6.0)
    ]
    row = summarize_case(
        Case(TRANSPORTS[1], "rtt-read-4k"), {"benchfs": ours, "ucx_perftest": theirs}
    )
    assert (row["p50_us"], row["p99_us"], row["perftest_us"]) == (20.0, 60.0, 6.0)
    assert row["mib_s"] is None and row["ratio"] is None and row["perftest_p99_us"] is None
    assert row["perftest_sleep_us"] == 70.0 and row["transport"] == "shm"


def load_run(mib_s: float, **extra: Any) -> dict[str, Any]:
    base = {
        "mib_s": mib_s,
        "p50_us": 100.0,
        "p99_us": 900.0,
        "timeouts": 0,
        "retries": 0,
        "failures": 0,
        "failed_calls": 0,
        "rejected_busy": 0,
        "pool_waits": 5,
        "client_mib_s": mib_s,
        "call_p99_us": 1e6,
        "windows_mib_s": [mib_s, mib_s],
        "steady_share": 1.0,
    }
    return {**base, **extra}


def test_overload_summary_takes_the_best_window_as_peak() -> None:
    runs = {
        "overload": [
            load_run(800),
            load_run(900, retries=2, steady_share=0.7),
            load_run(700, timeouts=1, steady_share=None),
        ],
        "peak-w1": [load_run(500)] * 3,
        "peak-w2": [load_run(1000), load_run(950), load_run(1100)],
        "peak-w4": [load_run(990)] * 3,
    }
    config = {"client": {"request_timeout_s": 30.0, "max_retries": 2}}
    over = summarize_overload(runs, RpcSettings.quick(3), config)
    assert over["mib_s"] == 800 and over["peak_mib_s"] == 1000 and over["peak_window"] == 2
    assert over["ratio_to_peak"] == 0.8
    assert (over["timeouts"], over["retries"], over["pool_waits"]) == (1, 2, 15)
    assert over["peak_by_window"] == {"1": 500, "2": 1000, "4": 990}
    assert list(PEAK_WINDOWS) == over["peak_windows"] == [1, 2, 4]
    assert over["steady_share"] == 0.7  # the worst load's worst second; None when too short


def test_targets_are_checked() -> None:
    cases = [
        {
            "transport": "tcp",
            "name": "write-4m",
            "ratio": 0.5,
            "ratio_discard_as_benchfs": 0.95,
            "ratio_storing_limit": 0.7,
            "p50_us": None,
        },
        {
            "transport": "shm",
            "name": "read-4m",
            "ratio": 0.95,
            "ratio_discard_as_benchfs": 0.75,
            "ratio_storing_limit": 0.85,
            "p50_us": None,
        },
        {"transport": "shm", "name": "rtt-null-rust", "ratio": None, "p50_us": 2.5},
        {
            "transport": "tcp",
            "name": "rtt-null-rust",
            "ratio": None,
            "p50_us": 12.0,
            "perftest_us": 7.0,
        },
        {"transport": "shm", "name": "rtt-write-4k", "ratio": None, "p50_us": 30.0},
        {"transport": "tcp", "name": "rtt-read-4k", "ratio": None, "p50_us": 30.0},
        {"transport": "tcp", "name": "rtt-null", "ratio": None, "p50_us": 500.0},
    ]
    overload = {
        "timeouts": 0,
        "retries": 3,
        "ratio_to_peak": 0.95,
        "failed_calls": 0,
        "steady_share": 0.85,
    }
    met = {t["target"]: t["met"] for t in rpc.targets({"cases": cases, "overload": overload})}
    assert met == {
        "write-4m over tcp, a server that keeps nothing: ratio to ucx_perftest as BenchFS runs "
        "UCX >= 0.8": True,
        "write-4m over tcp, storing on tmpfs: ratio to 1/(1/perftest + 1/copy) >= 0.8": False,
        "read-4m over shm, a server that keeps nothing: ratio to ucx_perftest as BenchFS runs "
        "UCX >= 0.8": False,
        "read-4m over shm, storing on tmpfs: ratio to 1/(1/perftest + 1/copy) >= 0.8": True,
        "rtt-null-rust over shm (Rust API): p50 <= 3 µs": True,
        "rtt-null-rust over tcp (Rust API): p50 <= 1.5 x ucx_perftest's round trip": False,
        "rtt-write-4k over shm: p50 <= 25 µs": False,
        "rtt-read-4k over tcp: p50 <= 60 µs": True,
        "overload: zero timeouts": True,
        "overload: zero retries": False,
        "overload: zero failed calls": True,
        "overload: every 1 s window >= 0.9 x the best": False,
        "overload: throughput >= 0.9 x peak": True,
    }


def test_dev_shm_is_tmpfs() -> None:
    assert filesystem_type(Path("/dev/shm")) == "tmpfs"
    assert filesystem_type(Path("/dev/shm/does/not/exist")) == "tmpfs"


# The client process's commands


def test_driver_commands_against_a_server(inproc_cluster: Callable[..., InProcessCluster]) -> None:
    cluster = inproc_cluster(1)
    with Client(str(cluster.registry), config=cluster.config) as client:
        driver = Driver(client, "t", 4 * 65536)
        driver.prepare()
        assert client.stat("/t.dat").st_size == 4 * 65536
        for op in ("write", "read"):
            bw = driver.obey(["bw", op, "0.05"])
            assert bw["calls"] >= 1 and bw["bytes"] == bw["calls"] * 4 * 65536
        for op in ("null", "write", "read"):
            rtt = driver.obey(["rtt", op, "200", "5"])
            assert rtt["count"] == 200 and 0 < rtt["min_us"] <= rtt["p50_us"] <= rtt["p99_us"]
        load = driver.obey(["load", "write", "0.05"])
        assert load["errors"] == 0 and load["first_error"] is None and load["calls"] >= 1
        assert [s["id"] for s in load["servers"]] == [0]
        assert load["servers"][0]["timeouts"] == 0
        with pytest.raises(ValueError, match="unknown"):
            driver.obey(["rtt", "sideways", "1", "1"])


# The command line


def bench_command() -> list[str]:
    beside = Path(sys.executable).parent / "benchfs-bench"
    return [str(beside)] if beside.exists() else [sys.executable, "-m", "benchfs.cli.bench"]


def positive(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value > 0


def processes_mentioning(text: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline:
            found.append(int(entry.name))
    return found


def perftest_ports(report: dict[str, Any]) -> set[str]:
    """The ports of every ucx_perftest the report's cases ran."""
    commands = [
        value
        for case in report["cases"]
        for runs in case["raw"].values()
        for run in runs
        for key, value in run.items()
        if key.startswith("command")
    ]
    return {port for c in commands for port in re.findall(r"-p (\d+)", c)}


@needs_perftest
@pytest.mark.timeout(180)
def test_rpc_quick_json_end_to_end() -> None:
    """Beside other tests (its checks are scoped to its own data directory and perftest
    ports), so its time bound is a loose one."""
    start = time.monotonic()
    out = subprocess.run(
        [*bench_command(), "rpc", "--quick", "--json"],
        capture_output=True,
        text=True,
        timeout=150,
    )
    elapsed = time.monotonic() - start
    assert out.returncode == 0, out.stderr
    assert elapsed < 120, f"--quick took {elapsed:.0f} s"
    report = json.loads(out.stdout)
    assert {"cases", "overload", "data_dir", "io_mode"} <= set(report)
    assert report["io_mode"] == "buffered" and report["data_fs"] == "tmpfs"
    assert "overload" in rendered(rpc.render, report)
    assert report["data_dir"].startswith("/dev/shm/benchfs-bench-")
    assert not Path(report["data_dir"]).exists()
    keys = {"transport", "name", "mib_s", "perftest_mib_s", "ratio", "p50_us", "p99_us"}
    names = [(c["transport"], c["name"]) for c in report["cases"]]
    assert names == [(t, n) for t in ("tcp", "shm") for n in CASE_NAMES]
    for case in report["cases"]:
        assert keys | {"perftest_us"} <= set(case)
        bandwidth = case["name"].endswith("-4m")
        for key in ("mib_s", "perftest_mib_s", "ratio", "perftest_as_benchfs_mib_s",
                    "discard_mib_s", "copy_mib_s", "storing_limit_mib_s"):  # fmt: skip
            assert positive(case[key]) if bandwidth else case[key] is None, (case["name"], key)
        for key in ("p50_us", "p99_us", "perftest_us"):
            assert case[key] is None if bandwidth else positive(case[key]), (case["name"], key)
        if not bandwidth:
            assert case["p99_us"] >= case["p50_us"]
            continue
        tcp = case["transport"] == "tcp"
        assert case["perftest_as_benchfs"] == ("-e, " if tcp else "") + "UCX_PROTO_ENABLE=n"
        assert "UCX_PROTO_ENABLE=n" in case["raw"]["ucx_perftest_as_benchfs"][0]["command"]
        # UCX cannot detect failed peers over shared memory alone: it refuses -e there.
        refused = case["error_handling_refused"]
        assert refused is None if tcp else "unreachable" in refused, refused
    over = report["overload"]
    for key in ("mib_s", "peak_mib_s", "p99_us"):
        assert positive(over[key]), key
    for key in ("timeouts", "retries"):
        assert isinstance(over[key], int) and over[key] >= 0, key
    assert over["clients"] == 4 and over["inflight_per_client"] == 64
    assert report["rndv_threshold_study"] is None and report["repeats"] == 1
    assert any("Client.stat" in n for n in report["notes"])
    assert any("4 client processes" in n for n in report["notes"])
    assert {t["target"] for t in report["targets"]} >= {"overload: zero timeouts"}
    # Daemons and client processes name the data directory; ucx_perftest is found by name.
    assert processes_mentioning(report["data_dir"]) == []
    ports = perftest_ports(report)
    assert len(ports) > 10, ports
    assert [p for port in ports for p in processes_mentioning(f"-p {port} ")] == []


@needs_perftest
@pytest.mark.timeout(120)
@pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root")
def test_rpc_quick_between_nodes_apart() -> None:
    """--netns: the cases over TCP between two nodes (ucx_perftest's initiator on n2 dials n1's
    address), 1, 2 and 4 servers with clients on other nodes; everything removed afterwards."""
    out = subprocess.run(
        [*bench_command(), "rpc", "--quick", "--netns", "--json"],
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert [(c["transport"], c["name"]) for c in report["cases"]] == [
        ("tcp", n) for n in CASE_NAMES
    ]
    perftest = report["cases"][0]["raw"]["ucx_perftest"][0]["command"]
    found = re.search(r"ip netns exec (bb\d+)-n2 .*ucx_perftest 10\.251\.0\.1 ", perftest)
    assert found, perftest
    assert report["overload"] is None and report["settings"]["netns"] is True
    rows = report["scaling"]["rows"]
    assert [r["servers"] for r in rows] == [1, 2, 4]
    assert all(positive(r["write_mib_s"]) and positive(r["read_mib_s"]) for r in rows)
    assert rows[0]["write_speedup"] == 1.0
    text = rendered(rpc.render, report)
    assert "4 servers" in text and "overload" not in text.split("note:")[0]
    assert not any(t["target"].startswith("overload") for t in report["targets"])
    assert processes_mentioning(report["data_dir"]) == []
    left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert f"{found.group(1)}-" not in left

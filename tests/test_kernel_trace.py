"""Kernel tracing: bpftrace's block latency and scheduler records, perf's folded stacks, the
slow-mode rule, the screen's verdict from distributions, and real tracers on a planted
bimodal device and on a real run (skipped, with one line, where tracing is unavailable)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from benchfs import latencymodes
from benchfs.config import load_config, section
from benchfs.diagnose.judge import Thresholds
from benchfs.diagnose.screen import NodeProbe, judge_screen
from benchfs.errors import ParseError
from benchfs.nodes import Node
from benchfs.probes import blocklat, bpftrace, perf, sched
from benchfs.probes.kerneltrace import parse_host_trace
from conftest import benchfs_run_command
from diagnose_sim import Sim, delayfs_or_skip, simulation

LOOP0 = str(7 << 20)
"""The kernel's number of loop0 (major 7) as tracepoints give it."""


@pytest.fixture
def th() -> Thresholds:
    return section(load_config(), "diagnose")


def hist(**buckets: int) -> blocklat.Histogram:
    """A histogram from `b<lowest us>=count` pairs."""
    return blocklat.Histogram.of((int(k[1:]), 2 * int(k[1:]) - 1, c) for k, c in buckets.items())


def test_a_second_population_is_a_mode_a_thinning_tail_is_not() -> None:
    """Two populations (90% at 32-63 us, 10% at 16-32 ms) give a mode of 10% at 16 ms up;
    a tail that thins out, one population, or a second hump below the floor, none."""
    two = hist(b32=900, b64=40, b16384=100)
    mode = blocklat.slow_mode(two)
    assert mode is not None and mode.lo_us == 16384 and mode.hi_us == 32767
    assert mode.count == 100 and mode.total == 1040 and abs(mode.share - 100 / 1040) < 1e-9
    assert "9.6% of 1040 I/Os at 16.384 ms-32.768 ms" in mode.describe()
    tail = hist(b32=900, b64=300, b128=100, b256=40, b512=20, b1024=10, b2048=8, b4096=5)
    assert blocklat.slow_mode(tail) is None
    assert blocklat.slow_mode(hist(b64=1000)) is None
    assert blocklat.slow_mode(hist(b16=900, b512=100), floor_us=2000) is None
    assert blocklat.slow_mode(hist(b32=900, b16384=3)) is None  # too few to be a mode
    assert blocklat.slow_mode(blocklat.Histogram(())) is None


def test_bpftrace_json_parses_per_device_direction_size_and_second(tmp_path: Path) -> None:
    """Records as bpftrace 0.17 prints them: a tick line per interval, then the histograms
    keyed by device, rwbs and size class; the device names the capture ends with; a line cut
    off at the end is skipped, a malformed one in the middle names the file and line."""
    lines = [
        '{"type": "attached_probes", "data": {"probes": 5}}',
        '{"type": "printf", "data": "{\\"tick\\": \\"100.5\\"}\\n"}',
        '{"type": "hist", "data": {"@device": {"' + LOOP0 + ',RS,1": [{"min": 32, "max": 63, '
        '"count": 9}, {"min": 16384, "max": 32767, "count": 1}], "' + LOOP0 + ',WS,0": '
        '[{"min": 128, "max": 255, "count": 4}]}}}',
        '{"type": "printf", "data": "{\\"tick\\": \\"101.5\\"}\\n"}',
        '{"type": "hist", "data": {"@block": {"' + LOOP0 + ',FN,1": [{"min": 0, "max": 0, '
        '"count": 2}]}}}',
        '{"type": "devices", "data": {"' + LOOP0 + '": "loop0"}}',
        '{"type": "tracer", "data": {"startup_cpu_s": 0.3, "cpu_s": 0.01, "wall_s": 2.0}}',
        '{"type": "hist", "data": {"@dev',
    ]
    path = tmp_path / "block.json"
    path.write_text("\n".join(lines))
    samples, extra = blocklat.read_capture(path)
    assert [(s.time, s.device, s.measure, s.op, s.small) for s in samples] == [
        (100.5, "loop0", "device", "read", True),
        (100.5, "loop0", "device", "write", False),
        (101.5, "loop0", "block", "other", True),
    ]
    assert extra["tracer"]["cpu_s"] == 0.01
    reads = blocklat.merge(samples, 100.0, 101.0, "device", "read", True)
    assert reads["loop0"].total == 10 and reads["loop0"].share_from(16384) == 0.1
    assert blocklat.merge(samples, 101.0, 102.0, "device") == {}
    lines[3] = "not json"
    path.write_text("\n".join(lines))
    with pytest.raises(ParseError, match=r"block\.json:4: not a bpftrace JSON line"):
        blocklat.read_capture(path)


def test_the_bpftrace_program_reads_both_measures_per_device_and_size() -> None:
    text = blocklat.bpftrace_program()
    for tp in ("block_rq_issue", "block_rq_complete", "block_io_start", "block_io_done"):
        assert f"tracepoint:block:{tp}" in text
    assert "args->nr_sector <= 256" in text and "interval:s:1" in text and "END" in text
    assert "block_io_start" not in blocklat.bpftrace_program(["device"])


def test_peers_that_share_the_mode_clear_the_device(th: Thresholds) -> None:
    """A device with 10% at 16 ms among peers with none is odd (10x over half the minimum
    share); when every device has that mode, none is; a device with too few I/Os is not
    judged."""
    healthy = hist(b32=1000, b64=20)
    bimodal = hist(b32=900, b16384=100)
    hists = {("h", "loop0"): healthy, ("h", "loop1"): bimodal, ("h", "loop2"): healthy}
    hists[("h", "loop3")] = hist(b32=10, b16384=5)  # below min_ops
    found = {f.key: f for f in latencymodes.find_modes(hists, {}, th)}
    assert list(found) == [("h", "loop1")]
    odd = found[("h", "loop1")]
    assert odd.odd and odd.peer_share == 0.0 and odd.worse == pytest.approx(10.0)
    shared = {("h", f"loop{i}"): bimodal for i in range(3)}
    assert not any(f.odd for f in latencymodes.find_modes(shared, {}, th))
    alone = latencymodes.find_modes({("h", "loop1"): bimodal}, {}, th)
    assert alone[0].peer_share is None and not alone[0].odd


def probe_with(name: str, host: str, device: str, rand4k: blocklat.Histogram) -> NodeProbe:
    p = NodeProbe(Node(name, host, "/scr"))
    p.latency = {"rand4k": {device: rand4k.to_json()}}
    p.devices_qd1 = {device: {"r_s": 500.0, "r_await": 2.0 if name == "b" else 0.06,
                              "r_await_max": 3.0, "aqu_sz": 1.0, "util": 50.0,
                              "rkB_s": 2000.0}}  # fmt: skip
    p.members = []
    return p


def test_the_screen_excludes_a_bimodal_device_and_says_what_iostat_saw(th: Thresholds) -> None:
    """Four nodes, b's device with 10% of its reads at 16-32 ms: b is excluded as a slow
    device on that evidence alone (10x its peers: overwhelming), the evidence naming the
    share, the range and iostat's mean."""
    healthy, bimodal = hist(b32=1000, b64=20), hist(b32=900, b16384=100)
    probes = [probe_with("a", "h1", "loop0", healthy), probe_with("b", "h2", "loop1", bimodal)]
    probes += [probe_with("c", "h3", "loop2", healthy), probe_with("d", "h4", "loop3", healthy)]
    result = judge_screen(probes, [], th, tracing=None)
    doc = result.to_json()
    by = {n["name"]: n for n in doc["nodes"]}
    assert [e.host for e in result.excluded] == ["h2"]
    assert by["b"]["verdict"]["kind"] == "slow device"
    flag = next(f for f in by["b"]["flags"] if f["flag"] == "dev_latency_mode")
    assert (
        "loop1: a second latency mode in 4 KiB reads at 1 in flight: 10.0% of 1000"
        in (flag["evidence"])
    )
    assert "iostat's mean r_await at 1 in flight: 2 ms" in flag["evidence"]
    assert by["b"]["latency"]["modes"][0]["flagged"] is True
    assert doc["tracing"] == "block latency traced"
    for n in ("a", "c", "d"):
        assert by[n]["verdict"]["status"] == "ok", by[n]
    # Two nodes of one host sharing the bimodal device: it is judged once, against the other
    # hosts' devices, and both nodes carry its flag.
    same = [probe_with(n, "h9", "loop9", bimodal) for n in ("x", "y")]
    shared = judge_screen([*same, *probes[2:]], [], th, tracing="kernel tracing unavailable: x")
    flagged = {
        n["name"] for n in shared.nodes if any(f["flag"] == "dev_latency_mode" for f in n["flags"])
    }
    assert flagged == {"x", "y"}
    assert shared.to_json()["tracing"] == "kernel tracing unavailable: x"


def test_scheduler_time_per_program_by_reason(tmp_path: Path) -> None:
    lines = [
        '{"type": "map", "data": {"@cpu": {"benchfs-s0-w0": 2000000000, "fio": 500000000}}}',
        '{"type": "map", "data": {"@runq": {"benchfs-s0-w0": 250000000}}}',
        '{"type": "map", "data": {"@slept": {"benchfs-s0-w0,1": 7000000000, "fio,2": '
        '1500000000, "kworker/0:1,128": 9000000000, "fio,4": 1000}}}',
    ]
    rows, _ = sched.parse_capture(lines, "sched.json")
    by = {r.comm: r.seconds for r in rows}
    assert rows[0].comm == "benchfs-s0-w0"
    assert by["benchfs-s0-w0"]["on CPU"] == 2.0 and by["benchfs-s0-w0"]["runnable"] == 0.25
    assert by["benchfs-s0-w0"]["sleeping"] == 7.0 and by["fio"]["waiting for I/O"] == 1.5
    assert by["kworker/0:1"]["idle"] == 9.0 and by["fio"]["other"] == 1e-6
    with pytest.raises(ParseError, match=r"sched\.json:1"):
        sched.parse_capture(['{"type": "map", "data": {"@slept": {"x": 1}}}', "{}"], "sched.json")


def test_folded_stacks_per_process_with_their_threads() -> None:
    lines = [
        "benchfs-s0-w0-4242;main;serve;io_uring_enter_[k] 30",
        "benchfs-s0-w0-4242;main;serve;memcpy 10",
        "benchfsd-4242;main;setup 1",
        "python-77;_PyEval_EvalFrameDefault 5",
    ]
    found = perf.parse_folded(lines)
    server = found[4242]
    assert server.samples == 41 and server.threads == ["benchfs-s0-w0", "benchfsd"]
    assert server.top_frames(2) == [("io_uring_enter_[k]", 30, 30), ("memcpy", 10, 10)]
    assert found[77].comm == "python"
    with pytest.raises(ParseError, match="not a folded stack"):
        perf.parse_folded(["no-count-here;a b"])


def test_a_host_trace_keeps_the_tracers_messages_as_notes() -> None:
    lines = [
        '{"source": "host", "host": "n1", "cpus": 2}',
        '{"source": "host", "ready": true}',
        "Traceback (most recent call last): a tracer's own message",
        '{"source": "perf", "folded": "benchfsd-9;main 3"}',
        '{"source": "host", "note": "CPU profiles unavailable: perf not found"}',
    ]
    data = parse_host_trace(lines, "kernel/n1.jsonl")
    assert data.host == "n1" and data.cpus == 2 and data.profiles[9].samples == 3
    assert data.notes == [
        "kernel/n1.jsonl:3: Traceback (most recent call last): a tracer's own message",
        "CPU profiles unavailable: perf not found",
    ]


# --- real tracers -------------------------------------------------------------------------


def tracing_or_skip() -> None:
    why = blocklat.unavailable() or perf.unavailable()
    if why is not None:
        pytest.skip(why)


@pytest.fixture
def sim(tmp_path: Path) -> Iterator[Sim]:
    binary = delayfs_or_skip(tmp_path)
    with simulation(tmp_path / "sim", binary) as s:
        yield s


def fio_4k(device: str, seconds: int) -> subprocess.Popen[bytes]:
    argv = ["fio", "--name=rand4k", f"--filename={device}", "--rw=randread", "--bs=4k",
            "--direct=1", "--ioengine=psync", "--iodepth=1", "--time_based",
            f"--runtime={seconds}", "--size=64M", "--output=/dev/null"]  # fmt: skip
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


@pytest.mark.serial
def test_the_block_tracer_measures_a_planted_bimodal_device(sim: Sim, tmp_path: Path) -> None:
    """Two loop devices over delayfs, 12% of one's reads delayed 20 ms: the kernel's
    histograms give that device a mode of 12% (+-3 points) at 16-32 ms, the other none, and
    the peer rule flags only the first."""
    tracing_or_skip()
    slow, fast = sim.disk("slow", 128 << 20), sim.disk("fast", 128 << 20)
    slow.fs.set_delay(20.0, 0.0, 0.12)
    with blocklat.Capture(tmp_path / "block.json") as tracer:
        tracer.wait_attached()
        jobs = [fio_4k(slow.dev, 3), fio_4k(fast.dev, 3)]
        for job in jobs:
            assert job.wait(timeout=60) == 0
    samples, extra = blocklat.read_capture(tracer.path)
    assert extra["tracer"]["wall_s"] > 0
    reads = blocklat.merge(samples, measure="device", op="read", small=True)
    mode = blocklat.slow_mode(reads[slow.name])
    assert mode is not None and abs(mode.share - 0.12) <= 0.03, mode
    assert mode.lo_us >= 8192 and mode.hi_us <= 65535
    assert blocklat.slow_mode(reads[fast.name]) is None
    th = section(load_config(), "diagnose")
    found = latencymodes.find_modes({k: reads[k] for k in (slow.name, fast.name)}, {}, th)
    assert [f.key for f in found if f.odd] == [slow.name]
    # The whole time in the block layer holds the same I/Os (no queue at one in flight).
    whole = blocklat.merge(samples, measure="block", op="read", small=True)
    if whole:
        assert whole[slow.name].total == pytest.approx(reads[slow.name].total, rel=0.05)


@pytest.mark.serial
def test_a_traced_run_leaves_histograms_profiles_and_flame_graphs(tmp_path: Path) -> None:
    """`benchfs-run launch` with run.kernel_trace traces its host; `benchfs-analyze --save`
    shows the kernel section (block latency, time on and off CPU, a flame graph per server,
    their top frames) and writes the flame graphs beside the report."""
    tracing_or_skip()
    env = {k: v for k, v in os.environ.items() if not k.startswith("BENCHFS_")}
    argv = [*benchfs_run_command(), "launch", "--servers", "2", "--clients", "2",
            "--file-size", "64M", "--results-root", str(tmp_path), "--json",
            "--set", "run.kernel_trace=true", "--set", "storage.direct_write=true"]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=180, env=env, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    run = Path(json.loads(done.stdout)["results_dir"])
    trace = run / "kernel" / "localhost.jsonl"
    data = parse_host_trace(trace.read_text().splitlines(), str(trace))
    assert data.block and data.sched and data.profiles, data.notes
    assert any(r.comm.startswith("benchfs-s") for r in data.sched)
    out = subprocess.run(
        [sys.executable, "-m", "benchfs.cli.analyze", str(run), "--save", "--json"],
        capture_output=True, text=True, timeout=120, env=env, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    report = json.loads(out.stdout)
    assert {i["id"] for i in report["insights"]} >= {"BFS-011"}
    page = (run / "analysis" / "report.html").read_text()
    assert 'id="kernel"' in page and page.count("data:image/svg+xml;base64,") == 2
    graphs = sorted(p.name for p in (run / "analysis" / "flamegraphs").iterdir())
    assert graphs == ["localhost-server-0.svg", "localhost-server-1.svg"]
    svg = (run / "analysis" / "flamegraphs" / graphs[0]).read_text()
    # Server 0's process: its worker thread, or the io_uring workers it made (direct writes are
    # done there; at 99 samples a second the worker itself may go unsampled).
    assert svg.startswith("<?xml") and ("benchfs-s0-w" in svg or "iou-wrk" in svg)
    tables = run / "analysis" / "tables"
    for name in ("block_latency", "block_heatmap", "sched_time", "top_frames"):
        assert (tables / f"{name}.csv").stat().st_size > 0, name


def test_without_root_the_tracer_says_why_in_one_line() -> None:
    """`benchfs-diagnose trace` as an unprivileged user: one note per tracer that cannot run,
    and a clean end at its deadline; the analysis of such a host shows the line."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root to drop to an unprivileged user (setpriv)")
    argv = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", sys.executable,
            "-m", "benchfs.cli.diagnose", "trace", "--seconds", "0.5"]  # fmt: skip
    env = {**os.environ, "TMPDIR": "/tmp"}
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env, check=False)
    if "Permission denied" in done.stderr and done.returncode != 0:
        pytest.skip(f"the checkout is not readable by nobody: {done.stderr.strip()[-200:]}")
    assert done.returncode == 0, done.stderr
    data = parse_host_trace(done.stdout.splitlines(), "trace")
    assert data.notes[0] == "kernel tracing unavailable: it needs root"
    assert not data.block and not data.profiles
    assert bpftrace.unavailable() is None or os.geteuid() != 0


@pytest.mark.serial
def test_a_trace_stops_cleanly_on_sigterm(tmp_path: Path) -> None:
    """SIGTERM (how a launcher stops it) ends the trace with everything printed."""
    tracing_or_skip()
    proc = subprocess.Popen(
        [sys.executable, "-m", "benchfs.cli.diagnose", "trace", "--no-profile",
         "--work", str(tmp_path)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    ready = threading.Event()
    lines: list[str] = []

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if '"ready"' in line:
                ready.set()

    reader = threading.Thread(target=read)
    reader.start()
    assert ready.wait(60), "".join(lines)
    proc.terminate()
    assert proc.wait(timeout=60) == 0, proc.stderr.read() if proc.stderr else ""
    reader.join(10)
    data = parse_host_trace(lines, "trace")
    assert "block" in data.costs and "sched" in data.costs and not data.notes

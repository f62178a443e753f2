"""IOR text/JSON (fixtures written to IOR's documented format) and real fio JSON -> result rows."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from benchfs.errors import ParseError
from benchfs.parsers import RateRow, ResultRow, parse_fio, parse_ior, parse_ior_json, parse_mdtest
from benchfs.units import MIB

DATA = Path(__file__).parent / "data" / "ior"


def read(name: str) -> str:
    return (DATA / name).read_text()


def by(rows: list[ResultRow], kind: str, op: str) -> list[ResultRow]:
    return [r for r in rows if r.kind == kind and r.operation == op]


def test_ior_text_iterations_and_summary() -> None:
    rows = parse_ior(read("ior-3.3-fpp.txt"), "ior-3.3-fpp.txt")
    writes = by(rows, "iteration", "write")
    assert [(r.iteration, r.bw_mib_s) for r in writes] == [(0, 512.0), (1, 640.0)]
    assert [r.bw_mib_s for r in by(rows, "iteration", "read")] == [1024.0, 1280.0]
    first = writes[0]
    assert first.tool == "ior" and first.tasks == 2 and first.segments == 2
    assert first.block_size == 64 * MIB and first.transfer_size == MIB
    assert first.bytes == 256 * MIB and first.iops == pytest.approx(515.22)
    assert first.latency_s == pytest.approx(0.003876) and first.seconds == 0.5
    assert first.file_per_proc is True and first.api == "POSIX"
    # bandwidth is the aggregate bytes over the iteration's time
    assert first.bytes / MIB / first.seconds == pytest.approx(first.bw_mib_s)

    (summary_w,) = by(rows, "summary", "write")
    (summary_r,) = by(rows, "summary", "read")
    assert summary_w.bw_mib_s == 576.0 and summary_w.bw_min_mib_s == 512.0
    assert summary_w.bw_max_mib_s == 640.0 and summary_w.bw_std_mib_s == 64.0
    assert summary_w.bytes == 256 * MIB and summary_w.tasks == 2 and summary_w.segments == 2
    assert summary_w.block_size == 64 * MIB and summary_w.transfer_size == MIB
    assert summary_w.iteration is None and summary_w.seconds == pytest.approx(0.45)
    # the summary's mean is the mean of the iterations
    assert summary_w.bw_mib_s == pytest.approx(sum(r.bw_mib_s for r in writes) / len(writes))
    assert summary_r.bw_mib_s == 1152.0


def test_ior4_text_with_stonewall_columns_and_interleaved_lines() -> None:
    rows = parse_ior(read("ior-4.0-shared.txt"), "ior-4.0-shared.txt")
    assert [(r.kind, r.operation) for r in rows] == [
        ("iteration", "write"),
        ("iteration", "read"),
        ("summary", "write"),
        ("summary", "read"),
    ]
    it_read, sum_write = rows[1], rows[2]
    assert it_read.bw_mib_s == 4096.0  # IOR prints large numbers without decimals
    assert it_read.file_per_proc is False and it_read.tasks == 4 and it_read.bytes == 64 * MIB
    assert sum_write.iops == 64.0 and sum_write.transfer_size == 4 * MIB
    assert sum_write.file_per_proc is False and sum_write.bytes == 64 * MIB


def test_ior_json_matches_the_text_of_the_same_run() -> None:
    from_json = parse_ior(read("ior-4.0-fpp.json"), "ior-4.0-fpp.json")
    from_text = parse_ior(read("ior-3.3-fpp.txt"), "ior-3.3-fpp.txt")
    key = [(r.kind, r.operation, r.iteration) for r in from_json]
    assert key == [(r.kind, r.operation, r.iteration) for r in from_text]
    for j, t in zip(from_json, from_text, strict=True):
        assert j.bw_mib_s == pytest.approx(t.bw_mib_s)
        assert (j.bytes, j.block_size, j.transfer_size) == (t.bytes, t.block_size, t.transfer_size)
        assert (j.tasks, j.segments, j.file_per_proc) == (t.tasks, t.segments, t.file_per_proc)
        assert j.iops == pytest.approx(t.iops, rel=1e-3)


def test_ior_json_flat_results_list() -> None:
    doc = json.loads(read("ior-4.0-fpp.json"))
    test = doc["tests"][0]
    test["Results"] = [r for group in test["Results"] for r in group]
    rows = parse_ior_json(json.dumps(doc), "flat.json")
    assert [(r.operation, r.iteration) for r in rows if r.kind == "iteration"] == [
        ("write", 0),
        ("read", 0),
        ("write", 1),
        ("read", 1),
    ]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (read("ior-truncated.txt"), "write line has 3 columns, the header 11 (truncated output?)"),
        ("IOR-3.3.0: MPI Coordinated Test of Parallel I/O\nBegan: now\n", "no 'Summary of all"),
        ("hello world\n", "not IOR output"),
        (
            read("ior-3.3-fpp.txt").replace("576.00", "lots"),
            "column 'Mean(MiB)' is 'lots', not a number",
        ),
        (
            read("ior-3.3-fpp.txt").replace(" Mean(s)", " Mean(x)"),
            "summary header lacks 'Mean(s)'",
        ),
        (read("ior-4.0-fpp.json")[:3000], "malformed or truncated JSON"),
        ('{"tests": []}', "needs a 'tests' and a 'summary' list"),
        (
            read("ior-4.0-fpp.json").replace('"bwMiB": 640.0000', '"bwMiB": "fast"'),
            "tests[0].Results[3].bwMiB is missing or not a number: 'fast'",
        ),
        (
            read("ior-4.0-fpp.json").replace('"operation": "read"', '"operation": "stat"'),
            "summary[1].operation is 'stat'",
        ),
    ],
)
def test_ior_bad_input_gets_a_clear_error(text: str, message: str) -> None:
    with pytest.raises(ParseError) as info:
        parse_ior(text, "the-source")
    assert "the-source" in str(info.value)
    assert message in str(info.value)


@pytest.fixture(scope="module")
def fio_output(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A real fio run here: one job writes 4 MiB in 64 KiB blocks, a second reads it back."""
    fio = shutil.which("fio")
    if fio is None:
        pytest.skip("fio is not installed (scripts/bootstrap installs it)")
    target = tmp_path_factory.mktemp("fio") / "data"
    out = subprocess.run(
        [
            fio,
            "--output-format=json",
            f"--filename={target}",
            "--ioengine=psync",
            "--bs=64k",
            "--size=4m",
            "--name=write",
            "--rw=write",
            "--end_fsync=1",
            "--name=read",
            "--stonewall",
            "--rw=read",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_fio_json_from_a_real_run(fio_output: str) -> None:
    rows = parse_fio(fio_output, "fio")
    assert [(r.operation, r.iteration) for r in rows] == [("write", 0), ("read", 1)]
    for r in rows:
        assert r.tool == "fio" and r.kind == "iteration"
        assert r.bytes == 4 * MIB and r.transfer_size == 64 * 1024 and r.block_size == 4 * MIB
        assert r.tasks == 1 and r.api == "psync"
        assert r.bw_mib_s > 0 and r.iops is not None and r.iops > 0
        assert r.seconds is not None and r.seconds >= 0
        # fio's own bandwidth agrees with its bytes over its runtime (ms resolution)
        if r.seconds and r.seconds > 0.01:
            assert r.bytes / MIB / r.seconds == pytest.approx(r.bw_mib_s, rel=0.2)


def test_fio_bad_input_gets_a_clear_error(fio_output: str) -> None:
    with pytest.raises(ParseError, match=r"run\.json: malformed or truncated JSON"):
        parse_fio(fio_output[: len(fio_output) // 2], "run.json")
    with pytest.raises(ParseError, match=r"run\.json: fio JSON has no jobs"):
        parse_fio('{"fio version": "fio-3.33", "jobs": []}', "run.json")
    doc = json.loads(fio_output[fio_output.index("{") :])
    del doc["jobs"][0]["write"]["runtime"]
    with pytest.raises(ParseError, match=r"jobs\[0\].*runtime is missing"):
        parse_fio(json.dumps(doc), "run.json")
    with pytest.raises(ParseError, match="no JSON object"):
        parse_fio("fio: engine psync not loadable\n", "run.json")


def test_ior_text_of_a_real_benchfs_run() -> None:
    """Real IOR (5fcf0ba, the BENCHFS backend): per iteration and summary, file per process."""
    rows = parse_ior(read("ior-5fcf0ba-benchfs-fpp.txt"), "ior")
    assert [(r.operation, r.kind, r.iteration) for r in rows] == [
        ("write", "iteration", 0), ("read", "iteration", 0),
        ("write", "iteration", 1), ("read", "iteration", 1),
        ("write", "summary", None), ("read", "summary", None),
    ]  # fmt: skip
    assert all(r.api == "BENCHFS" and r.file_per_proc for r in rows)
    for op in ("write", "read"):
        its = [r.bw_mib_s for r in rows if r.operation == op and r.kind == "iteration"]
        (summary,) = [r for r in rows if r.operation == op and r.kind == "summary"]
        assert summary.bw_mib_s == pytest.approx(sum(its) / 2, abs=0.01)


def test_mdtest_rates_of_a_real_run() -> None:
    """Real mdtest 4.x (5fcf0ba): every operation of the "SUMMARY rate" table, sample std dev
    over the 2 iterations as mdtest prints it."""
    rows = parse_mdtest(read("mdtest-5fcf0ba-benchfs-easy.txt"), "mdtest")
    by = {r.operation: r for r in rows}
    assert list(by) == ["create", "stat", "read", "remove", "tree_create", "tree_remove"]
    create = by["create"]
    assert create == RateRow(
        "mdtest", "create", "summary", 6848.324, 8119.488, 5577.161, 1797.696, 2
    )
    assert create.ops_std_s == pytest.approx(abs(8119.488 - 5577.161) / 2**0.5, abs=0.01)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("mdtest without a summary\n", "no mdtest"),
        (
            "SUMMARY rate (in ops/sec): (of 1 iterations)\n   Operation  Max\n   ---\n"
            "   File creation   12.0   11.0\n",
            "not an mdtest rate row",
        ),
        (
            "SUMMARY rate (in ops/sec): (of 1 iterations)\n   ---\n"
            "   File teleport   1.0   1.0   1.0   0.0\n",
            "unknown mdtest operation",
        ),
    ],
)
def test_mdtest_bad_input_gets_a_clear_error(text: str, message: str) -> None:
    with pytest.raises(ParseError, match=message):
        parse_mdtest(text, "mdtest")


def test_tcp_counters_parse_this_machines_own_files() -> None:
    """`benchfs.probes.netstat` on the kernel's files as they are here (what a run snapshots
    on each node), and on text that is not them."""
    from benchfs.probes import netstat

    text = "".join(Path(p).read_text() for p in netstat.SOURCES)
    counters = netstat.parse(text)
    assert set(counters) == {f"{proto}.{name}" for proto, name in netstat.COUNTERS}
    assert all(isinstance(v, int) and v >= 0 for v in counters.values())
    assert netstat.delta({"Tcp.OutSegs": 5}, {"Tcp.OutSegs": 9, "Tcp.RetransSegs": 1}) == {
        "Tcp.OutSegs": 4
    }
    assert netstat.parse("Tcp: OutSegs\nUdp: 3\ngarbage") == {}

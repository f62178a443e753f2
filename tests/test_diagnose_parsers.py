"""benchfs-diagnose parsers: this machine's tools, other versions' documented formats, and
truncated or garbage input (a clear error naming the file)."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from benchfs.diagnose.fio import result_of
from benchfs.errors import ParseError
from benchfs.probes.fio import FioError
from benchfs.probes.iostat import iostat_command, iostat_env, parse_iostat, read_iostat, summarize
from benchfs.probes.mdraid import member_devices, parse_mdstat
from benchfs.probes.smart import parse_nvme_smart_log, parse_smartctl_json
from benchfs.probes.triage import (
    parse_df,
    parse_free,
    parse_loadavg,
    parse_mpstat,
    parse_vmstat,
    run_triage,
)

DATA = Path(__file__).parent / "data" / "diagnose"

# --- iostat --------------------------------------------------------------------------------------

# sysstat 11.x text (Ubuntu 18.04): "Device:", avgqu-sz, await and svctm, 12-hour timestamps.
IOSTAT_11_TEXT = (DATA / "iostat-sysstat11.txt").read_text()

# sysstat 12.0 text (seed 004's): no colon, aqu-sz, r_await, svctm still there.
IOSTAT_12_0_TEXT = (DATA / "iostat-sysstat12.0.txt").read_text()

# sysstat 9.0 (RHEL 6) without -k: sectors per second, await only.
IOSTAT_9_TEXT = (DATA / "iostat-sysstat9.txt").read_text()

# sysstat 11.6 JSON: keys without '%' ("util", "rrqm"), avgqu-sz and svctm.
IOSTAT_11_JSON = {
    "sysstat": {
        "hosts": [
            {
                "nodename": "bnode105",
                "statistics": [
                    {
                        "timestamp": "08/03/20 10:15:01",
                        "avg-cpu": {"user": 1.0, "iowait": 0.2, "idle": 98.8},
                        "disk": [
                            {"disk_device": "md0", "rrqm/s": 0.0, "wrqm/s": 0.0, "r/s": 1240.0,
                             "w/s": 0.0, "rkB/s": 158720.0, "wkB/s": 0.0, "rrqm": 0.0,
                             "wrqm": 0.0, "avgrq-sz": 256.0, "avgqu-sz": 265.0, "await": 234.0,
                             "r_await": 234.0, "w_await": 0.0, "svctm": 0.8, "util": 100.0},
                        ],
                    }
                ],
            }
        ]
    }
}  # fmt: skip


def test_iostat_of_this_machine_json_and_text() -> None:
    """The sysstat installed here, both output forms, parsed by name."""
    argv = iostat_command(1.0, count=1)
    out = subprocess.run(argv, capture_output=True, text=True, env=iostat_env(), check=True)
    samples = parse_iostat(out.stdout, "iostat JSON")
    assert samples and all(s.t is not None for s in samples)
    assert {"r_await", "aqu_sz", "util", "r_s", "rkB_s"} <= set(samples[0].values)
    text_argv = [a for a in argv if a not in ("-o", "JSON")]
    out = subprocess.run(text_argv, capture_output=True, text=True, env=iostat_env(), check=True)
    text_samples = parse_iostat(out.stdout, "iostat text")
    assert {s.device for s in text_samples} == {s.device for s in samples}
    assert all(s.t is not None for s in text_samples)


def test_iostat_sysstat_11_text_weighted_await() -> None:
    samples = parse_iostat(IOSTAT_11_TEXT, "fixture")
    assert len(samples) == 4
    assert samples[1].values["aqu_sz"] == 265.0  # avgqu-sz
    stats = summarize(samples)
    # Request-weighted: (244.53 * 620 + 427 * 200) / 820
    assert stats["nvme1n1"].r_await == pytest.approx((244.53 * 620 + 427 * 200) / 820)
    assert stats["nvme1n1"].r_await_max == 427.0
    assert stats["nvme0n1"].util == pytest.approx(6.2)
    assert samples[2].t is not None and samples[2].t - samples[0].t == pytest.approx(1.0)


def test_iostat_sysstat_12_0_and_9_0_text() -> None:
    (s,) = parse_iostat(IOSTAT_12_0_TEXT, "fixture")
    assert s.device == "sdb" and s.values["w_await"] == 3.0 and s.values["util"] == 99.6
    (old,) = parse_iostat(IOSTAT_9_TEXT, "fixture")
    assert old.values["r_await"] == 7.5  # from await
    assert old.values["rkB_s"] == 400.0  # sectors -> kB


def test_iostat_sysstat_11_json_keys_without_percent() -> None:
    (s,) = parse_iostat(json.dumps(IOSTAT_11_JSON), "fixture")
    assert s.device == "md0" and s.values["aqu_sz"] == 265.0 and s.values["util"] == 100.0


def test_iostat_truncated_and_garbage_name_the_file(tmp_path: Path) -> None:
    whole = json.dumps(IOSTAT_11_JSON, indent=1)
    cut = tmp_path / "n1.json"
    cut.write_text(whole[: len(whole) // 2 + 300])
    with pytest.raises(ParseError, match=r"n1\.json.*truncated"):
        read_iostat(cut)
    # A capture killed mid-way still yields its complete intervals when asked to.
    two = json.loads(whole)
    stats = two["sysstat"]["hosts"][0]["statistics"]
    stats.append(stats[0])
    text = json.dumps(two, indent=1)
    cut.write_text(text[: text.rindex('"timestamp"') + 20])
    assert len(read_iostat(cut, partial=True)) == 1
    garbage = tmp_path / "garbage.txt"
    garbage.write_text("hello\nworld\n")
    with pytest.raises(ParseError, match=r"garbage\.txt.*Device"):
        read_iostat(garbage)
    short = tmp_path / "short.txt"
    short.write_text(IOSTAT_12_0_TEXT.rsplit(" ", 3)[0] + "\n")
    with pytest.raises(ParseError, match=r"short\.txt:2.*truncated"):
        read_iostat(short)
    nocol = tmp_path / "nocol.txt"
    nocol.write_text("Device r/s w/s\nsda 1 2\n")
    with pytest.raises(ParseError, match=r"nocol\.txt:2.*r_await"):
        read_iostat(nocol)


# --- md RAID -------------------------------------------------------------------------------------

MDSTAT_RESYNC = (DATA / "mdstat-resync.txt").read_text()

MDSTAT_RECOVERY = (DATA / "mdstat-recovery.txt").read_text()


def test_mdstat_resync_and_recovery() -> None:
    (md0,) = parse_mdstat(MDSTAT_RESYNC, "mdstat")
    assert md0.busy and md0.action == "resync" and md0.progress_pct == 8.6
    assert md0.finish_min == 150.2 and md0.members == ["nvme1n1", "nvme0n1"]
    assert "resync 8.6%" in md0.describe()
    md127, md1 = parse_mdstat(MDSTAT_RECOVERY, "mdstat")
    assert md127.action == "recover" and md127.degraded
    assert md127.failed == ["sde1"] and md127.spares == ["sdd1"]
    assert md1.level == "raid0" and not md1.busy and md1.members == ["sdf", "sdg"]


def test_mdstat_truncated_and_garbage() -> None:
    with pytest.raises(ParseError, match=r"mdstat.*truncated"):
        lines = MDSTAT_RESYNC.split("\n")
        parse_mdstat(lines[0] + "\n" + lines[1], "mdstat")
    with pytest.raises(ParseError, match="not /proc/mdstat"):
        parse_mdstat("garbage\n", "mdstat")
    with pytest.raises(ParseError, match=r"mdstat:2.*member"):
        parse_mdstat("Personalities : [raid1]\nmd0 : active raid1 nv?me[x]\n", "mdstat")


def test_member_devices_from_sysfs(tmp_path: Path) -> None:
    for dev, slaves in {"md0": ["nvme0n1", "nvme1n1"], "nvme0n1": [], "nvme1n1": []}.items():
        (tmp_path / dev / "slaves").mkdir(parents=True)
        for s in slaves:
            (tmp_path / dev / "slaves" / s).symlink_to(tmp_path / s)
    assert member_devices("md0", tmp_path) == ["nvme0n1", "nvme1n1"]
    assert member_devices("nvme0n1", tmp_path) == []


# --- SMART ---------------------------------------------------------------------------------------

SMART_NVME = {
    "json_format_version": [1, 0],
    "smartctl": {"version": [7, 3], "exit_status": 0},
    "device": {"name": "/dev/nvme1n1", "type": "nvme"},
    "smart_status": {"passed": True},
    "nvme_smart_health_information_log": {
        "critical_warning": 0,
        "temperature": 41,
        "available_spare": 100,
        "percentage_used": 3,
        "media_errors": 0,
    },
    "temperature": {"current": 41},
}


def test_smartctl_json_with_and_without_warnings() -> None:
    ok = parse_smartctl_json(json.dumps(SMART_NVME), "smart")
    assert ok.warnings == [] and ok.temperature_c == 41 and ok.passed
    bad = json.loads(json.dumps(SMART_NVME))
    bad["smart_status"]["passed"] = False
    bad["nvme_smart_health_information_log"].update(critical_warning=0x06, media_errors=12)
    health = parse_smartctl_json(json.dumps(bad), "smart")
    text = " ".join(health.warnings)
    assert "FAILED" in text and "bit 1" in text and "bit 2" in text and "12 media errors" in text
    ata = {
        "json_format_version": [1, 0],
        "smart_status": {"passed": True},
        "ata_smart_attributes": {
            "table": [{"id": 5, "raw": {"value": 8}}, {"id": 9, "raw": {"value": 1}}]
        },
    }
    assert parse_smartctl_json(json.dumps(ata), "smart").warnings == ["8 reallocated sectors"]


def test_nvme_smart_log_kelvin_and_wrapped_values() -> None:
    doc = {
        "critical_warning": {"value": 1},
        "temperature": 318,
        "percent_used": 100,
        "media_errors": 0,
    }
    h = parse_nvme_smart_log(json.dumps(doc), "nvme", "nvme0n1")
    assert h.temperature_c == 45 and h.critical_warning == 1
    assert any("spare" in w for w in h.warnings) and any("endurance" in w for w in h.warnings)


def test_smart_truncated_and_garbage() -> None:
    with pytest.raises(ParseError, match=r"smart.*truncated"):
        parse_smartctl_json(json.dumps(SMART_NVME)[:60], "smart")
    with pytest.raises(ParseError, match="not smartctl JSON"):
        parse_smartctl_json("{}", "smart")
    with pytest.raises(ParseError, match="critical_warning"):
        parse_nvme_smart_log('{"temperature": 300}', "nvme")
    with pytest.raises(ParseError, match="not a number"):
        parse_nvme_smart_log('{"critical_warning": "x"}', "nvme")


@pytest.mark.skipif(shutil.which("smartctl") is None, reason="smartctl not installed")
def test_smartctl_on_this_machine_parses() -> None:
    """Whatever the first disk here is, smartctl's JSON parses or says there is no SMART."""
    out = subprocess.run(
        ["smartctl", "--json", "-a", "/dev/vda"], capture_output=True, text=True, check=False
    )
    if out.returncode & 0b11:
        assert json.loads(out.stdout)["smartctl"]["exit_status"] == out.returncode
    else:
        parse_smartctl_json(out.stdout, "smartctl")


# --- triage --------------------------------------------------------------------------------------


def test_triage_on_this_machine(tmp_path: Path) -> None:
    summary, problems = run_triage(str(tmp_path), [], tmp_path)
    assert problems == [] or all("dmesg" in p for p in problems), problems
    for key in ("load1", "runq", "blocked", "cpu_iowait_max_pct", "mem_available_mib", "fs_type"):
        assert key in summary, key
    assert summary["fs_type"] and 0 <= summary["fs_use_pct"] <= 100
    assert isinstance(summary["d_state_tasks"], int)
    assert (tmp_path / "triage-vmstat.txt").read_text().strip()


def test_triage_commands_that_hang_or_are_missing_are_problems_not_failures(
    tmp_path: Path,
) -> None:
    """The commands are bounded together: ones that hang past the timeout are killed (with
    what they started) and named; a prefix that does not exist names every command."""
    hang = ["sh", "-c", 'sleep 31.7; exec "$@"', "sh"]
    began = time.monotonic()
    summary, problems = run_triage(str(tmp_path), hang, tmp_path, timeout_s=0.5)
    assert time.monotonic() - began < 10
    assert len(problems) == 6 and all("took over 0.5 s" in p for p in problems), problems
    left = subprocess.run(["pgrep", "-fx", "sleep 31.7"], capture_output=True, check=False)
    assert left.returncode == 1, f"sleepers left: {left.stdout!r}"
    assert "load1" not in summary and isinstance(summary["d_state_tasks"], int)
    _, problems = run_triage(str(tmp_path), [str(tmp_path / "no-such-tool")], tmp_path)
    # The snapshots one at a time, then the samplers together.
    order = ["loadavg", "free", "dmesg", "df", "vmstat", "mpstat"]
    assert [p.split(":")[0] for p in problems] == order


def test_triage_parsers_other_versions_and_garbage() -> None:
    # procps < 3.3.10: no "available" column.
    old_free = (
        "             total       used       free     shared    buffers     cached\n"
        "Mem:    16777216000 8000000000 4000000000          0 1000000000 2000000000\n"
    )
    assert parse_free(old_free, "free")["mem_available_mib"] == pytest.approx(7e9 / 2**20)
    # mpstat with a 12-hour clock: the time is two words in the header.
    mp = (DATA / "mpstat-12h.txt").read_text()
    assert parse_mpstat(mp, "mpstat") == {"cpu_iowait_max_pct": 51.52, "cpu_idle_min_pct": 48.48}
    df = (DATA / "df-posix.txt").read_text()
    assert parse_df(df, "df")["mount"] == "/scr ipt"
    for parse in (parse_vmstat, parse_mpstat, parse_free, parse_df, parse_loadavg):
        with pytest.raises(ParseError, match="garbage-src"):
            parse("total nonsense\n", "garbage-src")


def test_fio_probe_output_errors_name_the_file(tmp_path: Path) -> None:
    out = tmp_path / "fio-workload.json"
    out.write_text('{"fio version": "fio-3.33", "jobs": [{"jobname": "w", "read": {"io_bytes"')
    with pytest.raises(FioError, match=r"fio-workload\.json"):
        result_of(out, "workload")

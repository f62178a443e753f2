"""benchfs-diagnose judgment rules and the nodes file: edge cases, without probing."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from benchfs import schemas
from benchfs.cli.diagnose import main as diagnose_main
from benchfs.config import load_config, section
from benchfs.diagnose.judge import (
    KIND_DEVICE,
    Flag,
    Thresholds,
    decide,
    exclusion_cap,
    grounds,
)
from benchfs.diagnose.network import PairResult
from benchfs.diagnose.screen import NodeProbe, judge_screen, screen_csv
from benchfs.nodes import (
    Exclusion,
    Node,
    NodesFileError,
    from_allocation,
    load_nodes,
    read_exclusions,
    write_exclusions,
    write_nodes,
)
from benchfs.peers import MetricSpec, outliers
from benchfs.units import MIB

BW = MetricSpec("bw", "bandwidth", "MiB/s", higher_is_worse=False)
LAT = MetricSpec("lat", "latency", "ms", higher_is_worse=True, floor=2.0)


@pytest.fixture
def th() -> Thresholds:
    return section(load_config(), "diagnose")


def keys(found: list) -> list[str]:
    return sorted(o.key for o in found)


def test_defaults_come_from_the_one_config(th: Thresholds) -> None:
    assert th.z_threshold == 3.5 and th.member_ratio == 5.0 and 0 < th.max_exclude_share <= 1
    tighter = section(load_config(None, ["diagnose.r_await_ms=5"]), "diagnose")
    assert tighter.r_await_ms == 5.0
    with pytest.raises(ValueError, match=r"diagnose\.member_ratio"):
        load_config(None, ["diagnose.member_ratio=0.5"])


def test_one_slow_node_among_many(th: Thresholds) -> None:
    values = {f"n{i}": 1000.0 + 10 * i for i in range(8)}
    values["n3"] = 400.0
    (o,) = outliers(values, BW, th)
    assert o.key == "n3" and o.rule == "mad" and o.worse == pytest.approx(1040 / 400, rel=0.02)
    assert "bandwidth 400 MiB/s vs median" in o.evidence()


def test_all_equal_mad_zero_flags_nothing_but_a_real_outlier(th: Thresholds) -> None:
    assert outliers(dict.fromkeys("abcdef", 5.0), LAT, th) == []
    # Tiny differences among equal nodes are noise (MAD floor), a 10% one is below min_worse.
    assert outliers({"a": 5.0, "b": 5.0, "c": 5.0, "d": 5.05, "e": 5.5}, LAT, th) == []
    assert keys(outliers({"a": 5.0, "b": 5.0, "c": 5.0, "d": 5.0, "e": 50.0}, LAT, th)) == ["e"]


def test_one_sided_and_absolute_floor(th: Thresholds) -> None:
    # Higher latency is worse; lower latency (faster than the others) is never an outlier.
    assert keys(outliers({"a": 100.0, "b": 100.0, "c": 100.0, "d": 1000.0}, LAT, th)) == ["d"]
    assert outliers({"a": 10.0, "b": 10.0, "c": 10.0, "d": 1.0}, LAT, th) == []
    # 10x the median but under the absolute floor (fast devices' noise): not flagged.
    assert outliers({"a": 0.1, "b": 0.1, "c": 0.11, "d": 1.0}, LAT, th) == []
    assert keys(outliers({"a": 0.1, "b": 0.1, "c": 0.11, "d": 3.0}, LAT, th)) == ["d"]


def test_two_nodes(th: Thresholds) -> None:
    (o,) = outliers({"a": 100.0, "b": 30.0}, BW, th)
    assert o.key == "b" and o.rule == "two-node" and "two nodes" in o.evidence()
    assert outliers({"a": 100.0, "b": 60.0}, BW, th) == []
    assert outliers({"a": 100.0}, BW, th) == []
    assert outliers({"a": 100.0, "b": None, "c": math.nan}, BW, th) == []


def test_half_the_nodes_slow(th: Thresholds) -> None:
    values = {"a": 1000.0, "b": 990.0, "c": 1010.0, "d": 100.0, "e": 95.0, "f": 105.0}
    found = outliers(values, BW, th)
    assert keys(found) == ["d", "e", "f"] and {o.rule for o in found} == {"group"}
    assert all(o.reference == pytest.approx(1000.0) for o in found)
    # More than half slow: the minority is not called slow, nothing is flagged relatively.
    assert outliers({"a": 1000.0, "b": 100.0, "c": 95.0, "d": 105.0}, BW, th) == []


def two_kinds(severity: float) -> list[Flag]:
    """A bandwidth and a latency flag: two independent kinds of evidence, 2x worse."""
    return [
        Flag("bw", KIND_DEVICE, f"slow {severity}", severity, worse=2.0, family="bandwidth"),
        Flag("lat", KIND_DEVICE, "slow latency", 1.0, worse=2.0, family="latency"),
    ]


def test_cap_on_exclusions_worst_first(th: Thresholds) -> None:
    assert exclusion_cap(8, th) == 2 and exclusion_cap(3, th) == 1 and exclusion_cap(1, th) == 0
    flags: dict[str, list[Flag]] = {f"n{i}": [] for i in range(8)}
    for i, sev in ((1, 3.0), (2, 10.0), (5, 5.0)):
        flags[f"n{i}"] = two_kinds(sev)
    flags["n6"] = [Flag("pair", "slow network", "pair n6<->n7", 9.0, excludable=False)]
    verdicts, excluded = decide(flags, th)
    assert excluded == ["n2", "n5"]
    assert verdicts["n1"].status == "flagged" and "cap" in verdicts["n1"].reasons[-1]
    assert verdicts["n6"].status == "flagged" and "nothing here" in verdicts["n6"].reasons[-1]
    assert verdicts["n0"].status == "ok" and verdicts["n2"].kind == KIND_DEVICE
    assert "2 kinds of evidence agree (bandwidth, latency)" in verdicts["n2"].reasons[-1]


def test_exclusion_needs_agreement_or_one_overwhelming_signal(th: Thresholds) -> None:
    """One kind of evidence (even from two rules) keeps the node; two kinds, one signal at
    least overwhelming_ratio worse, or a state wrong in itself exclude it; a failed probe
    never does."""

    def flag(worse: float, family: str) -> Flag:
        return Flag(family, KIND_DEVICE, family, 5.0, worse=worse, family=family)

    cases = {
        "one": ([flag(1.6, "seqread")], None),
        "same kind twice": ([flag(2.0, "service"), flag(3.0, "service")], None),
        "two kinds": ([flag(1.6, "seqread"), flag(1.6, "seqwrite")], "2 kinds"),
        "overwhelming": ([flag(4.5, "service")], "one overwhelming (4.5x >= 4x)"),
        "md": ([Flag("md", "md resync", "md0 resync", math.inf)], "a state wrong in itself"),
        "probe": ([Flag("probe_failed", "probe failed", "fio", 1.0, excludable=False)], None),
    }
    for name, (fs, why) in cases.items():
        if why is None:
            assert grounds(fs, th) is None, name
        else:
            assert why in (grounds(fs, th) or ""), name


def probe(name: str, **fio: tuple[float, float]) -> NodeProbe:
    p = NodeProbe(Node(name, f"host-{name}", "/scr"))
    for probe_name, (mib_s, p50_us) in fio.items():
        p.fio[probe_name] = {"mib_s": mib_s, "iops": 1.0, "p50_us": p50_us, "p99_us": p50_us * 2}
    return p


def device(r_await: float) -> dict[str, float]:
    return {"r_s": 100.0, "r_await": r_await, "r_await_max": r_await, "aqu_sz": 1.0,
            "util": 50.0, "rkB_s": 1000.0}  # fmt: skip


def test_kind_device_vs_above_and_member_asymmetry(th: Thresholds) -> None:
    """The same fio slowness is a slow device when the device's r_await is high, and slow
    above the device when it is not; one member 100x its twin is flagged on its own."""
    probes = []
    for name, r_await, p50 in (("a", 1.0, 3000), ("b", 1.1, 3100), ("c", 0.9, 2900),
                               ("dev", 40.0, 60000), ("cg", 1.0, 900000)):  # fmt: skip
        p = probe(
            name,
            seqread=(500.0 if name not in ("dev", "cg") else 30.0, 1000),
            workload=(400.0, p50),
        )
        p.devices = {"loop0": {"r_s": 100.0, "r_await": r_await, "r_await_max": r_await,
                               "aqu_sz": 1.0, "util": 50.0, "rkB_s": 1000.0}}  # fmt: skip
        probes.append(p)
    twin = probe("twin", seqread=(500.0, 1000), workload=(400.0, 3000))
    twin.devices = {"loopA": device(0.8), "loopB": device(90.0)}
    twin.members = ["loopA", "loopB"]
    probes.append(twin)
    result = judge_screen(probes, [], th.replace(max_exclude_share=0.5))
    by = {n["name"]: n for n in result.nodes}
    assert by["dev"]["verdict"]["kind"] == "slow device"
    assert by["cg"]["verdict"]["kind"] == "slow above the device"
    assert any("the device is not slow" in f["evidence"] for f in by["cg"]["flags"])
    twin_flags = {f["flag"]: f for f in by["twin"]["flags"]}
    assert "member_asymmetry" in twin_flags
    assert (
        "loopB r_await 90 ms vs its twin loopA 0.8 ms" in twin_flags["member_asymmetry"]["evidence"]
    )
    for ok in ("a", "b", "c"):
        assert by[ok]["verdict"]["status"] == "ok", by[ok]
    # The twin's only evidence is its member asymmetry (112x): overwhelming on its own.
    assert {e.host for e in result.excluded} == {"host-dev", "host-cg", "host-twin"}
    csv_text = screen_csv(result.to_json())
    assert csv_text.splitlines()[0].startswith("host,name,verdict,kind,flags,")
    assert len(csv_text.splitlines()) == 1 + len(probes)


def test_queueing_every_node_shares_excludes_none(th: Thresholds) -> None:
    """Three healthy nodes at 18.7, 19.7 and 20.7 ms r_await under the many-files load (a busy
    machine, seen in the test suite): the one over the absolute threshold gets a note, not a
    flag. A node that also stands apart from its peers is flagged, and excluded with a second
    kind of evidence."""
    probes = []
    for name, r_await in (("n1", 18.7), ("n2", 19.7), ("n3", 20.7), ("n4", 19.0)):
        p = probe(name, seqread=(500.0, 1000), workload=(400.0, 15000))
        p.devices = {"loop0": device(r_await)}
        probes.append(p)
    result = judge_screen(probes, [], th)
    by = {n["name"]: n for n in result.nodes}
    assert result.excluded == [], by["n3"]
    assert by["n3"]["verdict"]["status"] == "ok" and by["n3"]["flags"] == []
    (note,) = [x for x in by["n3"]["notes"] if "r_await 20.7 ms" in x]
    assert "peers' median 19 ms (1.1x)" in note and "not this node's" in note
    probes[2].devices = {"loop0": device(45.0)}  # now 2.4x its peers' median
    result = judge_screen(probes, [], th)
    (flag,) = [f for f in result.nodes[2]["flags"] if f["flag"] == "dev_r_await_abs"]
    assert flag["excludable"] and flag["worse"] > 2
    # Latency under load alone is one kind of evidence: with the many-files rate low too,
    # the node goes.
    assert result.excluded == []
    probes[2].fio["workload"]["mib_s"] = 150.0
    result = judge_screen(probes, [], th)
    assert [e.host for e in result.excluded] == ["host-n3"]


def test_a_measured_flag_must_repeat(th: Thresholds) -> None:
    """A healthy node read at half its peers' rate once (a busy moment, seen in the test
    suite: 516 vs 975 MiB/s) with no device or above-device evidence: its flag stands only if
    a second probe of every node raised it again; otherwise it is dropped with a note. So
    does a slow device's."""
    probes = []
    for name, mib_s in (("a", 975.0), ("b", 516.0), ("c", 990.0), ("d", 960.0), ("e", 980.0)):
        p = probe(name, seqread=(mib_s, 1000), workload=(400.0, 3000))
        p.devices = {"loop0": device(1.0)}
        probes.append(p)
    slow_dev = probe("s", seqread=(30.0, 1000), workload=(400.0, 60000))
    slow_dev.devices = {"loop0": device(40.0)}
    probes.append(slow_dev)
    once_result = judge_screen(probes, [], th)
    once = {n["name"]: n for n in once_result.nodes}
    assert once["b"]["verdict"]["status"] != "ok"
    assert {f["kind"] for f in once["b"]["flags"]} == {"slow (cause unclear)"}
    slow = {f["flag"] for f in once["s"]["flags"]}
    for repeated, status in (
        ({"s": slow}, "ok"),
        ({"b": {f["flag"] for f in once["b"]["flags"]}, "s": slow}, None),
    ):
        by = {n["name"]: n for n in judge_screen(probes, [], th, repeated).nodes}
        if status == "ok":
            assert by["b"]["verdict"]["status"] == "ok" and by["b"]["flags"] == []
            assert any("not seen again on a second probe" in note for note in by["b"]["notes"])
        else:
            assert by["b"]["verdict"] == once["b"]["verdict"]
        assert by["s"]["verdict"]["kind"] == "slow device"  # it repeated
        assert by["s"]["verdict"]["confidence"] == "high" and by["s"]["verdict"]["severity"] > 3
    assert once["s"]["verdict"]["confidence"] == "medium"  # not probed twice
    assert once["b"]["verdict"]["confidence"] == "low"
    by = {n["name"]: n for n in judge_screen(probes, [], th, {}).nodes}
    assert by["s"]["verdict"]["status"] == "ok"  # a slow device seen once is not excluded


def test_nodes_file_round_trip_and_errors(tmp_path: Path) -> None:
    nodes = [
        Node("n1", "bnode001", "/scr", ("nvme0n1", "nvme1n1")),
        Node("n2", "bnode002", "/scr", (), ("ip", "netns", "exec", "n2")),
    ]
    path = tmp_path / "nodes.toml"
    write_nodes(path, nodes)
    assert load_nodes(path) == nodes
    bad = {
        '[[node]]\nname = "a"\nhost = "h"\n': r"node\[0\]\.scratch is missing",
        '[[node]]\nname = "a"\nhost = "h"\nscratch = "rel"\n': "not an absolute path",
        '[[node]]\nname = "a"\nhost = "h"\nscratch = "/s"\ndevices = "sda"\n': r"\.devices must",
        '[[node]]\nname = "a"\nhost = "h"\nscratch = "/s"\ncolour = 1\n': "unknown key 'colour'",
        '[[node]]\nname = "a"\nhost = "h"\nscratch = "/s"\n[[node]]\nname = "a"\nhost = "h"\n'
        'scratch = "/s"\n': r"node\[1\]\.name 'a' repeats",
        "[[node]\n": "malformed TOML",
        "": "no \\[\\[node\\]\\] tables",
    }
    for text, message in bad.items():
        path.write_text(text)
        with pytest.raises(NodesFileError, match=f"{path}.*{message}"):
            load_nodes(path)
    with pytest.raises(FileNotFoundError, match=r"nodes file .* does not exist"):
        load_nodes(tmp_path / "missing.toml")


def test_nodes_from_allocation(tmp_path: Path) -> None:
    nodefile = tmp_path / "pbs_nodes"
    nodefile.write_text("b2\nb2\nb10\nb1\nb10\n")
    nodes = from_allocation("/scr", ["nvme0n1"], env={"PBS_NODEFILE": str(nodefile)})
    assert [n.host for n in nodes] == ["b2", "b10", "b1"] and nodes[0].devices == ("nvme0n1",)
    assert [n.host for n in from_allocation("/scr", env={"SLURM_JOB_NODELIST": "b7"})] == ["b7"]
    plain = from_allocation("/scr", env={"SLURM_JOB_NODELIST": "b7,b9"})
    assert [n.host for n in plain] == ["b7", "b9"]
    with pytest.raises(NodesFileError, match="SLURM_JOB_NODELIST"):
        from_allocation("/scr", env={})


def test_exclusions_round_trip(tmp_path: Path) -> None:
    excluded = [Exclusion("b4", ("slow device: nvme1n1 r_await 120 ms",)), Exclusion("b9", ())]
    write_exclusions(tmp_path, excluded)
    assert (tmp_path / "excluded.txt").read_text() == "b4\nb9\n"
    assert read_exclusions(tmp_path) == excluded
    assert [e.host for e in read_exclusions(tmp_path / "excluded.txt")] == ["b4", "b9"]
    (tmp_path / "bad.json").write_text('[{"reasons": []}]')
    with pytest.raises(NodesFileError, match=r"bad\.json.*host"):
        read_exclusions(tmp_path / "bad.json")


def test_a_binary_exclusion_file_is_one_clear_error(tmp_path: Path) -> None:
    binary = tmp_path / "excluded.txt"
    binary.write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe")
    with pytest.raises(NodesFileError, match=r"excluded\.txt: not a text file"):
        read_exclusions(binary)


def test_show_checks_the_screen_against_its_schema(th: Thresholds, tmp_path: Path) -> None:
    """`benchfs-diagnose show`: a screen it wrote passes its schema and shows; a structurally
    wrong or binary screen.json is one line naming the file and the place, exit status 2."""
    probes = [probe(n, seqread=(500.0, 1000), workload=(400.0, 3000)) for n in "abc"]
    doc = judge_screen(probes, [], th).to_json()
    schemas.check(doc, schemas.SCREEN, "screen")
    good = tmp_path / "screen.json"
    good.write_text(json.dumps(doc))
    shown = CliRunner().invoke(diagnose_main, ["show", str(good)])
    assert shown.exit_code == 0 and "ok" in shown.stdout, shown.output
    broken = json.loads(json.dumps(doc))
    del broken["nodes"][1]["metrics"]
    cases = {
        json.dumps(broken).encode(): r"at \.nodes\[1\]: 'metrics' is a required property",
        json.dumps({**doc, "nodes": {}}).encode(): r"at \.nodes: \{\} is not of type 'array'",
        b"\x89PNG\r\n\x1a\n\xff": "not a JSON file",
    }
    for content, message in cases.items():
        bad = tmp_path / "bad.json"
        bad.write_bytes(content)
        done = CliRunner().invoke(diagnose_main, ["show", str(bad)])
        assert done.exit_code == 2, done.output
        assert done.exception is None or isinstance(done.exception, SystemExit)
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and str(bad) in done.stderr.replace("\n", ""), done.stderr
        assert re.search(message, done.stderr), done.stderr


def test_like_is_compared_with_like(th: Thresholds) -> None:
    """A twin-device btrfs node writes at a third of its ext4 peers' rate (seen on such a
    node): it has no peer of its kind, so it is reported, not judged against them."""
    probes = []
    for name, mib_s in (("a", 900.0), ("b", 950.0), ("c", 920.0), ("btrfs", 300.0)):
        p = probe(name, seqwrite=(mib_s, 1000), seqread=(mib_s, 1000), workload=(400.0, 3000))
        p.devices = {"loop0": device(1.0)}
        p.triage = {"fs_type": "btrfs" if name == "btrfs" else "ext4"}
        probes.append(p)
    probes[-1].members = ["loop0", "loop1"]
    by = {n["name"]: n for n in judge_screen(probes, [], th).nodes}
    assert by["btrfs"]["verdict"]["status"] == "ok", by["btrfs"]
    assert any("no peer of its kind (btrfs, 2 devices)" in x for x in by["btrfs"]["notes"])
    # Among its own kind it is judged as before.
    probes[0].triage = probes[1].triage = probes[2].triage = {"fs_type": "btrfs"}
    for p in probes[:3]:
        p.members = ["loop0", "loop1"]
    by = {n["name"]: n for n in judge_screen(probes, [], th).nodes}
    assert by["btrfs"]["verdict"]["status"] == "excluded", by["btrfs"]


def test_history_shows_a_node_slow_in_every_job(tmp_path: Path) -> None:
    """Screens and judgments append to the results root's history; `history` puts the node
    flagged every time above the one flagged once; a line cut by a crash is skipped."""
    from benchfs.diagnose import history

    def nodes(bad: str | None, status: str = "excluded") -> list[dict]:
        return [
            {"host": f"h{i}", "name": f"n{i}", "status": status if f"n{i}" == bad else "ok",
             "kind": "slow device" if f"n{i}" == bad else None,
             "severity": 12.5 if f"n{i}" == bad else None}
            for i in range(1, 4)
        ]  # fmt: skip

    for k in range(4):
        history.append(tmp_path, "screen", f"s{k}", nodes("n2"))
    history.append(tmp_path, "judge", "run", nodes("n3", "flagged"))
    with open(tmp_path / history.HISTORY_FILE, "a") as f:
        f.write('{"time": "cut')
    out = CliRunner().invoke(diagnose_main, ["history", "--results-root", str(tmp_path), "--json"])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.stdout)
    assert doc["entries"] == 5
    first, second = doc["nodes"][:2]
    assert (first["host"], first["seen"], first["excluded"], first["recent"]) == (
        "h2",
        5,
        4,
        "XXXX.",
    )
    assert first["kinds"] == {"slow device": 4} and first["worst"] == 12.5
    assert (second["host"], second["flagged"], second["excluded"]) == ("h3", 1, 0)
    assert "skipped" in out.stderr
    missing = CliRunner().invoke(diagnose_main, ["history", "--results-root", str(tmp_path / "x")])
    assert missing.exit_code == 2 and "no diagnosis history" in missing.stderr


def test_drain_prints_scontrol_with_the_evidence(tmp_path: Path) -> None:
    write_exclusions(tmp_path, [Exclusion("bnode3", ("slow device: loop3 r_await 20 ms " * 20,))])
    out = CliRunner().invoke(diagnose_main, ["drain", str(tmp_path)])
    assert out.exit_code == 0, out.output
    (line,) = out.stdout.splitlines()
    assert line.startswith("scontrol update nodename=bnode3 state=drain 'reason=benchfs: slow")
    assert len(line) < 300 and line.endswith("...'")


def pair(a: str, b: str, mib_s: float, rtt_us: float = 50.0) -> PairResult:
    return PairResult(a, b, mib_s, mib_s, rtt_us, rtt_us * 2)


def test_a_slow_pair_is_measured_again_and_placed_against_both_ends(th: Thresholds) -> None:
    """A slow pair between nodes whose other pairs are normal is the link, not grounds to
    exclude either end; it stands only if its repeat is as slow; a node all of whose pairs
    are slow is its network's fault."""
    names = ["a", "b", "c", "d", "e"]
    probes = [probe(n, seqread=(900.0, 1000), workload=(400.0, 3000)) for n in names]
    pairs = [pair(x, y, 100.0 if {x, y} == {"a", "b"} else 1000.0)
             for i, x in enumerate(names) for y in names[i + 1:]]  # fmt: skip
    once = judge_screen(probes, pairs, th)
    by = {n["name"]: n for n in once.nodes}
    for n in ("a", "b"):
        (flag,) = by[n]["flags"]
        assert flag["flag"] == "network_pair" and not flag["excludable"], flag
        assert "the link a<->b, not either node" in flag["evidence"]
        assert by[n]["verdict"]["status"] == "flagged"
    assert by["c"]["flags"] == [] and once.excluded == []
    busy = judge_screen(probes, pairs, th, None, {"a<->b": pair("a", "b", 980.0)})
    row = next(r for r in busy.to_json()["pairs"] if r["pair"] == "a<->b")
    assert row["flags"] == [] and "not when measured again" in row["note"]
    assert all(n["flags"] == [] for n in busy.nodes)
    again = judge_screen(probes, pairs, th, None, {"a<->b": pair("a", "b", 110.0)})
    assert "repeated" in {n["name"]: n for n in again.nodes}["a"]["flags"][0]["evidence"]
    # Every pair of e slow: e's network, excludable.
    slow_e = [pair(p.server, p.client, 100.0) if "e" in (p.server, p.client)
              else pair(p.server, p.client, 1000.0) for p in pairs]  # fmt: skip
    by = {n["name"]: n for n in judge_screen(probes, slow_e, th).nodes}
    assert all(f["excludable"] and "every pair of e is slow" in f["evidence"]
               for f in by["e"]["flags"])  # fmt: skip
    assert not any(f["excludable"] for f in by["a"]["flags"])
    assert "e's network" in by["a"]["flags"][0]["evidence"]


def test_a_binding_io_limit_agrees_with_a_slow_measurement(th: Thresholds) -> None:
    """A throttled node measured slow on sequential writes alone (its reads met a busy
    moment of its peers, seen once in 15 planted throttles) is excluded: the cgroup limit on
    its device, below what its peers wrote, is a second, independent kind of evidence. The
    same limit on a node measured at its peers' rate is no flag at all."""
    from benchfs.probes.iolimits import IoLimit

    probes = [probe(n, seqwrite=(900.0 + i, 1000), seqread=(800.0, 1000), workload=(400.0, 3000))
              for i, n in enumerate("abcd")]  # fmt: skip
    probes.append(probe("t", seqwrite=(300.0, 1000), seqread=(780.0, 1000), workload=(400.0, 3000)))
    limit = IoLimit("/x", "loop4", "write", 300 * MIB, "bytes/s", "blkio")
    probes[-1].io_limits = [limit]
    by = {n["name"]: n for n in judge_screen(probes, [], th).nodes}
    t = by["t"]
    assert [f["flag"] for f in t["flags"]] == ["fio_seqwrite_mib_s", "io_limit"], t["flags"]
    assert t["verdict"]["status"] == "excluded" and t["verdict"]["kind"] == "slow above the device"
    assert "limits loop4 writes to 300.0 MiB/s" in t["flags"][1]["evidence"]
    probes[0].io_limits = [limit]  # a's limit does not bind: a wrote at its peers' rate
    assert {n["name"]: n for n in judge_screen(probes, [], th).nodes}["a"]["flags"] == []

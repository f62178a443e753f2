"""Find on the servers (`Client.find`): every predicate, pages beyond one reply, names hidden
by a cut operation, bad input, and the `benchfs-bench find --quick` report's shape."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from benchfs import Client
from benchfs.bench import find as find_bench
from benchfs.cluster import LocalCluster
from conftest import rendered
from test_persistence import CRASH_SCRIPT
from test_placement import bench


@pytest.mark.timeout(120)
def test_find_predicates_pages_and_hidden_names(
    daemon_cluster: Callable[..., LocalCluster], tmp_path: Path
) -> None:
    cluster = daemon_cluster(3)
    with Client(cluster.registry_dir, cluster.config_path.read_text()) as c:
        c.mkdir("/a")
        c.mkdir("/a/sub")
        c.mkdir("/other")
        for i in range(1500):  # more than a page (512) on every owner
            c.open(f"/a/f{i:04d}", "w").close()
        with c.open("/a/sub/big01", "w") as f:
            f.write(b"x" * 3901)
        after = time.time_ns()
        with c.open("/a/sub/new01", "w") as f:
            f.write(b"y" * 3901)
        c.open("/other/f0001", "w").close()

        everything = c.find("/a")
        assert everything.examined == everything.matched == 1500 + 2 + 2  # /a, /a/sub
        assert [f.path for f in everything.found] == sorted(f.path for f in everything.found)
        files = {f.path for f in c.find("/a", kind="file").found}
        assert len(files) == 1502 and "/a/sub" not in files
        assert [f.path for f in c.find("/a", kind="dir").found] == ["/a", "/a/sub"]
        hits = c.find("/a", name="*01*", size=(3901, 3901))
        assert [(f.path, f.size) for f in hits.found] == [
            ("/a/sub/big01", 3901),
            ("/a/sub/new01", 3901),
        ]
        assert [f.path for f in c.find("/a", name="*01", newer_ns=after).found] == ["/a/sub/new01"]
        counted = c.find("/a", name="f1???", count_only=True)
        assert (counted.matched, counted.found) == (500, [])
        assert c.find("/nope").examined == 0
        assert {f.path for f in c.find("/", name="f0001").found} == {"/a/f0001", "/other/f0001"}
        with pytest.raises(ValueError, match="not one valid pattern"):
            c.find("/a", name="x/y")
        with pytest.raises(ValueError, match="not one valid pattern"):
            c.find("/a", name="[")
        with pytest.raises(OSError):
            c.find("relative")
    # A create cut after its first step leaves a hidden name without an inode: find, like
    # stat and listdir, does not see it.
    script = tmp_path / "crash.py"
    script.write_text(CRASH_SCRIPT)
    env = {**os.environ, "BENCHFS_CRASH_AT": "create:1"}
    args = [str(cluster.registry_dir), str(cluster.config_path), "create", "/a/ghost", ""]
    done = subprocess.run([sys.executable, str(script), *args], env=env, capture_output=True)
    assert done.returncode == -signal.SIGKILL
    with Client(cluster.registry_dir, cluster.config_path.read_text()) as c:
        assert c.find("/a", name="ghost").found == []


@pytest.mark.timeout(180)
@pytest.mark.serial
def test_find_bench_quick_json_shape() -> None:
    report = bench("find", "--quick", "--json")
    assert [c["name"] for c in report["cases"]] == ["walk", "find"]
    assert all(c["seconds"] > 0 and len(c["samples"]) == 1 for c in report["cases"])
    assert report["matched"] > 0 and report["files"] == 2000
    assert [t["target"] for t in report["targets"]] == ["find >= 10x faster than the walk"]
    assert "names/s" in rendered(find_bench.render, report)


@pytest.mark.timeout(120)
def test_benchfs_find_command(tmp_path: Path) -> None:
    """`benchfs find` on a started job: matches on stdout, the counts on stderr; bad input is
    one line."""
    benchfs = str(Path(sys.executable).parent / "benchfs")
    env = {k: v for k, v in os.environ.items() if not k.startswith("BENCHFS_")}
    env["BENCHFS_RUN_KERNEL_TRACE"] = "false"  # it traces the whole host; not tested here
    started = subprocess.run(
        [benchfs, "start", "--servers", "2", "--results-root", str(tmp_path)],
        capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip
    assert started.returncode == 0, started.stderr
    job = next(line.split("=", 1)[1] for line in started.stdout.splitlines()
               if line.startswith("export BENCHFS_JOB_DIR="))  # fmt: skip
    job = job.strip("'\"")
    try:
        state = json.loads((Path(job) / "job.json").read_text())
        with Client(state["registry"], Path(state["config"]).read_text()) as c:
            c.mkdir("/d")
            for i in range(12):
                with c.open(f"/d/x{i:02d}", "w") as f:
                    f.write(b"a" * i)
            c.symlink("x00", "/d/link")

        def run(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [benchfs, "find", *args, "--job", job],
                capture_output=True, text=True, timeout=60, env=env,
            )  # fmt: skip

        out = run("/d", "--name", "x1*", "--size", "10:11")
        assert out.returncode == 0, out.stderr
        assert out.stdout.split() == ["/d/x10", "/d/x11"]
        assert "2 of 14 names under /d match" in out.stderr
        assert run("--type", "d").stdout.split() == ["/", "/d"]
        assert run("--type", "l").stdout.split() == ["/d/link"]
        bad = run("relative")
        assert bad.returncode == 2 and "an absolute BenchFS path" in bad.stderr
    finally:
        subprocess.run([benchfs, "stop", "--job", job], capture_output=True, timeout=60, env=env)

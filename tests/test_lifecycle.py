"""`benchfs start / status / stage-in / stage-out / stop`, as a job script uses them: real
servers and a real FUSE mount started by the command, unmodified programs on the mount, the C
library and Python from the exported environment, verified staging of a generated tree, and a
stop after `kill -9` of the whole cluster."""

from __future__ import annotations

import contextlib
import filecmp
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from benchfs import Client, schemas
from benchfs.lifecycle.stage import WHOLE_MAX, BenchfsSide, LocalSide, StageFailed, stage
from benchfs.mount import is_mounted
from benchfs.procs import ProcessRef, descendants
from benchfs.results import read_json
from conftest import InProcessCluster, alive, run_bounded
from doc_examples import ROOT, examples

BIN = Path(sys.executable).parent


def benchfs(
    *args: str, env: dict[str, str] | None = None, timeout: float = 90
) -> subprocess.CompletedProcess[str]:
    return run_bounded([str(BIN / "benchfs"), *args], timeout, env={**os.environ, **(env or {})})


def exports(stdout: str) -> dict[str, str]:
    """The variables of `benchfs start`'s output, which must be export lines only."""
    lines = stdout.splitlines()
    assert lines and all(line.startswith("export BENCHFS_") for line in lines), stdout
    out = subprocess.run(
        ["sh", "-c", stdout + 'env -0 | grep -z "^BENCHFS_"'], capture_output=True, check=True
    ).stdout
    return dict(item.split("=", 1) for item in out.decode().split("\0") if item)


def start(tmp_path: Path, *extra: str) -> dict[str, str]:
    done = benchfs(
        "start", "--servers", "2", "--results-root", str(tmp_path / "results"),
        "--set", "layout.chunk_size=1M", *extra,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return exports(done.stdout)


def recorded(env: dict[str, str]) -> list[ProcessRef]:
    job = read_json(Path(env["BENCHFS_JOB_DIR"]) / "job.json")
    refs = []
    for p in job["processes"]:
        refs.append(ProcessRef(p["pid"], p["start"]))
        refs += [ProcessRef(pid, start) for pid, start in p["children"]]
    return refs


def scratch_dirs(env: dict[str, str]) -> list[str]:
    return list(read_json(Path(env["BENCHFS_JOB_DIR"]) / "manifest.json")["scratch_dirs"].values())


C_PROGRAM = r"""
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <benchfs.h>
int main(void)
{
    int rc = benchfs_init(NULL, NULL, NULL, 0); /* everything from the exported environment */
    if (rc < 0) { fprintf(stderr, "init: %s\n", benchfs_last_error()); return 1; }
    char buf[64] = {0};
    benchfs_file *f;
    if ((rc = benchfs_open("/from-cp.txt", O_RDONLY, &f)) < 0) {
        fprintf(stderr, "open: %s\n", benchfs_last_error());
        return 1;
    }
    ssize_t n = benchfs_pread(f, buf, sizeof buf - 1, 0);
    benchfs_close(f);
    struct benchfs_statfs st;
    if ((rc = benchfs_statfs(&st)) < 0) {
        fprintf(stderr, "statfs: %s\n", benchfs_last_error());
        return 1;
    }
    printf("%zd %s|%u %u %d\n", n, buf, st.servers, st.unreachable,
           st.total_bytes > st.free_bytes);
    return benchfs_finalize() < 0;
}
"""


def test_start_run_unmodified_programs_stop_leaves_nothing(tmp_path: Path) -> None:
    mount = tmp_path / "mnt"
    env = start(tmp_path, "--mount", str(mount))
    assert env["BENCHFS_MOUNT"] == str(mount) and env["BENCHFS_EXPECTED_SERVERS"] == "2"
    try:
        refs = recorded(env)
        assert refs and all(r.alive() for r in refs)
        # cp and dd on the mount, as any program would
        text = tmp_path / "hello.txt"
        text.write_text("hello from cp\n")
        subprocess.run(["cp", str(text), str(mount / "from-cp.txt")], check=True)
        subprocess.run(
            ["dd", "if=/dev/urandom", f"of={mount}/dd.bin", "bs=1M", "count=6", "status=none"],
            check=True,
        )
        # a Python script that only knows the environment
        script = (
            "from benchfs import Client\n"
            "with Client() as c:\n"
            "    print(c.stat('/dd.bin').st_size, sorted(c.listdir('/')))\n"
        )
        py = subprocess.run([sys.executable, "-c", script], env={**os.environ, **env},
                            capture_output=True, text=True, timeout=60)  # fmt: skip
        assert py.stdout.strip() == "6291456 ['dd.bin', 'from-cp.txt']", py.stderr
        # a C program linked against libbenchfs, no arguments, no other setting
        src = tmp_path / "app.c"
        src.write_text(C_PROGRAM)
        pc = {"PKG_CONFIG_PATH": str(BIN.parent / "lib" / "pkgconfig")}
        flags = subprocess.run(
            ["pkg-config", "--cflags", "--libs", "benchfs"],
            env={**os.environ, **pc}, capture_output=True, text=True, check=True,
        ).stdout.split()  # fmt: skip
        libdir = str(BIN.parent / "lib")
        subprocess.run(
            ["cc", str(src), "-o", str(tmp_path / "app"), *flags, f"-Wl,-rpath,{libdir}"],
            check=True,
        )
        app = subprocess.run(
            [str(tmp_path / "app")], env={**os.environ, **env}, capture_output=True, text=True,
            timeout=60,
        )  # fmt: skip
        assert app.returncode == 0, app.stderr
        assert app.stdout.strip() == "14 hello from cp\n|2 0 1", app.stdout
        # the complete program of docs/capi.md (README's C example), as written, no argument
        capi = examples(ROOT / "docs" / "capi.md")
        whole = next(e for e in capi if e.lang == "c" and "int main" in e.code)
        (tmp_path / "doc.c").write_text(whole.code)
        subprocess.run(
            ["cc", str(tmp_path / "doc.c"), "-o", str(tmp_path / "doc"), *flags,
             f"-Wl,-rpath,{libdir}"],
            check=True,
        )  # fmt: skip
        doc = subprocess.run(
            [str(tmp_path / "doc")], env={**os.environ, **env}, capture_output=True, text=True,
            timeout=60,
        )  # fmt: skip
        assert doc.returncode == 0 and "read 13 bytes: hello from C" in doc.stdout, doc.stderr
        # df through the mount reports the servers' real capacity
        df = os.statvfs(mount)
        assert df.f_blocks > 0 and df.f_bfree <= df.f_blocks
        status = benchfs("status", "--json", env=env)
        assert status.returncode == 0, status.stderr
        s = json.loads(status.stdout)
        assert s["state"] == "running" and s["mount"]["mounted"] == "mounted"
        assert [srv["process_alive"] for srv in s["servers"]] == [True, True]
        assert s["capacity"]["total_bytes"] > 0 and s["capacity"]["files"] >= 3
    finally:
        stopped = benchfs("stop", env=env)
    assert stopped.returncode == 0, stopped.stderr
    assert not [r.pid for r in refs if r.alive()]
    assert not is_mounted(mount)
    assert not [d for d in scratch_dirs(env) if Path(d).exists()]
    manifest = read_json(Path(env["BENCHFS_JOB_DIR"]) / "manifest.json")
    schemas.check(manifest, schemas.MANIFEST, "manifest.json")
    assert manifest["outcome"]["status"] == "ok" and manifest["analysis"]["exit_status"] == 0
    again = benchfs("stop", env=env)
    assert again.returncode == 0 and "was stopped at" in again.stderr


def make_tree(root: Path, seed: int = 7) -> int:
    """3,000 files of 0 B to 64 MiB, 256 MiB in all, 4 levels deep, with varied modes and
    times; returns the byte count."""
    rng = random.Random(seed)
    dirs = [root]
    for depth in range(1, 5):
        for i in range(3):
            d = (
                rng.choice([x for x in dirs if len(x.relative_to(root).parts) == depth - 1])
                / f"d{depth}{i}"
            )
            d.mkdir(parents=True, exist_ok=True)
            dirs.append(d)
    sizes = [64 << 20, 48 << 20, 32 << 20, 16 << 20] + [
        rng.choice([0, 1, 4095, 4096, 65537]) for _ in range(996)
    ]
    sizes += [rng.randrange(0, 80_000) for _ in range(2000)]
    sizes[-1] = 0
    left = (256 << 20) - sum(sizes)
    sizes[4] += left  # the total, exactly
    total = 0
    for i, size in enumerate(sizes):
        path = dirs[i % len(dirs)] / f"f{i:04d}"
        path.write_bytes(rng.randbytes(size))
        os.chmod(path, rng.choice([0o644, 0o600, 0o640, 0o755]))
        t = 1_600_000_000_000_000_000 + i * 1_000_003
        os.utime(path, ns=(t, t))
        total += size
    return total


def test_stage_in_and_out_keep_every_byte_and_attribute(tmp_path: Path) -> None:
    src = tmp_path / "src"
    total = make_tree(src)
    assert total == 256 << 20
    env = start(tmp_path)
    try:
        t0 = time.monotonic()
        staged_in = benchfs("stage-in", str(src), "/data", env=env)
        assert staged_in.returncode == 0, staged_in.stderr
        out = tmp_path / "out"
        staged_out = benchfs("stage-out", "/data", str(out), env=env)
        assert staged_out.returncode == 0, staged_out.stderr
        elapsed = time.monotonic() - t0
        assert elapsed < 60, f"stage-in and stage-out of 256 MiB took {elapsed:.1f} s"
        assert subprocess.run(["diff", "-r", str(src), str(out)]).returncode == 0
        files = [p for p in src.rglob("*") if p.is_file()]
        assert len(files) == 3000
        for p in files:
            q = out / p.relative_to(src)
            a, b = p.stat(), q.stat()
            assert (a.st_size, a.st_mode, a.st_mtime_ns) == (b.st_size, b.st_mode, b.st_mtime_ns), p
        manifests = sorted((Path(env["BENCHFS_JOB_DIR"]) / "staging").glob("*.json"))
        assert len(manifests) == 2
        for m in manifests:
            doc = read_json(m)
            schemas.check(doc, schemas.STAGE_MANIFEST, m)
            assert doc["status"] == "ok" and doc["files_copied"] == 3000
            assert doc["bytes_copied"] == total and all(f["verified"] for f in doc["files"])

        # A truncated file on either side is found and copied again; the rest is skipped.
        victim = next(p for p in files if p.stat().st_size > 100_000).relative_to(src)
        mounted_view = benchfs("status", "--json", env=env)
        assert mounted_view.returncode == 0
        from benchfs import Client

        with Client(env["BENCHFS_REGISTRY"], Path(env["BENCHFS_CONFIG"]).read_text()) as c:
            c.truncate(f"/data/{victim.as_posix()}", 1000)
        again = benchfs("stage-in", str(src), "/data", env=env)
        assert again.returncode == 0, again.stderr
        assert f"benchfs:/data/{victim.as_posix()}: 1000 bytes" in again.stderr
        assert "staged 1 files" in again.stderr and "2999 already verified" in again.stderr
        os.truncate(out / victim, 10)
        back = benchfs("stage-out", "/data", str(out), env=env)
        assert back.returncode == 0 and f"{out / victim}: 10 bytes" in back.stderr
        assert filecmp.cmp(src / victim, out / victim, shallow=False)
    finally:
        assert benchfs("stop", env=env).returncode == 0


def test_staging_keeps_links_as_cp_a_does_or_follows_them(tmp_path: Path) -> None:
    """A tree with every kind of link, staged in and out: kept as links (targets as written,
    their own times), as `cp -a` keeps them; with --follow-links, what they lead to is copied,
    and links that lead nowhere, back up, or outside BenchFS are named in notes."""
    src = tmp_path / "src"
    (src / "d" / "sub").mkdir(parents=True)
    (src / "d" / "f").write_bytes(b"data")
    outside = tmp_path / "outside.txt"
    outside.write_bytes(b"from the host")
    for target, name in [
        ("f", "d/rel"), ("d", "dirlink"), ("nowhere", "dangling"), (str(outside), "abs"),
        ("..", "d/sub/up"),
    ]:  # fmt: skip
        os.symlink(target, src / name)
        os.utime(src / name, ns=(1_000_000_000, 1_000_000_000), follow_symlinks=False)
    reference = tmp_path / "cp-a"
    subprocess.run(["cp", "-a", str(src), str(reference)], check=True)
    env = start(tmp_path)
    try:
        assert benchfs("stage-in", str(src), "/kept", env=env).returncode == 0
        out = tmp_path / "out"
        done = benchfs("stage-out", "/kept", str(out), env=env)
        assert done.returncode == 0, done.stderr
        assert (
            subprocess.run(["diff", "-r", "--no-dereference", str(reference), str(out)]).returncode
            == 0
        )
        for link in [p for p in reference.rglob("*") if p.is_symlink()]:
            copy = out / link.relative_to(reference)
            assert copy.is_symlink() and os.readlink(copy) == os.readlink(link)
            assert copy.lstat().st_mtime_ns == link.lstat().st_mtime_ns == 1_000_000_000
        manifest = read_json(
            next((Path(env["BENCHFS_JOB_DIR"]) / "staging").glob("stage-in-*.json"))
        )
        assert sorted(link["path"] for link in manifest["links"]) == [
            "abs", "d/rel", "d/sub/up", "dangling", "dirlink"
        ]  # fmt: skip

        followed = benchfs("stage-in", "--follow-links", str(src), "/followed", env=env)
        assert followed.returncode == 0, followed.stderr
        assert "dangling: a link that leads nowhere" in followed.stderr
        assert "d/sub/up: a link back to a directory above it" in followed.stderr
        from benchfs import Client

        with Client(env["BENCHFS_REGISTRY"], Path(env["BENCHFS_CONFIG"]).read_text()) as c:
            assert c.find("/followed", kind="symlink").found == []
            assert c.open("/followed/dirlink/rel").read() == b"data"
            assert c.open("/followed/abs").read() == b"from the host"
        # Out of BenchFS, following: the link to a host path is outside BenchFS, and named.
        back = benchfs("stage-out", "--follow-links", "/kept", str(tmp_path / "out-l"), env=env)
        assert back.returncode == 0, back.stderr
        assert "benchfs:/kept/abs: " in back.stderr and "outside BenchFS" in back.stderr
        assert (tmp_path / "out-l" / "dirlink" / "rel").read_bytes() == b"data"
        assert not any(p.is_symlink() for p in (tmp_path / "out-l").rglob("*"))
    finally:
        assert benchfs("stop", env=env).returncode == 0


def test_stop_keeps_the_data_after_a_failed_stage_out(tmp_path: Path) -> None:
    """Stage-out fsyncs what it wrote and says how long that took; when it failed, `stop`
    keeps BenchFS's data (it may be the only copy) unless told --delete-data."""
    src = tmp_path / "src"
    (src / "d").mkdir(parents=True)
    (src / "d" / "a").write_bytes(os.urandom(3 << 20))
    (src / "b").write_bytes(b"small")
    env = start(tmp_path)
    try:
        assert benchfs("stage-in", str(src), "/r", env=env).returncode == 0
        good = benchfs("stage-out", "/r", str(tmp_path / "good"), env=env)
        assert good.returncode == 0 and re.search(r"fsynced in \d+\.\d\d s", good.stderr)
        bad = tmp_path / "bad"
        (bad / "b").mkdir(parents=True)  # a directory where the file b goes
        failed = benchfs("stage-out", "/r", str(bad), env=env)
        assert failed.returncode == 1 and "1 files not staged" in failed.stderr
        assert "Traceback" not in failed.stderr
        # A destination that cannot be made: one line naming it.
        nowhere = benchfs("stage-out", "/r", "/dev/null/out", env=env)
        assert nowhere.returncode == 1 and "Traceback" not in nowhere.stderr
        assert "error ENOTDIR: /dev/null/out: Not a directory" in nowhere.stderr
    finally:
        stopped = benchfs("stop", env=env)
    assert stopped.returncode == 1
    assert f"the last stage-out to {bad} failed: node-local data kept" in stopped.stderr
    kept = scratch_dirs(env)
    assert kept and all(Path(d).is_dir() for d in kept)
    for d in kept:
        shutil.rmtree(d)


def test_an_interrupted_staging_across_nodes_leaves_no_copier(tmp_path: Path) -> None:
    """Ctrl-C of `benchfs stage-in --nodes` stops the copying process it started on each node
    (they run in sessions of their own, so the terminal's signal does not reach them)."""
    src = tmp_path / "src"
    src.mkdir()
    block = os.urandom(1 << 20)
    for i in range(24):
        (src / f"f{i:02d}").write_bytes(block * 32)
    env = start(tmp_path)
    try:
        # As a terminal starts it: with SIGINT's default action. A suite started in the
        # background by a shell without job control ignores SIGINT, and the stager inherited
        # that (Python then installs no KeyboardInterrupt handler): the Ctrl-C did nothing.
        stager = subprocess.Popen(
            [str(BIN / "benchfs"), "stage-in", "--nodes", "--threads", "1", str(src), "/d"],
            env={**os.environ, **env}, stderr=subprocess.PIPE, text=True,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )  # fmt: skip
        assert stager.stderr is not None
        # Each copier is held as soon as it appears (it needs a few tenths of a second to start
        # copying), so that the Ctrl-C lands mid-copy: 768 MiB took 2.4-2.7 s, less than a
        # busy machine once took to print the "copying" lines and find the copiers after them.
        copiers: list[int] = []
        deadline = time.monotonic() + 60
        while len(copiers) < 2 and time.monotonic() < deadline and stager.poll() is None:
            for p in descendants(stager.pid):
                with contextlib.suppress(OSError):  # gone, or not yet the copier it execs
                    line = Path(f"/proc/{p}/cmdline").read_text(errors="replace")
                    if p not in copiers and "benchfs.lifecycle.spread" in line:
                        os.kill(p, signal.SIGSTOP)
                        copiers.append(p)
            time.sleep(0.002)
        assert len(copiers) == 2, copiers
        said = [stager.stderr.readline() for _ in range(3)]  # the listing, then each node
        assert sum("copying" in line for line in said) == 2, said
        stager.send_signal(signal.SIGINT)
        for p in copiers:
            os.kill(p, signal.SIGCONT)
        _, err = stager.communicate(timeout=30)
        assert stager.returncode != 0 and "Traceback" not in err, err
        assert alive(copiers) == []
    finally:
        assert benchfs("stop", env=env).returncode in (0, 1)


class ShrinkingSource(LocalSide):
    """A source tree in which another program truncates a file right after the listing."""

    def __init__(self, root: Path, victim: Path) -> None:
        super().__init__(root)
        self.victim = victim

    def walk(self, follow_links: bool) -> tuple[list[Any], list[str]]:
        listed = super().walk(follow_links)
        os.truncate(self.victim, 3)
        return listed


def test_a_file_truncated_during_staging_fails_the_staging(tmp_path: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    dst.mkdir()
    (src / "ok").write_bytes(b"fine")
    (src / "big").write_bytes(os.urandom(1 << 20))
    manifest = tmp_path / "m.json"
    with pytest.raises(
        Exception, match=r"1048576 were listed: it changed or was truncated"
    ) as failed:
        stage(ShrinkingSource(src, src / "big"), LocalSide(dst), "in", manifest)
    assert "1 files not staged" in str(failed.value)
    doc = read_json(manifest)
    schemas.check(doc, schemas.STAGE_MANIFEST, manifest)
    assert doc["status"] == "failed" and [f["path"] for f in doc["files"]] == ["ok"]


@pytest.mark.parametrize("size", [WHOLE_MAX, WHOLE_MAX + 1])
def test_a_file_truncated_while_staged_into_benchfs_fails_the_staging(
    inproc_cluster: Callable[..., InProcessCluster], tmp_path: Path, size: int
) -> None:
    """Into BenchFS, small files (written whole) and large ones."""
    cluster = inproc_cluster(2)
    src = tmp_path / "src"
    src.mkdir()
    (src / "ok").write_bytes(b"fine")
    (src / "big").write_bytes(os.urandom(size))
    manifest = tmp_path / "m.json"
    with Client(str(cluster.registry), config=cluster.config) as c:
        side = BenchfsSide("/in", lambda: c)
        with pytest.raises(StageFailed, match=rf"{size} were listed: it changed or was truncated"):
            stage(ShrinkingSource(src, src / "big"), side, "in", manifest)
        assert c.open("/in/ok").read() == b"fine"
    assert [f["path"] for f in read_json(manifest)["files"]] == ["ok"]


def test_stop_after_the_whole_cluster_was_killed_cleans_up(tmp_path: Path) -> None:
    mount = tmp_path / "mnt"
    env = start(tmp_path, "--mount", str(mount))
    refs = recorded(env)
    job = read_json(Path(env["BENCHFS_JOB_DIR"]) / "job.json")
    mount_pid = next(p["pid"] for p in job["processes"] if p["role"] == "benchfs-mount")
    try:
        # The mount dies of a core-dumping signal (its core is kept and named); the rest is killed.
        for r in refs:
            r.signal(signal.SIGABRT if r.pid == mount_pid else signal.SIGKILL)
        deadline = time.monotonic() + 10
        while any(r.alive() for r in refs) and time.monotonic() < deadline:
            time.sleep(0.05)
        status = benchfs("status", "--json", env=env)
        assert status.returncode == 1
        s = json.loads(status.stdout)
        assert s["state"] == "down" and s["mount"]["mounted"] == "disconnected"
    finally:
        stopped = benchfs("stop", env=env)
    assert stopped.returncode == 1
    assert "server 0 on local-0 was not running at stop" in stopped.stderr
    said = next(line for line in stopped.stderr.splitlines() if f"the mount at {mount}" in line)
    assert "was not running at stop (crashed or killed)" in said, stopped.stderr
    assert "core-mount-" in said and "gdb " in said and "benchfs-mount build id" in said, said
    assert not is_mounted(mount) and not any(r.alive() for r in refs)
    assert not [d for d in scratch_dirs(env) if Path(d).exists()]
    assert not list(Path(env["BENCHFS_REGISTRY"]).glob("server-*.json"))
    manifest = read_json(Path(env["BENCHFS_JOB_DIR"]) / "manifest.json")
    assert manifest["outcome"]["status"] == "failed"


def test_commands_without_a_job_say_so_in_one_line(tmp_path: Path) -> None:
    for args in (["status"], ["stop"], ["stage-out", "/", str(tmp_path / "o")]):
        done = benchfs(*args)
        assert done.returncode == 2, done
        assert done.stderr.strip().count("\n") == 0 and "BENCHFS_JOB_DIR" in done.stderr
    done = benchfs("status", "--job", str(tmp_path))
    assert done.returncode == 1 and "is not a started job" in done.stderr
    assert "Traceback" not in done.stderr
    shutil.rmtree(tmp_path / "o", ignore_errors=True)


@pytest.mark.timeout(120)
@pytest.mark.serial
def test_staging_bench_quick_json(tmp_path: Path) -> None:
    """`benchfs-bench staging --quick` keeps its shape (its figures are measured by the full
    run, not asserted here) and leaves nothing behind."""
    from benchfs.bench import staging
    from benchfs.procs import descendants
    from conftest import rendered

    done = run_bounded(
        [str(BIN / "benchfs-bench"), "staging", "--quick", "--json", "--dir", str(tmp_path)], 110
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert set(report["mib_s"]) == {"stage-in", "stage-in stored", "stage-out", "cp -r",
                                    "cp -r + sync"}  # fmt: skip
    assert all(v > 0 for v in report["mib_s"].values())
    assert report["ratio_vs_cp_sync"] == pytest.approx(
        report["mib_s"]["stage-in"] / report["mib_s"]["cp -r + sync"]
    )
    assert report["stage_out_ratio_vs_cp_sync"] == pytest.approx(
        report["mib_s"]["stage-out"] / report["mib_s"]["cp -r + sync"]
    )
    assert report["stored_ratio_vs_cp_sync"] == pytest.approx(
        report["mib_s"]["stage-in stored"] / report["mib_s"]["cp -r + sync"]
    )
    # What the device did: stage-in wrote the tree (direct writes) at least once, and with
    # `stored` read it back too (direct writes leave nothing in the page cache to read).
    if report["device"] is not None:
        assert report["device_mib"]["stage-in"]["written"] >= 32
        assert report["device_mib"]["stage-in stored"]["read"] >= 32
    small = report["small"]
    assert small["files"] == 200 and all(v > 0 for v in small["files_s"].values())
    assert set(small["files_s"]) == {"stage-in inline", "stage-in chunkfile", "stage-in packed",
                                     "cp -r + sync", "create"}  # fmt: skip
    assert small["ratio_vs_create"] == pytest.approx(
        small["files_s"]["stage-in inline"] / small["files_s"]["create"]
    )
    assert small["inline_vs_other_layouts"] == pytest.approx(
        min(small["inline_vs_chunkfile"], small["inline_vs_packed"])
    )
    assert len(report["targets"]) == 7
    # The cold form: each tool with the page cache dropped before it (root here), its source
    # then read from the device.
    cold = report["cold"]
    assert set(cold["mib_s"]) == set(report["mib_s"]) and all(v > 0 for v in cold["mib_s"].values())
    assert cold["stage_out_ratio_vs_cp_sync"] == pytest.approx(
        cold["mib_s"]["stage-out"] / cold["mib_s"]["cp -r + sync"]
    )
    assert report["cache_dropped"] is (os.geteuid() == 0)
    if report["device"] is not None and report["cache_dropped"]:
        assert cold["device_mib"]["cp -r"]["read"] >= 32
    assert report["files"] == 4 and report["data_fs"] != "tmpfs"
    assert not Path(report["data_dir"]).exists()
    text = rendered(staging.render, report)
    assert "stage-out / cp -r + sync" in text and "small stage-in (inline) / create" in text
    assert "small stage-in inline / packed" in text
    assert "stage-in stored / cp -r + sync" in text and "cold stage-out / cp -r + sync" in text
    assert "(cold: page cache dropped first)" in text
    assert descendants(os.getpid()) == []

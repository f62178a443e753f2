"""A run with a planted slow server, traced by real Darshan: what the join of an application's
operations with the servers' must name (tests/test_darshan.py, and the fixture
tests/data/darshan/slow-server-run made with `python tests/darshan_runs.py OUT_DIR`).

Two simulated nodes on this host: node a's scratch is a directory, node b's is ext4 on a loop
device (direct I/O) over a file in delayfs (benchfs.simnodes), which sleeps DELAY_US before each
read and write, so b's server is slow at its device. Real IOR (BENCHFS_IOR_PREFIX) runs with two
MPI ranks through the mount under Darshan (BENCHFS_DARSHAN_PREFIX), with the servers' trace on.
Needs root (loop devices, mounts), gcc and libfuse3 (delayfs).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from benchfs.simnodes import Sim, build_delayfs

DELAY_US = 20_000
IOR_ARGS = "-a POSIX -t 1m -b 8m -F -w -r -C -e"
"""File per process, 1 MiB requests, 8 MiB each, fsync after the writes, each rank reads the
other's file (-C: not what its own client just wrote)."""
KEPT = ("manifest.json", "config.toml", "nodes.toml", "telemetry", "darshan")
"""What the committed fixture keeps of the run (what the join reads)."""


def make_run(work: Path, darshan: Path, ior: Path, delay_us: int = DELAY_US) -> Path:
    """Runs IOR on the two nodes; returns the results directory."""
    work.mkdir(parents=True, exist_ok=True)
    sim = Sim(work / "sim", build_delayfs(work))
    (work / "sim").mkdir(exist_ok=True)
    try:
        disk = sim.disk("b", 256 << 20)
        slow = sim.mount([disk], "b")
        (disk.fs.mountpoint / ".delay").write_text(f"{delay_us} {delay_us}\n")
        fast = work / "scratch-a"
        fast.mkdir(exist_ok=True)
        nodes = work / "nodes.toml"
        nodes.write_text(
            f'[[node]]\nname = "a"\nhost = "localhost"\nscratch = "{fast}"\n\n'
            f'[[node]]\nname = "b"\nhost = "localhost"\nscratch = "{slow}"\n'
        )
        results = work / "results"
        done = subprocess.run(
            [str(Path(sys.executable).parent / "benchfs-run"), "launch", "--nodes-file", str(nodes),
             "--clients", "2", "--results-root", str(results), "--darshan", str(darshan),
             "--workload", "command", "--via", "mount",
             "--command", f"{ior}/bin/ior {IOR_ARGS} -o {{mount}}/ior.dat"],
            capture_output=True, text=True, timeout=600, check=False,
        )  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"the run failed:\n{done.stdout}\n{done.stderr}")
        return next(results.glob("*-local-*"))
    finally:
        sim.close()


def keep_fixture(run: Path, out: Path) -> None:
    """Copies what the join reads of `run` into `out`."""
    out.mkdir(parents=True)
    for name in KEPT:
        src = run / name
        if src.is_dir():
            shutil.copytree(src, out / name)
        elif src.exists():
            shutil.copy2(src, out / name)


def main(argv: list[str]) -> int:
    out = Path(argv[0])
    darshan = Path(os.environ["BENCHFS_DARSHAN_PREFIX"])
    ior = Path(os.environ["BENCHFS_IOR_PREFIX"])
    run = make_run(Path(f"/tmp/darshan-runs-{os.getpid()}"), darshan, ior)
    keep_fixture(run, out)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

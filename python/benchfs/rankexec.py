"""`python -m benchfs.rankexec PLAN -- ARGV...`: become one rank of a launched job.

The pipeline writes PLAN (JSON, `{"ranks": [{"node", "prefix", "netns", "cpus", "mount",
"preload"}], "up": {"dir", "by"}}`, one entry per rank) and launches every rank through this
module with mpiexec or srun. Each rank finds its entry from the launcher's rank variable, sets
BENCHFS_NODE_NAME (the node its telemetry and logs name), BENCHFS_MOUNT, BENCHFS_NETNS (its
node's namespace, which the client enters once MPI is up), with `--via preload` LD_PRELOAD and
BENCHFS_PRELOAD_PREFIX (the interposition library, serving paths under the mount's path), and
the CPU affinity, replaces `{mount}`, `{rank}`, `{node}`, `{registry}` and `{config}` in ARGV,
and execs ARGV under the node's prefix: the rank keeps its pid, so the launcher's signals
reach the real program. With `up`, a rank says it is up (a file `rank-N` in `up.dir`) when it
execs (`by`: "exec") or when the built-in workload it runs has connected ("program").
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["RANK_VARIABLES", "UP_ENV", "mark_up", "rank_argv", "rank_from_env"]

RANK_VARIABLES = ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID")
"""Where Open MPI, PMIx launchers, MPICH (Hydra) and srun put the rank, in that order."""


UP_ENV = "BENCHFS_RANK_UP"
"""Where a built-in workload's rank says it is up (connected), for the pipeline's timeout."""


def mark_up() -> None:
    """Says this rank is up (its client connected): creates the file the plan named, once.
    The pipeline counts its workload timeout from the moment every rank is up."""
    path = os.environ.pop(UP_ENV, None)
    if path:
        with contextlib.suppress(OSError):
            open(path, "ab").close()


def rank_from_env(env: Mapping[str, str]) -> int:
    for name in RANK_VARIABLES:
        value = env.get(name)
        if value is not None and value.isdigit():
            return int(value)
    raise ValueError(f"no rank in the environment (looked for {', '.join(RANK_VARIABLES)})")


def rank_argv(
    entry: Mapping[str, Any], argv: Sequence[str], rank: int, env: Mapping[str, str] | None = None
) -> list[str]:
    """ARGV with the placeholders filled, under the entry's prefix: `{mount}`, `{rank}`,
    `{node}`, and `{registry}`/`{config}` (BENCHFS_REGISTRY/BENCHFS_CONFIG, for programs that
    take them as arguments)."""
    env = env or {}
    values = {"{mount}": entry.get("mount") or "", "{rank}": str(rank), "{node}": entry["node"]}
    values["{registry}"] = env.get("BENCHFS_REGISTRY", "")
    values["{config}"] = env.get("BENCHFS_CONFIG", "")
    filled = []
    for arg in argv:
        for key, value in values.items():
            arg = arg.replace(key, value)
        filled.append(arg)
    return [*entry.get("prefix", []), *filled]


def _trace_with_darshan(darshan: dict[str, str], argv: Sequence[str]) -> None:
    """Darshan first in LD_PRELOAD (before BenchFS's interposition library, so it sees the
    program's calls), DXT on, logs where the run keeps them; a program without MPI needs
    DARSHAN_ENABLE_NONMPI (an MPI program given it would write one log per rank)."""
    from benchfs.mpi import linked_mpi

    program = shutil.which(argv[0]) if argv else None
    if program is None or linked_mpi(program) is None:
        os.environ["DARSHAN_ENABLE_NONMPI"] = "1"
    preload = [darshan["LD_PRELOAD"], os.environ.get("LD_PRELOAD", "")]
    os.environ.update({k: v for k, v in darshan.items() if k != "LD_PRELOAD"})
    os.environ["LD_PRELOAD"] = ":".join(filter(None, preload))


def main(args: Sequence[str]) -> int:
    if len(args) < 3 or args[1] != "--":
        print("usage: python -m benchfs.rankexec PLAN -- ARGV...", file=sys.stderr)
        return 2
    try:
        with open(args[0], encoding="utf-8") as f:
            plan = json.load(f)
        rank = rank_from_env(os.environ)
        entry = plan["ranks"][rank]
    except (OSError, ValueError, KeyError, IndexError, TypeError) as e:
        print(f"benchfs.rankexec: cannot find this rank's entry in {args[0]}: {e}", file=sys.stderr)
        return 2
    os.environ["BENCHFS_NODE_NAME"] = entry["node"]
    up = plan.get("up")
    if up:
        # Up when the program connected (a built-in workload says so), or now (a command).
        os.environ[UP_ENV] = os.path.join(up["dir"], f"rank-{rank}")
        if up["by"] == "exec":
            mark_up()
    if entry.get("netns"):
        # MPI starts here, outside the node's namespace; the BenchFS client enters it.
        os.environ["BENCHFS_NETNS"] = entry["netns"]
    if entry.get("mount"):
        os.environ["BENCHFS_MOUNT"] = entry["mount"]
    if entry.get("preload"):
        # Only the program gets the library (not MPI's launcher, nor this Python).
        from benchfs.native import preload_env

        os.environ.update(preload_env(os.environ, entry["mount"]))
    darshan = entry.get("darshan")
    if darshan:
        _trace_with_darshan(darshan, args[2:])
    cpus = entry.get("cpus")
    if cpus:
        try:
            os.sched_setaffinity(0, cpus)
        except OSError as e:
            print(f"benchfs.rankexec: rank {rank}: cannot pin to CPUs {cpus}: {e}", file=sys.stderr)
            return 2
    argv = rank_argv(entry, args[2:], rank, os.environ)
    try:
        os.execvp(argv[0], argv)
    except OSError as e:
        print(f"benchfs.rankexec: rank {rank}: cannot run {argv[0]}: {e}", file=sys.stderr)
        return 127
    return 0  # not reached: exec replaced this process


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""The pre-run screen (`--screen`): benchfs-diagnose on the run's nodes, as a program as a
user would run it, and the nodes it leaves."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys

from benchfs.cluster import child_env
from benchfs.errors import EXIT_USAGE, RunError
from benchfs.launch import rank_command
from benchfs.nodes import Exclusion, Node, write_nodes
from benchfs.pipeline.context import RunContext
from benchfs.pipeline.roles import apply_exclusions
from benchfs.procs import stop_process, tail
from benchfs.results import ScreenDir

SCREEN_TIMEOUT_S = 1800.0
STOP_GRACE_S = 5.0


def screen_nodes(ctx: RunContext, nodes: list[Node]) -> list[Node]:
    """Screen `nodes` and drop the ones the screen excludes; the screen's directory goes under
    the run's diagnose/."""
    from benchfs.diagnose.screen import load_screen

    run_dir, manifest = ctx.run_dir, ctx.manifest
    run_dir.diagnose_dir.mkdir(exist_ok=True)
    screened = run_dir.diagnose_dir / "nodes.toml"
    write_nodes(screened, nodes)
    argv = [sys.executable, "-m", "benchfs.cli.diagnose", "screen", "--nodes", str(screened)]
    argv += ["--results-root", str(run_dir.diagnose_dir)]
    if ctx.spec.config:
        argv += ["--config", ctx.spec.config]
    try:
        argv += shlex.split(ctx.spec.screen_args or "")
    except ValueError as e:
        raise RunError("EINVAL", f"--screen-args: {e}", EXIT_USAGE) from e
    log = run_dir.diagnose_dir / "screen.log"
    ctx.progress.message(f"screening {len(nodes)} nodes with benchfs-diagnose")
    if ctx.launcher.name == "local":
        # All nodes are here: one process probes them at once (network probe included).
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                env=child_env(), start_new_session=True,
            )  # fmt: skip
        cmd = argv
    else:
        # One rank per node, each probing its own (benchfs-diagnose screen --mpi).
        plan = ctx.rank_plan("screen", nodes)
        hosts = [n.host for n in nodes]
        proc, cmd = ctx.launcher.ranks(hosts, rank_command(plan, [*argv, "--mpi"]), log)
    manifest.commands.append({"what": "screen", "argv": cmd})
    record = {"role": "screen", "pid": proc.pid, "argv": cmd}
    manifest.processes.append(record)
    try:
        record["exit_status"] = proc.wait(timeout=SCREEN_TIMEOUT_S)
    except BaseException:
        record["exit_status"] = stop_process(proc, STOP_GRACE_S, group=True)
        raise
    try:
        (screen_dir,) = run_dir.diagnose_dir.glob("*-screen-*")
        screen = load_screen(screen_dir)
    except (ValueError, FileNotFoundError) as e:
        raise RunError(
            "EIO",
            f"benchfs-diagnose screen wrote no screen (exit {proc.returncode}); "
            f"see {log}:\n{tail(log)}",
        ) from e
    shutil.copyfile(ScreenDir(screen_dir).screen_json, run_dir.prerun_screen)
    excluded = [
        Exclusion(e["host"], tuple(e.get("reasons", []))) for e in screen.get("excluded", [])
    ]
    kept, removed = apply_exclusions(nodes, excluded)
    for entry in removed:
        ctx.progress.message(f"screen excluded {entry['node']}: {'; '.join(entry['reasons'])}")
        manifest.excluded.append(entry)
    if not kept:
        raise RunError("EHOSTDOWN", "the screen excluded every node; see diagnose/")
    return kept

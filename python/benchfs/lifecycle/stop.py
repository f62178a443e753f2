"""`benchfs stop`: tear a started job down by its recorded processes, from any shell of the
job and also after a crash (`kill -9` of the whole cluster): unmount, stop the servers (SIGKILL
after a grace period), stop iostat, delete node-local data unless kept, then finish the
manifest and analyse the run like any other."""

from __future__ import annotations

import shutil
import signal
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from benchfs import _core, coredumps
from benchfs.errors import JobError, LaunchError
from benchfs.launch import Launcher, make_launcher, this_host
from benchfs.lifecycle.state import JobState
from benchfs.mount import detach_command
from benchfs.nodes import Node, load_nodes
from benchfs.pipeline.context import files_are_here
from benchfs.pipeline.run import run_analysis
from benchfs.pipeline.stages import SERVER_STOP_GRACE_S
from benchfs.procs import stop_refs, tail
from benchfs.results import Manifest, RunDir, read_json, utc_now

NODE_COMMAND_TIMEOUT_S = 120.0


@dataclass
class StopReport:
    """What `stop` did: `problems` are what went wrong before or during it (a server that had
    died, a directory that could not be removed); empty means a clean stop."""

    problems: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)


def _on_node(launcher: Launcher | None, node: Node, argv: list[str]) -> str | None:
    """Run a short command on `node`; the error, or None."""
    if launcher is None:
        return f"cannot reach {node.name}: no launcher"
    try:
        done = launcher.run(node, argv, NODE_COMMAND_TIMEOUT_S)
    except Exception as e:  # a timeout or a launcher that cannot start: say so, go on
        return f"{' '.join(argv[:2])} on {node.name}: {e}"
    if done.returncode != 0:
        return f"{' '.join(argv[:2])} on {node.name}: {(done.stderr or done.stdout).strip()}"
    return None


def _failed_stage_outs(job_dir: Path) -> list[str]:
    """Destinations whose last stage-out (by its manifest in the job directory) failed."""
    failed = []
    for path in sorted((job_dir / "staging").glob("stage-out-*.json")):
        try:
            doc = read_json(path)
        except ValueError:
            continue
        if doc.get("status") != "ok":
            failed.append(str(doc.get("destination", path)))
    return failed


def stop_job(
    job_dir: Path, keep_data: bool | None = None, say: Callable[[str], None] = lambda _: None
) -> StopReport:
    """Stop the job in `job_dir`; JobError when it cannot be stopped from here."""
    state = JobState.load(job_dir)
    report = StopReport()
    if state.stopped is not None:
        say(f"the job was stopped at {state.stopped}")
        return report
    if state.host != this_host():
        raise JobError(
            "EINVAL",
            f"the job was started on {state.host}: its processes are that host's, run "
            f"`benchfs stop` there",
        )
    run_dir = RunDir(Path(state.run_dir))
    manifest = Manifest(**read_json(run_dir.manifest_path))
    try:
        launcher: Launcher | None = make_launcher(state.launcher, state.mpiexec)
    except LaunchError as e:  # e.g. srun after the allocation ended: clean what is local
        report.problems.append(f"launcher {state.launcher}: {e.message}")
        launcher = None
    nodes = {n.name: n for n in load_nodes(run_dir.nodes_path)}
    stop_signal = launcher.stop_signal if launcher else signal.SIGTERM
    keep = state.keep_data if keep_data is None else keep_data
    failed_out = _failed_stage_outs(run_dir.path)
    if failed_out and keep_data is None and not keep:
        # BenchFS may hold the only copy of what did not reach the destination.
        keep = True
        report.problems.append(
            f"the last stage-out to {failed_out[0]} failed: node-local data kept, as BenchFS "
            "may hold the only copy (a stop with --delete-data deletes it regardless)"
        )

    for record, refs in state.refs("benchfs-mount"):
        say(f"unmounting {record['mountpoint']} on {record['node']}")
        was_running = bool(refs) and refs[0].alive()
        stop_refs(refs, stop_signal, SERVER_STOP_GRACE_S)
        cores = coredumps.core_dir(Path(record["log"]), f"mount-{record['node']}")
        if not was_running or coredumps.cores_in(cores):
            binary = coredumps.binary_in(record["argv"], "benchfs-mount")
            how = "was not running at stop (crashed or killed)" if not was_running else "crashed"
            report.problems.append(
                f"the mount at {record['mountpoint']} on {record['node']} {how}; "
                f"log {record['log']}; {coredumps.report(cores, binary)}"
            )
        coredumps.tidy(cores)
        # A mount whose process died is still there, disconnected: detach it.
        node = nodes.get(record["node"])
        if node is not None and (
            err := _on_node(launcher, node, detach_command(record["mountpoint"]))
        ):
            report.problems.append(f"unmounting {record['mountpoint']}: {err}")

    servers = state.refs("benchfsd")
    say(f"stopping {len(servers)} servers")
    copies = int(tomllib.loads(Path(state.config).read_text())["layout"]["replicas"])
    lost = (
        "its names and chunks have other copies (layout.replicas="
        f"{copies}) unless as many servers were lost"
        if copies > 1
        else "the data it held is lost"
    )
    for record, refs in servers:
        if not refs or not refs[0].alive():
            cores = coredumps.core_dir(Path(record["log"]), f"server-{record['server_id']}")
            binary = coredumps.binary_in(record["argv"], "benchfsd")
            crash = coredumps.report(cores, binary)
            report.problems.append(
                f"server {record['server_id']} on {record['node']} was not running at stop "
                f"(crashed or killed): {lost}; log {record['log']}; {crash}"
            )
    survivors = stop_refs(
        [r for _, refs in servers for r in refs], stop_signal, SERVER_STOP_GRACE_S
    )
    if survivors:
        report.problems.append(f"processes outlived SIGKILL: {[r.pid for r in survivors]}")
    for record, _ in servers:
        coredumps.tidy(coredumps.core_dir(Path(record["log"]), f"server-{record['server_id']}"))
        last = tail(Path(record["log"]), 1)
        record["exit_status"] = (
            0 if last.startswith(f"benchfsd: server {record['server_id']} stopped") else None
        )
    for _, refs in state.refs("iostat"):
        stop_refs(refs, launcher.interrupt_signal if launcher else signal.SIGINT, 5.0)

    registry = Path(state.registry)
    (registry / _core.JOB_SECRET_FILE).unlink(missing_ok=True)
    for entry in registry.glob("server-*.json"):  # left by servers that did not stop cleanly
        entry.unlink(missing_ok=True)

    for name, job in manifest.scratch_dirs.items():
        if keep:
            report.kept.append(job)
            continue
        node = nodes.get(name)
        if node is None:
            continue
        if files_are_here(node, state.launcher):
            shutil.rmtree(job, ignore_errors=True)
            err = f"could not remove {job}" if Path(job).exists() else None
        else:
            err = _on_node(launcher, node, ["rm", "-rf", "--one-file-system", job])
        if err:
            report.problems.append(err)
        else:
            report.removed.append(job)
    if keep:
        say(f"kept node-local data in {', '.join(report.kept)}")

    manifest.data_kept = keep
    by_pid = {p["pid"]: p for p in state.processes}
    for p in manifest.processes:
        if p.get("pid") in by_pid:
            p["exit_status"] = by_pid[p["pid"]].get("exit_status")
    manifest.commands.append({"what": "benchfs stop", "argv": ["benchfs", "stop", str(job_dir)]})
    if report.problems:
        manifest.finish("failed", "EHOSTDOWN", "; ".join(report.problems), 1)
    else:
        manifest.finish("ok", None, None, 0)
    manifest.write(run_dir)
    state.stopped = utc_now()
    state.save()
    if not report.problems:
        say("analysing the job's telemetry")
        run_analysis(run_dir, manifest)
    return report

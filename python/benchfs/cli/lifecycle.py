"""`benchfs`: BenchFS as a burst buffer a job lives in.

    eval "$(benchfs start --servers 4 --mount /tmp/bfs)"   # stdout: export lines only
    benchfs stage-in /scratch/project/input /input
    my_application /tmp/bfs/input ...
    benchfs stage-out /output /scratch/project/output
    benchfs stop

`start` runs the same pipeline, launchers and nodes files as `benchfs-run` and leaves the
cluster running; `status`, `stage-in`, `stage-out` and `stop` find it through
$BENCHFS_JOB_DIR (or --job) from any shell of the job.
"""

from __future__ import annotations

import json
import pwd
import sys
from pathlib import Path
from typing import Any, NoReturn

import click
from rich.markup import escape
from rich.table import Table

from benchfs import __version__
from benchfs.burstbuffer.phases import become_user
from benchfs.cli.burstbuffer import bb
from benchfs.cli.consoles import console
from benchfs.cli.options import cluster_options
from benchfs.cli.progress import make_progress
from benchfs.client import Client
from benchfs.errors import EXIT_FAILED, BenchfsError, JobError, errno_name
from benchfs.lifecycle.repair import repair_job
from benchfs.lifecycle.spread import NodeCopier
from benchfs.lifecycle.stage import CHECKS, BenchfsSide, LocalSide, manifest_path_for, stage
from benchfs.lifecycle.start import start_job
from benchfs.lifecycle.state import JobState, find_job
from benchfs.lifecycle.status import job_status
from benchfs.lifecycle.stop import stop_job
from benchfs.pipeline import RunSpec
from benchfs.units import human_size


def _fail(e: BenchfsError) -> NoReturn:
    console(stderr=True).print(
        f"[red]benchfs: error {e.code}:[/] {escape(e.message)}", highlight=False, soft_wrap=True
    )
    sys.exit(e.exit_code)


def _say(text: str) -> None:
    console(stderr=True).print(escape(text), highlight=False, soft_wrap=True)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="benchfs")
def main() -> None:
    """Start a BenchFS cluster for a job, stage data in and out, stop it."""


main.add_command(bb)


@main.command(short_help="Start a cluster and leave it running.")
@cluster_options
@click.option(
    "--mount",
    metavar="DIR",
    help="Mount BenchFS at DIR on every client host (exported as BENCHFS_MOUNT).",
)
@click.option(
    "--mount-owner", metavar="USER",
    help="With --mount, as root: show every file as USER's (a name or uid, with its group) "
    "and let USER in [the starting user].",
)  # fmt: skip
@click.option(
    "--screen-keeps-clients", is_flag=True,
    help="With --screen: slow nodes run no server but keep their clients and mounts "
    "(an allocation that cannot give nodes back) [slow nodes run nothing].",
)  # fmt: skip
@click.option("--stage-in", metavar="DIR", help="Stage DIR into BenchFS's / once it is up.")
@click.option(
    "--stage-nodes", "across_nodes", is_flag=True,
    help="With --stage-in: copy on every client node, each its share (as stage-in --nodes).",
)  # fmt: skip
def start(
    mount: str | None,
    mount_owner: str | None,
    screen_keeps_clients: bool,
    stage_in: str | None,
    across_nodes: bool,
    **options: Any,
) -> None:
    """Start the servers (and mounts) and leave them running; print `export` lines.

    Use as `eval "$(benchfs start ...)"`: stdout carries only the exports (also written to
    benchfs.env in the job directory), progress goes to stderr.
    """
    spec = RunSpec(
        servers=options["servers"],
        clients=options["clients"],
        config=options["config_path"],
        sets=options["sets"],
        keep_data=options["keep_data"],
        results_root=options["results_root"],
        nodes_file=options["nodes_file"],
        exclude_from=options["exclude_from"],
        screen=options["screen"],
        screen_args=options["screen_args"],
        launcher=options["launcher"],
        mpiexec=options["mpiexec"],
        server_nodes=options["server_nodes"],
        servers_per_node=options["servers_per_node"],
        clients_per_node=options["clients_per_node"],
        pin_cpus=options["pin_cpus"],
        mount_point=mount,
        mount_owner=None if mount_owner is None else _user_ids(mount_owner),
        screen_keeps_clients=screen_keeps_clients,
    )
    err = console(stderr=True)
    report, job = start_job(spec, sys.argv, make_progress(False, err, "benchfs"))
    if job is None:
        assert report.error is not None
        _fail(report.error)
    _say(f"BenchFS is up: {job.servers} servers; job directory {job.run_dir}")
    if stage_in is not None:
        try:
            _stage(job, "in", stage_in, "/", threads=4, manifest=None, across_nodes=across_nodes)
        except BenchfsError as e:
            _say("the staging failed; stopping the cluster")
            stop_job(Path(job.run_dir), say=_say)
            _fail(e)
    click.echo(job.env_text(), nl=False)


def _user_ids(user: str) -> tuple[int, int]:
    """(uid, gid) of a user name or numeric uid; usage error naming it when unknown."""
    try:
        entry = pwd.getpwuid(int(user)) if user.isdigit() else pwd.getpwnam(user)
    except KeyError:
        raise click.BadParameter(
            f"no user {user!r} on this host", param_hint="--mount-owner"
        ) from None
    return entry.pw_uid, entry.pw_gid


_job_option = click.option(
    "--job",
    type=click.Path(file_okay=False),
    help="The job directory [$BENCHFS_JOB_DIR, set by `benchfs start`].",
)
_threads_option = click.option(
    "--threads", type=click.IntRange(min=1), default=4, show_default=True,
    help="Files copied at once.",
)  # fmt: skip
_manifest_option = click.option(
    "--manifest", type=click.Path(dir_okay=False),
    help="The staging manifest [in the job directory, one per pair of trees].",
)  # fmt: skip
_follow_option = click.option(
    "--follow-links", is_flag=True,
    help="Copy what symbolic links lead to, as cp -rL does [keep them as links, as cp -a].",
)  # fmt: skip
_verify_option = click.option(
    "--verify", "check", type=click.Choice(CHECKS), default="received", show_default=True,
    help="What each file's check covers: the bytes as the servers received them (the network "
    "and their receipt), or as they read them back from their devices (a second pass).",
)  # fmt: skip
_nodes_option = click.option(
    "--nodes", "across_nodes", is_flag=True,
    help="Copy on every client node of the job, each its share, through the job's launcher "
    "(the local directory must be seen at the same path on every node) [this process].",
)  # fmt: skip


@main.command()
@_job_option
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def status(job: str | None, as_json: bool) -> None:
    """Membership, health, capacity and use of the job's cluster. Exit status 0 when every
    server answers, 1 otherwise."""
    try:
        s = job_status(find_job(job))
    except BenchfsError as e:
        _fail(e)
    if as_json:
        click.echo(json.dumps(s))
    else:
        out = console()
        out.print(f"job {s['job']}: [bold]{s['state']}[/] (started {s['started']} on {s['host']})")
        if s["error"]:
            out.print(f"[red]{escape(s['error'])}[/]", soft_wrap=True)
        table = Table("server", "node", "process", "answers", "size", "used", "free", "names")
        for srv in s["servers"]:
            alive = {True: "running", False: "[red]gone[/]", None: "?"}[srv.get("process_alive")]
            ok = "total_bytes" in srv and srv.get("error") is None
            answer = f"{srv['latency_s'] * 1e3:.1f} ms" if ok else "[red]no[/]"
            sizes = [
                human_size(srv[k]) if ok else "-"
                for k in ("total_bytes", "used_bytes", "avail_bytes")
            ]
            table.add_row(
                str(srv["id"]), srv["node"], alive, answer, *sizes, str(srv.get("files", "-"))
            )
        out.print(table)
        if s["capacity"]:
            c = s["capacity"]
            out.print(
                f"capacity {human_size(c['total_bytes'])}, used {human_size(c['used_bytes'])}, "
                f"free {human_size(c['avail_bytes'])}, {c['files']} files and directories"
            )
        if s["mount"]:
            m = s["mount"]
            out.print(f"mount {m['path']} on {m['node']}: {m['mounted']}")
        _print_copies(s.get("copies"))
    sys.exit(0 if s["state"] in ("running", "stopped") else EXIT_FAILED)


def _print_copies(copies: dict[str, Any] | None) -> None:
    """The copies part of `status`: lost servers and the files short of copies."""
    if not copies or not (copies["lost"] or copies["not_answering"]):
        return
    out = console()

    def ids(key: str) -> str:
        return ", ".join(map(str, copies[key])) or "none"

    out.print(
        f"servers declared lost: {ids('lost')}; repaired: {ids('repaired')}; "
        f"not answering: {ids('not_answering')}"
    )
    if copies["files_short"] is None:
        return
    if not copies["files_short_count"]:
        out.print("every file listed keeps the copies it asked for")
    else:
        out.print(f"{copies['files_short_count']} files have fewer live copies than asked")
    for f in copies["files_short"]:
        out.print(f"  {escape(f['path'])}: {f['left']} of {f['asked']}", soft_wrap=True)
    for e in copies["owners_not_answering"]:
        out.print(f"[yellow]not listed: {escape(e)}[/]", soft_wrap=True)
    if copies["files_short_count"]:
        out.print("`benchfs repair` re-creates their copies on live servers")
    back = sorted(set(copies["lost"]) - set(copies["not_answering"]))
    if back:
        ids = ", ".join(map(str, back))
        out.print(f"servers {ids} answer again: `benchfs repair` catches them up and uses them")


@main.command()
@_job_option
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def repair(job: str | None, as_json: bool) -> None:
    """Re-create, on live servers, the copies of chunks that lost servers held (files of
    layout.replicas 2 or 3), and catch up the lost servers that answer again (restarted or
    resumed), which are then used again. Servers that do not answer are declared lost first.
    Exit status 0 when every file was reached and every chunk has its copies again."""
    try:
        report = repair_job(find_job(job), say=_say)
    except BenchfsError as e:
        _fail(e)
    except (OSError, ValueError, TimeoutError) as e:
        _fail(BenchfsError("EHOSTDOWN", str(e)))
    if as_json:
        click.echo(json.dumps(report.as_dict()))
    else:
        _say(
            f"repaired {report.files} files: {report.copies} chunk copies, "
            f"{human_size(report.bytes)}, each checked against its source"
        )
        if report.rejoining and report.complete:
            _say(f"servers {', '.join(map(str, report.rejoining))} caught up and used again")
        for path, error in report.failed:
            _say(f"benchfs: {path}: {error}")
        for sid, e in report.owners_not_answering:
            lost = " (its files' names are lost with it)" if sid in report.lost else ""
            _say(f"benchfs: not reached: {e}{lost}")
        if report.lost_chunks:
            _say(f"benchfs: {report.lost_chunks} chunks have no copy left on a live server")
    sys.exit(0 if report.complete else EXIT_FAILED)


@main.command()
@_job_option
@click.option(
    "--keep-data/--delete-data", default=None, help="Keep the servers' data [as started]."
)
@click.option("--stage-out", metavar="DIR", help="Stage BenchFS's / out to DIR before stopping.")
@click.option(
    "--stage-nodes", "across_nodes", is_flag=True,
    help="With --stage-out: copy on every client node, each its share (as stage-out --nodes).",
)  # fmt: skip
def stop(
    job: str | None, keep_data: bool | None, stage_out: str | None, across_nodes: bool
) -> None:
    """Stop the job's cluster: optional stage-out, unmount, stop the servers, delete their
    data unless kept, finish the manifest and analyse the run. Also cleans up after a crash;
    exit status 1 then, naming what had died."""
    try:
        job_dir = find_job(job)
        if stage_out is not None:
            _stage(
                JobState.load(job_dir), "out", "/", stage_out, threads=4, manifest=None,
                across_nodes=across_nodes,
            )  # fmt: skip
        report = stop_job(job_dir, keep_data, say=_say)
    except BenchfsError as e:
        _fail(e)
    for problem in report.problems:
        _say(f"benchfs: {problem}")
    _say(f"stopped; the job's record is in {job_dir}")
    sys.exit(EXIT_FAILED if report.problems else 0)


def _stage(
    state: JobState, direction: str, source: str, destination: str, threads: int,
    manifest: str | None, follow_links: bool = False, across_nodes: bool = False,
    check: str = "received",
) -> None:  # fmt: skip
    state.use_network()
    config = Path(state.config).read_text()
    bfs = BenchfsSide(
        destination if direction == "in" else source, lambda: Client(state.registry, config),
        check,
    )  # fmt: skip
    local = LocalSide(Path(source if direction == "in" else destination).resolve())
    src, dst = (local, bfs) if direction == "in" else (bfs, local)
    if direction == "out":
        try:
            local.root.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise JobError(errno_name(e), f"{local.root}: {e.strerror}") from e
    path = (
        Path(manifest)
        if manifest
        else manifest_path_for(Path(state.run_dir), direction, src.label, dst.label)
    )
    copier = (
        NodeCopier(state, direction, local.root, bfs.root, threads, _say, check)
        if across_nodes
        else None
    )
    try:
        report = stage(
            src, dst, direction, path, threads, say=_say, follow_links=follow_links, copier=copier
        )
    except OSError as e:  # BenchFS unreachable, or the local side refused: one line
        raise JobError(errno_name(e), str(e)) from e
    finally:
        bfs.close()
    m = report.manifest
    rate = m["bytes_copied"] / max(m["seconds"], 1e-9) / (1 << 20)
    for note in m["notes"]:
        _say(f"note: {note}")
    durable = f"; fsynced in {m['fsync_seconds']:.2f} s" if direction == "out" else ""
    _say(
        f"staged {m['files_copied']} files ({human_size(m['bytes_copied'])}, {rate:.1f} MiB/s), "
        f"{m['files_skipped']} already verified; every file checked against the servers' "
        f"checksums (of the bytes as they {m['check']} them){durable}; manifest {path}"
    )


def _run_stage(
    direction: str, source: str, destination: str, job: str | None, threads: int,
    manifest: str | None, follow_links: bool, across_nodes: bool, check: str = "received",
) -> None:  # fmt: skip
    try:
        _stage(
            JobState.load(find_job(job)), direction, source, destination, threads, manifest,
            follow_links, across_nodes, check,
        )  # fmt: skip
    except BenchfsError as e:
        _fail(e)
    except ValueError as e:  # the client cannot reach the cluster (its registry, its config)
        _fail(BenchfsError("EINVAL", str(e)))


@main.command("stage-in")
@click.argument("source", type=click.Path(file_okay=False, exists=True))
@click.argument("destination", default="/")
@_job_option
@_threads_option
@_manifest_option
@_follow_option
@_nodes_option
@_verify_option
def stage_in(
    source: str, destination: str, job: str | None, threads: int, manifest: str | None,
    follow_links: bool, across_nodes: bool, check: str,
) -> None:  # fmt: skip
    """Copy the local directory SOURCE into the BenchFS directory DESTINATION [/]: in
    parallel, every file checked against the servers' checksums, sizes, modes and times
    kept, symbolic links kept as links; resumable (files already verified are skipped,
    damaged ones copied again)."""
    _run_stage("in", source, destination, job, threads, manifest, follow_links, across_nodes, check)


@main.command("stage-out")
@click.argument("source")
@click.argument("destination", type=click.Path(file_okay=False))
@_job_option
@_threads_option
@_manifest_option
@_follow_option
@_nodes_option
def stage_out(
    source: str, destination: str, job: str | None, threads: int, manifest: str | None,
    follow_links: bool, across_nodes: bool,
) -> None:  # fmt: skip
    """Copy the BenchFS directory SOURCE into the local directory DESTINATION, as stage-in
    does the other way; every file and directory written is fsynced before it succeeds."""
    _run_stage("out", source, destination, job, threads, manifest, follow_links, across_nodes)


@main.command("find")
@click.argument("root", default="/")
@click.option("--name", "pattern", default="", help="Glob the last component matches (*01*).")
@click.option(
    "--type",
    "kind",
    type=click.Choice(["f", "d", "l"]),
    help="f: files, d: directories, l: symbolic links.",
)
@click.option(
    "--size", metavar="LOW[:HIGH]", help="Size in bytes, or an inclusive range (3901, 0:4096)."
)
@click.option("--newer", type=click.Path(exists=True), help="Modified after this local file was.")
@click.option("--count", is_flag=True, help="Print the counts only.")
@_job_option
def find(
    root: str,
    pattern: str,
    kind: str | None,
    size: str | None,
    newer: str | None,
    count: bool,
    job: str | None,
) -> None:
    """The names under ROOT [/] that match, one per line, found by the servers (every metadata
    owner checks the names it holds), then how many were examined and matched on stderr."""
    if not root.startswith("/"):
        raise click.BadParameter(f"{root!r}: an absolute BenchFS path", param_hint="ROOT")
    try:
        low, _, high = (size or "").partition(":")
        bounds = (int(low), int(high or low)) if size else None
    except ValueError:
        raise click.BadParameter(f"{size!r}: bytes, or LOW:HIGH", param_hint="--size") from None
    newer_ns = Path(newer).stat().st_mtime_ns if newer else 0
    try:
        state = JobState.load(find_job(job))
        state.use_network()
        with Client(state.registry, Path(state.config).read_text()) as c:
            result = c.find(
                root,
                name=pattern,
                kind={"f": "file", "d": "dir", "l": "symlink", None: None}[kind],
                size=bounds,
                newer_ns=newer_ns,
                count_only=count,
            )
    except BenchfsError as e:
        _fail(e)
    except (OSError, ValueError) as e:
        _fail(BenchfsError("EINVAL", str(e)))
    for f in result.found:
        click.echo(f.path)
    _say(f"{result.matched} of {result.examined} names under {root} match")


@bb.command("stage", hidden=True)
@click.argument("direction", type=click.Choice(["in", "out"]))
@click.argument("source")
@click.argument("destination")
@click.option("--job", required=True)
@click.option("--manifest", required=True)
@click.option("--uid", type=int, required=True)
@click.option("--gid", type=int, required=True)
def bb_stage(
    direction: str, source: str, destination: str, job: str, manifest: str, uid: int, gid: int
) -> None:
    """`stage-in` or `stage-out` as the user UID:GID: started as root (the user may not read
    this Python's directories), the user's from here on, before any path is touched."""
    become_user(uid, gid)
    _run_stage(direction, source, destination, job, 4, manifest, False, False)

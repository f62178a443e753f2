"""`benchfs bb PHASE JOB_ID ...`: the phases of Slurm's burst buffer, as burst_buffer.lua calls
them (docs/burst-buffer.md). Each prints one line, the message Slurm records; the exit status
says whether the phase succeeded."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from benchfs.burstbuffer import phases
from benchfs.burstbuffer.phases import Directives, Phase, Site
from benchfs.errors import BenchfsError


def _phase_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    options = [
        click.argument("job_id"),
        click.option("--root", required=True, type=click.Path(file_okay=False),
                     help="The site's directory of burst-buffer jobs (shared with the nodes)."),
        click.option("--launcher", default="local", show_default=True,
                     type=click.Choice(["local", "mpiexec"]),
                     help="How BenchFS reaches the job's nodes from the controller's host."),
        click.option("--nodes-file", type=click.Path(dir_okay=False),
                     help="The site's nodes, named as Slurm names them [one per host]."),
        click.option("--scratch", help="Node-local directory, without --nodes-file [/tmp]."),
        click.option("--shared-host", is_flag=True,
                     help="The nodes share one host's directories (benchfs-run nodes --netns)."),
        click.option("--servers-per-node", type=click.IntRange(1, 64), default=1),
        click.option("--mount", help="Where the job's nodes mount BenchFS."),
        click.option("--stage-in", nargs=2, multiple=True, metavar="SRC DST"),
        click.option("--stage-out", nargs=2, multiple=True, metavar="SRC DST"),
        click.option("--set", "sets", multiple=True, metavar="KEY=VALUE"),
        click.option("--screen", type=click.Choice(["full", "quick"])),
    ]  # fmt: skip
    for option in reversed(options):
        fn = option(fn)
    return fn


def _phase(options: dict[str, Any]) -> Phase:
    site = Site(
        root=Path(options.pop("root")),
        launcher=options.pop("launcher"),
        nodes_file=options.pop("nodes_file"),
        scratch=options.pop("scratch"),
        shared_host=options.pop("shared_host"),
    )
    directives = Directives(
        servers_per_node=options.pop("servers_per_node"),
        mount=options.pop("mount"),
        stage_in=tuple(options.pop("stage_in")),
        stage_out=tuple(options.pop("stage_out")),
        sets=tuple(options.pop("sets")),
        screen=options.pop("screen"),
    )
    return Phase(site, options.pop("job_id"), directives)


def _report(name: str, phase: Phase, action: Callable[[], str]) -> None:
    ok, message = phases.run_phase(name, phase, action)
    click.echo(message)
    sys.exit(0 if ok else 1)


@click.group(short_help="Slurm burst-buffer phases (called by burst_buffer.lua).")
def bb() -> None:
    """The phases of a Slurm job with `#BB_LUA` directives, as burst_buffer.lua calls them
    (docs/burst-buffer.md); not for use by hand, except `status`."""


@bb.command()
@_phase_options
@click.option("--uid", type=int, required=True)
@click.option("--gid", type=int, required=True)
def setup(uid: int, gid: int, **options: Any) -> None:
    """Create the job's directory and record its user."""
    phase = _phase(options)
    _report("setup", phase, lambda: phases.setup(phase, uid, gid))


@bb.command("data-in")
@_phase_options
def data_in(**options: Any) -> None:
    """Check, as the job's user, that it can read its sources and create its destinations."""
    phase = _phase(options)
    _report("data-in", phase, lambda: phases.data_in(phase))


@bb.command("pre-run")
@_phase_options
@click.option("--worker", is_flag=True, hidden=True)
def pre_run(worker: bool, **options: Any) -> None:
    """Start BenchFS on the job's nodes and stage its input in."""
    phase = _phase(options)
    if worker:
        _report("pre-run-worker", phase, lambda: phases.pre_run_worker(phase))
    argv = [sys.argv[0], *sys.argv[1:]]
    _report("pre-run", phase, lambda: phases.pre_run(phase, argv))


@bb.command("post-run")
@_phase_options
def post_run(**options: Any) -> None:
    """Record how the job ended."""
    phase = _phase(options)
    _report("post-run", phase, lambda: phases.post_run(phase))


@bb.command("data-out")
@_phase_options
def data_out(**options: Any) -> None:
    """Stage the job's output out, as its user, checked as staging checks."""
    phase = _phase(options)
    _report("data-out", phase, lambda: phases.data_out(phase))


@bb.command()
@_phase_options
@click.option("--hurry", is_flag=True, help="Slurm skipped the stage-out (a cancel).")
def teardown(hurry: bool, **options: Any) -> None:
    """Stop BenchFS; delete node-local data only when no output can be lost."""
    phase = _phase(options)
    _report("teardown", phase, lambda: phases.teardown(phase, hurry))


@bb.command()
@_phase_options
def status(**options: Any) -> None:
    """The burst-buffer jobs (JOB_ID `all`), or one job's record."""
    job_id = options["job_id"]
    site = _phase_site(options)
    try:
        click.echo(phases.status(site, job_id))
    except BenchfsError as e:
        click.echo(e.message)
        sys.exit(1)


def _phase_site(options: dict[str, Any]) -> Site:
    return Site(root=Path(options["root"]))

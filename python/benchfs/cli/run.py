"""`benchfs-run`: start a BenchFS cluster, run a workload against it, record everything.

`benchfs-run launch` runs the pipeline of benchfs.pipeline from this process: nodes (a nodes
file, or simulated nodes on this host), exclusions and screening, servers started through a
launcher (local processes, mpiexec or srun), the workload, iostat on every node, teardown,
analysis and the manifest. `submit` renders a batch job that calls the same pipeline inside the
allocation; `sweep` runs it once per point of a parameter file.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from typing import NoReturn

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from benchfs import __version__
from benchfs.cli.consoles import console
from benchfs.cli.options import RUN_DEFAULTS, SizeType, cluster_options
from benchfs.cli.progress import make_progress
from benchfs.config import load_config
from benchfs.errors import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_USAGE, errno_name
from benchfs.parsers import MDTEST_OPERATIONS
from benchfs.pipeline import VIA, WORKLOADS, Pipeline, RunReport, RunSpec, apply_exclusions
from benchfs.results import write_text_atomic
from benchfs.units import format_size


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _print_report(console: Console, report: RunReport) -> None:
    data = report.to_json()
    rows: list[tuple[str, str]] = []
    if data["outcome"] == "ok":
        rows.append(("outcome", "[green]ok[/]"))
    else:
        rows.append(("outcome", f"[red]{data['outcome']}[/] ({data['code']})"))
    if data["servers"] is not None:
        where = (
            f" on {_plural(data['nodes'], 'node')} ({data['launcher']})" if data["nodes"] else ""
        )
        cluster = f"{_plural(data['servers'], 'server')}, {_plural(data['clients'], 'client')}"
        rows.append(("cluster", cluster + where))
        if data["excluded"]:
            rows.append(("excluded", ", ".join(data["excluded"])))
    if data["workload"] is not None:
        rows.append(("workload", escape(data["workload_line"] or f"{data['workload']} (not run)")))
    for key, label in (("write_mib_s", "write"), ("read_mib_s", "read")):
        if data[key] is not None:
            s = (data.get("spread") or {}).get(key)
            more = (
                f" (mean of {s['n']}: ± {s['std']:.1f}, min {s['min']:.1f}, max {s['max']:.1f})"
                if s and s["n"] > 1
                else ""
            )
            rows.append((label, f"{data[key]:.1f} MiB/s{more}"))
    for r in data["rows"] or []:
        if r.get("tool") == "io500":  # IO500's phases and score (benchfs.workloads.io500)
            if r["kind"] == "score":
                rows.append(
                    (
                        "score",
                        f"{r['total']:f} (bandwidth {r['bandwidth_gib_s']:f} GiB/s, "
                        f"IOPS {r['md_kiops']:f} kIOPS; one machine: not a list submission)",
                    )
                )
            else:
                rows.append((r["operation"], f"{r['score']:f} {r['unit']} ({r['seconds']:.1f} s)"))
        elif "ops_s" in r:  # mdtest's rates (benchfs.parsers.RateRow)
            label = MDTEST_OPERATIONS.get(r["operation"], r["operation"]).lower()
            spread = f" (± {r['ops_std_s']:,.0f})" if r["iterations"] > 1 else ""
            rows.append((label, f"{r['ops_s']:,.0f} ops/s{spread}"))
    if data["workload"] not in (None, "command"):
        total = f" ({format_size(data['bytes'])})" if data["bytes"] else ""
        if not data["verify_requested"]:
            verified = "not requested"
        elif data["verified"]:
            verified = "[green]every byte[/]" + total
        else:
            verified = "[red]no[/]"
        rows.append(("verified", verified))
    rows.append(("elapsed", f"{data['elapsed_s']:.1f} s"))
    if data["telemetry_files"]:
        rows.append(
            (
                "telemetry",
                f"{data['telemetry_files']} files in telemetry/ (load with benchfs.telemetry.load)",
            )
        )
    width = max(len(label) for label, _ in [*rows, ("results", "")])
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold", min_width=width)
    table.add_column()
    for label, value in rows:
        table.add_row(label, value)
    console.print(table)
    if data["results_dir"]:
        # Outside the table and never wrapped: the path must survive copy and paste. Its
        # value starts where the table's do (label, then the cell paddings of 1 + 1).
        console.print(
            f"[bold]{'results':<{width}}[/]  {escape(data['results_dir'])}",
            soft_wrap=True,
            highlight=False,
        )


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="benchfs-run")
def main() -> None:
    """Run BenchFS clusters and workloads, recording each run in a results directory."""


@main.command(name="launch")
@cluster_options
@click.option(
    "--file-size",
    type=SizeType(),
    help=f"Bytes per client [default: {format_size(RUN_DEFAULTS['file_size'])}, run.file_size].",
)
@click.option(
    "--transfer-size",
    type=SizeType(),
    help=f"Bytes per call [default: {format_size(RUN_DEFAULTS['transfer_size'])}, "
    "run.transfer_size].",
)
@click.option(
    "--repetitions",
    type=click.IntRange(min=1),
    help="Iterations of the workload; the summary gives their mean ± std, min, max "
    "[default: 1, run.repetitions].",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of a table.")
@click.option(
    "--timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=300.0,
    show_default=True,
    help="Seconds the workload may take, counted from the moment all its ranks are up "
    "(connected to the cluster; a --command once started); starting them may take this "
    "and 1 s per rank more. Then it is stopped.",
)
@click.option(
    "--kill-server-after",
    type=click.FloatRange(min=0),
    hidden=True,
    help="Fault tests only: SIGKILL the last server this many seconds into the workload.",
)
@click.option(
    "--kill-node",
    is_flag=True,
    hidden=True,
    help="Fault tests only: with --kill-server-after, every server of the last server's node.",
)
@click.option(
    "--workload",
    type=click.Choice(WORKLOADS),
    default="rw",
    show_default=True,
    help="rw: write, cross-read, verify; ior / mdtest: the built-in IOR and mdtest "
    "workloads; io500: IO500's phases and score (--preset); command: --command.",
)
@click.option(
    "--preset",
    type=click.Choice(["ci", "small"]),
    help="With --workload io500: the phases' sizes (ci: under a minute) [ci].",
)
@click.option(
    "--ior-prefix",
    metavar="PREFIX",
    help="With --workload io500: the IOR and mdtest phases run the real ior and mdtest in "
    "PREFIX/bin (contrib/ior/build-ior.sh), one MPI job per phase.",
)
@click.option("--ior-args", metavar="OPTIONS", help='IOR options, e.g. "-w -r -t 1m -b 16m -F".')
@click.option("--mdtest-args", metavar="OPTIONS", help='mdtest options, e.g. "-n 1000 -u".')
@click.option(
    "--command",
    "user_command",
    metavar="COMMAND",
    help="With --workload command: a program run as the client ranks, e.g. "
    "'fio --directory={mount} ... --output-format=json' or an IOR binary.",
)
@click.option(
    "--via",
    type=click.Choice(VIA),
    default="mount",
    show_default=True,
    help="How --command reaches BenchFS: the FUSE mount ({mount}), the C library, or the "
    "interposition library (LD_PRELOAD; paths under {mount}, nothing mounted).",
)
@click.option(
    "--darshan", "darshan_prefix", metavar="PREFIX", type=click.Path(file_okay=False),
    help="Trace --command with Darshan built in PREFIX (contrib/darshan/build-darshan.sh): "
    "preloaded, DXT on, its logs in the results' darshan/ (with --via mount or preload); "
    "turns the servers' telemetry.trace on (unless --set says otherwise), which the "
    "analysis joins with the logs.",
)  # fmt: skip
@click.option("--no-analysis", is_flag=True, help="Do not run benchfs-analyze at the end.")
def launch(
    servers: int | None,
    clients: int | None,
    file_size: int | None,
    transfer_size: int | None,
    repetitions: int | None,
    config_path: str | None,
    sets: tuple[str, ...],
    keep_data: bool,
    as_json: bool,
    results_root: str | None,
    timeout: float,
    kill_server_after: float | None,
    kill_node: bool,
    workload: str,
    ior_args: str | None,
    mdtest_args: str | None,
    preset: str | None,
    ior_prefix: str | None,
    user_command: str | None,
    via: str,
    nodes_file: str | None,
    exclude_from: str | None,
    screen: bool,
    screen_args: str | None,
    launcher: str,
    mpiexec: str | None,
    server_nodes: int | None,
    servers_per_node: int | None,
    clients_per_node: int | None,
    pin_cpus: bool,
    darshan_prefix: str | None,
    no_analysis: bool,
) -> None:
    """Run now, through a launcher: start the servers, run the workload, record it.

    The launcher (--launcher local, mpiexec or srun) says how processes reach the nodes; the
    run is the same for all three.
    """
    out = console()
    err = console(stderr=True)
    if (ior_args and workload != "ior") or (mdtest_args and workload != "mdtest"):
        _fail("EINVAL", "--ior-args needs --workload ior, --mdtest-args --workload mdtest", 2)
    if (preset or ior_prefix) and workload != "io500":
        _fail("EINVAL", "--preset and --ior-prefix go with --workload io500", EXIT_USAGE)
    io500_args = [*(["--preset", preset] if preset else [])]
    io500_args += ["--ior-prefix", ior_prefix] if ior_prefix else []
    if bool(user_command) != (workload == "command"):
        _fail("EINVAL", "--command goes with --workload command (and it needs one)", EXIT_USAGE)
    if darshan_prefix and not any(s.startswith("telemetry.trace=") for s in sets):
        # The analysis gives the program's calls to servers through their trace.
        sets = ("telemetry.trace=true", *sets)
    spec = RunSpec(
        servers=servers,
        clients=clients,
        file_size=file_size,
        transfer_size=transfer_size,
        repetitions=repetitions,
        config=config_path,
        sets=sets,
        keep_data=keep_data,
        results_root=results_root,
        timeout_s=timeout,
        kill_server_after_s=kill_server_after,
        kill_node=kill_node,
        workload=workload,
        workload_args={"ior": ior_args, "mdtest": mdtest_args}.get(workload)
        or (shlex.join(io500_args) if io500_args else None),
        command=user_command,
        via=via,
        nodes_file=nodes_file,
        exclude_from=exclude_from,
        screen=screen,
        screen_args=screen_args,
        launcher=launcher,
        mpiexec=mpiexec,
        server_nodes=server_nodes,
        servers_per_node=servers_per_node,
        clients_per_node=clients_per_node,
        pin_cpus=pin_cpus,
        darshan=None if darshan_prefix is None else os.path.abspath(darshan_prefix),
        analyze=not no_analysis,
    )
    report = Pipeline(spec, sys.argv, make_progress(as_json, err)).execute()
    if report.error is not None:
        err.print(
            f"[red]benchfs-run: error {report.error.code}:[/] {escape(report.error.message)}",
            highlight=False,
            soft_wrap=True,
        )
    if as_json:
        click.echo(json.dumps(report.to_json()))
    else:
        _print_report(out, report)
    sys.exit(report.exit_code)


main.add_command(
    click.Command(
        "local",
        callback=launch.callback,
        params=launch.params,
        help="The same as `launch` (its name before mpiexec and srun could launch).",
        short_help="The same as `launch`.",
    )
)


def _fail(code: str, message: str, exit_code: int = EXIT_FAILED) -> NoReturn:
    console(stderr=True).print(
        f"[red]benchfs-run: error {code}:[/] {escape(message)}", highlight=False, soft_wrap=True
    )
    sys.exit(exit_code)


@main.command(context_settings={"ignore_unknown_options": True})
@click.option(
    "--scheduler",
    type=click.Choice(["slurm", "pbs", "nqsv"]),
    required=True,
    help="Batch system: sbatch (Slurm), qsub (PBS Pro/OpenPBS) or qsub (NEC NQSV).",
)
@click.option("--nodes", type=click.IntRange(min=1), required=True, help="Nodes to allocate.")
@click.option("--time-limit", help="Wall time: minutes, 30s, 90m, 2h, HH:MM:SS, D-HH:MM:SS.")
@click.option("--queue", "--partition", "queue", help="Queue (PBS, NQSV) or partition (Slurm).")
@click.option("--account", help="Account or project to charge.")
@click.option(
    "--exclude-from",
    type=click.Path(exists=True),
    help="excluded.txt / excluded.json (or a screen directory) of hosts to leave out.",
)
@click.option(
    "--scratch", default="/tmp", show_default=True, help="Node-local scratch, for nodes.toml."
)
@click.option(
    "--cpus-per-node",
    type=click.IntRange(min=1),
    help="CPUs to ask per node: PBS ncpus and mpiprocs per chunk, NQSV --cpunum-lhost "
    "[the site's default].",
)
@click.option("--job-name", default="benchfs", show_default=True, help="The job's name.")
@click.option(
    "--directive",
    "directives",
    multiple=True,
    metavar="TEXT",
    help="Extra directive line after #SBATCH / #PBS, e.g. '--ntasks=4' (repeatable).",
)
@click.option(
    "--results-root",
    type=click.Path(file_okay=False),
    help="Where the job directory goes [run.results_root, $BENCHFS_RESULTS].",
)
@click.option("--dry-run", is_flag=True, help="Print the job script instead of submitting it.")
@click.option(
    "--run",
    "run_command",
    metavar="COMMAND",
    help="A burst-buffer job instead of a benchmark: `benchfs start` (the options after `--`), "
    "COMMAND (a shell command line), `benchfs stop`, which always runs.",
)
@click.option("--stage-in", metavar="DIR", help="With --run: stage DIR into BenchFS first.")
@click.option("--stage-out", metavar="DIR", help="With --run: stage BenchFS out to DIR at the end.")
@click.option(
    "--stage-nodes", is_flag=True,
    help="Stage in and out on every client node of the job, each its share (stage-in --nodes); "
    "DIRs must be seen at the same path on every node.",
)  # fmt: skip
@click.option(
    "--bb-lua", is_flag=True,
    help="With --run on Slurm: #BB_LUA directives for the site's burst_buffer.lua instead of "
    "inline commands; Slurm starts, stages and stops BenchFS (docs/burst-buffer.md).",
)  # fmt: skip
@click.argument("pipeline_args", nargs=-1, type=click.UNPROCESSED)
def submit(
    scheduler: str,
    nodes: int,
    time_limit: str | None,
    queue: str | None,
    account: str | None,
    exclude_from: str | None,
    scratch: str,
    cpus_per_node: int | None,
    job_name: str,
    directives: tuple[str, ...],
    results_root: str | None,
    dry_run: bool,
    run_command: str | None,
    stage_in: str | None,
    stage_out: str | None,
    stage_nodes: bool,
    bb_lua: bool,
    pipeline_args: tuple[str, ...],
) -> None:
    """Render a batch job that runs `benchfs-run launch PIPELINE_ARGS` and submit it.

    Give the pipeline's options after `--`, e.g.
    `benchfs-run submit --scheduler slurm --nodes 1 -- --servers 2 --clients 2 --file-size 8M`.
    With --run COMMAND the job is a burst buffer: `benchfs start PIPELINE_ARGS`, optional
    stage-in, COMMAND, optional stage-out, `benchfs stop` (docs/lifecycle.md).
    """
    from benchfs.nodes import NodesFileError, read_exclusions
    from benchfs.submit import (
        JobSpec,
        SubmitError,
        bb_lua_directives,
        check_exclusions,
        find_benchfs_run,
        new_job_dir_path,
        parse_time_limit,
        slurm_node_names,
    )
    from benchfs.submit import (
        submit as submit_job,
    )

    args = list(pipeline_args)
    if args and args[0] == "--":
        args = args[1:]
    if "--help" in args or "-h" in args:
        _fail("EINVAL", "the pipeline's --help is `benchfs-run launch --help`", EXIT_USAGE)
    # Check the pipeline's arguments now, not an hour later on the compute node.
    if run_command is None:
        checker, what = launch, "launch"
    else:
        from benchfs.cli.lifecycle import main as lifecycle

        checker, what = lifecycle.commands["start"], "start"
    try:
        parsed = checker.make_context(what, list(args))
    except click.ClickException as e:
        _fail("EINVAL", f"{what} arguments after `--`: {e.format_message()}", EXIT_USAGE)
    try:
        limit = None if time_limit is None else parse_time_limit(time_limit)
        excluded = read_exclusions(exclude_from) if exclude_from else []
        if excluded and scheduler == "slurm" and not dry_run:
            # Unknown names make sbatch reject the whole job: checked against Slurm first.
            excluded, notes = check_exclusions(excluded, slurm_node_names())
            for note in notes:
                click.echo(f"benchfs-run: note: {note}", err=True)
        root = results_root or load_config(None, [])["run"]["results_root"]
        spec = JobSpec(
            scheduler=scheduler,
            nodes=nodes,
            pipeline_args=args,
            job_dir=new_job_dir_path(root, scheduler),
            benchfs_run=find_benchfs_run(),
            time_limit_s=limit,
            queue=queue,
            account=account,
            excluded=excluded,
            scratch=scratch,
            cpus_per_node=cpus_per_node,
            job_name=job_name,
            extra_directives=directives,
            run_command=run_command,
            stage_in=None if stage_in is None else os.path.abspath(stage_in),
            stage_out=None if stage_out is None else os.path.abspath(stage_out),
            stage_nodes=stage_nodes,
            benchfs=find_benchfs_run("benchfs") if run_command is not None else "",
            bb_lua=bb_lua_directives(parsed, stage_in, stage_out) if bb_lua else None,
        )
        if dry_run:
            from benchfs.submit import render

            click.echo(render(spec), nl=False)
            return
        done = submit_job(spec)
    except (ValueError, NodesFileError, FileNotFoundError) as e:
        _fail("EINVAL", str(e), EXIT_USAGE)
    except SubmitError as e:
        _fail(e.code, e.message, EXIT_USAGE if e.code == "EINVAL" else EXIT_FAILED)
    click.echo(f"job       {done.job_id}")
    click.echo(f"results   {done.job_dir}")


@main.command()
@click.option(
    "--from-allocation",
    is_flag=True,
    help="Take the nodes of the current Slurm or PBS/NQSV allocation.",
)
@click.option(
    "--netns",
    type=int,
    metavar="N",
    help="Make N nodes on this host, each in its own network namespace with its own address "
    "(root; TCP between them); --scratch/nI is each one's scratch.",
)
@click.option("--remove-netns", is_flag=True, help="Remove the namespaces an earlier --netns made.")
@click.option(
    "--netns-tag",
    default="bfs",
    show_default=True,
    help="Namespace names: TAG-n1 ... and TAG-sw (letters and digits, at most 8).",
)
@click.option("--scratch", default="/tmp", show_default=True, help="Node-local scratch directory.")
@click.option(
    "--device", "devices", multiple=True, help="Block device behind scratch (repeatable)."
)
@click.option("--exclude", "excludes", multiple=True, help="Host to leave out (repeatable).")
@click.option(
    "--exclude-from", type=click.Path(exists=True), help="excluded.txt / excluded.json to apply."
)
@click.option(
    "--output", "-o", type=click.Path(dir_okay=False), help="Write here instead of stdout."
)
def nodes(
    from_allocation: bool,
    netns: int | None,
    remove_netns: bool,
    netns_tag: str,
    scratch: str,
    devices: tuple[str, ...],
    excludes: tuple[str, ...],
    exclude_from: str | None,
    output: str | None,
) -> None:
    """Print (or write) a nodes file (docs/nodes.md): of the allocation this runs in, or of
    nodes in network namespaces on this host."""
    from pathlib import Path

    from benchfs.errors import BenchfsError
    from benchfs.nodes import Exclusion, NodesFileError, dump_nodes, read_exclusions
    from benchfs.nodes import from_allocation as allocation_nodes
    from benchfs.simnodes import netns_nodes, remove_netns_nodes, tcpmem

    modes = [flag for flag, on in (("--from-allocation", from_allocation),
             ("--netns", netns is not None), ("--remove-netns", remove_netns)) if on]  # fmt: skip
    if len(modes) != 1:
        _fail("EINVAL", "give one of --from-allocation, --netns N and --remove-netns", EXIT_USAGE)
    try:
        if remove_netns:
            removed = remove_netns_nodes(netns_tag)
            click.echo(f"removed {', '.join(removed)}" if removed else "no namespaces to remove")
            if restored := tcpmem.restore_after(netns_tag):
                click.echo(f"benchfs-run nodes: {restored}", err=True)
            return
        left_out = [Exclusion(host) for host in excludes]
        if exclude_from:
            left_out += read_exclusions(exclude_from)
        if netns is not None:
            found = netns_nodes(netns, Path(scratch), netns_tag)
            if raised := tcpmem.raise_for(netns, netns_tag):
                click.echo(f"benchfs-run nodes: {raised}", err=True)
        else:
            found = allocation_nodes(scratch, devices)
    except (NodesFileError, FileNotFoundError) as e:
        _fail("EINVAL", str(e), EXIT_USAGE)
    except BenchfsError as e:
        _fail(e.code, e.message, e.exit_code)
    kept, _ = apply_exclusions(found, left_out)
    if not kept:
        hosts = ", ".join(sorted({e.host for e in left_out}))
        whose = " of the allocation" if from_allocation else ""
        _fail("EINVAL", f"every node{whose} is excluded ({hosts})")
    text = dump_nodes(kept)
    if output:
        write_text_atomic(output, text)
    else:
        click.echo(text, nl=False)


@main.command()
@click.argument("params", type=click.Path(exists=True, dir_okay=False))
@click.option(
    "--results-root",
    type=click.Path(file_okay=False),
    help="Where the sweep directory goes [run.results_root, $BENCHFS_RESULTS].",
)
@click.option(
    "--config", "config_path", type=click.Path(dir_okay=False), help="Base configuration."
)
@click.option("--dry-run", is_flag=True, help="List the points without running them.")
@click.option(
    "--timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=300.0,
    show_default=True,
    help="Seconds each point's workload may take once its ranks are up (as launch).",
)
def sweep(
    params: str, results_root: str | None, config_path: str | None, dry_run: bool, timeout: float
) -> None:
    """Run every point of a parameter file (jobs/params/*.toml); write index.csv."""
    from benchfs.sweep import SweepError, load_params, run_sweep, sweep_table

    err = console(stderr=True)
    try:
        plan = load_params(params)
    except SweepError as e:
        _fail("EINVAL", str(e), EXIT_USAGE)
    for notice in plan.notices:
        err.print(f"[dim]benchfs-run:[/] {escape(notice)}", highlight=False, soft_wrap=True)
    if dry_run:
        console().print(sweep_table(plan.axes, plan.rows_preview()))
        return

    def progress(message: str) -> None:
        err.print(f"[dim]benchfs-run:[/] {escape(message)}", highlight=False, soft_wrap=True)

    root = results_root or load_config(config_path, [])["run"]["results_root"]
    try:
        outcome = run_sweep(plan, root, progress, config=config_path, timeout_s=timeout)
    except KeyboardInterrupt:
        _fail(
            "EINTR", "sweep interrupted; index.csv lists the runs that finished", EXIT_INTERRUPTED
        )
    except OSError as e:
        _fail(errno_name(e), f"sweep: {e}")
    console().print(sweep_table(plan.axes, outcome.rows))
    click.echo(f"index     {outcome.index_path}")
    if outcome.interrupted:
        sys.exit(EXIT_INTERRUPTED)
    sys.exit(0 if outcome.ok else EXIT_FAILED)


if __name__ == "__main__":
    main()

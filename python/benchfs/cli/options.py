"""Options more than one command defines: byte sizes, and the cluster options that
`benchfs-run launch` and `benchfs start` share (one definition, so the two cannot drift)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from benchfs.config import load_config
from benchfs.launch import LAUNCHERS
from benchfs.units import parse_size

F = TypeVar("F", bound=Callable[..., Any])


class SizeType(click.ParamType):
    """Byte sizes with binary suffixes: 64M, 1MiB, 4k, 4096."""

    name = "size"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        try:
            return parse_size(value)
        except ValueError as e:
            self.fail(str(e), param, ctx)


#: The built-in `[run]` defaults, shown in --help (the configuration or a flag may change them).
RUN_DEFAULTS = load_config(None, environment=False)["run"]

#: Where the cluster runs and how it is configured, in the order --help lists them.
_CLUSTER_OPTIONS = (
    click.option(
        "--servers",
        type=click.IntRange(min=1),
        help=f"Servers to start [default: {RUN_DEFAULTS['servers']}, run.servers].",
    ),
    click.option(
        "--clients",
        type=click.IntRange(min=1),
        help=f"MPI client ranks [default: {RUN_DEFAULTS['clients']}, run.clients].",
    ),
    click.option(
        "--config",
        "config_path",
        type=click.Path(dir_okay=False),
        help="Configuration file [$BENCHFS_CONFIG].",
    ),
    click.option(
        "--set",
        "sets",
        multiple=True,
        metavar="SECTION.KEY=VALUE",
        help="Override one configuration key (repeatable; wins over file and environment).",
    ),
    click.option("--keep-data", is_flag=True, help="Keep the servers' data directories."),
    click.option(
        "--results-root",
        type=click.Path(file_okay=False),
        help="Where results directories go [run.results_root, $BENCHFS_RESULTS].",
    ),
    click.option(
        "--nodes-file",
        type=click.Path(dir_okay=False),
        help="Nodes file (docs/nodes.md); default: one simulated node per server on this host.",
    ),
    click.option(
        "--exclude-from",
        type=click.Path(),
        help="excluded.json / excluded.txt (or a screen directory) of nodes to leave out.",
    ),
    click.option("--screen", is_flag=True, help="Screen the nodes with benchfs-diagnose first."),
    click.option(
        "--screen-args", metavar="OPTIONS", help='benchfs-diagnose screen options, e.g. "--quick".'
    ),
    click.option(
        "--launcher",
        type=click.Choice(LAUNCHERS),
        default="local",
        show_default=True,
        help="How processes reach the nodes: local processes, mpiexec, or srun (in Slurm).",
    ),
    click.option("--mpiexec", metavar="PATH", help="The mpiexec to use (Open MPI or MPICH)."),
    click.option(
        "--server-nodes",
        type=click.IntRange(min=1),
        help="Servers on the first K nodes, clients on the others [all nodes run both].",
    ),
    click.option(
        "--servers-per-node", type=click.IntRange(min=1), help="Servers on each server node."
    ),
    click.option(
        "--clients-per-node", type=click.IntRange(min=1), help="Client ranks on each client node."
    ),
    click.option(
        "--pin-cpus", is_flag=True, help="Pin each server and rank to one CPU of its node."
    ),
)


def cluster_options(f: F) -> F:
    """Decorate a command with the cluster options, as if stacked above it in order."""
    for option in reversed(_CLUSTER_OPTIONS):
        f = option(f)
    return f

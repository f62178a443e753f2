"""`benchfs-config`: where this installation's native parts are, for builds and scripts.

export PKG_CONFIG_PATH=$(benchfs-config --pkg-config-path)
cc app.c -o app $(pkg-config --cflags --libs benchfs)
"""

from __future__ import annotations

import shlex
import sys

import click

from benchfs import __version__
from benchfs.burstbuffer import LUA_SCRIPT
from benchfs.native import LIBEXEC_DIR, PACKAGE_DIR, PKG_CONFIG_DIR, PRELOAD_LIBRARY, UCX_SETTINGS


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--pkg-config-path",
    "what",
    flag_value="pkg-config-path",
    help="The directory holding benchfs.pc (for PKG_CONFIG_PATH).",
)
@click.option(
    "--prefix", "what", flag_value="prefix", help="The prefix with lib/, include/ and libexec/."
)
@click.option(
    "--libexec", "what", flag_value="libexec", help="The directory of benchfsd and benchfs-mount."
)
@click.option(
    "--preload",
    "what",
    flag_value="preload",
    help="The interposition library, for LD_PRELOAD (docs/preload.md).",
)
@click.option(
    "--env",
    "what",
    flag_value="env",
    help="`export` lines of the UCX settings programs linking libbenchfs should run with.",
)
@click.option(
    "--modulefile",
    "what",
    flag_value="modulefile",
    help="An Lmod module file for the installation this Python is (make install writes it).",
)
@click.option(
    "--slurm-bb-lua",
    "what",
    flag_value="slurm-bb-lua",
    help="The burst_buffer.lua for Slurm's burst_buffer/lua plugin (docs/burst-buffer.md).",
)
@click.version_option(__version__, "-V", "--version", prog_name="benchfs-config")
def main(what: str | None) -> None:
    """Print where this BenchFS installation keeps its native parts."""
    if what is None:
        raise click.UsageError(
            "say what to print: --pkg-config-path, --prefix, --libexec, --preload, --env, "
            "--modulefile or --slurm-bb-lua"
        )
    if what == "modulefile":
        click.echo(modulefile(sys.prefix), nl=False)
        return
    if what == "env":
        for key, value in UCX_SETTINGS.items():
            click.echo(f"export {key}={shlex.quote(value)}")
        return
    path = {
        "pkg-config-path": PKG_CONFIG_DIR,
        "prefix": PACKAGE_DIR,
        "libexec": LIBEXEC_DIR,
        "preload": PRELOAD_LIBRARY,
        "slurm-bb-lua": LUA_SCRIPT,
    }[what]
    if not path.exists():
        raise click.ClickException(
            f"{path} does not exist: this benchfs package was installed without its native "
            "parts (run `make build` in a source tree)"
        )
    click.echo(str(path))


def modulefile(prefix: str) -> str:
    """An Lmod module file for the installation at `prefix` (its own Python environment)."""
    settings = "".join(f'setenv("{k}", "{v}")\n' for k, v in UCX_SETTINGS.items())
    return f"""-- BenchFS {__version__}: an ad-hoc file system over a job's node-local storage.
-- Written by `make install` (benchfs-config --modulefile); load with
--   module use {prefix}/share/modulefiles && module load benchfs
help([[BenchFS {__version__} in {prefix}: the benchfs, benchfs-run, benchfs-analyze,
benchfs-bench, benchfs-diagnose, benchfsd and benchfs-mount commands, and the C library
(pkg-config benchfs).]])
whatis("Name: benchfs")
whatis("Version: {__version__}")
whatis("Description: ad-hoc distributed file system for HPC burst buffers, with diagnostics")
local prefix = "{prefix}"
prepend_path("PATH", pathJoin(prefix, "bin"))
prepend_path("PKG_CONFIG_PATH", pathJoin(prefix, "lib/pkgconfig"))
setenv("BENCHFS_PREFIX", prefix)
-- Programs linking libbenchfs (IOR, an application) load UCX with these (benchfs/native.py).
{settings}"""

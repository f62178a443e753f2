"""Where the native parts of BenchFS are, and the UCX settings they run with.

The package carries them (a wheel does; `make build` puts them there in a source tree): the
daemon and the mount in `benchfs/libexec`, the C library and its pkg-config file in
`benchfs/lib`, the header in `benchfs/include`. The `benchfsd` and `benchfs-mount` commands a
wheel installs are `exec_benchfsd`/`exec_benchfs_mount` below: they replace themselves with
the packaged binary, which finds the UCX wheel's libraries through its rpath.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
LIBEXEC_DIR = PACKAGE_DIR / "libexec"
PKG_CONFIG_DIR = PACKAGE_DIR / "lib" / "pkgconfig"
#: The interposition library (docs/preload.md): `LD_PRELOAD=$(benchfs-config --preload)`.
PRELOAD_LIBRARY = PACKAGE_DIR / "lib" / "libbenchfs_preload.so"

# UCX's default way of hooking mmap ("bistro") costs 0.4 s at every library load on machines
# like ours, and its malloc hooks can deadlock or abort with libraries loaded after it
# (scripts/bootstrap writes the same into the source tree's ucx.conf, which says why). UCX logs
# to stdout by default, which would corrupt what the tools print there. Set before UCX loads:
# by `benchfs/__init__.py`, the commands below, and the module file (make install).
UCX_SETTINGS = {
    "UCX_MEM_MMAP_HOOK_MODE": "reloc",
    "UCX_MEM_MALLOC_HOOKS": "no",
    "UCX_MEM_MALLOC_RELOC": "no",
    "UCX_LOG_FILE": "stderr",
}


def use_ucx_settings() -> None:
    """Sets [`UCX_SETTINGS`] in this process's environment where the user has not."""
    for key, value in UCX_SETTINGS.items():
        os.environ.setdefault(key, value)


def preload_env(base: Mapping[str, str], prefix: str | os.PathLike[str]) -> dict[str, str]:
    """`base` for a program run with the interposition library (docs/preload.md): the library
    first in LD_PRELOAD (other preloads kept), its prefix, and the UCX settings where `base`
    has none."""
    env = {**UCX_SETTINGS, **base}
    env["BENCHFS_PRELOAD_PREFIX"] = str(prefix)
    env["LD_PRELOAD"] = ":".join(filter(None, [str(PRELOAD_LIBRARY), base.get("LD_PRELOAD")]))
    return env


def find_binary(name: str) -> str:
    """Path of a BenchFS program: the package's own (the build that matches the extension),
    else next to this Python, else on PATH."""
    for candidate in (LIBEXEC_DIR / name, Path(sys.executable).parent / name):
        if os.access(candidate, os.X_OK) and candidate.is_file():
            return str(candidate)
    found = shutil.which(name)
    if found is None:
        raise FileNotFoundError(
            f"{name} not found in {LIBEXEC_DIR}, next to {sys.executable} or on PATH: "
            "run `make build` in the source tree, or install the benchfs wheel"
        )
    return found


def _exec(name: str) -> None:
    path = LIBEXEC_DIR / name
    if not os.access(path, os.X_OK):
        sys.exit(f"{name}: {path} is missing: this benchfs package was built without it")
    use_ucx_settings()
    os.execv(path, [name, *sys.argv[1:]])


def exec_benchfsd() -> None:
    _exec("benchfsd")


def exec_benchfs_mount() -> None:
    _exec("benchfs-mount")

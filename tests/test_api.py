"""The typed face of the native module (its stub, `_core.pyi`, is checked against the built
module by mypy's stubtest in `make lint`)."""

from __future__ import annotations

from pathlib import Path

import benchfs
from benchfs import _core


def test_public_names() -> None:
    # Client and File are the Python layer over the native ones (tests/test_pyapi.py).
    assert benchfs.Client.__module__ == benchfs.File.__module__ == "benchfs.client"
    assert benchfs.Server is _core.Server
    assert benchfs.__version__ == _core.__version__
    assert (Path(benchfs.__file__).parent / "py.typed").exists()


def test_client_does_io_through_files() -> None:
    """Path-based I/O moved to `File`: the client opens, names and places; the file reads,
    writes and publishes."""
    client_methods = {
        "open", "stat", "unlink", "mkdir", "rmdir", "readdir", "rename", "truncate", "locate",
        "server_stats", "server_ids", "close",
    }  # fmt: skip
    assert client_methods <= set(dir(_core.Client))
    for removed in ("write", "read", "readinto", "file_size", "fsync"):
        assert not hasattr(_core.Client, removed), removed
    assert {"write", "read", "readinto", "fsync", "truncate", "close", "size", "path", "id"} <= set(
        dir(_core.File)
    )
    assert {"schemes", "with_servers", "servers_into"} <= set(dir(_core.PlacementStudy))
    assert _core.PlacementStudy.schemes()[0] == "layout"  # the default first

"""The typed face of the native module: `_core.pyi` must describe what `_core` really has."""

from __future__ import annotations

import ast
import inspect
from collections.abc import Callable
from pathlib import Path

import benchfs
from benchfs import _core

STUB = Path(benchfs.__file__).with_name("_core.pyi")


def _stub_params(fn: ast.FunctionDef) -> list[str]:
    args = [a.arg for a in fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs]
    return [a for a in args if a != "self"]


def _runtime_params(obj: Callable[..., object]) -> list[str]:
    return [p for p in inspect.signature(obj).parameters if p != "self"]


def test_public_names() -> None:
    # Client and File are the Python layer over the native ones (tests/test_pyapi.py).
    assert benchfs.Client.__module__ == benchfs.File.__module__ == "benchfs.client"
    assert benchfs.Server is _core.Server
    assert benchfs.__version__ == _core.__version__
    assert (Path(benchfs.__file__).parent / "py.typed").exists()


def test_stub_matches_the_native_module() -> None:
    tree = ast.parse(STUB.read_text())
    checked = 0
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            assert _stub_params(node) == _runtime_params(getattr(_core, node.name)), node.name
            checked += 1
        elif isinstance(node, ast.ClassDef):
            cls = getattr(_core, node.name)
            for item in node.body:
                if not isinstance(item, ast.FunctionDef) or item.name in ("__enter__", "__exit__"):
                    continue
                if item.name == "__init__":
                    assert _stub_params(item) == _runtime_params(cls), node.name
                elif any(getattr(d, "id", None) == "property" for d in item.decorator_list):
                    assert hasattr(cls, item.name), f"{node.name}.{item.name}"
                else:
                    method = getattr(cls, item.name)
                    assert _stub_params(item) == _runtime_params(method), f"{cls}.{item.name}"
                checked += 1
    stubbed = {n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.ClassDef)}
    native = {n for n in dir(_core) if not n.startswith("_") and callable(getattr(_core, n))}
    assert stubbed == native, "the stub and the native module disagree on their public names"
    assert checked > len(stubbed)


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

"""The one BenchFS configuration, as Python sees it.

Defaults, the file, the `BENCHFS_*` variables and overrides are merged by the Rust core
(`_core.resolve_config`), so the daemon, the client and these tools cannot disagree about a
value; Python only parses the effective TOML text it returns.
"""

from __future__ import annotations

import hashlib
import os
import tomllib
from collections.abc import Iterable
from typing import Any

from benchfs import _core

__all__ = ["config_hash", "load_config", "parse_config", "resolve_config_text"]


def resolve_config_text(
    path: str | os.PathLike[str] | None = None, overrides: Iterable[str] = ()
) -> str:
    """Return the effective configuration as TOML text (what a results directory records).

    `path` defaults to `$BENCHFS_CONFIG`; `overrides` are "section.key=value" strings that win
    over everything else. Raises FileNotFoundError or ValueError with the core's message.
    """
    return _core.resolve_config(None if path is None else os.fspath(path), list(overrides))


def parse_config(text: str) -> dict[str, Any]:
    """Parse effective config text (from `resolve_config_text` or a results directory)."""
    return tomllib.loads(text)


def load_config(
    path: str | os.PathLike[str] | None = None, overrides: Iterable[str] = ()
) -> dict[str, Any]:
    """Return the effective configuration as nested dicts: {"section": {"key": value}}."""
    return parse_config(resolve_config_text(path, overrides))


def config_hash(text: str) -> str:
    """SHA-256 (hex) of config text, so two runs can be told apart by their manifests alone."""
    return hashlib.sha256(text.encode()).hexdigest()

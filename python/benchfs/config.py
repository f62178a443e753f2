"""The one BenchFS configuration, as Python sees it.

Defaults, the file, the `BENCHFS_*` variables and overrides are merged by the Rust core
(`_core.resolve_config`), so the daemon, the client and these tools cannot disagree about a
value; Python only parses the effective TOML text it returns.
"""

from __future__ import annotations

import hashlib
import os
import tomllib
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from benchfs import _core

__all__ = [
    "Section",
    "config_hash",
    "load_config",
    "parse_config",
    "resolve_config_text",
    "section",
    "with_overrides",
]


def resolve_config_text(
    path: str | os.PathLike[str] | None = None,
    overrides: Iterable[str] = (),
    environment: bool = True,
) -> str:
    """Return the effective configuration as TOML text (what a results directory records).

    `path` defaults to `$BENCHFS_CONFIG`; `overrides` are "section.key=value" strings that win
    over everything else. `environment=False` reads neither `BENCHFS_*` nor `$BENCHFS_CONFIG`;
    an effective configuration file (this function's output, saved) is never combined with
    `BENCHFS_*` either (docs/config.md). Raises FileNotFoundError or ValueError with
    the core's message, which names the key, the value and where it came from.
    """
    return _core.resolve_config(
        None if path is None else os.fspath(path), list(overrides), environment
    )


def with_overrides(effective: str, overrides: Iterable[str]) -> str:
    """Effective configuration text with `overrides` applied and nothing else (no file, no
    environment): for facts known only after resolving, such as a run's directories."""
    return _core.config_with_overrides(effective, list(overrides))


def parse_config(text: str) -> dict[str, Any]:
    """Parse effective config text (from `resolve_config_text` or a results directory)."""
    return tomllib.loads(text)


def load_config(
    path: str | os.PathLike[str] | None = None,
    overrides: Iterable[str] = (),
    environment: bool = True,
) -> dict[str, Any]:
    """Return the effective configuration as nested dicts: {"section": {"key": value}}."""
    return parse_config(resolve_config_text(path, overrides, environment))


def config_hash(text: str) -> str:
    """SHA-256 (hex) of config text, so two runs can be told apart by their manifests alone."""
    return hashlib.sha256(text.encode()).hexdigest()


class Section(Mapping[str, Any]):
    """One section of an effective configuration, read-only; its keys are also attributes
    (`th.slow_op_ms`). The keys and defaults are Rust's (rust/benchfs-core/src/config.rs and, for
    the tools' sections, rust/benchfs-tools/src/config.rs; docs/config.md) and are not listed
    again in Python."""

    __slots__ = ("_values", "name")
    name: str
    _values: dict[str, Any]

    def __init__(self, name: str, values: Mapping[str, Any]) -> None:
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "_values", dict(values))

    def __getitem__(self, key: str) -> Any:
        return self._values[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __getattr__(self, key: str) -> Any:
        if key.startswith("_"):
            raise AttributeError(key)
        try:
            return self._values[key]
        except KeyError:
            raise AttributeError(f"[{self.name}] has no key {key!r}") from None

    def __setattr__(self, key: str, value: Any) -> None:
        raise AttributeError(f"[{self.name}] is read-only: use replace()")

    def __repr__(self) -> str:
        return f"Section({self.name!r}, {self._values!r})"

    def replace(self, **changes: Any) -> Section:
        """A copy with some keys changed (unknown keys are a ValueError)."""
        unknown = sorted(set(changes) - set(self._values))
        if unknown:
            raise ValueError(f"[{self.name}] has no key {', '.join(unknown)}")
        return Section(self.name, {**self._values, **changes})

    def to_dict(self) -> dict[str, Any]:
        return dict(self._values)


def section(config: Mapping[str, Any], name: str) -> Section:
    """Section `name` of a parsed effective configuration (`load_config`, a run's config)."""
    values = config.get(name)
    if not isinstance(values, Mapping):
        raise ValueError(
            f"the configuration has no [{name}] section: benchfs._core predates it "
            "(rebuild it with `make build`)"
        )
    return Section(name, values)

"""The analysis's thresholds: the `[insights]` section of the one configuration, and the
`[diagnose]` section for the judgment of which nodes slowed a run (`benchfs.slownodes`, shared
with benchfs-diagnose judge).

Their keys and defaults live in rust/benchfs-tools/src/config.rs and nowhere else. A run is
judged by the thresholds it was made with: its own config.toml, then any overrides given to
the analysis; the environment is not read (docs/results.md: analysis reads
only the results directory).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from benchfs.config import Section, load_config, section
from benchfs.results import RunDir

__all__ = ["Thresholds", "resolve_thresholds", "run_thresholds"]

#: The `[insights]` section (`th.slow_op_ms`, ...).
Thresholds = Section


def resolve_thresholds(
    path: str | os.PathLike[str] | None = None,
    overrides: Iterable[str] = (),
    name: str = "insights",
) -> Thresholds:
    """The `[insights]` (or `name`) thresholds of the effective configuration (defaults < file
    < `BENCHFS_INSIGHTS_*` < `overrides` such as "insights.slow_op_ms=50")."""
    return section(load_config(path, overrides), name)


def run_thresholds(
    run_dir: str | os.PathLike[str], overrides: Iterable[str] = (), name: str = "insights"
) -> Thresholds:
    """The `[insights]` (or `name`) thresholds run `run_dir` was made with (its config.toml;
    the defaults for a run without one), then `overrides`. Neither `BENCHFS_*` nor
    `$BENCHFS_CONFIG` is read."""
    recorded = RunDir(Path(run_dir)).config_path
    path = recorded if recorded.is_file() else None
    return section(load_config(path, overrides, environment=False), name)

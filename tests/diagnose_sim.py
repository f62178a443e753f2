"""The simulated nodes (benchfs.simnodes) for the benchfs-diagnose tests, skipping a test with
one line naming what this host lacks."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchfs.simnodes import MIB, Sim, build_delayfs, node, requirements, simulation

__all__ = ["MIB", "Sim", "delayfs_or_skip", "node", "simulation"]


def delayfs_or_skip(directory: Path) -> Path:
    """The compiled delayfs, or a skip naming what this host lacks."""
    missing = requirements()
    if missing:
        pytest.skip(f"the simulated nodes need {', '.join(missing)}")
    return build_delayfs(directory)

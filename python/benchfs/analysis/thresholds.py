"""The insight thresholds: the `[insights]` section of the one configuration.

Their defaults live in rust/benchfs-core/src/config.rs (`InsightsConfig`) and nowhere else;
Python reads the effective values through `benchfs.config`, like every other tool.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from benchfs.config import load_config

__all__ = ["Thresholds", "resolve_thresholds"]


@dataclass(frozen=True)
class Thresholds:
    """One field per key of `[insights]` (docs/config.md, docs/analysis.md)."""

    slow_op_ms: float
    min_ops: int
    depth1_share: float
    starvation_queue_ratio: float
    batch_mean_max: float
    batch_depth_min: float
    slow_node_pct: float
    slow_node_factor: float
    device_await_ratio: float
    device_await_min_ms: float
    placement_max_mean: float
    retry_rate: float
    pool_wait_share: float
    read_write_ratio: float
    small_write_bytes: int
    fsync_per_write: float
    handle_miss_share: float
    bimodal_mode_share: float

    @classmethod
    def keys(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> Thresholds:
        """The thresholds of a parsed effective configuration (ValueError if incomplete)."""
        section = config.get("insights")
        if not isinstance(section, Mapping):
            raise ValueError(
                "the configuration has no [insights] section: this build of benchfs._core "
                "predates the insight thresholds (rebuild it with `make build`)"
            )
        missing = [k for k in cls.keys() if k not in section]
        if missing:
            raise ValueError(f"[insights] lacks {', '.join(missing)}: rebuild with `make build`")
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            raw = section[f.name]
            values[f.name] = int(raw) if f.type in ("int", int) else float(raw)
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def resolve_thresholds(
    path: str | os.PathLike[str] | None = None, overrides: Iterable[str] = ()
) -> Thresholds:
    """The `[insights]` thresholds of the effective configuration (defaults < file <
    `BENCHFS_INSIGHTS_*` < `overrides` such as "insights.slow_op_ms=50")."""
    return Thresholds.from_config(load_config(path, overrides))

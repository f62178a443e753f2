"""iostat captures of a run (`iostat/<node>.json`) as one DataFrame, for the analysis tables.

Parsing is `benchfs.probes.iostat` (JSON or text `iostat -x` output of any sysstat version,
captures cut short by a signal read up to their last complete interval); this module only
turns its samples into a frame with one row per device and interval.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pandas as pd

from benchfs.probes.iostat import Sample, read_iostat

__all__ = ["COLUMNS", "frame", "is_member_device", "load_dir", "load_file"]

COLUMNS = ("r_s", "w_s", "rkB_s", "wkB_s", "r_await", "w_await", "aqu_sz", "util")
"""Per device and interval (util is %util); times are the interval's end, UTC."""
_VIRTUAL = re.compile(r"^(md\d+|dm-\d+|loop\d+|ram\d+|zram\d+|sr\d+|nbd\d+)$")


def is_member_device(device: str) -> bool:
    """True for a physical device (nvme0n1, sda), False for md/dm/loop/ram and similar."""
    return _VIRTUAL.match(device) is None


def frame(samples: Iterable[Sample], node: str) -> pd.DataFrame:
    """Samples as rows: t (UTC, NaT without -t), node, device, then COLUMNS."""
    rows = list(samples)
    t = np.array([np.nan if s.t is None else s.t for s in rows], dtype=np.float64)
    out = pd.DataFrame(
        {
            "t": pd.DatetimeIndex(pd.to_datetime(t, unit="s", utc=True)).as_unit("ns"),
            "node": node,
            "device": [s.device for s in rows],
            **{c: np.array([s.get(c) for s in rows], dtype=np.float64) for c in COLUMNS},
        }
    )
    return out


def load_file(path: str | os.PathLike[str], node: str | None = None) -> pd.DataFrame:
    """One capture (`<node>.json`; the node defaults to the file's stem); a truncated capture
    is read up to its last complete interval. ValueError (naming the file) if malformed."""
    p = Path(path)
    return frame(read_iostat(p, partial=True), node or p.stem)


def load_dir(directory: str | os.PathLike[str]) -> pd.DataFrame | None:
    """Every capture in `directory`, concatenated; None if there is none."""
    paths = sorted(Path(directory).glob("*.json"))
    if not paths:
        return None
    return pd.concat([load_file(p) for p in paths], ignore_index=True)

"""Byte sizes as people type them on HPC command lines ("64M", "1MiB", "4k").

Every suffix is binary (K = KiB = KB = 1024), as in IOR and fio, so "1M" is never ambiguous.
"""

from __future__ import annotations

import re

__all__ = ["format_size", "parse_size"]

_UNITS = {"": 0, "k": 1, "m": 2, "g": 3, "t": 4, "p": 5}
_SIZE_RE = re.compile(r"^\s*(\d+)\s*(?:([kmgtp])(?:i?b)?|b)?\s*$", re.IGNORECASE)


def parse_size(text: str | int) -> int:
    """Parse "64M", "1MiB", "4096" or "2g" into bytes; ValueError names the bad input."""
    if isinstance(text, int):
        value = text
    else:
        match = _SIZE_RE.match(text)
        if match is None:
            raise ValueError(
                f"invalid size {text!r}: expected a number with an optional suffix "
                "K, M, G, T or P (binary; KiB, MB etc. also accepted)"
            )
        value = int(match.group(1)) << (10 * _UNITS[(match.group(2) or "").lower()])
    if value < 0:
        raise ValueError(f"invalid size {text!r}: must not be negative")
    return value


def format_size(value: int) -> str:
    """Format bytes with the largest binary unit that divides them exactly ("64MiB", "1000B")."""
    for suffix, power in (("PiB", 5), ("TiB", 4), ("GiB", 3), ("MiB", 2), ("KiB", 1)):
        if value and value % (1 << (10 * power)) == 0:
            return f"{value >> (10 * power)}{suffix}"
    return f"{value}B"

"""Byte sizes as people type them on HPC command lines ("64M", "1MiB", "4k").

Every suffix is binary (K = KiB = KB = 1024), as in IOR and fio, so "1M" is never ambiguous.
"""

from __future__ import annotations

from benchfs import _core

__all__ = ["GIB", "KIB", "MIB", "format_size", "human_size", "parse_size", "shown_value"]

KIB = 1 << 10
MIB = 1 << 20
GIB = 1 << 30


def parse_size(text: str | int) -> int:
    """Parse "64M", "1MiB", "4096" or "2g" into bytes with the core's one size parser (the one
    configuration values use); ValueError names the bad input."""
    if isinstance(text, int):
        if text < 0:
            raise ValueError(f"invalid size {text}: a size must not be negative")
        return text
    return _core.parse_size(text)


def format_size(value: int) -> str:
    """Format bytes with the largest binary unit that divides them exactly ("64MiB", "1000B")."""
    for suffix, power in (("PiB", 5), ("TiB", 4), ("GiB", 3), ("MiB", 2), ("KiB", 1)):
        if value and value % (1 << (10 * power)) == 0:
            return f"{value >> (10 * power)}{suffix}"
    return f"{value}B"


def shown_value(key: str, value: object) -> object:
    """A configuration value as people read it: the bytes of a size key (`..._size`,
    `..._bytes`) with their unit, any other value as it is."""
    if isinstance(value, int) and not isinstance(value, bool) and key.endswith(("_size", "_bytes")):
        return format_size(value)
    return value


def human_size(value: float) -> str:
    """Bytes rounded for people, in the largest binary unit below them ("3.2 GiB", "512 B")."""
    for suffix, power in (("PiB", 5), ("TiB", 4), ("GiB", 3), ("MiB", 2), ("KiB", 1)):
        if value >= 1 << (10 * power):
            return f"{value / (1 << (10 * power)):.1f} {suffix}"
    return f"{value:.0f} B"

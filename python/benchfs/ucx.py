"""The UCX that BenchFS runs on: the one `benchfs._core` loaded (scripts/bootstrap installs UCX
1.22 from its PyPI wheel at `.venv/ucx`), and that UCX's own tools, so that references such as
`ucx_perftest` measure the same library.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

__all__ = ["find_tool", "loaded_libucp"]


def loaded_libucp(avoid: Path | None = None) -> str:
    """The libucp file this process mapped for `benchfs._core` (outside `avoid`).

    Read from /proc/self/maps after importing the extension, so that it is the exact file the
    dynamic linker chose (not a guess at library directories). RuntimeError if there is not
    exactly one.
    """
    import benchfs._core  # noqa: F401  (loads BenchFS's UCX into this process)

    found: list[str] = []
    with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and os.path.basename(fields[5].strip()).startswith("libucp.so"):
                path = fields[5].strip()
                if path not in found and not (avoid and Path(path).is_relative_to(avoid)):
                    found.append(path)
    if len(found) != 1:
        raise RuntimeError(
            f"cannot tell which libucp benchfs._core uses (mapped: {found or 'none'})"
        )
    return found[0]


def find_tool(name: str) -> str:
    """A UCX tool (`ucx_perftest`, `ucx_info`) of the UCX BenchFS loaded, else from PATH.

    FileNotFoundError names where it looked.
    """
    beside = Path(loaded_libucp()).parent.parent / "bin" / name
    if os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which(name)
    if found is None:
        raise FileNotFoundError(
            f"{name} not found in {beside.parent} (BenchFS's UCX) nor on PATH: "
            "run scripts/bootstrap"
        )
    return found

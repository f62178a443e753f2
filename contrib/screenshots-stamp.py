#!/usr/bin/env python3
"""Whether docs/images' report screenshots show the current report code.

The screenshots are made by contrib/report-screenshots.sh, which ends with `--write`: it records
a digest of each file that decides how a report looks. `--check` (run by the test suite) fails
with one line when any of them changed since, so the images cannot silently fall behind.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STAMP = ROOT / "docs" / "images" / "screenshots.json"
# How a run's and a sweep's report look: the page and its style, and the figures.
SOURCES = [
    "python/benchfs/analysis/report.py",
    "python/benchfs/analysis/plots.py",
    "python/benchfs/analysis/sweep.py",
]


def digests() -> dict[str, str]:
    return {name: hashlib.sha256((ROOT / name).read_bytes()).hexdigest() for name in SOURCES}


def main(argv: list[str]) -> int:
    if argv == ["--write"]:
        STAMP.write_text(json.dumps({"sources": digests()}, indent=2) + "\n")
        return 0
    if argv != ["--check"]:
        print("usage: screenshots-stamp.py --write | --check", file=sys.stderr)
        return 2
    recorded = json.loads(STAMP.read_text())["sources"] if STAMP.exists() else {}
    changed = [name for name, digest in digests().items() if recorded.get(name) != digest]
    if changed:
        print(
            f"docs/images' screenshots predate {', '.join(changed)}: "
            "run contrib/report-screenshots.sh",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

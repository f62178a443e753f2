"""JSON Schemas of the JSON files BenchFS writes, and the check of a document against one.

Each schema is `<name>.schema.json` beside this file and each document carries the
`schema_version` it was written with; readers check what they load, so a damaged or foreign
file is one line naming the file and the place, never a traceback.
"""

from __future__ import annotations

import json
import os
from functools import cache
from importlib import resources
from typing import Any

import jsonschema

__all__ = [
    "MANIFEST",
    "REPORT",
    "RUN_SUMMARY",
    "SCREEN",
    "STAGE_MANIFEST",
    "SWEEP_INDEX",
    "check",
    "schema",
]

MANIFEST = "manifest"
"""`manifest.json` of a run (docs/results.md)."""
REPORT = "report"
"""`analysis/report.json`, and `benchfs-analyze --json` (docs/analysis.md)."""
RUN_SUMMARY = "run-summary"
"""The object `benchfs-run launch --json` prints (docs/run.md)."""
SCREEN = "screen"
"""`screen.json` of a `benchfs-diagnose screen`."""
STAGE_MANIFEST = "stage-manifest"
"""The manifest of a `benchfs stage-in` or `stage-out` (docs/lifecycle.md)."""
SWEEP_INDEX = "sweep-index"
"""`index.json` of a `benchfs-run sweep` (docs/submit.md)."""


@cache
def schema(name: str) -> dict[str, Any]:
    """The JSON Schema `name` (e.g. SCREEN)."""
    text = resources.files(__package__).joinpath(f"{name}.schema.json").read_text("utf-8")
    return json.loads(text)


def check(doc: Any, name: str, source: str | os.PathLike[str]) -> None:
    """ValueError naming `source` and the first place where `doc` breaks schema `name`."""
    validator = jsonschema.Draft202012Validator(schema(name))
    error = jsonschema.exceptions.best_match(validator.iter_errors(doc))
    if error is not None:
        where = "".join(f"[{p!r}]" if isinstance(p, int) else f".{p}" for p in error.path)
        raise ValueError(f"{source}: not a {name} document: at {where or 'top'}: {error.message}")

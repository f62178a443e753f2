"""Entry points of the commands that need the `analysis` extra (pandas and matplotlib: tables,
telemetry frames, plots). Without it they say in one line which extra to install, instead of
failing on an import; `benchfs` (start, status, stop, staging) and the Python API need neither.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys

ANALYSIS_MODULES = ("pandas", "matplotlib")


def _run(module: str, command: str) -> None:
    missing = [m for m in ANALYSIS_MODULES if importlib.util.find_spec(m) is None]
    if missing:
        sys.exit(
            f"{command}: needs {' and '.join(missing)}, which come with the analysis extra: "
            "pip install 'benchfs[analysis]'"
        )
    importlib.import_module(module).main()


def run() -> None:
    _run("benchfs.cli.run", "benchfs-run")


def analyze() -> None:
    _run("benchfs.cli.analyze", "benchfs-analyze")


def bench() -> None:
    _run("benchfs.cli.bench", "benchfs-bench")


def diagnose() -> None:
    _run("benchfs.cli.diagnose", "benchfs-diagnose")

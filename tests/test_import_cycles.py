"""The import-cycle contracts of make lint (tests/import_cycles.py, pyproject.toml) run by the
real lint-imports on a package with cycles of every kind the check must count."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")
CONFIG = """
[tool.importlinter]
root_package = "cyc"
contract_types = ["acyclic_modules: import_cycles.AcyclicModulesContract"]

[[tool.importlinter.contracts]]
name = "No import cycles between modules"
type = "acyclic_modules"
packages = ["cyc"]
"""
MODULES = {
    # A cycle through imports inside a function and under TYPE_CHECKING.
    "cyc/__init__.py": "",
    "cyc/lazy.py": "def f():\n    from cyc.typed import T\n    return T\n",
    "cyc/typed.py": """
        from typing import TYPE_CHECKING
        if TYPE_CHECKING:
            from cyc.lazy import f
        T = 1
    """,
    # A cycle through a package's own __init__.
    "cyc/sub/__init__.py": "from cyc.sub.user import VALUE\n",
    "cyc/sub/user.py": "from cyc.sub import _native\nfrom cyc.sub import OTHER\nVALUE = 1\n",
    # An import of a compiled module named through its package: no cycle (the stub says so).
    "cyc/sub/_native.pyi": "X: int\n",
    "cyc/leaf/__init__.py": "from cyc.leaf.ext_user import Y\n",
    "cyc/leaf/ext_user.py": "from cyc.leaf import _native\nY = 1\n",
    "cyc/leaf/_native.pyi": "X: int\n",
}


def lint(tmp_path: Path, modules: dict[str, str]) -> subprocess.CompletedProcess[str]:
    for name, text in modules.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip())
    (tmp_path / "pyproject.toml").write_text(CONFIG)
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}:{Path(__file__).parent}"}
    return subprocess.run(
        [str(LINT_IMPORTS), "pyproject.toml", "--no-cache"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_every_kind_of_cycle_is_found_and_named(tmp_path: Path) -> None:
    done = lint(tmp_path, MODULES)
    out = " ".join(done.stdout.split())  # rich wraps long lines
    assert done.returncode == 1, done.stdout + done.stderr
    assert "cyc.lazy -> cyc.typed (line 2: from cyc.typed import T)" in out
    assert "cyc.typed -> cyc.lazy (line 3: from cyc.lazy import f)" in out
    assert "cyc.sub -> cyc.sub.user (line 1: from cyc.sub.user import VALUE)" in out
    assert "cyc.sub.user -> cyc.sub (line 2: from cyc.sub import OTHER)" in out
    assert out.count("Import cycle:") == 2 and "cyc.leaf" not in out


def test_a_package_without_cycles_keeps_the_contract(tmp_path: Path) -> None:
    acyclic = {k: v for k, v in MODULES.items() if not k.startswith(("cyc/lazy", "cyc/sub/"))}
    done = lint(tmp_path, acyclic)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "No import cycles between modules KEPT" in done.stdout

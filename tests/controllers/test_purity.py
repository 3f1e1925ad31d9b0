"""``controllers/`` imports nothing outside the standard library, numpy, scipy and itself.

The one project module it may use besides its own is :mod:`kairos_common.views` (the
agent and request views the wire carries), which itself imports only the standard library.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "controllers"
COMMON = Path(__file__).resolve().parents[2] / "kairos_common" / "views.py"
ALLOWED = set(sys.stdlib_module_names) | {"numpy", "scipy", "controllers"}
ALLOWED_PROJECT_MODULES = {"kairos_common.views"}
FORBIDDEN_STDLIB = {"asyncio", "socket", "subprocess", "time", "threading"}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            top = node.module.split(".")[0]
            names.add(node.module if node.module in ALLOWED_PROJECT_MODULES else top)
    return names


def test_controllers_are_pure() -> None:
    files = sorted(ROOT.rglob("*.py"))
    assert files
    for path in files:
        mods = _imports(path) - ALLOWED_PROJECT_MODULES
        assert mods <= ALLOWED, f"{path.name} imports {sorted(mods - ALLOWED)}"
        assert not mods & FORBIDDEN_STDLIB, f"{path.name} does I/O or reads clocks"


def test_the_shared_views_are_standard_library_only() -> None:
    """``kairos_common.views`` is what lets the wire skip the controllers: keep it a leaf."""
    mods = _imports(COMMON)
    assert mods <= set(sys.stdlib_module_names), f"views imports {sorted(mods)}"
    assert not mods & FORBIDDEN_STDLIB

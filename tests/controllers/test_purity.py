"""``controllers/`` imports nothing outside the standard library, numpy and itself."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "controllers"
ALLOWED = set(sys.stdlib_module_names) | {"numpy", "controllers"}
FORBIDDEN_STDLIB = {"asyncio", "socket", "subprocess", "time", "threading"}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_controllers_are_pure() -> None:
    files = sorted(ROOT.rglob("*.py"))
    assert files
    for path in files:
        mods = _imports(path)
        assert mods <= ALLOWED, f"{path.name} imports {sorted(mods - ALLOWED)}"
        assert not mods & FORBIDDEN_STDLIB, f"{path.name} does I/O or reads clocks"

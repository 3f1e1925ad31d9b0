"""The router's components are handed narrow collaborators, never the core.

:class:`router.core.RouterCore` and :func:`router.app.create_app` are the
composition root; every other module gets the services, settings and the few core
operations (:mod:`router.ports`) it uses. The first test keeps it that way; the
second shows what that buys: a component runs against a two-method stand-in.
"""

from __future__ import annotations

import ast
from pathlib import Path

from kairos_common.testing import ManualClock
from router.breaker import CircuitBreakers
from router.config import TimeoutSettings
from router.instances import Instance, InstancePool

ROUTER = Path(__file__).resolve().parents[2] / "router"
COMPOSITION_ROOT = {"core.py", "app.py", "testing.py"}


def _imports_core(path: Path) -> bool:
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module == "router.core":
            return True
        if isinstance(node, ast.Import) and any(a.name == "router.core" for a in node.names):
            return True
    return False


def test_only_the_composition_root_sees_the_core() -> None:
    seeing = {p.name for p in ROUTER.glob("*.py") if _imports_core(p)}
    assert seeing <= COMPOSITION_ROOT, f"{sorted(seeing - COMPOSITION_ROOT)} import the core"


class _Evacuations:
    """Records what the breakers asked to move (an :class:`router.ports.Evacuator`)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, bool, str]] = []

    def evacuate(self, name: str, *, ongoing_too: bool, reason: str) -> None:
        self.calls.append((name, ongoing_too, reason))


def test_breakers_run_on_their_narrow_collaborators() -> None:
    pool = InstancePool(1000)
    first, _second = pool.add("i0", "http://127.0.0.1:1"), pool.add("i1", "http://127.0.0.1:2")
    evacuations, pumped, clock = _Evacuations(), list[Instance](), ManualClock()
    breakers = CircuitBreakers(
        pool,
        evacuations,
        pumped.append,
        clock,
        TimeoutSettings(breaker_failures=2, breaker_open_s=5),
    )
    breakers.failure(first, "timeout")
    assert evacuations.calls == [] and first.eligible
    breakers.failure(first, "timeout")
    assert evacuations.calls == [("i0", True, "breaker")] and not first.eligible
    clock.advance(5.0)
    breakers.tick()
    assert first.eligible and pumped == [first]

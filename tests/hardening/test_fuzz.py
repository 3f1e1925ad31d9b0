"""Generated malformed and odd requests against every route: 0 5xx, 0 tracebacks.

The published run (docs/reliability.md) sends 10,000; ``make test`` sends a few
hundred with a fixed seed so it stays fast and reproducible.
"""

from __future__ import annotations

import re
from pathlib import Path

from router.app import create_app
from router.config import RouterConfig
from scripts.fuzz_router import ROUTES, run_fuzz


def test_fuzzed_requests_never_get_5xx_nor_a_traceback() -> None:
    result = run_fuzz(examples=250, seed_value=7)
    out = result.to_json()
    assert out["requests"] == 250
    assert out["5xx"] == 0, out["examples_5xx"]
    assert out["tracebacks"] == 0, out["examples_tracebacks"]
    assert not out["client_errors"]  # every generated request was really sent
    assert {"2xx", "4xx"} <= set(out["by_class"])  # both sides of the checks were reached


def test_every_route_is_fuzzed(tmp_path: Path) -> None:
    app = create_app(
        RouterConfig(backends=("http://127.0.0.1:9",), state_dir=tmp_path), background=False
    )
    served = set()
    for route in app.router.routes():
        if route.method == "HEAD":
            continue
        path = route.resource.canonical if route.resource is not None else ""
        served.add((route.method, re.sub(r"\{[^}]+\}", "{}", path)))
    fuzzed = {(m, re.sub(r"\{[^}]+\}", "{}", p)) for m, p in ROUTES}
    assert served == fuzzed

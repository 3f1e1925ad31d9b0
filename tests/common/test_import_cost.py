"""``import kairos_common.wire`` stays cheap: no numpy, no controllers.

id-tracker imports the wire contract before it blocks its signals; numpy's BLAS
pool would start threads there that keep SIGTERM deliverable (idtracker/cli.py).
The check runs ``python -X importtime`` in a fresh interpreter, so whatever this
test process already imported does not hide a regression.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

HEAVY = ("numpy", "scipy", "controllers")


def _imported(module: str) -> set[str]:
    """Every module a fresh interpreter loads for ``import module`` (from -X importtime)."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", f"import {module}"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    names: set[str] = set()
    for line in done.stderr.splitlines():
        if line.startswith("import time:") and line.count("|") == 2:
            name = line.rsplit("|", 1)[1].strip()
            if not name.startswith("self [us]"):
                names.add(name)
    assert names, done.stderr[-2000:]
    return names


@pytest.mark.parametrize("module", ["kairos_common.wire", "idtracker.cli", "idtracker.launch"])
def test_module_loads_no_numpy_and_no_controller(module: str) -> None:
    names = _imported(module)
    assert module in names
    heavy = sorted(n for n in names if n.split(".")[0] in HEAVY)
    assert heavy == [], f"import {module} loads {heavy[:10]}"

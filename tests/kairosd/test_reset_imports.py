"""`kairosd reset` runs from systemd's ExecStopPost after a crash, with the GPU
still clocked down: its import path must stay free of the control law."""

from __future__ import annotations

import subprocess
import sys


def test_the_cli_loads_no_controller_and_no_numpy() -> None:
    probe = (
        "import sys, kairosd.cli; "
        "print(sorted(m for m in sys.modules "
        "if m == 'numpy' or m == 'controllers' or m.startswith('controllers.') "
        "or m in ('kairosd.loop', 'kairosd.service', 'zeus')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "[]"

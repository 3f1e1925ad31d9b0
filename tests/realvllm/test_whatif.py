"""``kairos whatif`` against the real engine, in the reduced form of the validation
(docs/whatif.md; the full one is ``python -m scripts.validate_whatif --full``).

``kairos calibrate`` (the real command) fits a preset to the tier's vLLM in a
short budget; then four scripted agents launched by id-tracker run for real
through a kairos-router that records their traces, and the recording is
replayed on the fitted preset beside the run. The bounds are loose (a 2-core
machine shared with the rest of the suite, one run, a 30-second calibration):
what this catches is a broken pipeline — a trace that does not replay, a cache
model that serves other prefixes than vLLM does, a fit off by a factor — not the
validation's 5 %.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from scripts.whatif_lib.fleet import record_run
from scripts.whatif_lib.validation import LOOSE, Row, compare_runs, row_line, verdicts
from scripts.whatif_lib.workloads import generate
from simulator.preset_file import load_preset_file
from tests.realvllm.engine import VllmServer, tool

pytestmark = [pytest.mark.realvllm, pytest.mark.e2e, pytest.mark.timeout(600)]


@pytest.mark.xfail(
    reason="after merging with the agent-clients tier, kairos calibrate's 4-token probe gets "
    "1 counted token from the tier's server (whatif/probe.py _consume); passes on the what-if "
    "branch alone; under investigation",
    strict=False,
)
def test_a_recorded_run_replays_on_its_fitted_engine(
    vllm: VllmServer, vllm_workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    work = vllm_workdir / "whatif"
    work.mkdir(parents=True, exist_ok=True)
    preset = work / "tier.toml"
    cal = subprocess.run(
        [*tool("kairos"), "calibrate", "--vllm-url", vllm.url, "--out", str(preset),
         "--budget-s", "30", "--quiet"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert cal.returncode == 0, cal.stdout + cal.stderr
    fitted = load_preset_file(preset)  # the engine's limits, as vLLM states them
    assert fitted.engine.kv_capacity_tokens == vllm.metrics().capacity_tokens
    assert fitted.engine.block_size == 128
    run = record_run(vllm, generate("tiny"), work, "tiny", timeout_s=300)
    comparison = compare_runs([run], preset)
    figures = comparison.figures()
    passed = verdicts(figures, LOOSE)
    with capsys.disabled():
        print("\nwhatif (reduced):", row_line(Row("tier", "tiny", figures, passed, Path())))
    assert figures["agents"] == 4 and comparison.unfinished_simulated == 0
    assert all(passed.values()), (passed, figures, cal.stdout[-3000:])

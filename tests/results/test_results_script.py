"""Smoke test of ``scripts/results.py`` in ``--quick`` mode, plus its pure parts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from controllers import FrequencyLevels, InstanceSnapshot
from scripts.results import main
from scripts.results_lib.items import ITEMS
from scripts.results_lib.oracle import ScheduleController
from scripts.results_lib.render import fmt
from scripts.results_lib.runs import saving_pct, stat

# The quick run takes ~25 s of CPU; allow for a machine shared with other jobs.
pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def quick_out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("results")
    assert main(["--quick", "--out", str(out), "--jobs", "2"]) == 0
    return out


def test_quick_run_writes_every_item(quick_out: Path) -> None:
    doc = (quick_out / "results.md").read_text()
    for item in ITEMS:
        assert f"## {item.number}. {item.title}" in doc
        assert f"--only {item.name} --quick" in doc
        assert (quick_out / "results" / f"{item.name}.json").exists()
    assert "QUICK MODE" in doc
    assert "Not generated yet" not in doc
    pngs = sorted(p.name for p in (quick_out / "results").glob("*.png"))
    assert len(pngs) >= 7
    for name in pngs:
        assert f"(results/{name})" in doc


def test_quick_oracle_is_feasible_and_not_above_the_best_constant(quick_out: Path) -> None:
    d = json.loads((quick_out / "results" / "oracle.json").read_text())
    (row,) = d["rows"]
    o = row["oracle"]
    assert o["feasible"]
    assert o["p5_agent_throughput_tok_s"] >= row["slo"]
    assert o["completed_agents"] >= o["completion_floor"]
    best = o["constants"][str(o["best_constant_mhz"])]
    assert o["avg_power_w"] <= best["avg_power_w"] + 1e-9
    assert {p["policy"] for p in row["policies"]} >= {"no-control", "kairos"}


def test_only_rerenders_and_keeps_other_items(quick_out: Path) -> None:
    before = json.loads((quick_out / "results" / "fig4.json").read_text())
    assert main(["--quick", "--out", str(quick_out), "--only", "energy", "--jobs", "1"]) == 0
    doc = (quick_out / "results.md").read_text()
    assert "Not generated yet" not in doc
    assert json.loads((quick_out / "results" / "fig4.json").read_text()) == before


def test_unknown_item_is_rejected(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--only", "fig99"])
    err = capsys.readouterr().err
    assert "fig99" in err
    known = err.rsplit("known: ", 1)[1].strip()
    assert known.split(", ") == [i.name for i in ITEMS]  # the error names every item


def test_schedule_controller_follows_windows_and_admits_everyone() -> None:
    levels = FrequencyLevels.from_supported([660, 825, 975, 1785])
    ctrl = ScheduleController(levels, [825, 660, 1785], window_s=300.0)
    clocks = []
    for t in (0.0, 299.0, 300.0, 650.0, 5000.0):
        snap = InstanceSnapshot(now_s=t, epoch=int(t // 5), capacity_tokens=1000)
        clocks.append(ctrl.decide(snap).clock_mhz)
    assert clocks == [825, 825, 660, 1785, 1785]


def test_stat_and_paired_saving() -> None:
    s = stat([1.0, 3.0, None])
    assert s["mean"] == 2.0 and s["n"] == 2 and s["min"] == 1.0
    assert fmt(s, 1) == "2.0 ± 1.4"
    assert fmt(stat([])) == "–"
    sv = saving_pct(
        [{"avg_power_w": 400.0}, {"avg_power_w": 200.0}],
        [{"avg_power_w": 300.0}, {"avg_power_w": 150.0}],
    )
    assert sv["mean"] == pytest.approx(25.0) and sv["sd"] == pytest.approx(0.0)

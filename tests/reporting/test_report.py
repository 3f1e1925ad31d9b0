from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from reporting.metrics import SPEC_JSON_KEYS
from reporting.records import AgentRecord, EpochRecord, RunRecord
from reporting.report import build_reports, group_records
from tests.reporting.conftest import ag, ep, write

REQUIRED = SPEC_JSON_KEYS


def test_daemon_and_router_files_report_together(tmp_path: Path, cli: typer.Typer) -> None:
    daemon0 = write(tmp_path / "g0.jsonl", [ep(i, "g0", 300.0, 900) for i in range(4)])
    daemon1 = write(
        tmp_path / "g1.jsonl", [ep(i, "g1", 500.0, 1980, boost=i == 0) for i in range(4)]
    )
    router = write(tmp_path / "agents.jsonl", [ag("a", 10.0, pending_s=2.0), ag("b", 40.0)])
    result = CliRunner().invoke(cli, ["report", str(daemon0), str(daemon1), str(router), "--json"])
    assert result.exit_code == 0, result.output
    obj = json.loads(result.stdout)
    assert isinstance(obj, dict) and obj.keys() >= REQUIRED
    assert obj["policy"] == "kairos"
    assert obj["energy_j"] == pytest.approx(4 * 5 * (300 + 500))
    assert obj["avg_power_w"] == pytest.approx(800.0)  # two GPUs over the same 20 s
    assert obj["completed_agents"] == 2 and obj["slo_attainment"] == pytest.approx(0.5)
    assert obj["boost_fraction"] == pytest.approx(1 / 8)
    assert obj["preemptions"] == 8 and obj["mean_pending_s"] == pytest.approx(1.0)
    assert obj["instances"]["g0"]["avg_power_w"] == pytest.approx(300.0)
    assert obj["time_at_clock_s"] == {"900": 20.0, "1980": 20.0}

    table = CliRunner().invoke(cli, ["report", str(daemon0), str(daemon1), str(router)])
    assert table.exit_code == 0
    lines = table.stdout.splitlines()
    assert lines[0].startswith("policy kairos")
    assert any(ln.startswith("g0 ") for ln in lines) and any(ln.startswith("TOTAL") for ln in lines)
    assert "900: 20s (50%)" in table.stdout


def test_simulator_runs_compare_as_a_list_and_slo_flag(tmp_path: Path, cli: typer.Typer) -> None:
    recs: list[EpochRecord | AgentRecord | RunRecord] = []
    for policy, power in (("kairos", 300.0), ("no-control", 450.0)):
        run = f"sim-{policy}"
        counters = {"preemptions": 7.0, "recomputed_tokens": 1234.0}
        recs.append(
            RunRecord(run, policy, "sim", duration_s=20.0, slo_tok_s=20.0, counters=counters)
        )
        recs += [ep(i, "i0", power, 1000, policy=policy, run=run) for i in range(4)]
        recs += [ag(f"{policy}-a", 25.0, run=run), ag(f"{policy}-b", 30.0, run=run)]
    path = write(tmp_path / "sim.jsonl", recs)
    result = CliRunner().invoke(cli, ["report", str(path), "--json", "--slo", "28"])
    assert result.exit_code == 0, result.output
    objs = json.loads(result.stdout)
    assert [o["policy"] for o in objs] == ["kairos", "no-control"]
    assert objs[0]["preemptions"] == 7 and objs[0]["recomputed_tokens"] == 1234
    assert objs[0]["slo_attainment"] == pytest.approx(0.5)  # 25 < 28 ≤ 30
    assert objs[1]["avg_power_w"] == pytest.approx(450.0)
    assert objs[0]["completed_agents"] == 2


def test_plots_are_written(tmp_path: Path, cli: typer.Typer) -> None:
    path = write(tmp_path / "g0.jsonl", [ep(i, "g0", 300.0 + i, 900 + 15 * i) for i in range(6)])
    out = tmp_path / "plots"
    result = CliRunner().invoke(cli, ["report", str(path), "--plots", str(out)])
    assert result.exit_code == 0, result.output
    pngs = list(out.glob("*.png"))
    assert len(pngs) == 1 and pngs[0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bad_input_is_a_clear_error(tmp_path: Path, cli: typer.Typer) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"kind": "epoch", "t_s": 1}\nnot json\n')
    result = CliRunner().invoke(cli, ["report", str(bad)])
    assert result.exit_code == 2
    assert "bad.jsonl:1" in result.stderr
    missing = CliRunner().invoke(cli, ["report", str(tmp_path / "nope.jsonl")])
    assert missing.exit_code == 2


def test_agents_of_unlabelled_router_file_with_several_policies_stay_separate() -> None:
    recs = [ep(0, "g0", 100.0, 900, policy="kairos"), ep(0, "g1", 200.0, 900, policy="fixed:900")]
    recs_all: list[EpochRecord | AgentRecord | RunRecord] = [*recs, ag("x", 30.0)]
    groups = group_records(recs_all)
    assert {g.policy for g in groups} == {"kairos", "fixed:900", "unknown"}
    reports = build_reports(recs_all)
    assert sum(r.total.completed_agents for r in reports) == 1

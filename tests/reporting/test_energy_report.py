"""``kairos report`` with energy per agent: table, JSON and plot; sub-agents sum into parents."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from reporting.energy import energy_rows, with_energy
from reporting.records import AgentRecord
from tests.reporting.conftest import ag, ep, write


def _agents() -> list[AgentRecord]:
    parent = dataclasses.replace(ag("p", 30.0), name="swe-1")
    child = dataclasses.replace(ag("c", 20.0), name="swe-1/sub-1", parent_id="p")
    other = dataclasses.replace(ag("o", 40.0), name="swe-2")
    return with_energy([child, parent, other], {"p": (10.0, 90.0), "c": (5.0, 45.0)})


def test_sub_agents_sum_into_parents_and_groups_count_each_joule_once() -> None:
    child, parent, other = _agents()
    assert parent.energy_own_j == 100.0 and parent.energy_j == 150.0
    assert child.energy_j == 50.0 and child.energy_prefill_j == 5.0
    assert other.energy_j == 0.0  # no attributed work
    rows = energy_rows([child, parent, other])
    (run,) = rows["run"]
    assert run.energy_j == 150.0 and run.agents == 3
    (swe,) = rows["name"]
    assert swe.scope == "swe" and swe.energy_j == 150.0
    assert rows["agent"][0].energy_j == 150.0
    assert run.j_per_output_token == pytest.approx(150.0 / (300 + 200 + 400))


def test_report_shows_the_energy_table_json_and_plot(tmp_path: Path, cli: typer.Typer) -> None:
    epochs = write(tmp_path / "g0.jsonl", [ep(i, "g0", 300.0, 900) for i in range(4)])
    agents = write(tmp_path / "agents.jsonl", list(_agents()))
    table = CliRunner().invoke(cli, ["report", str(epochs), str(agents)])
    assert table.exit_code == 0, table.output
    assert "energy per agent" in table.stdout and "per agent name:" in table.stdout
    assert "150 J = 2.5% of the 6000 J measured" in table.stdout
    out = CliRunner().invoke(cli, ["report", str(epochs), str(agents), "--json"])
    obj = json.loads(out.stdout)
    assert obj["agent_energy"]["run"][0]["energy_j"] == 150.0
    plots = tmp_path / "plots"
    res = CliRunner().invoke(cli, ["report", str(epochs), str(agents), "--plots", str(plots)])
    assert res.exit_code == 0, res.output
    assert sorted(p.name for p in plots.glob("*.png")) == ["kairos-agent-energy.png", "kairos.png"]


def test_records_without_energy_show_no_energy_table(tmp_path: Path, cli: typer.Typer) -> None:
    agents = write(tmp_path / "agents.jsonl", [ag("a", 30.0)])
    table = CliRunner().invoke(cli, ["report", str(agents)])
    assert table.exit_code == 0 and "energy per agent" not in table.stdout

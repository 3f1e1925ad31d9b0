"""Records and the ``kairos report`` CLI shared by the reporting tests."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer

from reporting.cli import register
from reporting.records import AgentRecord, EpochRecord, JsonlWriter, RunRecord


def ep(i: int, inst: str, power: float, clock: int, policy: str = "kairos", run: str = "",
       boost: bool = False) -> EpochRecord:  # fmt: skip
    return EpochRecord(
        t_s=1000.0 + 5.0 * (i + 1), instance=inst, epoch=i, epoch_s=5.0, policy=policy,
        target_clock_mhz=clock, actual_clock_mhz=clock, energy_j=power * 5.0,
        avg_power_w=power, usage_tokens=1000 * i, capacity_tokens=100_000, ongoing=2,
        pending=0, min_throughput_tok_s=30.0, boost=boost, deferred=False, run=run,
        output_tokens=100, preemptions=1,
    )  # fmt: skip


def ag(aid: str, tput: float, run: str = "", pending_s: float = 0.0) -> AgentRecord:
    return AgentRecord(
        agent_id=aid, start_s=1000.0, end_s=1020.0, turns=3, decode_tokens=int(tput * 10),
        prompt_tokens=50, llm_time_s=10.0, pending_s=pending_s, throughput_tok_s=tput,
        slo_tok_s=20.0, slo_met=tput >= 20.0, run=run,
    )  # fmt: skip


@pytest.fixture
def cli() -> typer.Typer:
    app = typer.Typer()
    register(app)

    @app.command()
    def other() -> None:  # a second command keeps `report` a named subcommand
        """Unused."""

    return app


def write(path: Path, records: list[EpochRecord | AgentRecord | RunRecord]) -> Path:
    with JsonlWriter(path) as w:
        for r in records:
            w.write(r)
    return path

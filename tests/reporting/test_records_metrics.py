from __future__ import annotations

from pathlib import Path

import pytest

from reporting.metrics import percentile, slo_attainment, summarize
from reporting.records import AgentRecord, EpochRecord, JsonlWriter, RecordError, read_records


def epoch(i: int, energy: float, clock: int, boost: bool = False, inst: str = "g0") -> EpochRecord:
    return EpochRecord(
        t_s=5.0 * i,
        instance=inst,
        epoch=i,
        epoch_s=5.0,
        policy="kairos",
        target_clock_mhz=clock,
        actual_clock_mhz=clock,
        energy_j=energy,
        avg_power_w=energy / 5.0,
        usage_tokens=0,
        capacity_tokens=1,
        ongoing=0,
        pending=0,
        min_throughput_tok_s=None,
        boost=boost,
        deferred=False,
    )


def agent(aid: str, dec: int, t: float) -> AgentRecord:
    return AgentRecord(
        agent_id=aid,
        start_s=0,
        end_s=t,
        turns=1,
        decode_tokens=dec,
        prompt_tokens=10,
        llm_time_s=t,
        pending_s=1.0,
        throughput_tok_s=dec / t,
        slo_tok_s=20.0,
        slo_met=dec / t >= 20.0,
    )


def test_roundtrip(tmp_path: Path) -> None:
    p = tmp_path / "r.jsonl"
    recs = [epoch(1, 100.0, 900), agent("a", 100, 2.0)]
    with JsonlWriter(p) as w:
        for r in recs:
            w.write(r)
    assert list(read_records([p])) == recs


def test_bad_line_names_file_and_line(tmp_path: Path) -> None:
    p = tmp_path / "r.jsonl"
    p.write_text('{"kind":"epoch"}\n')
    with pytest.raises(RecordError, match=r"r.jsonl:1"):
        list(read_records([p]))


def test_metric_definitions() -> None:
    assert percentile([], 5) is None
    assert percentile([1.0, 2.0, 3.0], 50) == 2.0
    assert slo_attainment([10, 20, 30], 20) == pytest.approx(2 / 3)


def test_summary() -> None:
    epochs = [epoch(1, 1000.0, 900), epoch(2, 2000.0, 1785, boost=True)]
    agents = [agent("a", 100, 2.0), agent("b", 30, 3.0)]
    s = summarize("kairos", epochs, agents, slo_tok_s=20.0)
    assert s.avg_power_w == pytest.approx(300.0)
    assert s.energy_per_output_token_j == pytest.approx(3000 / 130)
    assert s.boost_fraction == pytest.approx(0.5)
    assert s.slo_attainment == pytest.approx(0.5)
    assert s.time_at_clock_s == {900: 5.0, 1785: 5.0}
    assert s.job_throughput_per_s == pytest.approx(2 / 10.0)


def test_summary_carries_every_spec_json_key() -> None:
    from dataclasses import fields

    from reporting.metrics import SPEC_JSON_KEYS, Summary

    assert {f.name for f in fields(Summary)} >= SPEC_JSON_KEYS

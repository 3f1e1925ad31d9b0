"""The validation's verdicts and table (scripts/whatif_lib/validation.py), and its
workloads (scripts/whatif_lib/workloads.py), without an engine."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from scripts.whatif_lib.validation import FULL, Row, markdown_table, verdict, verdicts
from scripts.whatif_lib.workloads import generate


def _figures(**over: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "agents": 24, "llm_time_median_abs_error": 0.03, "llm_time_p90_abs_error": 0.08,
        "ttft_error": -0.04, "ttft_simulated_s": 0.05, "ttft_measured_s": 0.052,
        "preemptions_simulated": 0.0, "preemptions_measured": 0.0, "preemptions_error": 0.0,
        "prefix_hits_simulated": 1000.0, "prefix_hits_measured": 1000.0,
        "prefix_hits_error": 0.0, "noise_median_abs": 0.01, "noise_p90_abs": 0.04,
    }  # fmt: skip
    return {**base, **over}


def test_the_issues_bounds() -> None:
    assert all(verdicts(_figures(), FULL).values())
    assert not verdicts(_figures(llm_time_median_abs_error=0.051), FULL)["llm_median"]
    assert not verdicts(_figures(llm_time_p90_abs_error=0.11), FULL)["llm_p90"]
    assert not verdicts(_figures(ttft_error=0.12), FULL)["ttft"]
    assert not verdicts(_figures(prefix_hits_error=-0.11), FULL)["prefix_hits"]
    few = _figures(preemptions_simulated=11.0, preemptions_measured=10.0, preemptions_error=0.1)
    assert verdicts(few, FULL)["preemptions"]
    none_sim = _figures(preemptions_simulated=0.0, preemptions_measured=4.0, preemptions_error=-1)
    assert not verdicts(none_sim, FULL)["preemptions"]


def test_a_busy_machine_makes_a_row_not_valid() -> None:
    figures = _figures()
    quiet = Row("A", "short", figures, verdicts(figures, FULL), Path("x.png"), contention=0.02)
    busy = Row("A", "long", figures, verdicts(figures, FULL), Path("y.png"), contention=0.6)
    assert quiet.valid and verdict(quiet) == "PASS"
    assert not busy.valid and verdict(busy).startswith("NOT VALID ON THIS MACHINE")
    table = markdown_table([quiet, busy])
    assert table.count("\n") == 3 and "| pass |" in table and "not valid" in table


def test_the_workloads_are_what_the_issue_asks() -> None:
    short, long = generate("short"), generate("long")
    assert len(short) >= 20 and len(long) >= 3
    assert generate("short") == short  # seeded: the same programs in every repeat
    assert max(t["prompt_tokens"] + t["output_tokens"] for a in short for t in a.turns) < 10_000
    firsts = [a.turns[0]["prompt_tokens"] for a in long]
    assert min(firsts) >= 10_000  # tens of thousands of tokens
    for agent in [*short, *long]:
        context = 0
        for turn in agent.turns:  # every turn extends the whole previous context
            assert turn["shared_prefix_tokens"] == context
            context = turn["prompt_tokens"] + turn["output_tokens"]

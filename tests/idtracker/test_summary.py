"""``id-tracker --summary``: what the agent run cost, printed when it ends."""

from __future__ import annotations

import dataclasses

import pytest

from idtracker.summary import energy_text, missing_line, summary_line
from idtracker.testing import StandInRouter
from kairos_common.errors import WireFormatError
from kairos_common.wire import AgentEnd, AgentEndReply, AgentSummary
from tests.idtracker.conftest import agent, run_tracker

BILL = AgentSummary(
    agent_id="x", turns=57, decode_tokens=48_213, prompt_tokens=900_000, llm_time_s=2061.3,
    pending_s=0.0, end_reason="exit", final=True, name="swe", throughput_tok_s=23.39,
    slo_tok_s=20.0, slo_met=True, energy_j=12_400.0,
)  # fmt: skip


@pytest.mark.e2e
@pytest.mark.timeout(60)
def test_summary_is_printed_on_stderr_when_the_agent_ends(base_env: dict[str, str]) -> None:
    with StandInRouter(summary=BILL) as router:
        done = run_tracker(router.url, base_env, agent("openai_agent.py", "1", "0"), "--summary")
        assert done.returncode == 0, done.stderr
        (start,) = router.starts
        assert router.wait_end(start.agent_id).summary_wait_s == 15.0  # the default wait
        assert done.stderr == (
            f"id-tracker: agent swe ({start.agent_id}) exit: 57 requests, 48213 output "
            "tokens, 23.4 tok/s, SLO 20 met, held 0.0 s; energy 12.4 kJ (3.44 Wh, "
            "0.257 J/output token)\n"
        )
        assert '"agent_id"' in done.stdout  # the agent's own output is untouched


@pytest.mark.e2e
@pytest.mark.timeout(60)
def test_summary_from_the_environment_and_from_an_older_router(
    router: StandInRouter, base_env: dict[str, str]
) -> None:
    base_env["KAIROS_SUMMARY"] = "true"
    done = run_tracker(router.url, base_env, ["true"], "--summary-wait-s", "2.5")
    assert done.returncode == 0
    (start,) = router.starts
    assert router.wait_end(start.agent_id).summary_wait_s == 2.5
    assert done.stderr == missing_line(delivered=True) + "\n"  # this stand-in sends none


@pytest.mark.e2e
@pytest.mark.timeout(60)
def test_no_summary_unless_asked(router: StandInRouter, base_env: dict[str, str]) -> None:
    done = run_tracker(router.url, base_env, ["true"])
    assert done.returncode == 0 and done.stderr == ""
    (start,) = router.starts
    assert router.wait_end(start.agent_id).summary_wait_s == 0.0


def test_summary_line_says_what_is_not_final_or_not_measured() -> None:
    so_far = dataclasses.replace(BILL, final=False, energy_j=532.0)
    assert "energy so far 532 J (0.148 Wh, 0.011 J/output token); the router's record" in (
        summary_line(so_far)
    )
    unmeasured = dataclasses.replace(BILL, energy_j=None, slo_met=False)
    line = summary_line(unmeasured)
    assert "SLO 20 missed" in line and "energy not measured" in line
    silent = dataclasses.replace(BILL, throughput_tok_s=None, decode_tokens=0)
    assert "no throughput" in summary_line(silent) and "J/output token" not in summary_line(silent)
    assert [energy_text(j) for j in (0.5, 999.0, 1500.0, 3.2e6)] == [
        "0.5 J", "999 J", "1.5 kJ", "3.2 MJ",
    ]  # fmt: skip
    assert "did not confirm" in missing_line(delivered=False)


def test_the_summary_wire_round_trips_and_rejects_bad_numbers() -> None:
    reply = AgentEndReply(BILL)
    assert AgentEndReply.from_json(reply.to_json()) == reply
    assert AgentEndReply.from_json({"ok": True}) == AgentEndReply()
    for field, bad in (("energy_j", -1.0), ("energy_j", 1e300), ("turns", 1.5), ("final", 1)):
        with pytest.raises(WireFormatError, match=field):
            AgentSummary.from_json({**BILL.to_json(), field: bad})
    for wait in (-0.1, 60.5, float("nan")):
        with pytest.raises(WireFormatError, match="summary_wait_s"):
            AgentEnd.from_json({"exit_code": 0, "summary_wait_s": wait})

"""The end call's summary: what an agent run cost, waited for until its last joules
are attributed (``AgentEnd.summary_wait_s``), as ``id-tracker --summary`` asks."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from kairos_common.testing import decision
from kairos_common.wire import AgentSummary
from reporting.records import AgentRecord, read_records
from router.testing import FakeBackend, RunningRouter
from tests.router.conftest import StartRouter, control, end_body, one_turn, start_agent

DECISION = "/kairos/v1/instances/i0/decision"


async def _measured(router: RunningRouter, epoch: int, total_j: float) -> None:
    """The instance's daemon reports its energy counter (a decision admitting nobody)."""
    body = decision("i0", epoch, energy_total_j=total_j).to_json()
    status, ack = await control("POST", router.url + DECISION, body)
    assert status == 200 and ack["accepted"], ack


async def _end(router: RunningRouter, token: str, **extra: Any) -> tuple[int, Any]:
    agent_id = token.split(".")[1]
    body = {**end_body(router, token), **extra}
    return await control("POST", f"{router.url}/kairos/v1/agents/{agent_id}/end", body)


async def test_the_end_call_waits_for_the_runs_last_joules(
    make_router: StartRouter, backend: FakeBackend, tmp_path: Path
) -> None:
    records = tmp_path / "agents.jsonl"
    router = await make_router([backend.url], records=records)
    await _measured(router, 1, 0.0)  # the daemon's counter starts
    token = await start_agent(router.url, name="swe", slo_tok_s=1.0)
    agent_id = token.split(".")[1]
    await one_turn(router, token)
    ending = asyncio.create_task(_end(router, token, summary_wait_s=30))
    await router.core.admission.wait_until(lambda: router.core.ledger.get(agent_id) is None)
    assert not ending.done()  # its request's joules are not measured yet
    await _measured(router, 2, 400.0)
    status, reply = await ending
    assert status == 200 and reply["ok"] is True
    summary = AgentSummary.from_json(reply["summary"])
    (record,) = [r for r in read_records([records]) if isinstance(r, AgentRecord)]
    assert summary.final and summary.energy_j is not None and summary.energy_j > 0
    assert summary.energy_j == record.energy_j
    assert (summary.agent_id, summary.name, summary.turns) == (agent_id, "swe", 1)
    assert summary.decode_tokens == record.decode_tokens > 0
    assert summary.slo_met is True and summary.end_reason == "exit"
    assert len(router.core.watch) == 0


async def test_a_summary_not_final_in_time_says_so(
    make_router: StartRouter, backend: FakeBackend
) -> None:
    router = await make_router([backend.url])
    await _measured(router, 1, 0.0)
    token = await start_agent(router.url)
    await one_turn(router, token)
    status, reply = await _end(router, token, summary_wait_s=0.05)
    assert status == 200
    summary = AgentSummary.from_json(reply["summary"])
    assert not summary.final and summary.turns == 1
    assert summary.energy_j == 0.0  # measured, but no epoch closed since the request
    assert len(router.core.watch) == 0  # the waiter that timed out is gone


async def test_without_a_daemon_measuring_the_summary_is_final_at_once(
    make_router: StartRouter, backend: FakeBackend
) -> None:
    router = await make_router([backend.url])
    token = await start_agent(router.url)
    await one_turn(router, token)
    status, reply = await _end(router, token, summary_wait_s=30)
    assert status == 200
    summary = AgentSummary.from_json(reply["summary"])
    assert summary.final and summary.energy_j is None and summary.turns == 1


async def test_an_end_without_summary_answers_as_before_and_bad_waits_are_refused(
    make_router: StartRouter, backend: FakeBackend
) -> None:
    router = await make_router([backend.url])
    first, second = await start_agent(router.url), await start_agent(router.url)
    for bad in (61, -1, "10", True):
        status, body = await _end(router, first, summary_wait_s=bad)
        assert status == 400 and "summary_wait_s" in body["error"]["message"]
    assert router.core.ledger.get(first.split(".")[1]) is not None  # nothing ended
    assert await _end(router, second) == (200, {"version": 2, "ok": True})
    status, body = await _end(router, second, summary_wait_s=1)
    assert status == 404 and len(router.core.watch) == 0


async def test_an_agent_still_ending_is_summed_up_so_far(
    make_router: StartRouter, backend: FakeBackend
) -> None:
    """An end that waits for a request in flight leaves the agent live: its summary,
    if the wait runs out first, is what it has done so far."""
    router = await make_router([backend.url])
    await _measured(router, 1, 0.0)
    token = await start_agent(router.url, name="lead")
    await one_turn(router, token)
    agent_id = token.split(".")[1]
    summary = router.core.agents.summary(agent_id, None)
    assert summary is not None and not summary.final
    assert (summary.name, summary.turns, summary.end_reason) == ("lead", 1, "end")
    assert summary.energy_j == 0.0  # its instance measures; no epoch closed yet
    assert router.core.agents.summary("nobody", None) is None


async def test_an_ended_agent_waiting_for_its_joules_has_a_status(
    make_router: StartRouter, backend: FakeBackend
) -> None:
    """Between its end and its record (its last joules not measured yet), the
    agent's status says ``ended``, with what it did; once written, 404."""
    router = await make_router([backend.url])
    await _measured(router, 1, 0.0)
    token = await start_agent(router.url, name="swe")
    agent_id = token.split(".")[1]
    await one_turn(router, token)
    url = f"{router.url}/kairos/v1/agents/{agent_id}"
    assert (await control("GET", url))[1]["state"] == "ongoing"
    assert await _end(router, token) == (200, {"version": 2, "ok": True})
    status, body = await control("GET", url)
    assert status == 200, body
    assert (body["state"], body["name"], body["turns"], body["end_reason"]) == (
        "ended",
        "swe",
        1,
        "exit",
    )
    assert body["energy_j"] == 0.0 and body["decode_tokens"] > 0
    await _measured(router, 2, 400.0)  # its last joules: the record is written
    status, _ = await control("GET", url)
    assert status == 404

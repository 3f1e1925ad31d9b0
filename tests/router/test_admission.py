"""Admission hold: FIFO release in arrival order, bounds (429/503 + Retry-After),
kairosd decisions (versioned, idempotent), fast path, and the local fallback."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from controllers import KAIROS, KAIROS_ALG1
from controllers.types import ADMIT_ALL
from kairos_common.errors import ConfigError
from kairos_common.testing import ManualClock, decision
from kairos_common.wire import InstanceState
from reporting.metrics import summarize
from reporting.records import GAVE_UP, read_records
from router.config import AdmissionSettings, RouterConfig
from router.testing import FakeBackend, RunningRouter
from tests.router.conftest import (
    CHAT,
    StartRouter,
    agent_key,
    control,
    end_agent,
    start_agent,
)

BIG: list[ChatCompletionMessageParam] = [
    {"role": "user", "content": "x" * 20_000}
]  # estimated ≈ 5000 tokens before usage


def _client(router: RunningRouter, token: str, real: str = "sk-user") -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url=router.url + "/v1", api_key=agent_key(token, real), max_retries=0
    )


async def _turn(router: RunningRouter, token: str, messages: Any = CHAT, real: str = "sk") -> None:
    client = _client(router, token, real)
    try:
        await client.chat.completions.create(model="fake-model", messages=messages)
    finally:
        await client.close()


async def _filled(make_router: StartRouter, backend: FakeBackend, **kw: Any) -> RunningRouter:
    """A router whose only instance (U_max = 10000) is above γ·U_max after agent A's turn."""
    backend.behaviour.capacity_tokens = 10_000
    backend.behaviour.prompt_tokens = 9_500
    router = await make_router([backend.url], **kw)
    await router.health.check_once()
    return router


def _aid(token: str) -> str:
    return token.split(".")[1]


async def test_held_agents_released_in_arrival_order(
    make_router: StartRouter, backend: FakeBackend
) -> None:
    router = await _filled(make_router, backend)
    adm = router.core.admission
    a = await start_agent(router.url)
    await _turn(router, a, real="sk-a")
    held = {}
    for name in ("b", "c", "d"):
        tok = await start_agent(router.url)
        held[name] = (tok, asyncio.create_task(_turn(router, tok, BIG, real=f"sk-{name}")))
        n = len(held)
        await adm.wait_until(lambda n=n: len(adm.queue("i0")) == n)  # type: ignore[misc]
    assert adm.queue("i0").order() == [_aid(t) for t, _ in held.values()]
    assert len(backend.received) == 1
    _, state = await control("GET", router.url + "/kairos/v1/instances/i0/state")
    assert [p.agent_id for p in InstanceState.from_json(state).pending] == adm.queue("i0").order()

    await end_agent(router, a)  # frees 9504 tokens: head (≈5000 est.) fits, the next would not
    await held["b"][1]
    for name in ("c", "d"):
        assert not held[name][1].done()
    _, c_status = await control("GET", f"{router.url}/kairos/v1/agents/{_aid(held['c'][0])}")
    assert c_status["state"] == "pending" and c_status["queue_position"] == 0
    await end_agent(router, held["b"][0])
    await held["c"][1]
    assert not held["d"][1].done()
    await end_agent(router, held["c"][0])
    await held["d"][1]
    keys = [r.headers["Authorization"] for r in backend.received]
    assert keys == ["Bearer sk-a", "Bearer sk-b", "Bearer sk-c", "Bearer sk-d"]
    d = router.core.ledger.get(_aid(held["d"][0]))
    assert d is not None and d.pending_s > 0 and d.llm_time_s >= d.pending_s


async def test_queue_full_429_and_timeout_503_with_retry_after(
    make_router: StartRouter, backend: FakeBackend
) -> None:
    settings = AdmissionSettings(max_pending_agents=1, max_wait_s=30.0, retry_after_s=7.0)
    router = await _filled(make_router, backend, admission=settings)
    adm = router.core.admission
    a = await start_agent(router.url)
    await _turn(router, a)
    b = await start_agent(router.url)
    b_task = asyncio.create_task(_turn(router, b))
    await adm.wait_until(lambda: len(adm.queue("i0")) == 1)
    c = await start_agent(router.url)
    body = {"model": "fake-model", "messages": CHAT}
    async with (
        aiohttp.ClientSession() as s,
        s.post(
            router.url + "/v1/chat/completions",
            json=body,
            headers={"Authorization": f"Bearer {agent_key(c)}"},
        ) as r,
    ):
        assert r.status == 429 and r.headers["Retry-After"] == "7"
        assert (await r.json())["error"]["code"] == "admission_queue_full"
    b_task.cancel()
    await asyncio.gather(b_task, return_exceptions=True)
    await adm.wait_until(lambda: len(adm.queue("i0")) == 0)  # a gone client leaves the queue

    short = AdmissionSettings(max_wait_s=0.05, retry_after_s=3.0)
    router2 = await _filled(make_router, backend, admission=short, state_dir=None)
    x = await start_agent(router2.url)
    await _turn(router2, x)
    y = await start_agent(router2.url)
    async with (
        aiohttp.ClientSession() as s,
        s.post(
            router2.url + "/v1/chat/completions",
            json=body,
            headers={"Authorization": f"Bearer {agent_key(y)}"},
        ) as r,
    ):
        assert r.status == 503 and r.headers["Retry-After"] == "3"
        assert (await r.json())["error"]["code"] == "admission_timeout"
    assert len(router2.core.admission.queue("i0")) == 0


async def test_a_session_whose_held_requests_gave_up_ends_recorded_as_gave_up(
    make_router: StartRouter, backend: FakeBackend, tmp_path: Path
) -> None:
    """A session that never ran because its held request got the 503 ends with
    ``end_reason`` ``gave-up`` whatever its end signal, so ``kairos report`` counts
    it as a missed SLO and not as a session done, as the simulator does."""
    records = tmp_path / "agents.jsonl"
    short = AdmissionSettings(max_wait_s=0.05)
    router = await _filled(make_router, backend, admission=short, records=records)
    ran = await start_agent(router.url)
    await _turn(router, ran)
    held = await start_agent(router.url)
    with pytest.raises(openai.InternalServerError) as err:  # the 503 after max_wait_s
        await _turn(router, held)
    assert err.value.status_code == 503
    await end_agent(router, held)
    await end_agent(router, ran)
    recs = {r.agent_id: r for r in read_records([records])}
    gave_up, done = recs[_aid(held)], recs[_aid(ran)]
    assert (gave_up.end_reason, gave_up.turns, gave_up.exit_code) == (GAVE_UP, 0, 0)
    assert gave_up.pending_s > 0.0
    assert (done.end_reason, done.turns) == ("exit", 1)
    summary = summarize("router", [], list(recs.values()), slo_tok_s=1.0)
    assert (summary.completed_agents, summary.gave_up_agents) == (1, 1)
    ended = router.core.metrics.registry.get_sample_value(
        "kairos_router_agents_ended_total", {"reason": GAVE_UP}
    )
    assert ended == 1.0


def _decision(epoch: int, admit: tuple[str, ...] = (), start: float = 100.0, **kw: Any) -> Any:
    return decision("i0", epoch, admit=admit, start_unix_s=start, **kw).to_json()


async def test_daemon_decisions_versioned_and_never_admit_twice(
    make_router: StartRouter, backend: FakeBackend
) -> None:
    router = await _filled(make_router, backend)
    adm = router.core.admission
    url = router.url + "/kairos/v1/instances/i0/decision"
    a = await start_agent(router.url)
    await _turn(router, a)
    status, ack = await control("POST", url, _decision(1, valid_for_s=60.0))
    assert status == 200 and ack["accepted"]
    b = await start_agent(router.url)
    b_task = asyncio.create_task(_turn(router, b))
    await adm.wait_until(lambda: _aid(b) in adm.queue("i0"))
    await end_agent(router, a)
    assert _aid(b) in adm.queue("i0")  # fresh daemon: no local admission, wait for its epoch
    status, ack = await control("POST", url, _decision(2, (_aid(b),)))
    assert ack == {"version": 2, "accepted": True, "admitted": [_aid(b)], "reason": ""}
    await b_task
    _, dup = await control("POST", url, _decision(2, (_aid(b),)))
    _, late = await control("POST", url, _decision(1, (_aid(b),)))
    assert not dup["accepted"] and "duplicate" in dup["reason"]
    assert not late["accepted"] and "stale" in late["reason"]
    _, restarted = await control("POST", url, _decision(0, (_aid(b),), start=200.0))
    assert restarted["accepted"] and restarted["admitted"] == []  # b is not pending: no-op
    metrics = router.core.metrics.render().decode()
    assert 'kairos_router_admissions_total{instance="i0",source="daemon"} 1.0' in metrics
    status, bad = await control("POST", url, {"instance": "i0"})
    assert status == 400 and "daemon_id" in bad["error"]["message"]
    old = {**_decision(3), "version": 1}  # a daemon of the release before
    status, refused = await control("POST", url, old)
    assert status == 400 and refused["error"]["code"] == "unsupported_wire_version"
    assert "version 1 is not supported: this side speaks version 2" in refused["error"]["message"]


async def test_fast_path_and_defer(make_router: StartRouter, backend: FakeBackend) -> None:
    router = await make_router([backend.url])
    await router.health.check_once()
    url = router.url + "/kairos/v1/instances/i0/decision"
    await control("POST", url, _decision(1, valid_for_s=60.0))
    a = await start_agent(router.url)
    await _turn(router, a)  # low load: admitted at once, not an epoch later
    agent = router.core.ledger.get(_aid(a))
    assert agent is not None and agent.admitted and agent.pending_s == 0.0
    await control("POST", url, _decision(2, valid_for_s=60.0, defer=True))
    b = await start_agent(router.url)
    b_task = asyncio.create_task(_turn(router, b))
    adm = router.core.admission
    await adm.wait_until(lambda: _aid(b) in adm.queue("i0"))
    await control("POST", url, _decision(3, (_aid(b),), valid_for_s=60.0))
    await b_task


async def test_daemon_without_admission_control_is_never_held(
    make_router: StartRouter, backend: FakeBackend
) -> None:
    """A no-control daemon admits everyone; the router's fast path must not hold
    agents for an epoch even above β·U_max (the same rule would)."""
    router = await _filled(make_router, backend)
    url = router.url + "/kairos/v1/instances/i0/decision"
    a = await start_agent(router.url)
    await _turn(router, a)  # fills the instance above γ·U_max
    await control("POST", url, _decision(1, valid_for_s=60.0, rule=ADMIT_ALL))
    b = await start_agent(router.url)
    await _turn(router, b, BIG)  # would be held under KAIROS's rule
    agent = router.core.ledger.get(_aid(b))
    assert agent is not None and agent.admitted and agent.pending_s == 0.0


async def test_stale_daemon_falls_back_to_local_rule(
    make_router: StartRouter, backend: FakeBackend
) -> None:
    clock = ManualClock()
    router = await _filled(make_router, backend, clock=clock)
    adm = router.core.admission
    url = router.url + "/kairos/v1/instances/i0/decision"
    a = await start_agent(router.url)
    await _turn(router, a)
    await control("POST", url, _decision(1, valid_for_s=5.0))
    b = await start_agent(router.url)
    b_task = asyncio.create_task(_turn(router, b))
    await adm.wait_until(lambda: _aid(b) in adm.queue("i0"))
    await end_agent(router, a)
    adm.pump_all()
    assert _aid(b) in adm.queue("i0")  # daemon still fresh
    clock.advance(6.0)
    adm.pump_all()  # what the maintenance loop does each second
    await b_task
    metrics = router.core.metrics.render().decode()
    assert 'kairos_router_admissions_total{instance="i0",source="local"} 1.0' in metrics


async def test_runs_without_capacity_admits_everything(
    make_router: StartRouter, backend: FakeBackend
) -> None:
    backend.behaviour.capacity_tokens = None
    backend.behaviour.prompt_tokens = 10**9
    router = await make_router([backend.url])
    await router.health.check_once()
    for _ in range(3):
        await _turn(router, await start_agent(router.url))
    assert len(backend.received) == 3


async def test_an_agent_that_comes_back_within_the_grace_keeps_its_place(
    make_router: StartRouter, backend: FakeBackend
) -> None:
    """A held agent whose request gave up (here: its client left; a 503 after
    ``max_wait_s`` takes the same path) and that retries within
    ``requeue_grace_s`` goes back ahead of agents that arrived after it; later
    than that, it queues at the back like a newcomer."""
    clock = ManualClock()
    settings = AdmissionSettings(requeue_grace_s=60.0)
    router = await _filled(make_router, backend, clock=clock, admission=settings)
    adm = router.core.admission
    q = adm.queue("i0")
    await _turn(router, await start_agent(router.url))  # fills i0
    b, c = await start_agent(router.url), await start_agent(router.url)

    async def held(token: str) -> asyncio.Task[None]:
        task = asyncio.create_task(_turn(router, token))
        await adm.wait_until(lambda: _aid(token) in q)
        return task

    async def leave(task: asyncio.Task[None], token: str) -> None:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await adm.wait_until(lambda: _aid(token) not in q)

    b_first = await held(b)
    clock.advance(1.0)
    await leave(b_first, b)
    c_task = await held(c)
    clock.advance(30.0)
    b_again = await held(b)
    assert q.order() == [_aid(b), _aid(c)]
    _, status = await control("GET", f"{router.url}/kairos/v1/agents/{_aid(b)}")
    assert status["queue_position"] == 0

    await leave(b_again, b)
    clock.advance(61.0)  # past the grace: a newcomer's place
    b_late = await held(b)
    assert q.order() == [_aid(c), _aid(b)]
    for task, token in ((b_late, b), (c_task, c)):
        await leave(task, token)


def test_the_router_s_own_rule_is_its_policy_s_with_the_operator_s_thresholds() -> None:
    """No dummy controller, no second copy of the law: the rule of the ``policy`` the
    daemons run, with ``[admission] beta`` / ``gamma`` if the operator set them."""
    assert RouterConfig().rule() == KAIROS.rule
    assert RouterConfig(policy="kairos-alg1").rule() == KAIROS_ALG1.rule
    tight = RouterConfig(admission=AdmissionSettings(beta=0.9, gamma=0.8)).rule()
    assert (tight.beta, tight.gamma, tight.evictable_after_s) == (0.9, 0.8, 60.0)
    assert not RouterConfig(policy="no-control").rule().enabled
    with pytest.raises(ConfigError, match="gamma"):
        RouterConfig(admission=AdmissionSettings(gamma=0.99))  # above kairos's β
    with pytest.raises(ConfigError, match="renamed kairos-alg1"):
        RouterConfig(policy="kairos-paper")

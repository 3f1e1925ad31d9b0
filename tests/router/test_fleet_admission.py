"""Fleet admission through the real router and the `openai` client: a newcomer
goes to an instance that admits it now, and a held agent moves to any instance
that gets room (docs/control-law.md point 8). Two fake backends of 10K-token KV caches each."""

from __future__ import annotations

import asyncio
import dataclasses

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from controllers import KAIROS, KAIROS_ALG1
from controllers.admission import HeldAgent, Placement, admits_now, place
from controllers.placement import Consolidating, PlacementRequest
from kairos_common.testing import ManualClock, decision
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
]  # ≈ 5000 tokens estimated before usage


async def _turn(
    router: RunningRouter, token: str, messages: list[ChatCompletionMessageParam]
) -> None:
    client = openai.AsyncOpenAI(
        base_url=router.url + "/v1", api_key=agent_key(token, "sk"), max_retries=0
    )
    try:
        await client.chat.completions.create(model="fake-model", messages=messages)
    finally:
        await client.close()


async def _two(
    make_router: StartRouter, backend: FakeBackend, backend2: FakeBackend, prompt_tokens: int
) -> RunningRouter:
    for b in (backend, backend2):
        b.behaviour.capacity_tokens = 10_000
        b.behaviour.prompt_tokens = prompt_tokens
    router = await make_router([backend.url, backend2.url])
    await router.health.check_once()
    return router


async def _two_full(
    make_router: StartRouter, backend: FakeBackend, backend2: FakeBackend, clock: ManualClock
) -> RunningRouter:
    """Two 10K-token instances, each past γ·U_max with one 9.5K-token session."""
    for b in (backend, backend2):
        b.behaviour.capacity_tokens = 10_000
        b.behaviour.prompt_tokens = 9_500
    router = await make_router([backend.url, backend2.url], clock=clock)
    await router.health.check_once()
    for _ in range(2):
        await _turn(router, await start_agent(router.url), CHAT)  # one per instance
    return router


async def _newcomer_runs_at_once(
    router: RunningRouter, backend: FakeBackend, backend2: FakeBackend
) -> None:
    b = await start_agent(router.url)
    await asyncio.wait_for(_turn(router, b, BIG), 5.0)  # not held
    adm = router.core.admission
    assert adm.queue("i0").order() == [] and adm.queue("i1").order() == []
    assert len(backend.received) + len(backend2.received) == 3


async def test_newcomer_goes_where_it_is_admitted_now(
    make_router: StartRouter, backend: FakeBackend, backend2: FakeBackend
) -> None:
    router = await _two(make_router, backend, backend2, prompt_tokens=4_900)
    a = await start_agent(router.url)
    await _turn(router, a, CHAT)  # i0 holds 4.9K: under θ·U_max, Algorithm 2 would pick it
    b = await start_agent(router.url)
    await _turn(router, b, BIG)  # 4.9K + 5K > β·U_max on i0: admitted at once on i1
    assert len(backend2.received) == 1
    assert router.core.admission.queue("i0").order() == []
    _, status = await control("GET", f"{router.url}/kairos/v1/agents/{b.split('.')[1]}")
    assert status["instance"] == "i1" and status["state"] == "ongoing"


async def test_held_agent_moves_to_the_instance_that_gets_room(
    make_router: StartRouter, backend: FakeBackend, backend2: FakeBackend
) -> None:
    router = await _two(make_router, backend, backend2, prompt_tokens=9_500)
    adm = router.core.admission
    a = await start_agent(router.url)
    await _turn(router, a, CHAT)  # i0 above γ·U_max
    c = await start_agent(router.url)
    await _turn(router, c, CHAT)  # i0 would hold c: it goes to i1, now above γ too
    assert len(backend.received) == len(backend2.received) == 1
    b = await start_agent(router.url)
    held = asyncio.create_task(_turn(router, b, BIG))
    await adm.wait_until(lambda: len(adm.queue("i0")) == 1)  # no room anywhere: held
    await end_agent(router, c)
    await asyncio.wait_for(held, 5.0)  # i1 freed: b moved there, i0 never freed
    assert len(backend2.received) == 2 and len(backend.received) == 1
    assert router.core.metrics.admissions.labels("i1", "fleet").value == 1


async def test_prompt_beyond_the_engine_limit_is_never_held(
    make_router: StartRouter, backend: FakeBackend, backend2: FakeBackend
) -> None:
    """vLLM rejects a prompt beyond its limit at once and it holds no cache, so the
    router forwards it at once even with no room anywhere: held, it would wait for a
    nearly empty instance only to get the same 400."""
    router = await _two(make_router, backend, backend2, prompt_tokens=9_500)
    for _ in range(2):
        await _turn(router, await start_agent(router.url), CHAT)  # both above γ·U_max
    for b in (backend, backend2):
        b.behaviour.fail_next, b.behaviour.fail_status = 1, 400  # vLLM: prompt too long
    huge: list[ChatCompletionMessageParam] = [{"role": "user", "content": "x" * 60_000}]
    newcomer = await start_agent(router.url)  # ≈15K tokens > the 10K caches (no max length)
    with pytest.raises(openai.BadRequestError):
        await asyncio.wait_for(_turn(router, newcomer, huge), 10.0)  # held: times out
    assert len(backend.received) + len(backend2.received) == 3
    assert router.core.admission.queue("i0").order() == []


async def test_idle_contexts_a_cpu_tier_holds_do_not_hold_a_newcomer(
    make_router: StartRouter, backend: FakeBackend, backend2: FakeBackend
) -> None:
    """Both instances are above γ·U_max with sessions idle for a minute. Their
    daemons report vLLM's CPU KV tier, so those contexts need no room in HBM and a
    newcomer runs at once (control-law point 13); once the daemons go stale the
    router's own fallback counts every context again and would hold it."""
    clock = ManualClock()
    router = await _two_full(make_router, backend, backend2, clock)
    adm = router.core.admission
    clock.advance(60.0)  # both sessions idle by the default 10 s window
    for epoch, idle_after_s in ((1, 120.0), (2, 10.0)):
        rule = dataclasses.replace(KAIROS.rule, idle_after_s=idle_after_s)
        for i in range(2):
            sent = decision(f"i{i}", epoch, rule=rule, capacity_tokens=10_000,
                            offload_tokens=1_000_000, daemon_id="d", start_unix_s=1.0)  # fmt: skip
            assert adm.apply_decision(sent).accepted
        if epoch == 1:  # a daemon whose law waits 120 s calls them active: all resident
            gates = [adm.gate(i) for i in router.core.pool]
            assert [g.resident_tokens for g in gates] == [g.load.usage_tokens for g in gates]
    assert [adm.gate(i).resident_tokens for i in router.core.pool] == [0, 0]
    listed = router.core.instances_json()  # what GET /kairos/v1/instances shows
    assert [(i["offload_tokens"], i["admission_usage_tokens"]) for i in listed] == [
        (1_000_000, 0),
        (1_000_000, 0),
    ]
    await _newcomer_runs_at_once(router, backend, backend2)
    clock.advance(30.0)  # the daemons' decisions expire: the paper's rule again
    assert all(adm.gate(i).resident_tokens is None for i in router.core.pool)
    assert not any(admits_now(adm.gate(i), 5_000, adm.rule) for i in router.core.pool)


async def test_sessions_idle_past_the_eviction_window_do_not_hold_a_newcomer(
    make_router: StartRouter, backend: FakeBackend, backend2: FakeBackend
) -> None:
    """Both instances are above γ·U_max, no CPU tier. While their sessions are idle
    for less than the daemons' eviction window a newcomer is held; once they have
    been idle past it, vLLM keeps their blocks only as evictable prefix cache and
    the newcomer runs at once (control-law point 14). A daemon whose law has no
    window (``kairos-alg1``) counts them all."""
    clock = ManualClock()
    router = await _two_full(make_router, backend, backend2, clock)
    adm = router.core.admission

    def report(epoch: int, evictable_after_s: float | None) -> None:
        rule = dataclasses.replace(KAIROS.rule, evictable_after_s=evictable_after_s)
        for i in range(2):
            sent = decision(f"i{i}", epoch, rule=rule, capacity_tokens=10_000, daemon_id="d",
                            start_unix_s=1.0)  # fmt: skip
            assert adm.apply_decision(sent).accepted

    clock.advance(30.0)  # idle, not yet past the window
    report(1, 60.0)
    assert not any(admits_now(adm.gate(i), 5_000, adm.rule) for i in router.core.pool)
    clock.advance(40.0)  # idle 70 s
    report(2, None)  # a law without a window: every context still counts
    assert not any(admits_now(adm.gate(i), 5_000, adm.rule) for i in router.core.pool)
    report(3, 60.0)
    assert [adm.gate(i).resident_tokens for i in router.core.pool] == [0, 0]
    listed = router.core.instances_json()  # what GET /kairos/v1/instances shows
    assert [(i["admission_rule"]["evictable_after_s"], i["admission_usage_tokens"])  # type: ignore[index]
            for i in listed] == [(60.0, 0), (60.0, 0)]  # fmt: skip
    await _newcomer_runs_at_once(router, backend, backend2)


async def test_each_instance_admits_by_its_daemons_rule(
    make_router: StartRouter, backend: FakeBackend, backend2: FakeBackend
) -> None:
    """The router's own rule (``kairos``'s: β, γ = 0.98, 0.95) would admit a
    600-token newcomer beside a 9.1K-token session on either 10K-token instance.
    i0's daemon runs ``kairos-alg1`` and carries the paper's 0.95, 0.90: there it is
    held, so it goes to i1 (control-law point 18). Once that decision expires, i0
    is judged by the router's own rule again."""
    clock = ManualClock()
    for b in (backend, backend2):
        b.behaviour.capacity_tokens = 10_000
        b.behaviour.prompt_tokens = 9_096  # C_a = 9.1K: under γ·U_max = 9.5K
    router = await make_router([backend.url, backend2.url], clock=clock)
    await router.health.check_once()
    for _ in range(2):
        await _turn(router, await start_agent(router.url), CHAT)  # one per instance
    adm = router.core.admission
    assert all(admits_now(adm.gate(i), 600, adm.rule) for i in router.core.pool)
    paper = decision("i0", 1, rule=KAIROS_ALG1.rule, capacity_tokens=10_000, policy="kairos-alg1")
    assert adm.apply_decision(paper).accepted
    i0, i1 = router.core.pool
    assert not admits_now(adm.gate(i0), 600, adm.rule)
    assert admits_now(adm.gate(i1), 600, adm.rule)
    newcomer = PlacementRequest("x", 0, 600)
    assert place(Consolidating(), newcomer, adm.gates(), adm.rule) == Placement("i1", True)
    shown = router.core.instances_json()[0]["admission_rule"]
    assert shown == dataclasses.asdict(KAIROS_ALG1.rule)
    clock.advance(30.0)  # the decision expires: the router's own rule again
    assert admits_now(adm.gate(i0), 600, adm.rule)


async def test_idle_agents_move_to_make_room_for_a_held_one(
    make_router: StartRouter, backend: FakeBackend, backend2: FakeBackend
) -> None:
    """i0 holds two idle sessions (3K + 4K), i1 one (5.5K): a 5K newcomer fits on
    neither alone, though together they have 5.5K free. The router moves the 4K
    idle session to i1 and admits the newcomer on i0 at once (control-law point
    15); the moved session's next turn goes to i1. Sessions still working are never
    moved, and with ``admission.make_room = false`` the newcomer waits."""
    clock = ManualClock()
    for b in (backend, backend2):
        b.behaviour.capacity_tokens = 10_000
    router = await make_router([backend.url, backend2.url], clock=clock)
    await router.health.check_once()
    adm = router.core.admission
    tokens = []
    for b, prompt in ((backend, 2_996), (backend, 3_996), (backend2, 5_496)):
        b.behaviour.prompt_tokens = prompt  # C_a = prompt + 4 completion tokens
        tokens.append(await start_agent(router.url))
        await _turn(router, tokens[-1], CHAT)
    assert router.core.ledger.usage_tokens("i0") == 7_000
    assert router.core.ledger.usage_tokens("i1") == 5_500
    clock.advance(5.0)  # still active by the 10 s window: nobody may move
    assert adm.make_room([HeldAgent("x", "i1", 5_000)]) == ()
    clock.advance(25.0)  # idle now
    backend.behaviour.prompt_tokens = 4_996
    newcomer = await start_agent(router.url)
    await asyncio.wait_for(_turn(router, newcomer, BIG), 5.0)  # admitted at once
    moved = tokens[1].split(".")[1]
    _, status = await control("GET", f"{router.url}/kairos/v1/agents/{moved}")
    assert status["instance"] == "i1" and status["state"] == "ongoing"
    _, status = await control("GET", f"{router.url}/kairos/v1/agents/{newcomer.split('.')[1]}")
    assert status["instance"] == "i0"
    metrics = router.core.metrics
    assert metrics.admissions.labels("i0", "room").value == 1
    assert 'kairos_router_reassignments_total{reason="room",source="i0",target="i1"} 1.0' in (
        metrics.render().decode()
    )
    assert len(backend.received) == 3 and len(backend2.received) == 1
    await _turn(router, tokens[1], CHAT)  # the moved session's next turn
    assert len(backend2.received) == 2

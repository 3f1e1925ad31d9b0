"""Algorithm 2 (consolidate, then spread), Algorithm 3 (reassignment after 8 turns on a
2x imbalance), and failover away from unhealthy or draining instances."""

from __future__ import annotations

import asyncio

from router.testing import FakeBackend, RunningRouter
from tests.router.conftest import (
    StartRouter,
    control,
    end_agent,
    instance_of,
    one_turn,
    start_agent,
)


async def _two(make_router: StartRouter, a: FakeBackend, b: FakeBackend) -> RunningRouter:
    router = await make_router([a.url, b.url])
    await router.health.check_once()  # learns U_max from both /metrics
    return router


async def test_consolidates_then_spreads(
    make_router: StartRouter, backend: FakeBackend, backend2: FakeBackend
) -> None:
    for b in (backend, backend2):
        b.behaviour.capacity_tokens = 10_000
        b.behaviour.prompt_tokens = 3000
    router = await _two(make_router, backend, backend2)
    placed = []
    for _ in range(5):
        token = await start_agent(router.url)
        await one_turn(router, token)
        placed.append(instance_of(router, token))
    # U_0 < 0.5*U_max keeps filling i0; then the least-loaded; i1 fills below θ; then a tie
    assert placed == ["i0", "i0", "i1", "i1", "i0"]


async def test_reassignment_after_8_turns_on_2x_imbalance(
    make_router: StartRouter, backend: FakeBackend, backend2: FakeBackend
) -> None:
    for b in (backend, backend2):
        b.behaviour.prompt_tokens = 2000
    router = await _two(make_router, backend, backend2)
    admin = router.url + "/kairos/v1/admin/instances"
    tokens = [await start_agent(router.url) for _ in range(3)]
    assert (await control("POST", admin + "/i1/drain", {"draining": True}))[0] == 200
    await one_turn(router, tokens[0])
    await one_turn(router, tokens[1])
    await control("POST", admin + "/i1/drain", {"draining": False})
    await control("POST", admin + "/i0/drain", {"draining": True})
    await one_turn(router, tokens[2])
    await control("POST", admin + "/i0/drain", {"draining": False})
    assert [instance_of(router, t) for t in tokens] == ["i0", "i0", "i1"]
    for _ in range(7):  # U_i0 = 2·U_i1, but fewer than T_reassign = 8 turns since assignment
        await one_turn(router, tokens[0])
        assert instance_of(router, tokens[0]) == "i0"
    before = len(backend2.received)
    await one_turn(router, tokens[0])
    assert instance_of(router, tokens[0]) == "i1"
    assert len(backend2.received) == before + 1  # the 8th request already went to i1
    metrics = router.core.metrics.render().decode()
    assert 'kairos_router_reassignments_total{reason="imbalance",source="i0",target="i1"} 1.0' in (
        metrics
    )


async def test_no_reassignment_to_idle_instance(
    make_router: StartRouter, backend: FakeBackend, backend2: FakeBackend
) -> None:
    router = await _two(make_router, backend, backend2)
    token = await start_agent(router.url)
    for _ in range(10):
        await one_turn(router, token)
    assert instance_of(router, token) == "i0"  # i1 idle: not a target (consolidation kept)
    assert backend2.received == []


async def test_unhealthy_instance_evacuated_and_never_chosen(
    make_router: StartRouter, backend: FakeBackend, backend2: FakeBackend
) -> None:
    router = await _two(make_router, backend, backend2)
    token = await start_agent(router.url)
    await one_turn(router, token)
    assert instance_of(router, token) == "i0"
    backend.behaviour.healthy = False
    await router.health.check_once()
    await router.health.check_once()  # unhealthy_after_failures = 2
    assert not router.core.pool.resolve("i0").healthy
    assert instance_of(router, token) == "i1"  # moved off the dead instance
    newcomer = await start_agent(router.url)
    await one_turn(router, newcomer)
    assert instance_of(router, newcomer) == "i1"
    backend.behaviour.healthy = True
    await router.health.check_once()
    assert router.core.pool.resolve("i0").healthy


async def test_admin_add_remove_instance(
    make_router: StartRouter, backend: FakeBackend, backend2: FakeBackend
) -> None:
    router = await make_router([backend.url])
    admin = router.url + "/kairos/v1/admin/instances"
    status, _ = await control("POST", admin, {"name": "gpu1", "url": backend2.url})
    assert status == 200
    token = await start_agent(router.url)
    await one_turn(router, token)
    assert instance_of(router, token) == "i0"
    status, _ = await control("DELETE", admin + "/i0")
    assert status == 200
    assert instance_of(router, token) == "gpu1"
    await one_turn(router, token)
    assert len(backend2.received) == 1
    status, body = await control("DELETE", admin + "/nope")
    assert status == 404 and body["error"]["code"] == "not_found"


async def test_overflow_relief_moves_a_request_that_cannot_fit_beside_the_running_ones(
    make_router: StartRouter, backend: FakeBackend, backend2: FakeBackend
) -> None:
    """Two agents on i0 grow past its KV cache; while one runs, the other's request
    moves to i1 (control-law point 10); while none runs, idle contexts move nobody."""
    for b in (backend, backend2):
        b.behaviour.capacity_tokens = 10_000
        b.behaviour.prompt_tokens = 1000
    router = await _two(make_router, backend, backend2)
    a, b = await start_agent(router.url), await start_agent(router.url)
    await one_turn(router, a)
    await one_turn(router, b)
    assert [instance_of(router, t) for t in (a, b)] == ["i0", "i0"]  # consolidated
    backend.behaviour.prompt_tokens = 5000  # both contexts grow to 5004: U_i0 > U_max
    await one_turn(router, a)
    await one_turn(router, b)
    assert router.core.ledger.usage_tokens("i0") == 10_008
    await one_turn(router, a)  # U_i0 > U_max, but only idle contexts beside it: stays
    assert instance_of(router, a) == "i0"
    backend.behaviour.gate = asyncio.Event()
    running = asyncio.create_task(one_turn(router, a))
    async with backend.arrived:
        await backend.arrived.wait_for(lambda: len(backend.received) == 6)
    try:  # 5004 running + its 5004 > 10_000: moves to i1 at once (on i0 it would wait)
        await asyncio.wait_for(one_turn(router, b), timeout=30)
    finally:
        backend.behaviour.gate.set()
        await running
    assert [instance_of(router, t) for t in (a, b)] == ["i0", "i1"]
    assert len(backend2.received) == 1
    metrics = router.core.metrics.render().decode()
    assert 'reassignments_total{reason="overflow",source="i0",target="i1"} 1.0' in metrics


async def _outgrown_pair(router: RunningRouter, backend: FakeBackend) -> tuple[str, str]:
    """Two agents admitted on i0 (10K-token cache) whose contexts grow to 5004 tokens
    each (U > U_max); then the first's next request runs, held at the backend."""
    backend.behaviour.capacity_tokens = 10_000
    backend.behaviour.prompt_tokens = 1000
    await router.health.check_once()
    a, b = await start_agent(router.url), await start_agent(router.url)
    await one_turn(router, a)
    await one_turn(router, b)
    backend.behaviour.prompt_tokens = 5000  # both contexts grow to 5004: U > U_max
    await one_turn(router, a)
    await one_turn(router, b)
    await one_turn(router, a)  # only idle contexts beside it: runs
    assert router.core.ledger.usage_tokens("i0") == 10_008
    backend.behaviour.gate = asyncio.Event()
    return a, b


async def test_a_request_that_would_overflow_with_nowhere_to_go_waits_for_room(
    make_router: StartRouter, backend: FakeBackend
) -> None:
    """One instance: two agents grow past its KV cache. While one runs, the other's
    request would make vLLM preempt and no instance has room for it, so the agent
    goes back to the hold queue (control-law point 16) and its request reaches the
    backend only once the running agent has ended and Eq. 13 admits it again."""
    router = await make_router([backend.url])
    a, b = await _outgrown_pair(router, backend)
    running = asyncio.create_task(one_turn(router, a))
    async with backend.arrived:
        await backend.arrived.wait_for(lambda: len(backend.received) == 6)
    waiting = asyncio.create_task(one_turn(router, b))  # 5004 running + its 5004 > 10_000
    adm = router.core.admission
    await adm.wait_until(lambda: b.split(".")[1] in adm.queue("i0"))
    ledger = router.core.ledger
    agent_b = ledger.get(b.split(".")[1])
    assert agent_b is not None and not agent_b.admitted
    assert ledger.usage_tokens("i0") == 5_004  # its context no longer counts
    backend.behaviour.gate.set()
    await running
    assert not waiting.done() and len(backend.received) == 6  # 5004 + 5004 > β·U_max
    await end_agent(router, a)
    await asyncio.wait_for(waiting, timeout=30)  # admitted again, on the same instance
    assert len(backend.received) == 7 and instance_of(router, b) == "i0" and agent_b.admitted
    metrics = router.core.metrics.render().decode()
    assert 'kairos_router_overflow_holds_total{instance="i0"} 1.0' in metrics


async def test_without_admission_control_the_request_runs_beside_the_others(
    make_router: StartRouter, backend: FakeBackend
) -> None:
    """Point 16 holds back only under admission control: behind ``kairos-no-ta``
    daemons (here: none yet, so the router's own rule for that policy) the request
    runs beside the others, and vLLM would preempt."""
    router = await make_router([backend.url], policy="kairos-no-ta")
    a, b = await _outgrown_pair(router, backend)
    running = asyncio.create_task(one_turn(router, a))
    async with backend.arrived:
        await backend.arrived.wait_for(lambda: len(backend.received) == 6)
    waiting = asyncio.create_task(one_turn(router, b))
    try:  # reaches the backend beside the running request (vLLM would preempt)
        async with backend.arrived:
            await asyncio.wait_for(
                backend.arrived.wait_for(lambda: len(backend.received) == 7), timeout=30
            )
    finally:
        backend.behaviour.gate.set()
        await running
        await waiting
    assert "kairos_router_overflow_holds_total{" not in router.core.metrics.render().decode()

"""A router serving one cell (docs/cells.md): ids carry the cell, another cell's
identities are refused (421), ``/health/room`` answers the cell-room rule and a
start that asks for room is declined (503 ``cell_full``) when there is none."""

from __future__ import annotations

from typing import Any

import aiohttp
import openai
import pytest

from kairos_common.identity import cell_of, compose_key, issue_token, new_agent_id
from kairos_common.wire import REQUIRE_ROOM_HEADER
from router.testing import FakeBackend, RunningRouter, role_headers
from tests.router.conftest import CHAT, StartRouter, control, one_turn, start_agent


async def _room(router: RunningRouter) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as s, s.get(router.url + "/health/room") as r:
        return r.status, await r.json()


async def _start(router: RunningRouter, **headers: str) -> tuple[int, Any]:
    url = router.url + "/kairos/v1/agents"
    return await control("POST", url, {}, headers={**role_headers(url, "POST"), **headers})


async def _cell_router(make_router: StartRouter, backend: FakeBackend, **kw: Any) -> RunningRouter:
    backend.behaviour.capacity_tokens = 10_000
    router = await make_router([backend.url], cell="a", **kw)
    await router.health.check_once()  # learns U_max
    return router


async def test_a_cell_router_mints_ids_of_its_cell(
    make_router: StartRouter, backend: FakeBackend
) -> None:
    router = await _cell_router(make_router, backend)
    token = await start_agent(router.url)
    assert cell_of(token.split(".")[1]) == "a"
    await one_turn(router, token)  # its own cell's identity is served
    assert len(backend.received) == 1


async def test_another_cells_identity_is_refused_not_served(
    make_router: StartRouter, backend: FakeBackend
) -> None:
    router = await _cell_router(make_router, backend)
    # Signed with this router's own secret: only the cell is wrong.
    foreign = issue_token(new_agent_id("b"), router.core.agents.secret)
    client = openai.AsyncOpenAI(
        base_url=router.url + "/v1", api_key=compose_key(foreign, "sk"), max_retries=0
    )
    with pytest.raises(openai.APIStatusError) as err:
        await client.chat.completions.create(model="fake-model", messages=CHAT)
    await client.close()
    assert err.value.status_code == 421
    assert err.value.code == "wrong_cell"
    assert backend.received == [] and router.core.ledger.get(foreign.split(".")[1]) is None
    # An end misrouted to this cell is not "delivered" (a 404 would be).
    agent_id = foreign.split(".")[1]
    status, body = await control("POST", f"{router.url}/kairos/v1/agents/{agent_id}/end", {})
    assert status == 421 and body["error"]["code"] == "wrong_cell"
    status, _ = await _start(router, **{"X-Kairos-Cell": "b"})
    assert status == 421


async def test_a_router_without_a_cell_serves_every_identity(
    make_router: StartRouter, backend: FakeBackend
) -> None:
    router = await make_router([backend.url])
    token = await start_agent(router.url)
    assert cell_of(token.split(".")[1]) is None
    celled = issue_token(new_agent_id("b"), router.core.agents.secret)
    await one_turn(router, celled)
    assert len(backend.received) == 1


async def test_room_follows_the_admission_rule_and_counts_unplaced_starts(
    make_router: StartRouter, backend: FakeBackend
) -> None:
    router = await _cell_router(make_router, backend)
    assert await _room(router) == (200, {"room": True, "cell": "a"})
    # 10K cache, 3K placeholder: three started agents that have not sent a request
    # yet take the room a fourth would need.
    for _ in range(3):
        status, _ = await _start(router, **{REQUIRE_ROOM_HEADER: "1"})
        assert status == 200
    status, body = await _room(router)
    assert (status, body) == (503, {"room": False, "cell": "a"})
    status, body = await _start(router, **{REQUIRE_ROOM_HEADER: "1"})
    assert status == 503 and body["error"]["code"] == "cell_full"
    # Without the header (every cell full: the balancer's fallback) it still lands.
    status, _ = await _start(router)
    assert status == 200


async def test_a_full_instance_leaves_no_room(
    make_router: StartRouter, backend: FakeBackend
) -> None:
    router = await _cell_router(make_router, backend, cell_start_reserve_s=0.0)
    backend.behaviour.prompt_tokens = 9_600  # past gamma after one turn
    await one_turn(router, await start_agent(router.url))
    status, body = await _room(router)
    assert status == 503 and body == {"room": False, "cell": "a"}  # no agent data

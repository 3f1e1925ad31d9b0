from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from router.testing import FakeBackend, RunningRouter, role_headers, start_router

StartRouter = Callable[..., Awaitable[RunningRouter]]


@pytest.fixture
async def backend() -> AsyncIterator[FakeBackend]:
    fake = FakeBackend()
    await fake.start()
    yield fake
    await fake.stop()


@pytest.fixture
async def backend2() -> AsyncIterator[FakeBackend]:
    fake = FakeBackend()
    await fake.start()
    yield fake
    await fake.stop()


@pytest.fixture
async def make_router(tmp_path: Path) -> AsyncIterator[StartRouter]:
    started: list[RunningRouter] = []

    async def make(backends: list[str], state_dir: Path | None = None, **kw: Any) -> RunningRouter:
        # A fresh state directory per router unless the test shares one on purpose
        # (start/end are persisted at once, so a shared one would restore agents).
        fresh = tmp_path / ("state" if not started else f"state{len(started)}")
        router = await start_router(backends, state_dir or fresh, **kw)
        started.append(router)
        return router

    yield make
    for router in started:
        await router.stop()


@pytest.fixture
async def router(make_router: StartRouter, backend: FakeBackend) -> RunningRouter:
    return await make_router([backend.url])


async def start_agent(url: str, **body: Any) -> str:
    """Register an agent like id-tracker does; returns its identity token."""
    import aiohttp

    async with (
        aiohttp.ClientSession() as s,
        s.post(url + "/kairos/v1/agents", json=body, headers=role_headers(url, "POST")) as resp,
    ):
        assert resp.status == 200, await resp.text()
        return str((await resp.json())["token"])


async def control(method: str, url: str, body: Any = None, **kw: Any) -> tuple[int, Any]:
    """Call a control/admin endpoint with the credential of the role it needs (found
    the way id-tracker and kairosd find it); returns (status, JSON body)."""
    import aiohttp

    kw.setdefault("headers", role_headers(url, method))
    async with (
        aiohttp.ClientSession() as s,
        s.request(method, url, json=body, **kw) as resp,
    ):
        return resp.status, await resp.json(content_type=None)


def end_body(router: RunningRouter, token: str, exit_code: int = 0) -> dict[str, Any]:
    """An agent-end body with the agent's end key, as the id-tracker that started it sends."""
    from kairos_common.identity import end_key, parse_token

    agent_id, _ = parse_token(token)
    return {"exit_code": exit_code, "end_key": end_key(agent_id, router.core.agents.secret)}


async def end_agent(router: RunningRouter, token: str) -> None:
    """End the agent of ``token`` as its id-tracker would (must succeed)."""
    agent_id = token.split(".")[1]
    status, _ = await control(
        "POST", f"{router.url}/kairos/v1/agents/{agent_id}/end", end_body(router, token)
    )
    assert status == 200


def agent_key(token: str, real_key: str | None = "sk-user") -> str:
    from kairos_common.identity import compose_key

    return compose_key(token, real_key)


CHAT: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hello"}]


async def one_turn(router: RunningRouter, token: str) -> None:
    """One chat turn of the agent holding ``token``, through the real openai client."""
    client = openai.AsyncOpenAI(base_url=router.url + "/v1", api_key=agent_key(token))
    await client.chat.completions.create(model="fake-model", messages=CHAT)
    await client.close()


def instance_of(router: RunningRouter, token: str) -> str | None:
    """The instance the router's ledger assigns the agent holding ``token`` to."""
    agent = router.core.ledger.get(token.split(".")[1])
    assert agent is not None
    return agent.instance

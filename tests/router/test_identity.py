"""Identity extraction, real-key forwarding, forged identities, anonymous requests."""

from __future__ import annotations

import asyncio

import aiohttp
import openai
import pytest

from kairos_common.identity import issue_token
from router.testing import FakeBackend, RunningRouter
from tests.router.conftest import CHAT, StartRouter, agent_key, start_agent


async def test_identity_from_bearer_key_and_real_key_forwarded(
    router: RunningRouter, backend: FakeBackend
) -> None:
    token = await start_agent(router.url, name="swe-1")
    agent_id = token.split(".")[1]
    client = openai.AsyncOpenAI(base_url=router.url + "/v1", api_key=agent_key(token))
    await client.chat.completions.create(model="fake-model", messages=CHAT)
    await client.close()
    headers = backend.received[0].headers
    assert headers["Authorization"] == "Bearer sk-user"
    assert not any("kairos1" in v for v in headers.values())
    agent = router.core.ledger.get(agent_id)
    assert agent is not None and agent.turns == 1 and agent.name == "swe-1"


async def test_identity_without_real_key_forwards_no_credential(
    router: RunningRouter, backend: FakeBackend
) -> None:
    token = await start_agent(router.url)
    client = openai.AsyncOpenAI(base_url=router.url + "/v1", api_key=token)
    await client.completions.create(model="fake-model", prompt="x")
    await client.close()
    assert "Authorization" not in backend.received[0].headers


async def test_x_api_key_on_messages_route(router: RunningRouter, backend: FakeBackend) -> None:
    token = await start_agent(router.url)
    agent_id = token.split(".")[1]
    body = {"model": "fake-model", "max_tokens": 8, "messages": CHAT}
    headers = {"x-api-key": agent_key(token, "sk-ant"), "anthropic-version": "2023-06-01"}
    async with (
        aiohttp.ClientSession() as s,
        s.post(router.url + "/v1/messages", json=body, headers=headers) as resp,
    ):
        assert resp.status == 200
        out = await resp.json()
    assert out["type"] == "message"
    assert backend.received[0].headers["x-api-key"] == "sk-ant"
    agent = router.core.ledger.get(agent_id)
    assert agent is not None and agent.decode_tokens == 4


async def test_explicit_header_identity_is_not_forwarded(
    router: RunningRouter, backend: FakeBackend
) -> None:
    token = await start_agent(router.url)
    client = openai.AsyncOpenAI(
        base_url=router.url + "/v1",
        api_key="sk-plain",
        default_headers={"X-Kairos-Agent": token},
    )
    await client.chat.completions.create(model="fake-model", messages=CHAT)
    await client.close()
    headers = {k.lower(): v for k, v in backend.received[0].headers.items()}
    assert "x-kairos-agent" not in headers
    assert headers["authorization"] == "Bearer sk-plain"
    assert router.core.ledger.get(token.split(".")[1]) is not None


async def test_forged_identity_rejected_with_401(
    router: RunningRouter, backend: FakeBackend
) -> None:
    forged = issue_token("victim", b"not-the-router-secret-0123456789")
    client = openai.AsyncOpenAI(base_url=router.url + "/v1", api_key=agent_key(forged))
    with pytest.raises(openai.AuthenticationError) as err:
        await client.chat.completions.create(model="fake-model", messages=CHAT)
    await client.close()
    assert err.value.status_code == 401
    assert isinstance(err.value.body, dict) and "identity" in err.value.body["message"]
    assert backend.received == []
    assert router.core.ledger.get("victim") is None


async def test_altered_agent_id_rejected(router: RunningRouter) -> None:
    token = await start_agent(router.url)
    _, agent_id, sig = token.split(".")
    altered = f"kairos1.{agent_id[:-1]}{'0' if agent_id[-1] != '0' else '1'}.{sig}"
    client = openai.AsyncOpenAI(base_url=router.url + "/v1", api_key=agent_key(altered))
    with pytest.raises(openai.AuthenticationError):
        await client.chat.completions.create(model="fake-model", messages=CHAT)
    await client.close()


async def test_anonymous_requests_are_one_turn_agents(
    router: RunningRouter, backend: FakeBackend
) -> None:
    client = openai.AsyncOpenAI(base_url=router.url + "/v1", api_key="sk-anon")
    await asyncio.gather(
        *(client.chat.completions.create(model="fake-model", messages=CHAT) for _ in range(3))
    )
    await client.close()
    assert len(backend.received) == 3
    assert len(router.core.ledger) == 0  # one-turn agents leave with their request
    assert router.core.ledger.usage_tokens("i0") == 0


async def test_anonymous_keyed_by_api_key(make_router: StartRouter, backend: FakeBackend) -> None:
    router = await make_router([backend.url], anonymous="api-key")
    client = openai.AsyncOpenAI(base_url=router.url + "/v1", api_key="sk-team")
    for _ in range(2):
        await client.chat.completions.create(model="fake-model", messages=CHAT)
    await client.close()
    agents = list(router.core.ledger)
    assert len(agents) == 1 and agents[0].agent_id.startswith("key-") and agents[0].turns == 2
    assert "sk-team" not in agents[0].agent_id

"""The clock's prefill signal (docs/control-law.md, point 9): the router reports, per
agent, the uncached prompt tokens of requests forwarded to vLLM that have not yet
answered, and nothing once the first byte is back."""

from __future__ import annotations

import asyncio

import openai
import pytest

from kairos_common.wire import InstanceState
from router.ledger import Agent, PrefillClaim
from router.testing import FakeBackend
from tests.router.conftest import StartRouter, agent_key, control, start_agent

LONG = [{"role": "user", "content": "word " * 4000}]


async def _prefill(url: str, agent_id: str) -> int:
    status, state = await control("GET", url + "/kairos/v1/instances/i0/state")
    assert status == 200
    views = {a.agent_id: a for a in InstanceState.from_json(state).ongoing}
    return views[agent_id].prefill_tokens if agent_id in views else 0


async def _one_agent(
    make_router: StartRouter, backend: FakeBackend
) -> tuple[str, str, openai.AsyncOpenAI]:
    """A router on ``backend``, an agent on it: (router URL, agent id, its client)."""
    router = await make_router([backend.url])
    token = await start_agent(router.url)
    client = openai.AsyncOpenAI(
        base_url=router.url + "/v1", api_key=agent_key(token), max_retries=0
    )
    return router.url, token.split(".")[1], client


async def test_prefill_tokens_shown_until_the_first_byte(
    make_router: StartRouter, backend: FakeBackend
) -> None:
    url, agent_id, client = await _one_agent(make_router, backend)
    backend.behaviour.prompt_tokens = 5000
    await client.chat.completions.create(model="fake-model", messages=LONG)  # C_a = 5004
    backend.behaviour.gate = asyncio.Event()
    longer = [*LONG, {"role": "user", "content": "more " * 4000}]
    pending = asyncio.ensure_future(
        client.chat.completions.create(model="fake-model", messages=longer, stream=True)
    )
    await backend.wait_received(2)
    # The body is ≈ 40,000 bytes ≈ 10,000 tokens; 5004 of them are the cached context.
    assert 4900 < await _prefill(url, agent_id) < 5200
    _, status = await control("GET", f"{url}/kairos/v1/agents/{agent_id}")
    assert status["prefill_tokens"] == await _prefill(url, agent_id)
    backend.behaviour.hold_eof = asyncio.Event()  # the response stays open after its events
    backend.behaviour.gate.set()
    stream = await pending
    chunks = stream.__aiter__()
    try:
        await chunks.__anext__()  # the first token is out: the prompt was prefilled
        assert await _prefill(url, agent_id) == 0  # while the response is still open
    finally:
        backend.behaviour.hold_eof.set()
    async for _ in chunks:
        pass
    assert await _prefill(url, agent_id) == 0
    await client.close()


async def test_failed_request_leaves_no_prefill_behind(
    make_router: StartRouter, backend: FakeBackend
) -> None:
    url, agent_id, client = await _one_agent(make_router, backend)
    backend.behaviour.fail_next = 1
    with pytest.raises(openai.InternalServerError):
        await client.chat.completions.create(model="fake-model", messages=LONG)
    _, status = await control("GET", f"{url}/kairos/v1/agents/{agent_id}")
    assert status["in_flight"] == 0 and status["prefill_tokens"] == 0
    assert await _prefill(url, agent_id) == 0
    await client.close()


async def test_request_abandoned_before_its_first_byte_leaves_no_prefill_behind(
    make_router: StartRouter, backend: FakeBackend
) -> None:
    """The client leaves while vLLM is still on the prompt: no byte ever came back,
    so the claim is taken back when the router's handler is cancelled."""
    url, agent_id, client = await _one_agent(make_router, backend)
    backend.behaviour.gate = asyncio.Event()  # never opened: vLLM never answers
    pending = asyncio.ensure_future(
        client.chat.completions.create(model="fake-model", messages=LONG)
    )
    await backend.wait_received(1)
    assert await _prefill(url, agent_id) > 0  # claimed while the prompt is prefilled
    pending.cancel()
    await asyncio.gather(pending, return_exceptions=True)
    async with asyncio.timeout(10):
        await backend.cancelled_event.wait()  # the router dropped the upstream request
    _, status = await control("GET", f"{url}/kairos/v1/agents/{agent_id}")
    assert status["in_flight"] == 0 and status["prefill_tokens"] == 0
    assert await _prefill(url, agent_id) == 0
    await client.close()


def test_claim_is_taken_back_exactly_once() -> None:
    agent = Agent(agent_id="a", arrival_s=0.0, start_unix_s=0.0)
    first, second = PrefillClaim(agent), PrefillClaim(agent)
    first.start(3000)
    second.start(-50)  # a prompt shorter than the context: nothing to prefill
    assert agent.prefill_tokens == 3000
    first.done()
    first.done()
    second.done()
    assert agent.prefill_tokens == 0

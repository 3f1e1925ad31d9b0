"""Usage accounting: streams with and without client-requested usage, no-usage backends,
sync and async SDK clients, Anthropic and Responses shapes."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import openai

from router.testing import FakeBackend, RunningRouter
from tests.router.conftest import CHAT, agent_key, start_agent


async def _agent_client(router: RunningRouter) -> tuple[str, openai.AsyncOpenAI]:
    token = await start_agent(router.url)
    client = openai.AsyncOpenAI(base_url=router.url + "/v1", api_key=agent_key(token))
    return token.split(".")[1], client


async def test_stream_without_usage_request_gets_no_usage_chunk(
    router: RunningRouter, backend: FakeBackend
) -> None:
    backend.behaviour.prompt_tokens = 120
    agent_id, client = await _agent_client(router)
    stream = await client.chat.completions.create(model="fake-model", messages=CHAT, stream=True)
    chunks = [c async for c in stream]
    await client.close()
    assert [c.usage for c in chunks] == [None] * len(chunks)
    assert all(c.choices for c in chunks)  # the injected choices=[] usage chunk was stripped
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "tok " * 4
    assert backend.received[0].body["stream_options"] == {"include_usage": True}
    agent = router.core.ledger.get(agent_id)
    assert agent is not None
    assert (agent.context_tokens, agent.decode_tokens, agent.context_estimated) == (124, 4, False)
    assert agent.llm_time_s > 0


async def test_stream_with_usage_request_keeps_usage_chunk(
    router: RunningRouter, backend: FakeBackend
) -> None:
    backend.behaviour.prompt_tokens = 50
    agent_id, client = await _agent_client(router)
    stream = await client.chat.completions.create(
        model="fake-model",
        messages=CHAT,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [c async for c in stream]
    await client.close()
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 4
    agent = router.core.ledger.get(agent_id)
    assert agent is not None and agent.context_tokens == 54


async def test_completions_stream_and_non_stream(
    router: RunningRouter, backend: FakeBackend
) -> None:
    backend.behaviour.prompt_tokens = 10
    agent_id, client = await _agent_client(router)
    out = await client.completions.create(model="fake-model", prompt="p")
    assert out.usage is not None and out.usage.prompt_tokens == 10
    stream = await client.completions.create(model="fake-model", prompt="p", stream=True)
    texts = [c.choices[0].text async for c in stream]
    await client.close()
    assert "".join(texts) == "tok " * 4
    agent = router.core.ledger.get(agent_id)
    assert agent is not None and agent.turns == 2 and agent.decode_tokens == 8


async def test_sync_client_chat_and_completions(
    router: RunningRouter, backend: FakeBackend
) -> None:
    backend.behaviour.prompt_tokens = 7
    token = await start_agent(router.url)

    def run_sync() -> list[str]:
        with openai.OpenAI(base_url=router.url + "/v1", api_key=agent_key(token)) as client:
            a = client.chat.completions.create(model="fake-model", messages=CHAT)
            b = client.completions.create(model="fake-model", prompt="x")
            s = client.chat.completions.create(model="fake-model", messages=CHAT, stream=True)
            streamed = "".join(c.choices[0].delta.content or "" for c in s)
            return [a.choices[0].message.content or "", b.choices[0].text, streamed]

    results = await asyncio.to_thread(run_sync)
    assert results == ["tok " * 4] * 3
    agent = router.core.ledger.get(token.split(".")[1])
    assert agent is not None and agent.turns == 3 and agent.context_tokens == 11


async def test_non_stream_body_passed_through_unchanged(
    router: RunningRouter, backend: FakeBackend
) -> None:
    body = {"model": "fake-model", "messages": CHAT}
    async with aiohttp.ClientSession() as s:
        headers = {"X-Request-Id": "req-42"}
        async with s.post(router.url + "/v1/chat/completions", json=body, headers=headers) as r:
            via_router = await r.read()
            assert r.headers["X-Request-Id"] == "req-42"
            assert r.content_type == "application/json"
        async with s.post(backend.url + "/v1/chat/completions", json=body) as r:
            direct = await r.read()

    def strip(raw: bytes) -> dict[str, object]:
        return {k: v for k, v in json.loads(raw).items() if k != "created"}

    assert strip(via_router) == strip(direct)
    forwarded = {k.lower(): v for k, v in backend.received[0].headers.items()}
    assert forwarded["x-request-id"] == "req-42"


async def test_missing_usage_is_estimated_and_marked(
    router: RunningRouter, backend: FakeBackend
) -> None:
    backend.behaviour.usage = False
    agent_id, client = await _agent_client(router)
    stream = await client.chat.completions.create(model="fake-model", messages=CHAT, stream=True)
    _ = [c async for c in stream]
    await client.close()
    agent = router.core.ledger.get(agent_id)
    assert agent is not None and agent.context_estimated and agent.estimated_turns == 1
    assert agent.decode_tokens == 4  # one token per content event
    text = router.core.metrics.render().decode()
    assert 'kairos_router_usage_estimated_total{instance="i0"} 1.0' in text


async def test_anthropic_stream_usage(router: RunningRouter, backend: FakeBackend) -> None:
    backend.behaviour.prompt_tokens = 30
    token = await start_agent(router.url)
    body = {"model": "fake-model", "max_tokens": 8, "messages": CHAT, "stream": True}
    headers = {"x-api-key": agent_key(token)}
    async with (
        aiohttp.ClientSession() as s,
        s.post(router.url + "/v1/messages", json=body, headers=headers) as r,
    ):
        raw = await r.read()
    assert raw.count(b"event: content_block_delta") == 4
    assert "stream_options" not in backend.received[0].body
    agent = router.core.ledger.get(token.split(".")[1])
    assert agent is not None and agent.context_tokens == 34 and not agent.context_estimated


async def test_responses_usage(router: RunningRouter, backend: FakeBackend) -> None:
    backend.behaviour.prompt_tokens = 12
    agent_id, client = await _agent_client(router)
    out = await client.responses.create(model="fake-model", input="hi")
    await client.close()
    assert out.usage is not None and out.usage.output_tokens == 4
    agent = router.core.ledger.get(agent_id)
    assert agent is not None and agent.context_tokens == 16


async def test_stream_options_without_include_usage_is_completed_then_stripped(
    router: RunningRouter, backend: FakeBackend
) -> None:
    backend.behaviour.prompt_tokens = 9
    token = await start_agent(router.url)
    body = {
        "model": "fake-model",
        "messages": CHAT,
        "stream": True,
        "stream_options": {"include_usage": False},
    }
    headers = {"Authorization": f"Bearer {agent_key(token)}"}
    async with (
        aiohttp.ClientSession() as s,
        s.post(router.url + "/v1/chat/completions", json=body, headers=headers) as r,
    ):
        raw = await r.read()
        assert r.content_type == "text/event-stream"
    assert b'"usage"' not in raw and raw.endswith(b"data: [DONE]\n\n")
    assert backend.received[0].body["stream_options"] == {"include_usage": True}
    agent = router.core.ledger.get(token.split(".")[1])
    assert agent is not None and agent.context_tokens == 13 and not agent.context_estimated

"""A streaming client that closes as soon as it has read ``[DONE]`` (as SDKs do)
must not lose the turn: the upstream finished, its usage arrived, vLLM holds the
context. Found against real vLLM (tests/realvllm: a chat-stream agent recorded
with 0 turns). Nor the online model's observation of the request: that outcome
once lacked its send time, and under `taskset -c 0 make test` the real-engine
prefill test found no observation of its request."""

from __future__ import annotations

import asyncio

import aiohttp

from router.testing import FakeBackend
from tests.router.conftest import StartRouter, agent_key, start_agent


async def test_client_closing_after_done_keeps_the_turn(
    make_router: StartRouter, backend: FakeBackend
) -> None:
    backend.behaviour.hold_eof = asyncio.Event()  # our end of stream comes after the client left
    router = await make_router([backend.url])
    token = await start_agent(router.url)
    body = {"model": "fake-model", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    headers = {"Authorization": f"Bearer {agent_key(token)}"}
    url = router.url + "/v1/chat/completions"
    async with aiohttp.ClientSession() as s, s.post(url, json=body, headers=headers) as r:
        async for line in r.content:
            if line.strip() == b"data: [DONE]":
                break
        # leaving the session closes the connection before the response ended
    backend.behaviour.hold_eof.set()
    agent = router.core.ledger.get(token.split(".")[1])
    assert agent is not None
    async with asyncio.timeout(5):  # the handler finishes once the backend ends its stream
        while agent.in_flight:
            await asyncio.sleep(0.01)
    assert agent.turns == 1 and agent.context_tokens is not None
    (seen,) = router.core.observations.recent("i0")
    assert seen.prompt_tokens + seen.completion_tokens == agent.context_tokens
    assert seen.ttft_s >= 0.0 and seen.t_s > 0.0

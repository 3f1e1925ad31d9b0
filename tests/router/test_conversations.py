"""An agent's conversations on the real router (router/conversations.py): a side
request under the agent's identity (a harness's title or summary call) must not
make the router forget the main conversation's context, in admission (``U``) or
in the clock's prefill signal (control-law point 9)."""

from __future__ import annotations

import asyncio

import openai
from openai.types.chat import ChatCompletionMessageParam

from kairos_common.wire import InstanceState
from router.testing import FakeBackend, RunningRouter
from tests.router.conftest import (
    StartRouter,
    agent_key,
    control,
    end_agent,
    one_turn,
    start_agent,
)

WORDS = "word " * 4000  # 20,000 bytes: 5,000 tokens at the 4 bytes a token learned below
MAIN: list[ChatCompletionMessageParam] = [
    {"role": "system", "content": "You are the main coding agent."},
    {"role": "user", "content": WORDS},
]
SIDE: list[ChatCompletionMessageParam] = [
    {"role": "system", "content": "Write a 5-word title for this session."},
    {"role": "user", "content": "Fix the failing test"},
]


def _client(router: RunningRouter, token: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=router.url + "/v1", api_key=agent_key(token), max_retries=0)


async def _main_then_side(router: RunningRouter, backend: FakeBackend, token: str) -> None:
    """The agent's main turn (C_a 5,004), then a 100-token side request."""
    client = _client(router, token)
    backend.behaviour.prompt_tokens = 5000
    await client.chat.completions.create(model="fake-model", messages=MAIN)
    backend.behaviour.prompt_tokens = 100
    await client.chat.completions.create(model="fake-model", messages=SIDE)
    await client.close()


async def _router(make_router: StartRouter, backend: FakeBackend, **kw: object) -> RunningRouter:
    backend.behaviour.capacity_tokens = 10_000
    router = await make_router([backend.url], **kw)
    await router.health.check_once()  # learns U_max from /metrics
    return router


async def test_a_side_request_keeps_the_main_context_counted(
    make_router: StartRouter, backend: FakeBackend
) -> None:
    router = await _router(make_router, backend)
    token = await start_agent(router.url)
    agent_id = token.split(".")[1]
    await _main_then_side(router, backend, token)
    _, status = await control("GET", f"{router.url}/kairos/v1/agents/{agent_id}")
    assert status["context_tokens"] == 5_004  # the paper's C_a would say 104
    assert status["conversations"] == 2
    assert router.core.ledger.usage_tokens("i0") == 5_004

    # The main conversation's next turn: ≈ 10,000 prompt tokens of which its own
    # 5,004 are cached, so ≈ 5,000 to prefill (not 10,000 − 104).
    client = _client(router, token)
    backend.behaviour.gate = asyncio.Event()
    longer: list[ChatCompletionMessageParam] = [
        *MAIN,
        {"role": "assistant", "content": "Done."},
        {"role": "user", "content": WORDS},
    ]
    pending = asyncio.ensure_future(
        client.chat.completions.create(model="fake-model", messages=longer)
    )
    try:
        await backend.wait_received(3)
        _, state = await control("GET", router.url + "/kairos/v1/instances/i0/state")
        views = {a.agent_id: a for a in InstanceState.from_json(state).ongoing}
        assert 4_800 < views[agent_id].prefill_tokens < 5_300
    finally:
        backend.behaviour.gate.set()
        await pending
        await client.close()


async def test_a_newcomer_does_not_take_the_room_of_a_main_conversation(
    make_router: StartRouter, backend: FakeBackend
) -> None:
    """After the side request the instance still holds the main conversation's
    5,004 tokens, so a 5,000-token newcomer waits (past γ·U_max of a 10,000-token
    cache) until the first agent ends."""
    router = await _router(make_router, backend)
    first = await start_agent(router.url)
    await _main_then_side(router, backend, first)
    newcomer = await start_agent(router.url)
    backend.behaviour.prompt_tokens = 5000
    client = _client(router, newcomer)
    other: list[ChatCompletionMessageParam] = [
        {"role": "system", "content": "Another agent."},
        {"role": "user", "content": WORDS},
    ]
    waiting = asyncio.ensure_future(
        client.chat.completions.create(model="fake-model", messages=other)
    )
    adm = router.core.admission
    await adm.wait_until(lambda: newcomer.split(".")[1] in adm.queue("i0"))
    assert len(backend.received) == 2
    await end_agent(router, first)
    await asyncio.wait_for(waiting, timeout=30)
    assert len(backend.received) == 3
    await client.close()


async def test_with_no_window_only_what_runs_counts_beside_the_latest(
    make_router: StartRouter, backend: FakeBackend
) -> None:
    """``conversation_window_s = 0``: the paper's C_a for a sequence of requests,
    and the newcomer is admitted at once beside the side request's 104 tokens."""
    router = await _router(make_router, backend, conversation_window_s=0.0)
    first = await start_agent(router.url)
    await _main_then_side(router, backend, first)
    assert router.core.ledger.usage_tokens("i0") == 104
    newcomer = await start_agent(router.url)
    client = _client(router, newcomer)
    backend.behaviour.prompt_tokens = 5000
    await asyncio.wait_for(
        client.chat.completions.create(model="fake-model", messages=MAIN), timeout=30
    )
    await client.close()


async def test_a_sub_agent_request_that_ends_frees_room_at_once(
    make_router: StartRouter, backend: FakeBackend
) -> None:
    """While a sub-agent's request runs, its context counts beside the waiting main
    conversation's (3,004 + 5,004), and a 3,000-token newcomer is held on the
    10,000-token cache; when that request ends the agent counts 5,004 again and the
    newcomer is admitted at once, not at the router's next periodic pass (these
    test routers run none)."""
    router = await _router(make_router, backend)
    first = await start_agent(router.url)
    client = _client(router, first)
    backend.behaviour.prompt_tokens = 5000
    await client.chat.completions.create(model="fake-model", messages=MAIN)
    sub: list[ChatCompletionMessageParam] = [
        {"role": "system", "content": "You are a search sub-agent."},
        {"role": "user", "content": "Find where the flag is parsed."},
    ]
    backend.behaviour.prompt_tokens = 3000
    await client.chat.completions.create(model="fake-model", messages=sub)
    ledger = router.core.ledger
    assert ledger.usage_tokens("i0") == 5_004  # the sub-agent idles: the largest counts
    backend.behaviour.gate = asyncio.Event()
    running = asyncio.ensure_future(
        client.chat.completions.create(model="fake-model", messages=sub)
    )
    newcomer = await start_agent(router.url)
    other = _client(router, newcomer)
    held = asyncio.ensure_future(
        other.chat.completions.create(
            model="fake-model",
            messages=[{"role": "user", "content": "word " * 2400}],  # ≈ 3,000 tokens
        )
    )
    try:
        adm = router.core.admission
        await adm.wait_until(lambda: newcomer.split(".")[1] in adm.queue("i0"))
        assert ledger.usage_tokens("i0") == 3_004 + 5_004
    finally:
        backend.behaviour.gate.set()
    await running
    await asyncio.wait_for(held, timeout=30)
    assert len(backend.received) == 4
    await client.close()
    await other.close()


async def test_a_side_request_is_sized_by_its_own_conversation_near_the_cache_edge(
    make_router: StartRouter, backend: FakeBackend
) -> None:
    """Two agents have outgrown a 10,000-token cache (5,004 tokens each) and one of
    them runs. The other's 104-token side conversation fits beside it, so its next
    side request runs at once: neither held back (control-law point 16) nor moved
    for its agent's 5,004 tokens, which would not fit (its main turn would wait)."""
    router = await _router(make_router, backend)
    a, b = await start_agent(router.url), await start_agent(router.url)
    backend.behaviour.prompt_tokens = 1000
    await one_turn(router, a)
    await one_turn(router, b)
    side = _client(router, b)
    backend.behaviour.prompt_tokens = 100
    await side.chat.completions.create(model="fake-model", messages=SIDE)
    backend.behaviour.prompt_tokens = 5000
    await one_turn(router, a)
    await one_turn(router, b)
    ledger = router.core.ledger
    assert ledger.usage_tokens("i0") == 10_008
    backend.behaviour.gate = asyncio.Event()
    running = asyncio.ensure_future(one_turn(router, a))
    backend.behaviour.prompt_tokens = 100
    try:
        await backend.wait_received(6)
        answer = asyncio.ensure_future(
            side.chat.completions.create(model="fake-model", messages=SIDE)
        )
        await backend.wait_received(7)  # reached vLLM beside the running turn
        agent_b = ledger.get(b.split(".")[1])
        assert agent_b is not None and agent_b.admitted and agent_b.instance == "i0"
    finally:
        backend.behaviour.gate.set()
    await running
    await answer
    await side.close()
    metrics = router.core.metrics.render().decode()
    assert "kairos_router_overflow_holds_total{" not in metrics


async def _claude_code_turn(
    router: RunningRouter, token: str, first_message: str, billing: str
) -> None:
    """One ``/v1/messages`` request as Claude Code 2.1.332 sends it (docs/agents.md):
    its session header, its billing header block, then its system prompt."""
    import httpx

    body = {
        "model": "fake-model",
        "max_tokens": 32000,
        "system": [
            {"type": "text", "text": f"x-anthropic-billing-header: cc_version=2.1.332.{billing};"},
            {"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "x"}},
        ],
        "messages": [{"role": "user", "content": first_message}],
    }
    headers = {
        "x-api-key": agent_key(token),
        "anthropic-version": "2023-06-01",
        "X-Claude-Code-Session-Id": "7bd2df25-fdd5-48bd-9170-ddfdfa9de445",
    }
    async with httpx.AsyncClient(timeout=30) as http:
        resp = await http.post(router.url + "/v1/messages", json=body, headers=headers)
        assert resp.status_code == 200, resp.text


async def test_a_compacted_claude_code_session_is_counted_at_its_new_size(
    make_router: StartRouter, backend: FakeBackend
) -> None:
    """Claude Code compacts a 5,000-token conversation to 1,000: the summary takes the
    first message's place, so the root is new. By its session the router knows it
    is the same conversation and counts 1,004 at once; by the root it would count
    the dead 5,004 for ``conversation_window_s`` (5 minutes), holding back
    newcomers for a context nobody will send again."""
    router = await _router(make_router, backend)
    token = await start_agent(router.url)
    agent_id = token.split(".")[1]
    backend.behaviour.prompt_tokens = 5000
    await _claude_code_turn(router, token, WORDS, billing="79e")
    backend.behaviour.prompt_tokens = 1000
    await _claude_code_turn(router, token, "This session is being continued ...", billing="cf6")
    _, status = await control("GET", f"{router.url}/kairos/v1/agents/{agent_id}")
    assert status["context_tokens"] == 1_004
    assert status["conversations"] == 1
    assert router.core.ledger.usage_tokens("i0") == 1_004

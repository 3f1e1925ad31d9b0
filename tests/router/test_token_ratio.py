"""Bytes a token, learned from agents' first requests (router/token_ratio.py): the
estimator alone, and a newcomer sized by it through the real router."""

from __future__ import annotations

import asyncio

import openai
from hypothesis import given
from hypothesis import strategies as st
from openai.types.chat import ChatCompletionMessageParam

from router.testing import FakeBackend, RunningRouter
from router.token_ratio import (
    DEFAULT_BYTES_PER_TOKEN,
    MAX_BYTES_PER_TOKEN,
    MIN_BYTES_PER_TOKEN,
    MIN_PROMPT_TOKENS,
    MIN_SAMPLES,
    WINDOW,
    BytesPerToken,
)
from tests.router.conftest import StartRouter, agent_key, end_agent, start_agent


def test_four_bytes_a_token_until_enough_agents_then_their_median() -> None:
    ratio = BytesPerToken()
    for _ in range(MIN_SAMPLES - 1):
        ratio.observe(3_000, 1_000)
    assert ratio.value == DEFAULT_BYTES_PER_TOKEN and ratio.tokens(40_000) == 10_000
    ratio.observe(3_000, 1_000)
    assert ratio.value == 3.0 and ratio.tokens(30_000) == 10_000


def test_small_or_empty_prompts_are_not_evidence() -> None:
    ratio = BytesPerToken()
    for _ in range(2 * MIN_SAMPLES):
        ratio.observe(10_000, MIN_PROMPT_TOKENS - 1)  # the chat template's framing
        ratio.observe(0, 5_000)
        ratio.observe(5_000, 0)
    assert ratio.samples == 0 and ratio.value == DEFAULT_BYTES_PER_TOKEN


def test_one_agent_sending_padding_does_not_move_the_estimate() -> None:
    ratio = BytesPerToken()
    for _ in range(MIN_SAMPLES):
        ratio.observe(3_000, 1_000)
    ratio.observe(10_000_000, 1_000)  # megabytes of whitespace
    assert ratio.value == 3.0


def test_it_follows_a_model_swap_within_the_window() -> None:
    ratio = BytesPerToken()
    for _ in range(WINDOW):
        ratio.observe(4_000, 1_000)
    for _ in range(WINDOW // 2 + 1):
        ratio.observe(2_500, 1_000)
    assert ratio.value == 2.5


@given(
    st.lists(st.tuples(st.integers(-(10**9), 10**9), st.integers(-(10**9), 10**9)), max_size=200),
    st.integers(0, 10**9),
    st.integers(0, 10**9),
)
def test_bounded_and_monotone_whatever_it_is_fed(
    observed: list[tuple[int, int]], small: int, large: int
) -> None:
    ratio = BytesPerToken()
    for body_bytes, tokens in observed:
        ratio.observe(body_bytes, tokens)
    assert MIN_BYTES_PER_TOKEN <= ratio.value <= MAX_BYTES_PER_TOKEN
    low, high = sorted((small, large))
    assert 0 <= ratio.tokens(low) <= ratio.tokens(high)


def _user(chars: int) -> list[ChatCompletionMessageParam]:
    return [{"role": "user", "content": "x" * chars}]


async def _turn(router: RunningRouter, token: str, chars: int) -> None:
    client = openai.AsyncOpenAI(
        base_url=router.url + "/v1", api_key=agent_key(token, "sk"), max_retries=0
    )
    try:
        await client.chat.completions.create(model="fake-model", messages=_user(chars))
    finally:
        await client.close()


async def test_a_newcomer_is_sized_by_the_bytes_a_token_its_predecessors_took(
    make_router: StartRouter, backend: FakeBackend
) -> None:
    """Agents whose 2,000-token first prompts took about 4,400 bytes (2.2 a token,
    as code in JSON may) teach the router. A newcomer's 17,600-byte body is then
    sized at about 8,000 tokens, not 4,400, so on a 10,000-token instance already
    holding a 2,000-token session it waits instead of being admitted past β."""
    backend.behaviour.capacity_tokens = 10_000
    backend.behaviour.prompt_tokens = 2_000
    router = await make_router([backend.url])
    await router.health.check_once()
    for _ in range(MIN_SAMPLES):
        token = await start_agent(router.url)
        await _turn(router, token, 4_330)
        await end_agent(router, token)
    ratio = router.core.body_tokens.value
    assert 2.1 < ratio < 2.3
    assert f"kairos_router_body_bytes_per_token {ratio}" in router.core.metrics.render().decode()

    resident = await start_agent(router.url)
    await _turn(router, resident, 100)
    adm = router.core.admission
    newcomer = await start_agent(router.url)
    task = asyncio.create_task(_turn(router, newcomer, 17_530))
    await adm.wait_until(lambda: len(adm.queue("i0")) == 1)
    agent = router.core.ledger.get(newcomer.split(".")[1])
    assert agent is not None and 7_600 < (agent.estimated_context_tokens or 0) < 8_400
    assert not task.done()
    await end_agent(router, resident)
    await task

"""One identity, two conversations, on the real engine (router/conversations.py).

A harness sends a short side request (a title, a summary) between two turns of
its main conversation, under the same key. vLLM keeps the main conversation's
prefix in its cache across it, and the next main turn is served from it (vLLM's
own ``prefix_cache_hits`` counter is the judge); so the router keeps counting the
main conversation's context as the agent's ``C_a`` rather than the side
request's, in the agent's status and in the instance's ``U``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.realvllm.engine import (
    VllmServer,
    reusable_prefix_tokens,
    running_router,
    start_agent,
    wait_for,
)

pytestmark = [pytest.mark.realvllm, pytest.mark.e2e, pytest.mark.timeout(600)]


def _context(line: dict[str, object]) -> int:
    usage = line["usage"]
    assert isinstance(usage, dict)
    return int(usage["prompt_tokens"]) + int(usage["completion_tokens"])


def test_a_side_request_leaves_the_main_conversation_counted_and_cached(
    vllm: VllmServer, vllm_workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    workdir = vllm_workdir / "conversations"
    with running_router(workdir, vllm.url, name="conversations") as router:
        agent = start_agent(router, workdir, "side", "400")
        try:
            first = agent.line()
            agent_id = str(first["agent"])
            main = _context(first)
            assert agent.line() == {"ready": "side"}
            agent.release()
            side = _context(agent.line())
            assert agent.line() == {"ready": "main"}
            status = router.agent(agent_id)
            usage = wait_for(
                "the router's U to settle after the side request",
                lambda: router.instances()[0]["usage_tokens"] or None,
                timeout_s=30,
            )
            second, hits = agent.last_turn_from_cache(vllm)
        finally:
            agent.kill()
    with capsys.disabled():
        print(
            f"\n[conversations] main context {main} tokens, side request {side}; "
            f"router C_a {status['context_tokens']} over {status['conversations']} "
            f"conversations, U {usage}; main turn 2: prompt "
            f"{second['usage']['prompt_tokens']} tokens, {hits:.0f} from vLLM's prefix cache"
        )
    assert side < main
    assert status["context_tokens"] == main and status["conversations"] == 2
    assert usage == main
    assert hits >= reusable_prefix_tokens(main) > 0  # the main prefix was still cached

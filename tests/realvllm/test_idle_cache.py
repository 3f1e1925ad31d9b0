"""What an idle session leaves in the real engine (docs/control-law.md, point 14).

Between two turns of an agent, vLLM holds none of its KV blocks: the first turn's
blocks were freed when it finished and stay only as prefix cache, which vLLM
evicts for whoever needs the room. The router's ``U`` still counts the agent's
whole context. If nobody needs the room, the second turn reuses the prefix (vLLM's
own ``prefix_cache_hits`` counter is the judge). This is why Kairos stops counting
a session idle past ``evictable_after_s`` towards admission: the room it holds is
Kairos's bookkeeping, not vLLM's.
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


def test_an_idle_session_holds_no_blocks_and_its_prefix_stays_reusable(
    vllm: VllmServer, vllm_workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    workdir = vllm_workdir / "idle-cache"
    with running_router(workdir, vllm.url, name="idle-cache") as router:
        agent = start_agent(router, workdir, "turns", "2", "300", "20", "40", "--wait")
        try:
            first = agent.line()
            assert agent.line() == {"ready": 1}
            context = first["usage"]["prompt_tokens"] + first["usage"]["completion_tokens"]
            wait_for(
                f"the router's U to count the idle session's {context} tokens",
                lambda: router.instances()[0]["usage_tokens"] == context or None,
                timeout_s=30,
            )
            idle = vllm.wait_idle()
            second, hits = agent.last_turn_from_cache(vllm)
        finally:
            agent.kill()
    with capsys.disabled():
        print(
            f"\n[idle cache] context {context} tokens in U; vLLM kv usage while idle "
            f"{idle.kv_usage_frac}; second turn prompt {second['usage']['prompt_tokens']} "
            f"tokens, {hits:.0f} from the prefix cache"
        )
    assert idle.kv_usage_frac == 0.0  # the engine reserves nothing for the idle session
    reusable = reusable_prefix_tokens(first["usage"]["prompt_tokens"])
    assert hits >= reusable > 0  # its prefix was still there to reuse

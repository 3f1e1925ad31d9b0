"""What reaches vLLM when a client walks away, and what reaches the client when vLLM says no."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.realvllm.agents.real_agent import MODEL, error_cases
from tests.realvllm.conftest import SPEC
from tests.realvllm.engine import (
    Router,
    VllmServer,
    http,
    run_agent,
    running_router,
    start_agent,
    until_conclusive,
    wait_for,
)

pytestmark = [pytest.mark.realvllm, pytest.mark.e2e, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def router(vllm: VllmServer, vllm_workdir: Path) -> Iterator[Router]:
    with running_router(vllm_workdir, vllm.url, name="router-drop") as r:
        yield r


def _drop_once(
    vllm: VllmServer, router: Router, vllm_workdir: Path
) -> tuple[dict[str, Any], int, dict[str, Any]]:
    """One agent: a full turn, then a 1900-token stream it drops after 3 chunks.
    Returns its first turn, the tokens vLLM generated, and the router's view of it
    once the dropped request is finished there. The agent ends (id-tracker reports
    it) on every path, so nothing of it stays in the router's U."""
    before = vllm.wait_idle()
    proc = start_agent(router, vllm_workdir, "drop")
    try:
        first = proc.line()
        assert proc.line() == {"read": 3}
        agent_id = first["agent_id"]
        # vLLM is frozen from the agent's third chunk until the router has let the
        # request go, so however slowly the agent and the router run, the drop
        # reaches vLLM long before the 1,900 tokens are out
        with vllm.paused():
            proc.release()
            assert proc.line() == {"dropped": True}
            status = wait_for(
                "the router to finish the dropped request",
                lambda: ((a := router.agent(agent_id))["in_flight"] == 0 and a) or None,
                timeout_s=30,
            )
        after = vllm.wait_idle(timeout_s=60)  # running returns to 0
        generated = (after.generation_tokens_total or 0) - (before.generation_tokens_total or 0)
        inst = router.instances()[0]
        proc.release()
        assert proc.wait() == 0
        return first, generated, {**status, "usage_tokens": inst["usage_tokens"]}
    finally:
        proc.kill()


def test_dropped_stream_is_aborted_upstream_and_not_counted(
    vllm: VllmServer, router: Router, vllm_workdir: Path
) -> None:
    # The tiny model decodes 1900 tokens in a few seconds: were the agent to read its
    # third chunk only after vLLM finished (vLLM is paused from that chunk on, so
    # this needs a machine starved for seconds), there would be nothing left to
    # abort. Such a try proves nothing either way and is run again (bounded); a
    # router that never aborts upstream fails every try.
    def aborted(t: tuple[dict[str, Any], int, dict[str, Any]]) -> bool:
        return t[1] < 1900 + t[0]["usage"]["completion_tokens"]

    tries = until_conclusive(lambda _: _drop_once(vllm, router, vllm_workdir), aborted)
    first, generated, status = tries[-1]
    print(
        f"\nrealvllm drop: vLLM generated {generated - first['usage']['completion_tokens']} "
        f"of the 1900 streamed tokens, in {len(tries)} tries"
    )
    assert aborted(tries[-1]), (
        f"vLLM generated every token in {len(tries)} tries ({[t[1] for t in tries]}): "
        "no abort reached it"
    )
    # the ledger keeps the completed turn only: C_a is that turn's context
    usage = first["usage"]
    assert status["turns"] == 1
    assert status["context_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert status["decode_tokens"] == usage["completion_tokens"]
    assert status["usage_tokens"] == status["context_tokens"]


def _direct(vllm: VllmServer, model: str, content: str) -> tuple[int, Any]:
    status, body = http(
        "POST",
        vllm.url + "/v1/chat/completions",
        {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": 8},
    )
    return status, json.loads(body)


def test_vllm_errors_reach_the_client_unchanged(
    vllm: VllmServer, router: Router, vllm_workdir: Path
) -> None:
    report = run_agent(router, vllm_workdir, "errors", str(SPEC.max_model_len))
    through = {
        name: (r["status"], json.loads(r["body"]))
        for name, r in report.items()
        if name != "agent_id"
    }
    # the same requests straight to vLLM: same status, same body
    direct = {
        name: _direct(vllm, case["model"], case["content"])
        for name, case in error_cases(SPEC.max_model_len).items()
    }
    assert through == direct
    assert through["too_long"][0] == 400
    assert str(SPEC.max_model_len) in through["too_long"][1]["error"]["message"]
    assert through["unknown_model"][0] == 404


def test_a_reply_past_the_model_length_is_cut_there_not_refused(vllm: VllmServer) -> None:
    # vLLM clamps max_tokens to max_model_len − prompt: a prompt that fits is served
    # and its reply stops at the model's length. The simulator's engine and the fake
    # vLLM do the same (tests/simulator/test_engine.py, tests/fakevllm); they used to
    # refuse such a request as if prompt + max_tokens had to fit.
    prompt_tokens = SPEC.max_model_len - 20
    status, body = http(
        "POST",
        vllm.url + "/v1/completions",
        {"model": MODEL, "prompt": [100] * prompt_tokens, "max_tokens": 200, "ignore_eos": True},
    )
    assert status == 200, body
    reply = json.loads(body)
    assert reply["choices"][0]["finish_reason"] == "length"
    assert (reply["usage"]["prompt_tokens"], reply["usage"]["completion_tokens"]) == (
        prompt_tokens,
        20,
    )

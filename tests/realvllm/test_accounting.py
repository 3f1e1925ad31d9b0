"""Token accounting and capacity through ``kairos-router`` against the real engine.

For every inference route, streaming and not, one agent launched by id-tracker
makes one request with the ``openai`` SDK; the router's per-agent record must
hold exactly the prompt and output tokens vLLM's own counters moved by
(``vllm:prompt_tokens_total`` / ``vllm:generation_tokens_total`` deltas).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kairos_common.vllm_metrics import parse_vllm_metrics
from router.token_ratio import DEFAULT_BYTES_PER_TOKEN, MIN_SAMPLES
from tests.realvllm.engine import (
    REPO,
    Router,
    VllmServer,
    get_json,
    http,
    run_agent,
    running_router,
    wait_for,
)

pytestmark = [pytest.mark.realvllm, pytest.mark.e2e, pytest.mark.timeout(900)]

CASES = [
    (route, stream)
    for route in ("chat", "completions", "responses", "messages")
    for stream in ("plain", "stream")
]


@pytest.fixture(scope="module")
def router(vllm: VllmServer, vllm_workdir: Path) -> Iterator[Router]:
    with running_router(vllm_workdir, vllm.url, name="router-accounting") as r:
        yield r


def _record(router: Router, agent_id: str) -> dict[str, Any]:
    return wait_for(
        f"the router's record of {agent_id}",
        lambda: router.records_by_agent().get(agent_id),
        timeout_s=30,
    )


@pytest.mark.parametrize(("route", "stream"), CASES)
def test_agent_tokens_equal_vllm_counters(
    vllm: VllmServer, router: Router, vllm_workdir: Path, route: str, stream: str
) -> None:
    before = vllm.wait_idle()
    report = run_agent(router, vllm_workdir, "route", route, stream)
    after = vllm.wait_idle()
    assert before.prompt_tokens_total is not None and after.prompt_tokens_total is not None
    assert before.generation_tokens_total is not None
    assert after.generation_tokens_total is not None
    prompt = after.prompt_tokens_total - before.prompt_tokens_total
    output = after.generation_tokens_total - before.generation_tokens_total
    rec = _record(router, report["agent_id"])
    assert rec["turns"] == 1
    assert (rec["prompt_tokens"], rec["decode_tokens"]) == (prompt, output), (
        f"{route}/{stream}: router counted {rec['prompt_tokens']}+{rec['decode_tokens']}, "
        f"vLLM {prompt}+{output}; client saw {report}"
    )
    assert prompt > 0 and output > 0
    # streams the router asked usage for behind the client's back show no extra event
    assert report.get("usage_chunks", 0) == 0


def test_claude_codes_token_count_through_the_router(
    vllm: VllmServer, router: Router, vllm_workdir: Path
) -> None:
    """``/v1/messages/count_tokens`` (router/token_count.py) reaches vLLM with the
    agent's real key and comes back as vLLM answers it; it counts what the
    ``/v1/messages`` request then takes, and it is no turn of the agent."""
    report = run_agent(router, vllm_workdir, "count")
    headers = {"x-api-key": "sk-user-real-key", "anthropic-version": "2023-06-01"}
    status, direct = http(
        "POST", vllm.url + "/v1/messages/count_tokens", report["body"], headers=headers
    )
    assert status == 200
    assert report["count"] == json.loads(direct)
    assert report["count"]["input_tokens"] == report["usage"]["input_tokens"] > 0
    rec = _record(router, report["agent_id"])
    assert rec["turns"] == 1 and rec["prompt_tokens"] == report["usage"]["input_tokens"]


def test_capacity_from_cache_config_info(vllm: VllmServer, router: Router) -> None:
    text = vllm.metrics_text()
    parsed = parse_vllm_metrics(text)
    info = next(line for line in text.splitlines() if line.startswith("vllm:cache_config_info{"))
    assert 'num_gpu_blocks="32"' in info
    assert parsed.capacity_tokens == 32 * 128
    inst = wait_for(
        "the router to learn the capacity",
        lambda: next((i for i in router.instances() if i.get("capacity_tokens")), None),
        timeout_s=30,
    )
    assert inst["capacity_tokens"] == parsed.capacity_tokens
    models = get_json(router.url + "/v1/models")
    assert [m["id"] for m in models["data"]] == ["tiny-llama"]


def _ttft_sum_s(vllm: VllmServer) -> float:
    """vLLM's own ``vllm:time_to_first_token_seconds_sum`` (all label sets)."""
    lines = vllm.metrics_text().splitlines()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in lines
        if line.startswith("vllm:time_to_first_token_seconds_sum")
    )


def test_first_streamed_byte_is_the_first_token(
    vllm: VllmServer, router: Router, vllm_workdir: Path
) -> None:
    """The prefill signal (docs/control-law.md, point 9) ends at a stream's first byte,
    so that byte must not come before vLLM has prefilled the prompt: the router's
    time to first byte is at least vLLM's own time to first token for the request."""
    vllm.wait_idle()
    before = _ttft_sum_s(vllm)
    report = run_agent(router, vllm_workdir, "turns", "1", "900", "0", "4")
    vllm.wait_idle()
    engine_ttft_s = _ttft_sum_s(vllm) - before
    prompt_tokens = report["usages"][0]["prompt_tokens"]

    def latest() -> dict[str, Any] | None:
        # The client has its [DONE] before the router has accounted the request (on
        # a busy machine the scrape can come first): wait for this request's
        # observation, the latest one.
        state = get_json(router.url + "/kairos/v1/instances/i0/state")
        seen = max(state["observations"], key=lambda o: o["t_s"], default=None)
        return seen if seen is not None and seen["prompt_tokens"] == prompt_tokens else None

    seen = wait_for("the router's observation of the request", latest, timeout_s=30)
    assert engine_ttft_s > 0
    assert seen["ttft_s"] >= 0.9 * engine_ttft_s, (
        f"router saw the first byte after {seen['ttft_s']:.3f}s, vLLM's first token "
        f"took {engine_ttft_s:.3f}s: the stream starts before the prefill ends"
    )


def test_bytes_a_token_learned_from_the_real_tokenizer(
    vllm: VllmServer, router: Router, vllm_workdir: Path
) -> None:
    """Agents whose first prompt is Python source teach the router how many body
    bytes a token takes (router/token_ratio.py): its gauge must match what vLLM's
    own tokenizer made of such a body, not the 4 bytes a token it starts from."""
    chars = 2000
    prompts = {
        run_agent(router, vllm_workdir, "code", str(chars))["usage"]["prompt_tokens"]
        for _ in range(MIN_SAMPLES)
    }
    assert len(prompts) == 1  # the same body each time
    source = (REPO / "tests/realvllm/agents/real_agent.py").read_text()[:chars]
    body = {"messages": [{"role": "user", "content": source}], "model": "tiny-llama"}
    expected = (len(json.dumps(body, separators=(",", ":"))) + len(',"max_tokens":4')) / min(
        prompts
    )
    status, page = http("GET", router.url + "/metrics")
    assert status == 200
    line = next(
        ln
        for ln in page.decode().splitlines()
        if ln.startswith("kairos_router_body_bytes_per_token ")
    )
    learned = float(line.split()[1])
    print(
        f"\n[bytes a token] learned {learned:.3f}, vLLM's tokenizer {expected:.3f} on {chars} chars"
    )
    assert abs(learned - expected) < 0.05 * expected
    assert abs(learned - DEFAULT_BYTES_PER_TOKEN) > 0.5

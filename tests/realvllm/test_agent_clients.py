"""The agents people run, through Kairos, on the real engine: Claude Code (Anthropic
Messages), the Codex CLI (OpenAI Responses over SSE) and mini-swe-agent (LiteLLM,
OpenAI chat), each the pinned release from its registry, each launched by
``id-tracker`` in front of ``kairos-router`` and a real vLLM, as docs/agents.md
tells a user to (its commands are what runs here).

What a user relies on, judged by vLLM's own counters: the client finishes; every
turn reaches vLLM with the user's key (vLLM runs with ``--api-key``: the identity
key, or any other, would fail the turn); the agent's record holds its turns and
exactly vLLM's prompt and output tokens; the agent ends when the client exits; a
client killed while vLLM works on its request has that request aborted; Claude
Code's ``count_tokens`` calls are never turns. And what the clients' shape does to
the law (docs/agents.md, "How these clients load the control law"): a newcomer
asking for ``max_tokens`` 32000 is sized by its prompt, and a compacted Claude Code
session counts at its new size.

The model is the tier's tiny one with a 64K window and replies that end after a
few tokens (scripts/realvllm_agent_model.py): noise, never a tool call, so every
client takes its first reply as the answer.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.realvllm.clients import (
    CAP_TOKENS,
    SPEC,
    Counters,
    Home,
    finish,
    idle_counters,
    recipe,
    recipes,
    record_of,
    router_requests,
    run,
    start,
    unavailable,
)
from tests.realvllm.engine import (
    BLOCK_TOKENS,
    Router,
    VllmServer,
    http,
    running_router,
    running_vllm,
    unavailable_reason,
    until_conclusive,
    wait_for,
)

pytestmark = [pytest.mark.realvllm, pytest.mark.e2e, pytest.mark.timeout(600)]
WORDS = ("the", "quick", "brown", "fox", "jumps", "over", "the", "lazy", "dog", "while")
TEXT = " ".join(WORDS * 350)
"""A 17 KB first prompt: with Claude Code's own 49 KB, a long prefill to interrupt,
and a history a compaction replaces by something shorter."""


def needs(which: str) -> None:
    reason = unavailable(which)
    if reason is not None:
        print(f"\nagent clients: skipping: {reason}")
        pytest.skip(reason)


@pytest.fixture(scope="module")
def vllm(vllm_workdir: Path) -> Iterator[VllmServer]:
    """vLLM as docs/agents.md starts it (tool calls on, a window that holds Claude
    Code's prompt), serving the agent model, with the user's key required."""
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    reuse = os.environ.get("KAIROS_REALVLLM_AGENTS_URL")
    if reuse:  # a developer's server already running SPEC: iterate faster
        yield VllmServer(reuse.rstrip("/"), None, SPEC)
        return
    with running_vllm(vllm_workdir / "agents", SPEC, name="vllm-agents") as server:
        print(f"\nagent clients: vLLM up in {server.startup_s:.0f}s at {server.url}")
        yield server


@pytest.fixture(scope="module")
def router(vllm: VllmServer, vllm_workdir: Path) -> Iterator[Router]:
    with running_router(vllm_workdir / "agents", vllm.url, name="router-agents") as r:
        yield r


def _accounted(router: Router, agent_id: str, before: Counters, vllm: VllmServer) -> dict[str, Any]:
    """The agent's record, checked against what vLLM did meanwhile (nothing else ran)."""
    record = record_of(router, agent_id)
    done = idle_counters(vllm).minus(before)
    assert done["requests"] >= 1
    assert {k: record[k] for k in ("prompt_tokens", "decode_tokens")} == {
        "prompt_tokens": done["prompt_tokens"],
        "decode_tokens": done["decode_tokens"],
    }
    assert record["turns"] == done["requests"]
    return record


def _finished(result_stderr: str, summary: dict[str, str], record: dict[str, Any]) -> None:
    """The client exited 0, id-tracker ended the agent with it and printed its record."""
    assert summary["reason"] == "exit", result_stderr[-2000:]
    assert record["end_reason"] == "exit" and record["exit_code"] == 0
    assert summary["rest"].startswith(
        f"{record['turns']} requests, {record['decode_tokens']} output tokens"
    ), summary


def _ongoing(router: Router) -> list[dict[str, Any]]:
    """The agents the router has placed on the instance, as its daemon sees them."""
    _, body = http("GET", router.url + "/kairos/v1/instances/i0/state")
    return list(json.loads(body)["ongoing"])


def _exited(proc: subprocess.Popen[str]) -> None:
    """Fail at once, with its output, if the client is gone."""
    if proc.poll() is not None:
        result = finish(proc)
        raise AssertionError(f"the client exited {result.returncode}:\n{result.stderr[-3000:]}")


def _claude(router: Router, command: str) -> str:
    """The Claude Code recipe with another last line (its environment, then ``command``)."""
    lines = recipe("claude-code", router).rstrip("\n").splitlines()
    assert lines[-1].startswith("id-tracker ")
    return "\n".join([*lines[:-1], command]) + "\n"


def test_the_doc_starts_vllm_as_the_tests_do() -> None:
    """docs/agents.md's vLLM line has the tool-call flags every client needs, and so
    has the server the recipes run against here (the parser is the model's own)."""
    doc = (Path(__file__).parents[2] / "docs" / "agents.md").read_text()
    serve = doc[doc.index("\nvllm serve ") :].replace("\\\n", " ").splitlines()[1]
    for flag in ("--enable-auto-tool-choice", "--tool-call-parser"):
        assert flag in serve and flag in SPEC.extra
    assert set(recipes()) == {"claude-code", "codex-config", "codex", "mini-swe-agent"}


def test_claude_code_recipe(
    vllm: VllmServer, router: Router, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Claude Code's recipe, and how the router sizes it before its first reply: by
    its prompt (body bytes over the bytes a token), not by the 32000 tokens it
    asks to generate. vLLM is paused until the router has forwarded it."""
    needs("npm")
    home = Home.make(tmp_path)
    before = idle_counters(vllm)
    with vllm.paused():
        proc = start(recipe("claude-code", router), home, router)
        try:
            newcomer = wait_for(
                "Claude Code's first request at the router",
                lambda: (
                    _exited(proc) or next((a for a in _ongoing(router) if a.get("in_flight")), None)
                ),
                timeout_s=60,
            )
            usage = router.instances()[0]["usage_tokens"]
        except BaseException:
            proc.kill()
            raise
    result = finish(proc)
    summary = result.summary()
    assert summary["id"] == newcomer["agent_id"] and summary["name"] == "claude"
    record = _accounted(router, summary["id"], before, vllm)
    _finished(result.stderr, summary, record)
    prompt = record["prompt_tokens"] / record["turns"]  # its turns' prompts differ by a few
    sized = newcomer["estimated_context_tokens"]
    with capsys.disabled():
        print(
            f"\n[claude-code] {record['turns']} turns, {record['prompt_tokens']} prompt + "
            f"{record['decode_tokens']} output tokens; newcomer sized {sized} tokens (the "
            f"instance's U {usage}, prefill signal {newcomer['prefill_tokens']}) for a "
            f"{prompt:.0f}-token prompt; by its max_tokens it would be {prompt + CAP_TOKENS:.0f}"
            f"\n{result.stderr.strip().splitlines()[-1]}"
        )
    assert newcomer["context_tokens"] is None  # sized before any reply
    assert usage == sized
    assert abs(sized - prompt) < 0.15 * prompt  # its prompt, within the bytes-a-token error


def _recipe(
    vllm: VllmServer, router: Router, home: Home, name: str, program: str
) -> dict[str, Any]:
    """Run recipe ``name`` to its end; the agent's record, checked against vLLM."""
    before = idle_counters(vllm)
    result = run(recipe(name, router), home, router)
    summary = result.summary()
    assert summary["name"] == program
    record = _accounted(router, summary["id"], before, vllm)
    _finished(result.stderr, summary, record)
    return record


def test_codex_recipe(vllm: VllmServer, router: Router, tmp_path: Path) -> None:
    needs("npm")
    home = Home.make(tmp_path)
    config = home.home / ".codex" / "config.toml"
    config.parent.mkdir()
    config.write_text(recipe("codex-config", router))
    responses = router_requests(router).get(("responses", "200"), 0)
    record = _recipe(vllm, router, home, "codex", "codex")
    assert router_requests(router).get(("responses", "200"), 0) - responses == record["turns"]


def test_mini_swe_agent_recipe(vllm: VllmServer, router: Router, tmp_path: Path) -> None:
    needs("mswea")
    record = _recipe(vllm, router, Home.make(tmp_path), "mini-swe-agent", "mini")
    # noise is never a bash tool call: it asks again until it gives up (3 format errors)
    assert record["turns"] >= 2


def _kv_tokens(vllm: VllmServer) -> int:
    """What vLLM's KV cache holds now, in tokens (its usage is relative to all
    blocks but its null block, docs/real-engine.md)."""
    assert SPEC.num_gpu_blocks is not None
    usage = vllm.metrics().kv_usage_frac or 0.0
    return round(usage * (SPEC.num_gpu_blocks - 1)) * BLOCK_TOKENS


def _kill_once(
    vllm: VllmServer, router: Router, workdir: Path
) -> tuple[bool, dict[str, int], dict[str, Any], dict[str, float]]:
    """Claude Code under id-tracker, interrupted (SIGINT to id-tracker, as ``kill
    -INT`` would) while vLLM prefills its request. vLLM is frozen from the moment
    it is seen running until the router has let the request go, so a slow client or
    router cannot let it finish first. Returns whether it was caught running, vLLM's
    work meanwhile, the agent's record, and how long it ran in vLLM, the KV cache it
    held then and the router's size for it."""
    home = Home.make(workdir)
    (home.project / "text.txt").write_text(TEXT)
    before = idle_counters(vllm)
    status, _ = http("POST", vllm.url + "/reset_prefix_cache")  # a whole prefill to run
    assert status == 200
    command = 'exec id-tracker --summary -- claude -p "$(cat text.txt)"'
    proc = start(_claude(router, command), home, router)
    try:
        t0 = time.monotonic()

        def seen() -> str | None:
            if proc.poll() is not None:
                return "exited"
            return "running" if vllm.metrics().num_running else None

        state = wait_for("Claude Code's request running in vLLM", seen, timeout_s=60)
        ran_s = time.monotonic() - t0
        with vllm.paused():
            caught = state == "running" and Counters.read(vllm).completed() == before.completed()
            held = _kv_tokens(vllm)
            (agent,) = _ongoing(router)
            proc.send_signal(signal.SIGINT)
            result = finish(proc)
            record = record_of(router, result.summary()["id"])  # written once it has ended
        seen = {"ran_s": ran_s, "kv_tokens": held, "sized": agent["estimated_context_tokens"]}
        return caught, idle_counters(vllm).minus(before), record, seen
    finally:
        if proc.poll() is None:
            proc.kill()


def test_a_client_killed_mid_request_has_its_vllm_request_aborted(
    vllm: VllmServer, router: Router, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Had vLLM not aborted the interrupted request, it would have completed once
    resumed: 16,000 prompt tokens and a reply in its counters. A try in which the
    request was not caught running (it finished first on a fast machine) proves
    nothing and is run again, at most three times."""
    needs("npm")
    tries = until_conclusive(
        lambda i: _kill_once(vllm, router, tmp_path / f"try{i}"), lambda t: t[0]
    )
    caught, done, record, seen = tries[-1]
    with capsys.disabled():
        print(
            f"\n[kill] interrupted after {seen['ran_s']:.1f}s in vLLM's prefill ({len(tries)} "
            f"tries), vLLM holding {seen['kv_tokens']:.0f} tokens of KV cache for a request "
            f"the router sized {seen['sized']:.0f} (max_tokens {CAP_TOKENS}): vLLM then "
            f"completed {done['requests']} requests, {done['prompt_tokens']} prompt tokens; "
            f"record turns {record['turns']}, end {record['end_reason']}"
        )
    assert caught, f"the request was never caught running in {len(tries)} tries"
    assert done == {"requests": 0, "prompt_tokens": 0, "decode_tokens": 0}
    assert record["turns"] == 0 and record["end_reason"] == "terminated"
    # vLLM holds what it has prefilled, nothing for the 32000 tokens asked for
    assert 0 < seen["kv_tokens"] <= 1.2 * seen["sized"] + BLOCK_TOKENS


SESSION = """exec id-tracker --summary -- sh -c '
claude -p "$(cat text.txt)" </dev/null >/dev/null
claude -p --continue "And now?" </dev/null >/dev/null
claude -p --continue /context </dev/null >/dev/null
claude -p --continue /compact </dev/null >/dev/null
claude -p --continue "After the compaction" </dev/null >/dev/null
echo compacted
read line'
"""


def test_a_claude_code_session_its_token_counts_and_its_compaction(
    vllm: VllmServer, router: Router, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One agent, one Claude Code session: a long first turn, a second, ``/context``
    (Claude Code counts its context with ``/v1/messages/count_tokens``), ``/compact``
    (a summary replaces the history) and a turn after it. The counts are never
    turns; after the compaction the router counts the session at its new size, as
    one conversation (router/conversations.py: by its session, not its root, which
    the compaction changed)."""
    needs("npm")
    home = Home.make(tmp_path)
    (home.project / "text.txt").write_text(TEXT)
    before = idle_counters(vllm)
    counts_before = router_requests(router).get(("count_tokens", "200"), 0)
    proc = start(_claude(router, SESSION), home, router, gated=True)
    try:
        assert proc.stdout is not None and proc.stdin is not None
        line = proc.stdout.readline()
        assert line == "compacted\n", (line, proc.poll())
        (agent,) = _ongoing(router)
        status = router.agent(agent["agent_id"])
        proc.stdin.write("\n")
        proc.stdin.flush()
        result = finish(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
    summary = result.summary()
    record = _accounted(router, summary["id"], before, vllm)
    _finished(result.stderr, summary, record)
    counts = router_requests(router).get(("count_tokens", "200"), 0) - counts_before
    with capsys.disabled():
        print(
            f"\n[session] {record['turns']} turns ({record['prompt_tokens']} prompt tokens), "
            f"{counts:.0f} count_tokens calls; largest context {record['max_context_tokens']}, "
            f"after the compaction C_a {status['context_tokens']} over "
            f"{status['conversations']} conversation(s)"
        )
    assert counts >= 1  # /context counted through the router, and none became a turn
    assert status["conversations"] == 1
    assert status["context_tokens"] < record["max_context_tokens"]

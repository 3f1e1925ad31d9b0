"""An agent for the real-vLLM tier: the ``openai`` SDK, configured by id-tracker alone.

usage:
  real_agent.py route ROUTE STREAM        one request on chat|completions|responses|messages
  real_agent.py turns N FIRST GROW OUTS [--wait-first] [--wait]
                                          N streamed chat turns: FIRST words, then GROW more a
                                          turn, OUTS (comma list, last repeats) tokens each
                                          (ignore_eos); --wait-first / --wait print a
                                          "ready" line and read a stdin line before the first
                                          / every later turn (AGENT_SEED varies the text)
  real_agent.py drop                      one full turn, then a stream it drops after 3
                                          chunks; waits for a stdin line before the drop
                                          and another before exiting
  real_agent.py errors MAX_LEN            a too-long prompt and an unknown model
  real_agent.py code CHARS                one chat request whose prompt is source code:
                                          the first CHARS characters of this file
  real_agent.py count                     /v1/messages/count_tokens, then /v1/messages
                                          with the same messages (as Claude Code)
  real_agent.py side WORDS                a main chat turn of WORDS words, a short side
                                          request of another conversation (a title, as
                                          a harness asks for one), then the main
                                          conversation's second turn; a "ready" line
                                          and a stdin line before each of the last two

Every mode prints JSON lines on stdout (progress, then a final report with the
agent id id-tracker gave it). ``/v1/messages`` is Anthropic's protocol, which the
openai SDK does not speak, so that route goes through the SDK's own HTTP client
(httpx) to ``ANTHROPIC_BASE_URL`` with ``ANTHROPIC_API_KEY``, as Claude Code would.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import httpx
import openai

MODEL = "tiny-llama"
WORDS = "the quick brown fox jumps over the lazy dog while kairos lowers the clock".split()  # noqa: SIM905
# 14 words: seeds 5 apart give distinct texts (no shared prefix blocks) for 14 agents


def say(obj: dict[str, Any]) -> None:
    print(json.dumps(obj), flush=True)


def text(n_words: int, seed: int) -> str:
    return " ".join(WORDS[(seed + i) % len(WORDS)] for i in range(n_words))


def usage_dict(usage: Any) -> dict[str, Any] | None:
    if usage is None:
        return None
    return dict(usage) if isinstance(usage, dict) else usage.model_dump()


def _messages(client: httpx.Client, stream: bool) -> dict[str, Any]:
    base = os.environ["ANTHROPIC_BASE_URL"].rstrip("/")
    body = {
        "model": MODEL,
        "max_tokens": 12,
        "stream": stream,
        "messages": [{"role": "user", "content": text(9, 3)}],
    }
    headers = {"x-api-key": os.environ["ANTHROPIC_API_KEY"], "anthropic-version": "2023-06-01"}
    if not stream:
        resp = client.post(f"{base}/v1/messages", json=body, headers=headers, timeout=60)
        resp.raise_for_status()
        return {"usage": resp.json().get("usage")}
    events: list[str] = []
    usage: dict[str, Any] = {}
    with client.stream(
        "POST", f"{base}/v1/messages", json=body, headers=headers, timeout=60
    ) as resp:
        resp.raise_for_status()
        for line in resp.iter_lines():
            if not line.startswith("data:"):
                continue
            obj = json.loads(line[5:])
            events.append(obj.get("type", ""))
            usage.update((obj.get("message") or {}).get("usage") or {})
            usage.update(obj.get("usage") or {})
    return {"usage": usage, "events": events}


def count() -> dict[str, Any]:
    """Claude Code's token count, then the request it counted, both as Claude Code
    sends them (Anthropic protocol, ``x-api-key``, through ``ANTHROPIC_BASE_URL``)."""
    base = os.environ["ANTHROPIC_BASE_URL"].rstrip("/")
    headers = {"x-api-key": os.environ["ANTHROPIC_API_KEY"], "anthropic-version": "2023-06-01"}
    body = {"model": MODEL, "messages": [{"role": "user", "content": text(60, 4)}]}
    with httpx.Client(timeout=60) as http:
        counted = http.post(f"{base}/v1/messages/count_tokens", json=body, headers=headers)
        counted.raise_for_status()
        sent = http.post(f"{base}/v1/messages", json={**body, "max_tokens": 4}, headers=headers)
        sent.raise_for_status()
    return {"count": counted.json(), "usage": sent.json().get("usage"), "body": body}


def route(name: str, stream: bool) -> dict[str, Any]:
    client = openai.OpenAI(max_retries=0)
    prompt = text(11, 1)
    if name == "chat":
        msgs: Any = [{"role": "user", "content": prompt}]
        if not stream:
            r = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=12)
            return {"usage": usage_dict(r.usage)}
        chunks = list(
            client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=12, stream=True)
        )
        # the router asked vLLM for usage behind the client's back: it must not show
        return {"usage": None, "usage_chunks": sum(c.usage is not None for c in chunks)}
    if name == "completions":
        if not stream:
            c = client.completions.create(model=MODEL, prompt=prompt, max_tokens=12)
            return {"usage": usage_dict(c.usage)}
        parts = list(
            client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, stream=True)
        )
        return {"usage": None, "usage_chunks": sum(p.usage is not None for p in parts)}
    if name == "responses":
        if not stream:
            r = client.responses.create(model=MODEL, input=prompt, max_output_tokens=12)
            return {"usage": usage_dict(r.usage)}
        usage = None
        kinds = []
        for ev in client.responses.create(
            model=MODEL, input=prompt, max_output_tokens=12, stream=True
        ):
            kinds.append(ev.type)
            if ev.type == "response.completed":
                usage = usage_dict(ev.response.usage)
        return {"usage": usage, "events": kinds}
    if name == "messages":
        with httpx.Client() as http:
            return _messages(http, stream)
    raise SystemExit(f"unknown route {name}")


def turns(n: int, first: int, grow: int, outs: list[int], flags: list[str]) -> dict[str, Any]:
    client = openai.OpenAI(max_retries=0)
    seed = int(os.environ.get("AGENT_SEED", "0"))
    history: list[Any] = []
    usages = []
    for k in range(n):
        if (k == 0 and "--wait-first" in flags) or (k > 0 and "--wait" in flags):
            say({"ready": k})
            sys.stdin.readline()
        history.append({"role": "user", "content": text(first if k == 0 else grow, seed + k)})
        stream = client.chat.completions.create(
            model=MODEL,
            messages=history,
            max_tokens=outs[min(k, len(outs) - 1)],
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
        reply, usage = [], None
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                reply.append(chunk.choices[0].delta.content)
            if chunk.usage is not None:
                usage = usage_dict(chunk.usage)
        history.append({"role": "assistant", "content": "".join(reply)})
        usages.append(usage)
        say({"turn": k, "usage": usage, "agent": os.environ.get("KAIROS_AGENT_ID")})
    return {"usages": usages}


def _chat(client: openai.OpenAI, messages: Any, max_tokens: int) -> tuple[str, Any]:
    r = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=max_tokens)
    return r.choices[0].message.content or "", usage_dict(r.usage)


def side(words: int) -> dict[str, Any]:
    """One identity, two conversations: the main one, and a side request between
    its turns (router/conversations.py)."""
    client = openai.OpenAI(max_retries=0)
    main: list[Any] = [
        {"role": "system", "content": text(12, 0)},
        {"role": "user", "content": text(words, 6)},
    ]
    reply, usage = _chat(client, main, 8)
    say({"main": 0, "usage": usage, "agent": os.environ.get("KAIROS_AGENT_ID")})
    say({"ready": "side"})
    sys.stdin.readline()
    title = [
        {"role": "system", "content": text(7, 9)},
        {"role": "user", "content": text(5, 11)},
    ]
    _, side_usage = _chat(client, title, 4)
    say({"side": 0, "usage": side_usage})
    say({"ready": "main"})
    sys.stdin.readline()
    main += [{"role": "assistant", "content": reply}, {"role": "user", "content": text(20, 2)}]
    _, usage = _chat(client, main, 8)
    say({"main": 1, "usage": usage})
    return {}


def code(chars: int) -> dict[str, Any]:
    """A coding agent's kind of prompt: Python source, as it reads files."""
    client = openai.OpenAI(max_retries=0)
    with open(__file__, encoding="utf-8") as f:
        source = f.read()[:chars]
    msgs: Any = [{"role": "user", "content": source}]
    r = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=4)
    return {"usage": usage_dict(r.usage)}


def drop() -> dict[str, Any]:
    client = openai.OpenAI(max_retries=0)
    msgs: Any = [{"role": "user", "content": text(20, 2)}]
    first = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=10)
    say({"turn": 0, "usage": usage_dict(first.usage), "agent_id": os.environ["KAIROS_AGENT_ID"]})
    stream = client.chat.completions.create(
        model=MODEL,
        messages=msgs,
        max_tokens=1900,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    for seen, _chunk in enumerate(stream, start=1):
        if seen >= 3:
            break
    say({"read": 3})
    sys.stdin.readline()  # the test freezes vLLM before the drop
    stream.close()  # the client walks away mid-stream
    say({"dropped": True})
    sys.stdin.readline()
    return {}


def error_cases(max_len: int) -> dict[str, dict[str, str]]:
    """Requests vLLM refuses: a prompt longer than the model's length, an unknown model."""
    return {
        "too_long": {"model": MODEL, "content": text(max_len + 50, 0)},
        "unknown_model": {"model": "no-such-model", "content": "hello"},
    }


def errors(max_len: int) -> dict[str, Any]:
    client = openai.OpenAI(max_retries=0)
    out: dict[str, Any] = {}
    for name, case in error_cases(max_len).items():
        try:
            client.chat.completions.create(
                model=case["model"],
                messages=[{"role": "user", "content": case["content"]}],
                max_tokens=8,
            )
            out[name] = {"status": 200}
        except openai.APIStatusError as exc:
            out[name] = {"status": exc.status_code, "body": exc.response.text}
    return out


def main() -> int:
    mode, args = sys.argv[1], sys.argv[2:]
    if mode == "route":
        report = route(args[0], args[1] == "stream")
    elif mode == "turns":
        outs = [int(x) for x in args[3].split(",")]
        report = turns(int(args[0]), int(args[1]), int(args[2]), outs, args[4:])
    elif mode == "drop":
        report = drop()
    elif mode == "errors":
        report = errors(int(args[0]))
    elif mode == "code":
        report = code(int(args[0]))
    elif mode == "count":
        report = count()
    elif mode == "side":
        report = side(int(args[0]))
    else:
        raise SystemExit(f"unknown mode {mode}")
    say({**report, "agent_id": os.environ.get("KAIROS_AGENT_ID")})
    return 0


if __name__ == "__main__":
    sys.exit(main())

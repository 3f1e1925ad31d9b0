"""What the fake vLLM server reads from and writes to OpenAI-style requests.

Token counts (documented, deterministic, cheap): a text of ``n`` characters is
``ceil(n / 4)`` tokens; a chat message adds 4 tokens of framing and a chat prompt
2 more. Generated text is filler of exactly one token per word ("tok ").

Hints (so a trace replayer reproduces recorded turns without sending megabytes)
are read from ``vllm_xargs`` (vLLM's field for extra per-request arguments) or the
top level of the body:

* ``kairos_prompt_tokens`` — use this prompt length instead of the estimate;
* ``kairos_output_tokens`` — generate exactly this many tokens (capped by
  ``max_tokens``/``max_completion_tokens``);
* ``kairos_shared_prefix_tokens`` — leading tokens identical to this context's
  previous prompt (otherwise computed by comparing messages).

Prefix caching needs to know *whose* context a prompt extends. The router strips
agent identity, exactly as in production, so — like vLLM's block hashing — the
fake keys a context by the hash of its first message and reuses the longest run
of leading messages identical to that context's previous request.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

DEFAULT_OUTPUT_TOKENS = 128
FILLER = "tok "


class BadRequest(ValueError):
    """The request body is not acceptable (becomes an OpenAI-style 400)."""


def text_tokens(text: str) -> int:
    return math.ceil(len(text) / 4)


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [p.get("text", "") for p in content if isinstance(p, dict)]
        return "".join(p for p in parts if isinstance(p, str))
    if content is None:
        return ""
    raise BadRequest("message content must be a string or a list of parts")


@dataclass(frozen=True, slots=True)
class ParsedPrompt:
    """A request reduced to what the engine model needs."""

    prompt_tokens: int
    output_tokens: int
    max_tokens: int | None
    cache_key: str
    message_hashes: tuple[str, ...]
    message_tokens: tuple[int, ...]
    shared_prefix_hint: int | None
    stream: bool
    include_usage: bool


def _int_field(body: dict[str, Any], key: str) -> int | None:
    xargs = body.get("vllm_xargs")
    value = xargs.get(key) if isinstance(xargs, dict) and key in xargs else body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise BadRequest(f"{key} must be a non-negative integer")
    return value


def _stream_flags(body: dict[str, Any]) -> tuple[bool, bool]:
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise BadRequest("'stream' must be a boolean")
    opts = body.get("stream_options")
    if opts is not None:
        if not stream:
            raise BadRequest("Stream options can only be defined when `stream=True`.")
        if not isinstance(opts, dict):
            raise BadRequest("'stream_options' must be an object")
    include_usage = bool(opts.get("include_usage")) if isinstance(opts, dict) else False
    return stream, include_usage


def parse_request(body: Any, *, chat: bool) -> ParsedPrompt:
    """Validate a chat/completions body and size it in tokens."""
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("'messages' must be a non-empty list")
        texts = []
        for m in messages:
            if not isinstance(m, dict):
                raise BadRequest("each message must be an object")
            texts.append(str(m.get("role", "")) + "\x00" + _content_text(m.get("content")))
        tokens = [text_tokens(t.split("\x00", 1)[1]) + 4 for t in texts]
        estimate = sum(tokens) + 2
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and all(isinstance(p, str) for p in prompt):
            prompt = "".join(prompt)
        if not isinstance(prompt, str):
            raise BadRequest("'prompt' must be a string")
        texts, tokens = [prompt], [max(text_tokens(prompt), 1)]
        estimate = tokens[0]
    hashes = tuple(
        message_hash(*t.split("\x00", 1)) if chat else message_hash("", t) for t in texts
    )
    max_tokens = _int_field(body, "max_completion_tokens") or _int_field(body, "max_tokens")
    hint_out = _int_field(body, "kairos_output_tokens")
    output = hint_out if hint_out is not None else (max_tokens or DEFAULT_OUTPUT_TOKENS)
    if max_tokens is not None:
        output = min(output, max_tokens)
    prompt_hint = _int_field(body, "kairos_prompt_tokens")
    stream, include_usage = _stream_flags(body)
    return ParsedPrompt(
        prompt_tokens=max(prompt_hint if prompt_hint is not None else estimate, 1),
        output_tokens=max(output, 1),
        max_tokens=max_tokens,
        cache_key=hashes[0],
        message_hashes=hashes,
        message_tokens=tuple(tokens),
        shared_prefix_hint=_int_field(body, "kairos_shared_prefix_tokens"),
        stream=stream,
        include_usage=include_usage,
    )


class PrefixIndex:
    """Remembers each context's last prompt (as message hashes), bounded LRU."""

    def __init__(self, max_contexts: int = 20_000) -> None:
        self._last: OrderedDict[str, tuple[tuple[str, ...], tuple[int, ...]]] = OrderedDict()
        self._max = max_contexts

    def shared_prefix(self, parsed: ParsedPrompt) -> int:
        """Tokens of ``parsed`` shared with its context's previous prompt; records it."""
        prev = self._last.get(parsed.cache_key)
        self._last[parsed.cache_key] = (parsed.message_hashes, parsed.message_tokens)
        self._last.move_to_end(parsed.cache_key)
        while len(self._last) > self._max:
            self._last.popitem(last=False)
        if parsed.shared_prefix_hint is not None:
            return min(parsed.shared_prefix_hint, parsed.prompt_tokens)
        if prev is None:
            return 0
        shared = 0
        for h_prev, h_new, tok in zip(
            prev[0], parsed.message_hashes, parsed.message_tokens, strict=False
        ):
            if h_prev != h_new:
                break
            shared += tok
        return min(shared, parsed.prompt_tokens)

    def record_output(self, cache_key: str, text: str) -> None:
        """Append the generated reply, which the client sends back next turn."""
        prev = self._last.get(cache_key)
        if prev is None:
            return
        h = message_hash("assistant", text)
        self._last[cache_key] = (prev[0] + (h,), prev[1] + (text_tokens(text) + 4,))


def message_hash(role: str, text: str) -> str:
    return hashlib.blake2b(f"{role}\x00{text}".encode(), digest_size=12).hexdigest()


def filler(tokens: int) -> str:
    return FILLER * tokens


def usage_obj(prompt: int, completion: int, cached: int | None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "completion_tokens": completion,
    }
    if cached is not None:
        out["prompt_tokens_details"] = {"cached_tokens": cached}
    return out


def finish_reason(parsed: ParsedPrompt, generated: int) -> str:
    """ "length" when the reply reached ``max_tokens`` or was cut short of what was
    asked for, which the engine does only at the model's length (as vLLM does)."""
    at_max = parsed.max_tokens is not None and generated >= parsed.max_tokens
    return "length" if at_max or generated < parsed.output_tokens else "stop"


def chat_response(
    rid: str, model: str, text: str, reason: str, usage: dict[str, Any]
) -> dict[str, Any]:
    return {
        "id": rid,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text, "tool_calls": []},
                "logprobs": None,
                "finish_reason": reason,
                "stop_reason": None,
            }
        ],
        "usage": usage,
    }


def completion_response(
    rid: str, model: str, text: str, reason: str, usage: dict[str, Any]
) -> dict[str, Any]:
    return {
        "id": rid,
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "text": text,
                "logprobs": None,
                "finish_reason": reason,
                "stop_reason": None,
            }
        ],
        "usage": usage,
    }


def chunk(
    rid: str, model: str, *, chat: bool, text: str | None, reason: str | None, first: bool = False
) -> dict[str, Any]:
    """One streaming chunk in vLLM's shape (``usage`` omitted: sent separately)."""
    if chat:
        delta: dict[str, Any] = {"content": text or ""}
        if first:
            delta = {"role": "assistant", "content": ""}
        choice: dict[str, Any] = {
            "index": 0,
            "delta": delta,
            "logprobs": None,
            "finish_reason": reason,
        }
        obj = "chat.completion.chunk"
    else:
        choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": reason}
        obj = "text_completion"
    return {
        "id": rid,
        "object": obj,
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
    }


def usage_chunk(rid: str, model: str, *, chat: bool, usage: dict[str, Any]) -> dict[str, Any]:
    obj = "chat.completion.chunk" if chat else "text_completion"
    return {
        "id": rid,
        "object": obj,
        "created": int(time.time()),
        "model": model,
        "choices": [],
        "usage": usage,
    }


def error_body(message: str, err_type: str, code: int) -> dict[str, Any]:
    """vLLM's ErrorResponse shape."""
    return {"error": {"message": message, "type": err_type, "param": None, "code": code}}

"""Usage accounting on responses, and the SSE filter for streams.

For ``/v1/chat/completions`` and ``/v1/completions`` streams the router asks the
backend for usage (``stream_options.include_usage``) even when the client did
not; :class:`SseUsageFilter` then removes that extra final usage event (``choices:
[]`` plus ``usage``) so the client sees exactly the events it asked for. Complete
events are forwarded as soon as they arrive: only a partial trailing event is
kept until its terminating blank line, since SSE clients consume whole events.

Usage shapes understood: OpenAI (``prompt_tokens``/``completion_tokens``),
Responses API and Anthropic (``input_tokens``/``output_tokens``; Anthropic streams
split them over ``message_start`` and ``message_delta``).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

_EVENT_SPLIT = re.compile(rb"\r?\n\r?\n")
_DATA_PREFIX = re.compile(rb"^data: ?", re.M)


@dataclass(slots=True)
class Usage:
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None

    @property
    def complete(self) -> bool:
        return self.prompt_tokens is not None and self.completion_tokens is not None

    def merge(self, raw: Any) -> bool:
        """Fold a ``usage`` object in; returns True if it carried token counts."""
        if not isinstance(raw, dict):
            return False
        found = False
        for field, names in (
            ("prompt_tokens", ("prompt_tokens", "input_tokens")),
            ("completion_tokens", ("completion_tokens", "output_tokens")),
        ):
            for name in names:
                value = raw.get(name)
                if isinstance(value, int) and not isinstance(value, bool):
                    setattr(self, field, value)
                    found = True
                    break
        cached = _cached_tokens(raw)
        if cached is not None:
            self.cached_tokens = cached
        return found


def _cached_tokens(raw: dict[str, Any]) -> int | None:
    """Prefix-cache hits: OpenAI ``prompt_tokens_details.cached_tokens`` or
    Anthropic ``cache_read_input_tokens`` (vLLM reports the former when enabled)."""
    details = raw.get("prompt_tokens_details")
    value = details.get("cached_tokens") if isinstance(details, dict) else None
    if value is None:
        value = raw.get("cache_read_input_tokens")
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return None


def _usage_object(obj: Any) -> Any:
    if not isinstance(obj, dict):
        return None
    usage = obj.get("usage")
    if usage is not None:
        return usage
    for wrapper in ("response", "message"):
        inner = obj.get(wrapper)
        if isinstance(inner, dict) and inner.get("usage") is not None:
            return inner["usage"]
    return None


_DECODER = json.JSONDecoder()
_USAGE_VALUE = re.compile(rb'"usage"\s*:\s*')


def usage_from_body(body: bytes) -> Usage | None:
    """Usage of a non-streaming JSON response, or None when absent/unparseable.

    Decodes only the ``usage`` value (the last one in the body: OpenAI, Responses and
    Anthropic bodies all carry it at the top level, after the content), not the
    whole response, which can be large.
    """
    usage = Usage()
    # The last '"usage"' key, found from the end (it follows the content, which
    # can be long); the regex runs over the whole body only if that one is not a key.
    last = _USAGE_VALUE.match(body, max(body.rfind(b'"usage"'), 0))
    if last is None:
        matches = list(_USAGE_VALUE.finditer(body))
        if not matches:
            return None
        last = matches[-1]
    try:
        text = body[last.end() :].decode("utf-8")
        raw, _ = _DECODER.raw_decode(text)
    except (ValueError, UnicodeDecodeError):
        raw = None
    if usage.merge(raw):
        return usage
    try:
        obj = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None
    return usage if usage.merge(_usage_object(obj)) else None


class SseUsageFilter:
    """Feed upstream bytes in, get the bytes to forward out; collects usage."""

    __slots__ = ("_buf", "events", "strip_usage_event", "usage")

    def __init__(self, strip_usage_event: bool) -> None:
        self.strip_usage_event = strip_usage_event
        self.usage = Usage()
        self.events = 0
        self._buf = b""

    def feed(self, data: bytes) -> bytes:
        if not self._buf and data.endswith(b"\n\n") and b'"usage"' not in data:
            self.events += data.count(b"data:")  # whole events, nothing to account: as is
            return data
        buf = self._buf + data if self._buf else data
        lf, crlf = buf.rfind(b"\n\n"), buf.rfind(b"\r\n\r\n")
        end = max(lf + 2 if lf >= 0 else 0, crlf + 4 if crlf >= 0 else 0)
        if not end:
            self._buf = buf
            return b""
        complete, self._buf = buf[:end], buf[end:]
        return self._process(complete)

    def flush(self) -> bytes:
        """Whatever is left when the upstream stream ends."""
        rest, self._buf = self._buf, b""
        return self._process(rest) if rest else b""

    def _process(self, complete: bytes) -> bytes:
        self.events += complete.count(b"data:")
        if b'"usage"' not in complete:
            return complete
        if b"\r\n\r\n" in complete:
            kept: list[bytes] = []
            for event in _EVENT_SPLIT.split(complete):
                if not event:
                    continue
                if b'"usage"' in event and self._consume_usage(event):
                    continue
                kept.append(event + b"\n\n")
            return b"".join(kept)
        return self._process_lf(complete)

    def _process_lf(self, complete: bytes) -> bytes:
        """Fast path for ``\\n\\n`` framing: only events that mention usage are parsed."""
        out: list[bytes] = []
        start = 0
        idx = complete.find(b'"usage"')
        while idx >= 0:
            ev_start = complete.rfind(b"\n\n", start, idx)
            ev_start = start if ev_start < 0 else ev_start + 2
            ev_end = complete.find(b"\n\n", idx)
            ev_end = len(complete) if ev_end < 0 else ev_end + 2
            if self._consume_usage(complete[ev_start:ev_end]):
                out.append(complete[start:ev_start])
                start = ev_end
            idx = complete.find(b'"usage"', ev_end)
        if not out:
            return complete
        out.append(complete[start:])
        return b"".join(out)

    def _consume_usage(self, event: bytes) -> bool:
        """Record usage in ``event``; True when the event must be dropped."""
        payload = _DATA_PREFIX.split(event, maxsplit=1)
        if len(payload) != 2:
            return False
        try:
            obj = json.loads(payload[1])
        except (ValueError, UnicodeDecodeError):
            return False
        has_usage = self.usage.merge(_usage_object(obj))
        return (
            has_usage
            and self.strip_usage_event
            and isinstance(obj, dict)
            and obj.get("choices") == []
        )

    def estimated_completion_tokens(self) -> int:
        """Without usage: one token per content event (vLLM streams ~1 token/event),
        minus the framing events (role, finish, ``[DONE]``)."""
        return max(0, self.events - 3)

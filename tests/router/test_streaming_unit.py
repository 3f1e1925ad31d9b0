"""The SSE filter: arbitrary chunk boundaries, stripping only the injected usage event."""

from __future__ import annotations

import json

import pytest

from router.streaming import SseUsageFilter, usage_from_body


def _events(with_usage: bool) -> bytes:
    chunks: list[dict[str, object]] = [
        {"choices": [{"index": 0, "delta": {"content": f"t{i}"}}]} for i in range(5)
    ]
    if with_usage:
        chunks.append({"choices": [], "usage": {"prompt_tokens": 11, "completion_tokens": 5}})
    out = b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks)
    return out + b"data: [DONE]\n\n"


@pytest.mark.parametrize("step", [1, 3, 7, 50, 10_000])
@pytest.mark.parametrize("strip", [True, False])
def test_filter_any_split(step: int, strip: bool) -> None:
    raw = _events(with_usage=True)
    filt = SseUsageFilter(strip_usage_event=strip)
    out = b"".join(filt.feed(raw[i : i + step]) for i in range(0, len(raw), step)) + filt.flush()
    assert filt.usage.prompt_tokens == 11 and filt.usage.completion_tokens == 5
    assert out == (_events(with_usage=False) if strip else raw)


def test_crlf_events_and_usage_in_content_not_stripped() -> None:
    content = {"choices": [{"index": 0, "delta": {"content": 'say "usage"'}}]}
    raw = b"data: " + json.dumps(content).encode() + b"\r\n\r\n"
    filt = SseUsageFilter(strip_usage_event=True)
    assert filt.feed(raw[:10]) + filt.feed(raw[10:]) + filt.flush() == raw
    assert filt.usage.prompt_tokens is None


def test_injected_usage_with_crlf_framing_is_stripped() -> None:
    usage = {"choices": [], "usage": {"prompt_tokens": 2, "completion_tokens": 1}}
    keep = b'data: {"choices": [{"index": 0}]}\r\n\r\n'
    raw = keep + b"data: " + json.dumps(usage).encode() + b"\r\n\r\n"
    filt = SseUsageFilter(strip_usage_event=True)
    out = filt.feed(raw) + filt.flush()
    assert b"usage" not in out and b'"index": 0' in out
    assert filt.usage.completion_tokens == 1


def test_usage_from_bodies() -> None:
    assert usage_from_body(b'{"usage": {"input_tokens": 3, "output_tokens": 2}}') is not None
    assert usage_from_body(b'{"usage": null}') is None
    assert usage_from_body(b"not json usage") is None

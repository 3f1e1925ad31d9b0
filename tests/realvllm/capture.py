"""Capture what a real vLLM says on the wire, for the parsers' unit tests.

``python -m tests.realvllm.capture [OUT_DIR]`` starts the tier's vLLM server
(the cached environment must exist: ``make realvllm``), sends one request of
each kind straight to it, and writes the raw bytes: ``metrics.txt`` (its
``/metrics`` page after that traffic), ``<route>.sse`` for streams and
``<route>.json`` for plain responses. The stored copies live in
``tests/fixtures/vllm-0.32/`` (the default OUT_DIR); ``test_live_engine_matches_
stored_captures`` checks on every run that the live engine still says the same
things in the same shapes.
"""

from __future__ import annotations

import sys
import tempfile
import urllib.request
from pathlib import Path
from typing import Any

from tests.realvllm.engine import MODEL_NAME, REPO, VllmSpec, http, running_vllm

FIXTURES = REPO / "tests" / "fixtures" / "vllm-0.32"
PROMPT = "the quick brown fox jumps over the lazy dog"


def _requests() -> dict[str, tuple[str, dict[str, Any]]]:
    chat = [{"role": "user", "content": PROMPT}]
    base = {"model": MODEL_NAME, "seed": 1, "temperature": 0.0}  # greedy: same bytes every run
    usage = {"stream_options": {"include_usage": True}}
    return {
        "chat.json": ("/v1/chat/completions", {**base, "messages": chat, "max_tokens": 5}),
        "chat.sse": (
            "/v1/chat/completions",
            {**base, "messages": chat, "max_tokens": 5, "stream": True, **usage},
        ),
        "completions.json": ("/v1/completions", {**base, "prompt": PROMPT, "max_tokens": 5}),
        "completions.sse": (
            "/v1/completions",
            {**base, "prompt": PROMPT, "max_tokens": 5, "stream": True, **usage},
        ),
        "responses.json": ("/v1/responses", {**base, "input": PROMPT, "max_output_tokens": 5}),
        "responses.sse": (
            "/v1/responses",
            {**base, "input": PROMPT, "max_output_tokens": 5, "stream": True},
        ),
        "messages.json": ("/v1/messages", {**base, "messages": chat, "max_tokens": 5}),
        "messages.sse": (
            "/v1/messages",
            {**base, "messages": chat, "max_tokens": 5, "stream": True},
        ),
    }


def _raw_post(url: str, body: dict[str, Any]) -> bytes:
    """The response bytes exactly as sent (no SSE client in between)."""
    status, data = http("POST", url, body)
    if status != 200:
        raise RuntimeError(f"POST {url} -> {status}: {data[:300]!r}")
    return data


def capture(vllm_url: str) -> dict[str, bytes]:
    """One request of each kind, then ``/metrics``; returns file name → bytes."""
    out = {name: _raw_post(vllm_url + path, body) for name, (path, body) in _requests().items()}
    with urllib.request.urlopen(vllm_url + "/metrics", timeout=10) as resp:  # noqa: S310
        out["metrics.txt"] = resp.read()
    return out


def main() -> int:
    out_dir = Path(sys.argv[1]) if len(sys.argv) > 1 else FIXTURES
    with (
        tempfile.TemporaryDirectory() as work,
        running_vllm(Path(work), VllmSpec(num_gpu_blocks=32, max_model_len=2048)) as server,
    ):
        files = capture(server.url)
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (out_dir / name).write_bytes(data)
        print(f"{out_dir / name}: {len(data)} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())

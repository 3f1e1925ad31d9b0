"""Talking to a running vLLM for calibration: its model, its metrics, timed calls.

Only vLLM's public surface is used: ``GET /v1/models`` (the served model name,
never guessed), ``GET /metrics`` (capacity from ``cache_config_info``, the
prefix-cache and preemption counters, whether anything else is running) and
``POST /v1/completions`` with token-id prompts, streamed, so a probe's prompt
has exactly the tokens it asks for and every output token's arrival is timed
(``ignore_eos`` and ``max_tokens`` fix the output length; ``return_token_ids``
shows coalesced tokens). The API key, if any, is sent to vLLM and nowhere else.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from kairos_common.vllm_metrics import MetricsParseError, VllmMetrics, parse_vllm_metrics
from whatif.errors import ProbeError

CALL_TIMEOUT_S = 600.0
"""One probe call's bound (a long prefill on a slow CPU takes tens of seconds)."""
KEEPALIVE_S = 4.0
GET_TIMEOUT = aiohttp.ClientTimeout(total=30.0, connect=10.0)
"""Models, metrics, version: a server that does not answer these in 30 s is not probed."""


@dataclass(slots=True)
class TimedCall:
    """One streamed completion: when it was sent and when each token arrived
    (``time.perf_counter`` seconds; coalesced tokens share a time)."""

    sent_s: float
    token_s: list[float] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0

    @property
    def first_s(self) -> float:
        if not self.token_s:
            raise ProbeError("a probe call returned no token")
        return self.token_s[0]

    @property
    def last_s(self) -> float:
        if not self.token_s:
            raise ProbeError("a probe call returned no token")
        return self.token_s[-1]


class VllmProbe:
    """An HTTP client for one vLLM server (open it with ``async with``)."""

    def __init__(self, url: str, api_key: str | None = None, model: str | None = None) -> None:
        self.url = url.rstrip("/")
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.model = model
        self.max_model_len: int | None = None
        """The served model's length, from ``/v1/models`` (None: not listed)."""
        self._listed = False
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> VllmProbe:
        # Idle connections are dropped before uvicorn's (vLLM's server) 5 s keep-alive
        # closes them: a request written on a closing connection fails.
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=CALL_TIMEOUT_S, connect=10.0),
            connector=aiohttp.TCPConnector(keepalive_timeout=KEEPALIVE_S),
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("VllmProbe used outside 'async with'")
        return self._session

    async def _get(self, path: str) -> bytes:
        try:
            async with self.session.get(
                self.url + path, headers=self._headers, timeout=GET_TIMEOUT
            ) as resp:
                body = await resp.read()
                if resp.status != 200:
                    raise ProbeError(f"GET {self.url}{path} -> {resp.status}: {body[:200]!r}")
                return body
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise ProbeError(f"GET {self.url}{path} failed: {exc or type(exc).__name__}") from None

    async def served_model(self) -> str:
        """The model to probe: the one given (it must be served), else the first
        ``/v1/models`` lists; its ``max_model_len`` is kept."""
        if self.model is not None and self._listed:
            return self.model
        try:
            data = json.loads(await self._get("/v1/models"))
            cards = [m for m in data["data"] if isinstance(m.get("id"), str)]
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ProbeError(f"{self.url}/v1/models: not an OpenAI model list ({exc})") from None
        if not cards:
            raise ProbeError(f"{self.url}/v1/models lists no model")
        wanted = self.model or cards[0]["id"]
        card = next((c for c in cards if c["id"] == wanted), None)
        if card is None:
            served = ", ".join(c["id"] for c in cards)
            raise ProbeError(f"{self.url} does not serve {wanted!r} (it serves {served})")
        length = card.get("max_model_len")
        if isinstance(length, int) and not isinstance(length, bool) and length > 0:
            self.max_model_len = length
        self.model = wanted
        self._listed = True
        return wanted

    async def version(self) -> str:
        """vLLM's version (``GET /version``), or ``unknown``."""
        try:
            return str(json.loads(await self._get("/version")).get("version", "unknown"))
        except (ProbeError, ValueError, AttributeError):
            return "unknown"

    async def metrics(self) -> VllmMetrics:
        text = (await self._get("/metrics")).decode("utf-8", errors="replace")
        try:
            metrics = parse_vllm_metrics(text)
        except MetricsParseError as exc:
            raise ProbeError(f"{self.url}/metrics: {exc}") from None
        if not metrics.metrics_enabled:
            raise ProbeError(
                f"{self.url}/metrics has no vllm: series (started with --disable-log-stats?)"
            )
        return metrics

    async def complete(self, prompt: list[int], max_tokens: int) -> TimedCall:
        """One streamed completion of the token-id ``prompt``, exactly ``max_tokens``
        tokens long, every token's arrival timed."""
        body: dict[str, Any] = {
            "model": await self.served_model(),
            "prompt": prompt,
            "max_tokens": max_tokens,
            "ignore_eos": True,
            "temperature": 0.0,
            "stream": True,
            "stream_options": {"include_usage": True},
            "return_token_ids": True,
        }
        call = TimedCall(time.perf_counter())
        try:
            async with self.session.post(
                self.url + "/v1/completions", json=body, headers=self._headers
            ) as resp:
                if resp.status != 200:
                    detail = await resp.read()
                    raise ProbeError(f"POST /v1/completions -> {resp.status}: {detail[:300]!r}")
                async for line in resp.content:
                    _consume(line, call)
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise ProbeError(f"POST {self.url}/v1/completions failed: {exc!r}") from None
        if len(call.token_s) < max_tokens:
            raise ProbeError(f"a probe asked {max_tokens} tokens and got {len(call.token_s)}")
        return call


def _consume(line: bytes, call: TimedCall) -> None:
    """One SSE line of a completion stream into ``call``."""
    now = time.perf_counter()
    data = line.strip()
    if not data.startswith(b"data:"):
        return
    data = data[5:].strip()
    if data == b"[DONE]":
        return
    try:
        obj = json.loads(data)
    except ValueError:
        raise ProbeError(f"vLLM sent a stream event that is not JSON: {data[:100]!r}") from None
    for choice in obj.get("choices") or ():
        ids = choice.get("token_ids")
        count = len(ids) if isinstance(ids, list) else (1 if choice.get("text") else 0)
        call.token_s.extend([now] * count)
    usage = obj.get("usage")
    if isinstance(usage, dict):
        call.prompt_tokens = int(usage.get("prompt_tokens") or 0)
        call.completion_tokens = int(usage.get("completion_tokens") or 0)

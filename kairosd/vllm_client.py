"""Scrape one vLLM server's ``/metrics`` (aiohttp, bounded by a timeout).

Parsing is :func:`kairos_common.vllm_metrics.parse_vllm_metrics` (shared with
the router); this module only does HTTP and error translation.
"""

from __future__ import annotations

import aiohttp

from kairos_common.vllm_metrics import MetricsParseError, VllmMetrics, parse_vllm_metrics
from kairosd.errors import VllmMetricsError, VllmUnavailableError


class VllmClient:
    """GET ``{base_url}/metrics`` and parse it."""

    def __init__(self, session: aiohttp.ClientSession, base_url: str, timeout_s: float) -> None:
        self.url = base_url.rstrip("/") + "/metrics"
        self._session = session
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)

    async def fetch(self) -> VllmMetrics:
        """One scrape; raises :class:`VllmUnavailableError` / :class:`VllmMetricsError`."""
        try:
            async with self._session.get(self.url, timeout=self._timeout) as resp:
                if resp.status != 200:
                    raise VllmUnavailableError(f"{self.url} answered HTTP {resp.status}")
                text = await resp.text()
        except TimeoutError as exc:
            raise VllmUnavailableError(f"{self.url} timed out") from exc
        except aiohttp.ClientError as exc:
            raise VllmUnavailableError(f"{self.url}: {exc}") from exc
        try:
            return parse_vllm_metrics(text)
        except MetricsParseError as exc:
            raise VllmMetricsError(f"{self.url}: {exc}") from exc

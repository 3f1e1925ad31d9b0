"""``/metrics`` (Prometheus text) and ``/healthz`` (JSON) over aiohttp.

Binds 127.0.0.1 by default: the endpoints expose fleet internals and there is
no auth, so exposing them beyond the host is an explicit operator decision.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from kairosd.metrics import DaemonMetrics


class HealthServer:
    """Serve ``metrics`` and ``health()`` (returns ``(healthy, body)``)."""

    def __init__(
        self,
        metrics: DaemonMetrics,
        health: Callable[[], tuple[bool, dict[str, Any]]],
        host: str,
        port: int,
    ) -> None:
        self._metrics = metrics
        self._health = health
        self.host = host
        self.port = port
        self._runner: web.AppRunner | None = None

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/metrics", self._get_metrics)
        app.router.add_get("/healthz", self._get_health)
        return app

    async def _get_metrics(self, _req: web.Request) -> web.Response:
        body = self._metrics.render()
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _get_health(self, _req: web.Request) -> web.Response:
        ok, body = self._health()
        return web.json_response(body, status=200 if ok else 503)

    async def start(self) -> int:
        """Start listening; returns the bound port (useful with port 0)."""
        self._runner = web.AppRunner(self.app(), access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        server = site._server
        sockets = getattr(server, "sockets", None) or []
        if sockets:
            self.port = int(sockets[0].getsockname()[1])
        return self.port

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

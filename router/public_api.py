"""The unauthenticated routes: ``/health`` (liveness), ``/health/ready`` (the leader
only), ``/metrics`` and the merged ``/v1/models``.

Handed the pool, the instance listing, the metrics registry, the identity resolver
and the upstream session (a getter: the session opens at start-up, after the
routes are built), not the core.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import aiohttp
from aiohttp import web

from kairos_common.wire import LIVENESS_PATH, READY_PATH, ROLE_LEADER
from router.config import TimeoutSettings
from router.identity_mw import IdentityResolver, upstream_headers
from router.instances import InstancePool
from router.metrics import RouterMetrics
from router.openai_errors import as_response, error_parts
from router.ports import InstanceListing


class PublicApi:
    """Liveness, Prometheus metrics and the models every eligible instance serves."""

    def __init__(
        self,
        *,
        pool: InstancePool,
        listing: InstanceListing,
        metrics: RouterMetrics,
        identity: IdentityResolver,
        identity_header: str,
        timeouts: TimeoutSettings,
        session: Callable[[], aiohttp.ClientSession],
        readiness: Callable[[], dict[str, object]] | None = None,
    ) -> None:
        self._readiness = readiness
        self._pool = pool
        self._listing = listing
        self._metrics = metrics
        self._identity = identity
        self._identity_header = identity_header
        self._models_timeout = aiohttp.ClientTimeout(total=timeouts.health_timeout_s * 2)
        self._session = session

    def routes(self) -> list[web.RouteDef]:
        return [
            web.get(LIVENESS_PATH, self.health),
            web.get(READY_PATH, self.ready),
            web.get("/metrics", self.metrics),
            web.get("/v1/models", self.models),
        ]

    async def health(self, _request: web.Request) -> web.Response:
        eligible = self._pool.eligible()
        return web.json_response(
            {
                "status": "ok" if eligible else "unavailable",
                "instances": self._listing.instances_json(),
            },
            status=200 if eligible else 503,
        )

    async def ready(self, _request: web.Request) -> web.Response:
        """Readiness (kairos_common.wire.READY_PATH): 200 only on the leader, so that a
        front balancer sends traffic there; the body says why not, and the store's state."""
        body: dict[str, object] = {"ready": True, "role": ROLE_LEADER}
        if self._readiness is not None:
            body = self._readiness()
        return web.json_response(body, status=200 if body.get("ready") else 503)

    async def metrics(self, _request: web.Request) -> web.Response:
        return web.Response(body=self._metrics.render(), content_type="text/plain", charset="utf-8")

    async def models(self, request: web.Request) -> web.Response:
        """``/v1/models`` of every eligible instance, merged by model id."""
        ident = self._identity.resolve(request.headers)
        headers = upstream_headers(request.headers, ident, self._identity_header, "models")
        session, timeout = self._session(), self._models_timeout

        async def fetch(url: str) -> tuple[int, Any]:
            try:
                async with session.get(url + "/v1/models", headers=headers, timeout=timeout) as r:
                    return r.status, await r.json(content_type=None)
            except (aiohttp.ClientError, TimeoutError, ValueError):
                return 0, None

        results = await asyncio.gather(*(fetch(i.base_url) for i in self._pool.eligible()))
        merged: dict[str, Any] = {}
        for status, body in results:
            if status == 401:
                return as_response(error_parts(401, "backend rejected the API key",
                    code="invalid_api_key", err_type="authentication_error"))  # fmt: skip
            if status == 200 and isinstance(body, dict) and isinstance(body.get("data"), list):
                for model in body["data"]:
                    if isinstance(model, dict) and isinstance(model.get("id"), str):
                        merged.setdefault(model["id"], model)
        if not merged and not any(s == 200 for s, _ in results):
            return as_response(error_parts(503, "no backend answered /v1/models",
                err_type="server_error", code="no_healthy_backend"))  # fmt: skip
        return web.json_response({"object": "list", "data": list(merged.values())})

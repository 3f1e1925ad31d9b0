"""``POST /v1/messages/count_tokens``: Anthropic's token counting, passed through.

Claude Code and other Anthropic clients ask this route how many input tokens a
request would take (context management, ``/context``). vLLM serves it beside
``/v1/messages``; a Claude Code user pointed at the router got 404 "unknown route"
before, since only the inference routes were proxied.

It is a tokenization, not an inference: no generation, no KV cache. So it is never
held for admission, never placed, and never accounted. It does not create an agent,
and it changes no agent's context, turns or activity. It goes to the caller's own
instance when the router knows the agent and that instance is eligible (the one that
serves its requests). Otherwise it goes to the first eligible instance that lists the
body's model, else the first eligible one.

It carries the caller's real key, as inference does (the agent part of a composed
key is stripped). Errors come in Anthropic form (``router.app.error_middleware``).
No retry: vLLM answers it from its tokenizer, and a client counts again if it must.
"""

from __future__ import annotations

from collections.abc import Callable

import aiohttp
import structlog
from aiohttp import web

from router.config import TimeoutSettings
from router.errors import (
    BadRequestError,
    NoBackendError,
    UpstreamError,
    UpstreamTimeoutError,
)
from router.identity_mw import IdentityResolver, upstream_headers
from router.instances import Instance, InstancePool
from router.json_body import parse_json, read_body
from router.metrics import RouterMetrics

log = structlog.get_logger("kairos.router.token_count")

PATH = "/v1/messages/count_tokens"
ROUTE = "count_tokens"
"""Its ``route`` label in ``kairos_router_requests_total``."""


class TokenCountApi:
    """The pass-through; handed what it reads, not the core."""

    def __init__(
        self,
        *,
        pool: InstancePool,
        instance_of: Callable[[str], str | None],
        identity: IdentityResolver,
        identity_header: str,
        metrics: RouterMetrics,
        timeouts: TimeoutSettings,
        max_body_bytes: int,
        session: Callable[[], aiohttp.ClientSession],
    ) -> None:
        self._pool = pool
        self._instance_of = instance_of
        self._identity = identity
        self._identity_header = identity_header
        self._metrics = metrics
        # A tokenization answers in milliseconds; a backend busy prefilling may take
        # seconds to get to it, but never the generation bound.
        self._timeout = aiohttp.ClientTimeout(
            total=timeouts.health_timeout_s * 15, sock_connect=timeouts.connect_s
        )
        self._max_body = max_body_bytes
        self._body_read_s = timeouts.body_read_s
        self._session = session
        self._seq = 0

    def routes(self) -> list[web.RouteDef]:
        return [web.post(PATH, self.count_tokens)]

    async def count_tokens(self, request: web.Request) -> web.Response:
        try:
            response = await self._count(request)
        except Exception as exc:  # RouterError and aiohttp's HTTPException carry a status
            self._metrics.requests.labels(ROUTE, str(getattr(exc, "status", 500))).inc()
            raise
        self._metrics.requests.labels(ROUTE, str(response.status)).inc()
        return response

    async def _count(self, request: web.Request) -> web.Response:
        body = await read_body(request, self._max_body, self._body_read_s)
        obj = await parse_json(body)
        if not isinstance(obj, dict):
            raise BadRequestError("the request body must be a JSON object")
        ident = self._identity.resolve(request.headers)
        inst = self._choose(ident.agent_id, obj.get("model"))
        self._seq += 1
        request_id = request.headers.get("X-Request-Id") or f"count-{self._seq}"
        headers = upstream_headers(request.headers, ident, self._identity_header, request_id)
        try:
            async with self._session().post(
                inst.base_url + PATH, data=body, headers=headers, timeout=self._timeout
            ) as upstream:
                payload = await upstream.read()
                status, content_type = upstream.status, upstream.content_type
        except TimeoutError as exc:
            raise UpstreamTimeoutError(f"{inst.name} did not count the tokens in time") from exc
        except aiohttp.ClientError as exc:
            log.warning("count_tokens_upstream_failed", instance=inst.name, error=str(exc))
            raise UpstreamError(f"could not reach {inst.name}") from exc
        return web.Response(
            status=status,
            body=payload,
            content_type=content_type or "application/json",
            headers={"X-Request-Id": request_id},
        )

    def _choose(self, agent_id: str | None, model: object) -> Instance:
        """The agent's own instance if eligible, else one that serves ``model``."""
        eligible = self._pool.eligible()
        if not eligible:
            raise NoBackendError("no healthy backend instance")
        own = self._pool.get(self._instance_of(agent_id)) if agent_id else None
        if own is not None and own in eligible:
            return own
        serving = [i for i in eligible if isinstance(model, str) and model in i.served_models]
        return (serving or eligible)[0]

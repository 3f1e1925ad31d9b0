"""Relaying one upstream response to the client (JSON at once, SSE as it arrives).

Split from :mod:`router.proxy` so the proxy module holds the request's path
through identity, placement, admission and retries (:mod:`router.forwarding`),
and this one the byte shovelling with its two failure sides (an upstream that
stops, a client that stops reading). Plain functions of their inputs: the only
collaborator is the clock that stamps the first byte.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp
import structlog

from router.errors import TransportError, UpstreamError
from router.exchange import Exchange
from router.openai_errors import sse_error_event
from router.streaming import SseUsageFilter, Usage, usage_from_body
from router.upstream import UpstreamResponse

log = structlog.get_logger("kairos.router.proxy")

_DROP_RESPONSE = frozenset(
    {"content-length", "transfer-encoding", "connection", "keep-alive", "date", "server",
     "content-encoding"}
)  # fmt: skip
_RESCHEDULE_EVERY_S = 1.0
_ERROR_WRITE_S = 5.0


@dataclass(slots=True)
class Outcome:
    """What one relayed response did: the accounting input of :class:`router.proxy.Proxy`."""

    status: int
    usage: Usage | None
    estimated_completion: int
    first_data_s: float | None = None
    t_sent_s: float | None = None


async def relay(
    ex: Exchange,
    resp: UpstreamResponse,
    inject: bool,
    request_id: str,
    finished: list[Outcome],
    idle_s: float,
    clock: Callable[[], float],
    first_data: Callable[[], None],
    *,
    t_sent_s: float,
) -> Outcome:
    """Relay the response to ``ex``; ``finished`` gets the outcome as soon as the upstream's
    final usage has arrived (before our end of stream). ``first_data`` is called
    when the first byte of the answer arrives (the whole body when not streamed):
    the prompt has been prefilled by then. Every outcome carries ``t_sent_s`` (when
    the request went upstream), the early ``finished`` one too: it is the one
    accounted when the client leaves right after the upstream finished, and the
    online model's observation of the request needs it."""
    headers = {k: v for k, v in resp.headers if k.lower() not in _DROP_RESPONSE}
    if not resp.has_header("X-Request-Id"):
        headers["X-Request-Id"] = request_id
    if not resp.content_type.startswith("text/event-stream"):
        try:
            data = await resp.read()
        except TransportError as exc:
            raise UpstreamError(f"upstream body failed: {exc}") from None
        first_data()
        # Sent now: the client has its answer while the router accounts the
        # request. A client gone by now changes nothing (send returns quietly):
        # the backend did the work, so the turn is accounted.
        await ex.send(resp.status, headers, data)
        usage = usage_from_body(data) if resp.status == 200 else None
        return Outcome(resp.status, usage, max(1, len(data) // 8), t_sent_s=t_sent_s)
    await ex.start(resp.status, headers)
    filt = SseUsageFilter(strip_usage_event=inject)
    loop = asyncio.get_running_loop()
    read = resp.readany
    next_reschedule = loop.time() + _RESCHEDULE_EVERY_S
    first_data_s: float | None = None
    writing = False
    try:
        # One timer bounds both sides: an upstream that goes quiet and a client
        # that stops reading (its write never drains) are dropped after idle_s.
        async with asyncio.timeout(idle_s) as idle:
            while chunk := await read():
                if first_data_s is None:
                    first_data_s = clock()
                    first_data()
                data = filt.feed(chunk)
                if not finished and filt.usage.complete and resp.status == 200:
                    est = filt.estimated_completion_tokens()
                    finished.append(Outcome(resp.status, filt.usage, est, first_data_s, t_sent_s))
                if data:
                    writing = True
                    await ex.write(data)
                    writing = False
                now = loop.time()
                if now >= next_reschedule:  # idle bound exact to within a second
                    idle.reschedule(now + idle_s)
                    next_reschedule = now + _RESCHEDULE_EVERY_S
        rest = filt.flush()
        if rest:
            writing = True
            await ex.write(rest)
            writing = False
    except (TransportError, aiohttp.ClientError, TimeoutError, ConnectionResetError) as exc:
        # aiohttp reports a client that went away as ClientConnectionResetError,
        # a ClientError too: who failed is told by what we were doing.
        if writing and isinstance(exc, ConnectionResetError):
            log.info("client_disconnected", path=ex.path)
            if not filt.usage.complete:
                return Outcome(499, None, 0)
            # The upstream finished (its usage arrived) and the client left as
            # the last bytes went out: the work was done, so it is accounted.
        elif writing and isinstance(exc, TimeoutError):
            log.info("slow_client_dropped", path=ex.path, idle_s=idle_s)
            ex.abort()
            return Outcome(499, None, 0)
        else:
            log.warning("upstream_stream_failed", error=type(exc).__name__)
            anthropic = ex.path == "/v1/messages"
            with contextlib.suppress(ConnectionResetError, TimeoutError):
                async with asyncio.timeout(_ERROR_WRITE_S):
                    await ex.write(sse_error_event("upstream stream failed", anthropic))
                    await ex.end()
            return Outcome(502, None, 0)
    else:
        with contextlib.suppress(ConnectionResetError):
            # A client that read [DONE] may close before our end of stream: the
            # request is complete all the same and must be accounted.
            await ex.end()
    usage = filt.usage if filt.usage.complete else None
    est = filt.estimated_completion_tokens()
    return Outcome(resp.status, usage, est, first_data_s, t_sent_s)

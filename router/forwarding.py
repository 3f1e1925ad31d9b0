"""Forwarding one request to its agent's instance, and the retry policy.

Split from :mod:`router.proxy` so the proxy module holds the request's path
through identity, placement, admission and accounting, and this one what happens
between the router and the backends: which failures are retried where, which
feed the circuit breaker, and which become the client's error.

Retry policy: a request is retried on another eligible instance (``max_attempts``
in all; the agent moves with the retry) only when it provably did not reach a
backend — the connection was refused or failed before anything was sent — or the
backend answered 503 (vLLM: not ready) before any byte reached the client. A POST
that may have reached a backend is never sent twice: no duplicate generations,
no duplicate stored ``/v1/responses``. Timeouts and 5xx feed the per-instance
circuit breaker (:mod:`router.breaker`). After the first byte, an upstream
failure is sent to the client in the protocol's error form and the stream ends.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import structlog

from router.breaker import CircuitBreakers
from router.config import TimeoutSettings
from router.errors import (
    BadRequestError,
    RouterError,
    TransportClosedError,
    TransportConnectError,
    TransportRequestError,
    TransportTimeoutError,
    UpstreamError,
    UpstreamTimeoutError,
)
from router.exchange import Exchange
from router.instances import Instance, InstancePool
from router.ledger import Agent, Ledger
from router.metrics import RouterMetrics
from router.placement_service import PlacementService
from router.ports import HealthSink
from router.relay import Outcome, relay
from router.upstream import UpstreamClient

log = structlog.get_logger("kairos.router.proxy")


@dataclass(frozen=True, slots=True)
class _Retry:
    """An attempt that provably did not run the request: ``error`` for the final 502,
    ``reason`` for the retries metric."""

    error: str
    reason: str


class Forwarder:
    """Sends a request upstream with the retry policy above; one per proxy.

    ``upstream`` gives the hot path's client at each attempt (it is opened at app
    start-up, after the wiring). ``running`` counts the requests being forwarded to
    or relayed from each instance: the ``running`` count of an observation, without
    a pass over the instance's agents.
    """

    def __init__(
        self,
        *,
        pool: InstancePool,
        ledger: Ledger,
        placement: PlacementService,
        metrics: RouterMetrics,
        breakers: CircuitBreakers,
        health: HealthSink,
        clock: Callable[[], float],
        timeouts: TimeoutSettings,
        max_attempts: int,
        upstream: Callable[[], UpstreamClient],
    ) -> None:
        self._pool = pool
        self._ledger = ledger
        self._placement = placement
        self._metrics = metrics
        self._breakers = breakers
        self._health = health
        self._clock = clock
        self._timeouts = timeouts
        self._max_attempts = max_attempts
        self._upstream = upstream
        self.running: dict[str, int] = {}

    async def forward(
        self,
        ex: Exchange,
        agent: Agent,
        body: bytes,
        headers: dict[str, str],
        inject: bool,
        finished: list[Outcome],
        first_data: Callable[[], None],
    ) -> Outcome:
        """Send the request to ``agent``'s instance, retrying on another one only
        when the attempt provably did not run it (the agent moves with the retry)."""
        tried: set[str] = set()
        last_error = "no attempt"
        attempts = self._max_attempts
        running = self.running
        pool = self._pool
        for attempt in range(attempts):
            inst = pool.get(agent.instance)
            if inst is None:
                break
            tried.add(inst.name)
            last = attempt + 1 >= attempts
            running[inst.name] = running.get(inst.name, 0) + 1
            try:
                result = await self._attempt(
                    ex, inst, body, headers, inject, finished, first_data, last
                )
            finally:
                running[inst.name] -= 1
            if not isinstance(result, _Retry):
                return result
            last_error = result.error
            if not last:
                self._retry_move(agent, inst.name, result.reason, tried)
        raise UpstreamError(f"no backend could serve the request ({last_error})", retry_after_s=2)

    async def _attempt(
        self,
        ex: Exchange,
        inst: Instance,
        body: bytes,
        headers: dict[str, str],
        inject: bool,
        finished: list[Outcome],
        first_data: Callable[[], None],
        last: bool,
    ) -> Outcome | _Retry:
        """One try on ``inst``: the relayed response, or why another instance may try."""
        clock = self._clock
        t_sent = clock()
        try:
            resp = await self._upstream().request(
                ex.method, inst.base_url, ex.path_qs, headers, body,
                read_timeout_s=self._timeouts.first_byte_s,
            )  # fmt: skip
        except TransportTimeoutError:
            self._breakers.failure(inst, "timeout")
            raise UpstreamTimeoutError(
                f"instance {inst.name} sent no response within {self._timeouts.first_byte_s}s"
            ) from None
        except TransportConnectError as exc:
            # Refused / unreachable: nothing was sent, so a retry cannot duplicate.
            # The backend's address stays in the log, out of the client's error body.
            log.warning("upstream_connect_failed", instance=inst.name, error=str(exc))
            self._health.mark_health(inst, ok=False)
            return _Retry("connection failed", "connect")
        except TransportClosedError:
            # Reset or closed after (part of) the request went out: it may be
            # running on the backend; answering 502 beats generating twice.
            self._breakers.failure(inst, "disconnected")
            raise UpstreamError(f"instance {inst.name} dropped the connection") from None
        except TransportRequestError as exc:  # a forwarded header with a control character
            raise BadRequestError(str(exc)) from None
        m = self._metrics
        m.ttfb.labels(inst.name).observe(clock() - t_sent)
        if resp.status >= 500:
            self._breakers.failure(inst, f"http_{resp.status}")
            if resp.status == 503 and not last:
                resp.close()  # not ready: it did not run the request
                return _Retry("HTTP 503", "http_503")
        else:
            self._breakers.success(inst)
        done = False
        try:
            result = await relay(
                ex, resp, inject, headers["X-Request-Id"], finished,
                self._timeouts.idle_stream_s, clock, first_data, t_sent_s=t_sent,
            )  # fmt: skip
            done = True
            return result
        finally:
            if done:
                resp.release()
            else:
                resp.close()

    def _retry_move(self, agent: Agent, source: str, reason: str, tried: set[str]) -> None:
        m = self._metrics
        m.retries.labels(source, reason).inc()
        try:
            target = self._placement.choose(agent, exclude=tried)
        except RouterError:
            return
        if agent.admitted:
            self._ledger.set_ongoing(agent, target.name)
            m.reassignments.labels(source, target.name, "retry").inc()
        else:
            self._ledger.place(agent, target.name)
        log.info("upstream_retry", agent=agent.agent_id, source=source, target=target.name,
                 reason=reason)  # fmt: skip

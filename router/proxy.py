"""The inference hot path: identity → placement → admission → upstream → ledger.

Kept lean on purpose (the router's added latency is a published number): one
JSON parse of the request, no re-serialisation unless usage has to be injected,
per-route metric children bound once, complete SSE events forwarded as they
arrive.

Retries, and which upstream failures feed the circuit breaker or become the
client's error: :mod:`router.forwarding`.

Limits (docs/reliability.md): bodies are capped and read within a bound,
parsed with a depth limit (large ones off the event loop); an agent's requests
waiting for admission are bounded; a request that would wait is first checked
with a backend for a valid API key, so bogus keys never occupy hold-queue slots;
a client that stops reading a stream is dropped after ``idle_stream_s``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import structlog
from aiohttp import web

from router.admission import AdmissionService
from router.agents import AgentService
from router.breaker import CircuitBreakers
from router.config import RouterConfig, TimeoutSettings
from router.conversations import claude_code_thread, conversation_key
from router.energy import ONE_TURN, EnergyService
from router.errors import (
    AuthenticationError,
    BadRequestError,
    RouterError,
    TooManyRequestsError,
)
from router.exchange import AiohttpExchange, Exchange
from router.forwarding import Forwarder
from router.identity_mw import IdentityResolver, KeyChecker, upstream_headers
from router.instances import InstancePool
from router.json_body import parse_json
from router.leadership import LeaderGate
from router.ledger import Agent, Ledger, PrefillClaim
from router.metrics import RouterMetrics
from router.observations import ObservationLog, observation
from router.openai_errors import router_error_parts
from router.placement_service import PlacementService
from router.ports import HealthSink
from router.relay import Outcome
from router.streaming import Usage
from router.trace_recorder import TraceRecorder
from router.upstream import UpstreamClient

log = structlog.get_logger("kairos.router.proxy")

ROUTES = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completions",
    "/v1/responses": "responses",
    "/v1/messages": "messages",
}
_USAGE_INJECTABLE = frozenset({"chat", "completions"})
_INJECT_PREFIX = b'{"stream_options":{"include_usage":true},'


@dataclass(frozen=True, slots=True)
class ProxyLimits:
    """The part of :class:`RouterConfig` the proxy enforces per request."""

    timeouts: TimeoutSettings
    max_body_bytes: int
    max_attempts: int
    max_waiting_per_agent: int
    retry_after_s: float
    identity_header: str

    @classmethod
    def from_config(cls, cfg: RouterConfig) -> ProxyLimits:
        return cls(
            timeouts=cfg.timeouts,
            max_body_bytes=cfg.max_body_bytes,
            max_attempts=cfg.max_attempts,
            max_waiting_per_agent=cfg.max_waiting_per_agent,
            retry_after_s=cfg.admission.retry_after_s,
            identity_header=cfg.identity_header,
        )


def _check_body(obj: Any) -> None:
    if not isinstance(obj, dict):
        raise BadRequestError("request body must be a JSON object")
    stream = obj.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise BadRequestError("'stream' must be a boolean")
    options = obj.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise BadRequestError("'stream_options' must be an object")
    model = obj.get("model")
    if model is not None and not isinstance(model, str):
        raise BadRequestError("'model' must be a string")


class Proxy:
    """aiohttp handlers for the OpenAI/Anthropic inference routes.

    Handed, by the composition root, the services a request passes through and
    nothing else: every one is bound as an attribute here, so the hot path pays one
    attribute load per collaborator (no ``core.x.y`` chains, no indirection).
    """

    def __init__(
        self,
        *,
        pool: InstancePool,
        ledger: Ledger,
        agents: AgentService,
        placement: PlacementService,
        admission: AdmissionService,
        energy: EnergyService,
        observations: ObservationLog,
        metrics: RouterMetrics,
        identity: IdentityResolver,
        breakers: CircuitBreakers,
        health: HealthSink,
        clock: Callable[[], float],
        limits: ProxyLimits,
        gate: LeaderGate | None = None,
        trace: TraceRecorder | None = None,
    ) -> None:
        self._gate = gate if gate is not None else LeaderGate(clock)
        self._pool = pool
        self._ledger = ledger
        self._agents = agents
        self._placement = placement
        self._admission = admission
        self._energy = energy
        self._observations = observations
        self._metrics = metrics
        self.identity = identity
        self.breakers = breakers
        self._health = health
        self._clock = clock
        self._limits = limits
        self._trace = trace
        """Agent traces for ``kairos whatif`` (None: not recording, the default)."""
        self._identity_header = limits.identity_header
        self._session: aiohttp.ClientSession | None = None
        self._upstream: UpstreamClient | None = None
        self.timeouts = limits.timeouts
        self.max_body = limits.max_body_bytes
        self.keys = KeyChecker(clock)
        self._request_prefix = f"kr-{uuid.uuid4().hex[:12]}"
        self._request_seq = 0
        self._overhead = {r: metrics.overhead.labels(r) for r in ROUTES.values()}
        self._forwarder = Forwarder(
            pool=pool,
            ledger=ledger,
            placement=placement,
            metrics=metrics,
            breakers=breakers,
            health=health,
            clock=clock,
            timeouts=limits.timeouts,
            max_attempts=limits.max_attempts,
            upstream=lambda: self.upstream,  # opened at start-up, after the wiring
        )

    @property
    def session(self) -> aiohttp.ClientSession:
        """The upstream client session (opened at app start-up)."""
        if self._session is None:
            raise RuntimeError("router proxy used before start-up")
        return self._session

    @session.setter
    def session(self, session: aiohttp.ClientSession | None) -> None:
        self._session = session

    @property
    def upstream(self) -> UpstreamClient:
        """The hot path's upstream client (opened at app start-up): requests to the
        backends go through it; the session above serves the key probe."""
        if self._upstream is None:
            raise RuntimeError("router proxy used before start-up")
        return self._upstream

    @upstream.setter
    def upstream(self, client: UpstreamClient | None) -> None:
        self._upstream = client

    async def _read_json(self, ex: Exchange) -> tuple[bytes, dict[str, Any]]:
        body = await ex.read_body(self.max_body, self.timeouts.body_read_s)
        obj = await parse_json(body)
        _check_body(obj)
        return body, obj

    async def handle(self, request: web.Request) -> web.StreamResponse:
        """The aiohttp route handler: :meth:`serve` over the request, and the
        response it sent (aiohttp leaves a sent response alone)."""
        ex = AiohttpExchange(request)
        await self.serve(ex)
        assert ex.response is not None
        return ex.response

    async def serve(self, ex: Exchange) -> None:
        """Answer one inference request, whichever server received it (an error in
        the route's protocol form when it fails before the answer started)."""
        route = ROUTES[ex.path]
        request_id = ex.headers.get("X-Request-Id")
        if not request_id:
            self._request_seq += 1
            request_id = f"{self._request_prefix}-{self._request_seq}"
        try:
            self._gate.check()  # a standby forwards nothing (docs/scale-out.md)
            await self._handle(ex, route, request_id)
        except RouterError as exc:
            m = self._metrics
            m.errors.labels(route, exc.code).inc()
            m.requests.labels(route, str(exc.status)).inc()
            status, headers, body = router_error_parts(
                exc, anthropic=route == "messages", request_id=request_id
            )
            await ex.send(status, headers, body)

    async def _handle(self, ex: Exchange, route: str, request_id: str) -> None:
        clock = self._clock
        t0 = clock()
        body, obj = await self._read_json(ex)
        ident = self.identity.resolve(ex.headers)
        stream = obj.get("stream") is True
        inject = False
        if stream and route in _USAGE_INJECTABLE:
            options = obj.get("stream_options")
            if "stream_options" not in obj and body.lstrip().startswith(b"{"):
                body = _INJECT_PREFIX + body.lstrip()[1:]  # splice, no re-serialisation
                inject = True
            elif not (options or {}).get("include_usage"):
                obj["stream_options"] = {**(options or {}), "include_usage": True}
                body = json.dumps(obj).encode()
                inject = True
        agents = self._agents
        admission = self._admission
        ledger = self._ledger
        thread = claude_code_thread(ex.headers) if route == "messages" else None
        conversation = conversation_key(route, obj, thread)
        agent = agents.for_request(ident.agent_id)
        agent.in_flight += 1
        agent.last_seen_s = t0
        ledger.request_started(agent, conversation)
        prefill = PrefillClaim(agent)
        first = agent.context_tokens is None
        completed = False
        try:
            if first:
                # Sized before placement: fleet admission places the newcomer where
                # its prompt is admitted now (controllers/admission.py), bounded.
                ledger.set_estimate(agent, admission.estimate_tokens(len(body)))
            self._place(agent, ledger.cached_tokens(agent, conversation))
            headers = upstream_headers(ex.headers, ident, self._identity_header, request_id)
            if admission.admit_now(agent):
                held_s = 0.0
            else:
                held_s = await self._wait_admission(agent, headers)
            self._overhead[route].observe(clock() - t0 - held_s)
            # Learned bytes a token, as estimate_tokens; vLLM prefills whatever was sent.
            cached = ledger.cached_tokens(agent, conversation)
            prefill.start(admission.body_tokens.tokens(len(body)) - cached)
            finished: list[Outcome] = []  # set by the relay once the upstream finished
            try:
                outcome = await self._forwarder.forward(
                    ex, agent, body, headers, inject, finished, prefill.done
                )
            except asyncio.CancelledError:
                # The client left (handler cancelled) after the upstream finished, e.g.
                # an SDK that closes on [DONE]: vLLM did the work and holds the
                # context, so the turn is accounted before the cancellation goes on.
                if finished:
                    done = finished[0]
                    completed = self._account(
                        agent, route, stream, t0, len(body), first, done, conversation
                    )
                raise
            completed = self._account(
                agent, route, stream, t0, len(body), first, outcome, conversation
            )
        finally:
            prefill.done()
            agent.in_flight -= 1
            agent.last_seen_s = clock()
            if not completed:  # else the completion already ended it in the ledger
                ledger.request_ended(agent, conversation)
            agents.request_done(agent)

    async def _wait_admission(self, agent: Agent, headers: dict[str, str]) -> float:
        """Wait for admission, with two guards for requests that really wait: a bound
        per agent, and a key the backend accepts (a bogus key must not keep a queue
        slot). The key is asked about only if the agent did not pass at once."""
        limits = self._limits
        if agent.in_flight > limits.max_waiting_per_agent:
            raise TooManyRequestsError(
                f"agent has more than {limits.max_waiting_per_agent} requests "
                "waiting for admission",
                retry_after_s=limits.retry_after_s,
            )
        inst = self._pool.get(agent.instance)
        base = inst.base_url if inst is not None else None
        if base is not None and self.keys.known(base, headers) is False:
            raise AuthenticationError("the backend rejected this API key")
        wait = asyncio.create_task(self._admission.wait_admitted(agent))
        await asyncio.sleep(0)  # the admission fast path completes in this step
        if wait.done() or base is None or self.keys.known(base, headers) is not None:
            return await wait
        try:
            ok = await self.keys.accepted(self.session, base, headers)
        except BaseException:
            wait.cancel()
            raise
        if not ok:
            wait.cancel()  # leaves the hold queue
            with contextlib.suppress(asyncio.CancelledError, RouterError):
                await wait
            raise AuthenticationError("the backend rejected this API key")
        return await wait

    def _observe(self, inst_name: str, usage: Usage | None, outcome: Outcome) -> None:
        """Keep a streamed request with exact usage for the online model (docs/beyond.md §1)."""
        if (
            usage is None
            or not usage.complete
            or outcome.first_data_s is None
            or outcome.t_sent_s is None
            or not inst_name
        ):
            return
        running = self._forwarder.running.get(inst_name, 0) + 1  # this request has left the count
        self._observations.record(
            inst_name,
            observation(
                t_sent_s=outcome.t_sent_s,
                first_data_s=outcome.first_data_s,
                end_s=self._clock(),
                prompt_tokens=usage.prompt_tokens or 0,
                cached_tokens=usage.cached_tokens or 0,
                completion_tokens=usage.completion_tokens or 0,
                running=max(running, 1),
                active_context_tokens=self._ledger.usage_tokens(inst_name),
            ),
        )

    def _place(self, agent: Agent, request_tokens: int) -> None:
        """Place ``agent``'s request; ``request_tokens`` is the context it brings (its
        conversation's), which overflow relief and the hold-back fit beside the
        running requests (a harness's side request is not its whole agent)."""
        inst = self._pool.get(agent.instance)
        if inst is not None and inst.eligible:
            self._placement.maybe_reassign(agent, request_tokens)
            self._admission.hold_overflow(agent, request_tokens)  # then admit_now waits
            return
        was_admitted = agent.admitted and inst is not None
        newcomer = agent.instance is None
        target, admits = self._placement.choose_admitting(agent)
        if was_admitted:
            self._ledger.set_ongoing(agent, target.name)
            return
        self._ledger.place(agent, target.name)
        if newcomer and admits:
            # Fleet admission has just evaluated the rule on the target with this
            # agent's size, and a newcomer holds no place in any queue: admitted as
            # the fast path would admit it, without evaluating the rule twice.
            self._admission.admit_placed(agent, target)

    def _account(
        self, agent: Agent, route: str, stream: bool, t0: float,
        body_len: int, first: bool, outcome: Outcome, conversation: int,
    ) -> bool:  # fmt: skip
        """Account a finished request; an agent's ``first`` request with usage also
        teaches the router how many bytes a token takes (:mod:`router.token_ratio`).
        True if it completed (and so ended in the ledger, its conversation's new
        context recorded); False for an error answer."""
        m = self._metrics
        latency = self._clock() - t0
        m.requests.labels(route, str(outcome.status)).inc()
        m.latency.labels(route, "true" if stream else "false").observe(latency)
        if outcome.status != 200:
            return False
        inst_name = agent.instance or ""
        usage = outcome.usage
        estimated = usage is None or not usage.complete
        body_tokens = self._admission.body_tokens
        if estimated:
            prompt = body_tokens.tokens(body_len)
            completion = outcome.estimated_completion
            m.usage_estimated.labels(inst_name).inc()
        else:
            assert usage is not None
            prompt = usage.prompt_tokens or 0
            completion = usage.completion_tokens or 0
            if first:
                body_tokens.observe(body_len, prompt)
        m.tokens.labels(inst_name, "prompt").inc(prompt)
        m.tokens.labels(inst_name, "completion").inc(completion)
        self._ledger.record_completion(
            agent, prompt_tokens=prompt, completion_tokens=completion,
            latency_s=latency, estimated=estimated, conversation=conversation,
        )  # fmt: skip
        self._energy.record(
            inst_name, ONE_TURN if agent.ephemeral else agent.agent_id, prompt,
            (usage.cached_tokens or 0) if usage is not None else 0, completion,
            t0 if outcome.t_sent_s is None else outcome.t_sent_s, outcome.first_data_s,
        )  # fmt: skip
        self._observe(inst_name, usage, outcome)
        if self._trace is not None:
            self._trace.request(
                agent, conversation, t0_s=t0, t_sent_s=outcome.t_sent_s,
                first_data_s=outcome.first_data_s, t_end_s=t0 + latency,
                prompt_tokens=prompt, completion_tokens=completion,
                cached_tokens=usage.cached_tokens if usage is not None else None,
                instance=inst_name,
            )  # fmt: skip
        inst = self._pool.get(agent.instance)
        admission = self._admission
        if inst is not None and len(admission.queues.get(inst.name, ())):
            admission.pump(inst)
        return True

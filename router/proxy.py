"""The inference hot path: identity → placement → admission → upstream → ledger.

Kept lean on purpose (the router's added latency is a published number): one
JSON parse of the request, no re-serialisation unless usage has to be injected,
per-route metric children bound once, complete SSE events forwarded as they
arrive.

Retry policy: a request is retried on another eligible instance (``max_attempts``
in all; the agent moves with the retry) only when it provably did not reach a
backend — the connection was refused or failed before anything was sent — or the
backend answered 503 (vLLM: not ready) before any byte reached the client. A POST
that may have reached a backend is never sent twice: no duplicate generations,
no duplicate stored ``/v1/responses``. Timeouts and 5xx feed the per-instance
circuit breaker (:mod:`router.breaker`). After the first byte, an upstream
failure is sent to the client in the protocol's error form and the stream ends.

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
from dataclasses import dataclass
from typing import Any

import aiohttp
import structlog
from aiohttp import web

from router.breaker import CircuitBreakers
from router.core import RouterCore
from router.energy import ONE_TURN
from router.errors import (
    AuthenticationError,
    BadRequestError,
    RouterError,
    TooManyRequestsError,
    UpstreamError,
    UpstreamTimeoutError,
)
from router.identity_mw import IdentityResolver, KeyChecker, upstream_headers
from router.json_body import parse_json, read_body
from router.ledger import Agent
from router.observations import observation
from router.openai_errors import from_router_error, sse_error_event
from router.streaming import SseUsageFilter, Usage, usage_from_body

log = structlog.get_logger("kairos.router.proxy")

ROUTES = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completions",
    "/v1/responses": "responses",
    "/v1/messages": "messages",
}
_USAGE_INJECTABLE = frozenset({"chat", "completions"})
_DROP_RESPONSE = frozenset(
    {"content-length", "transfer-encoding", "connection", "keep-alive", "date", "server",
     "content-encoding"}
)  # fmt: skip
_INJECT_PREFIX = b'{"stream_options":{"include_usage":true},'
_RESCHEDULE_EVERY_S = 1.0
_ERROR_WRITE_S = 5.0


@dataclass(slots=True)
class _Outcome:
    status: int
    usage: Usage | None
    estimated_completion: int
    first_data_s: float | None = None
    t_sent_s: float | None = None


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
    """aiohttp handlers for the OpenAI/Anthropic inference routes."""

    def __init__(self, core: RouterCore) -> None:
        self.core = core
        self._session: aiohttp.ClientSession | None = None
        cfg = core.config
        self.timeouts = cfg.timeouts
        self.max_body = cfg.max_body_bytes
        # aiohttp's own timers bound connect and every socket read (first byte, body)
        # without an asyncio.timeout per request; streams add the tighter idle bound.
        self._upstream_timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=cfg.timeouts.connect_s, sock_read=cfg.timeouts.first_byte_s
        )
        m = core.metrics
        self.identity = IdentityResolver(
            core.secret, core.config.identity_header, core.config.anonymous
        )
        self.breakers = CircuitBreakers(core, core.clock)
        self.keys = KeyChecker(core.clock)
        self._request_prefix = f"kr-{uuid.uuid4().hex[:12]}"
        self._request_seq = 0
        self._overhead = {r: m.overhead.labels(r) for r in ROUTES.values()}

    @property
    def session(self) -> aiohttp.ClientSession:
        """The upstream client session (opened at app start-up)."""
        if self._session is None:
            raise RuntimeError("router proxy used before start-up")
        return self._session

    @session.setter
    def session(self, session: aiohttp.ClientSession | None) -> None:
        self._session = session

    async def _read_json(self, request: web.Request) -> tuple[bytes, dict[str, Any]]:
        body = await read_body(request, self.max_body, self.timeouts.body_read_s)
        obj = await parse_json(body)
        _check_body(obj)
        return body, obj

    async def handle(self, request: web.Request) -> web.StreamResponse:
        route = ROUTES[request.path]
        anthropic = route == "messages"
        request_id = request.headers.get("X-Request-Id")
        if not request_id:
            self._request_seq += 1
            request_id = f"{self._request_prefix}-{self._request_seq}"
        try:
            return await self._handle(request, route, request_id)
        except RouterError as exc:
            self.core.metrics.errors.labels(route, exc.code).inc()
            self.core.metrics.requests.labels(route, str(exc.status)).inc()
            return from_router_error(exc, anthropic=anthropic, request_id=request_id)

    async def _handle(
        self, request: web.Request, route: str, request_id: str
    ) -> web.StreamResponse:
        core = self.core
        t0 = core.clock()
        body, obj = await self._read_json(request)
        cfg = core.config
        ident = self.identity.resolve(request.headers)
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
        agent = core.agents.for_request(ident.agent_id)
        agent.in_flight += 1
        agent.last_seen_s = t0
        try:
            if agent.context_tokens is None:
                # Sized before placement: fleet admission places the newcomer where
                # its prompt is admitted now (controllers/admission.py), bounded.
                agent.estimated_context_tokens = core.admission.estimate_tokens(len(body))
            self._place(agent)
            headers = upstream_headers(request.headers, ident, cfg.identity_header, request_id)
            held_s = 0.0 if agent.admitted else await self._wait_admission(agent, headers)
            self._overhead[route].observe(core.clock() - t0 - held_s)
            finished: list[_Outcome] = []  # set by the relay once the upstream finished
            try:
                resp, outcome = await self._forward(request, agent, body, headers, inject, finished)
            except asyncio.CancelledError:
                # The client left (handler cancelled) after the upstream finished, e.g.
                # an SDK that closes on [DONE]: vLLM did the work and holds the
                # context, so the turn is accounted before the cancellation goes on.
                if finished:
                    self._account(agent, route, stream, t0, held_s, len(body), finished[0])
                raise
            self._account(agent, route, stream, t0, held_s, len(body), outcome)
            return resp
        finally:
            agent.in_flight -= 1
            agent.last_seen_s = core.clock()
            core.agents.request_done(agent)

    async def _wait_admission(self, agent: Agent, headers: dict[str, str]) -> float:
        """Wait for admission, with two guards for requests that really wait: a bound
        per agent, and a key the backend accepts (a bogus key must not keep a queue
        slot). The key is asked about only if the agent did not pass at once."""
        core = self.core
        if agent.in_flight > core.config.max_waiting_per_agent:
            raise TooManyRequestsError(
                f"agent has more than {core.config.max_waiting_per_agent} requests "
                "waiting for admission",
                retry_after_s=core.config.admission.retry_after_s,
            )
        inst = core.pool.get(agent.instance)
        base = inst.base_url if inst is not None else None
        if base is not None and self.keys.known(base, headers) is False:
            raise AuthenticationError("the backend rejected this API key")
        wait = asyncio.create_task(core.admission.wait_admitted(agent))
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

    def _observe(self, inst_name: str, usage: Usage | None, outcome: _Outcome) -> None:
        """Keep a streamed request with exact usage for the online model (issue 10)."""
        if (
            usage is None
            or not usage.complete
            or outcome.first_data_s is None
            or outcome.t_sent_s is None
            or not inst_name
        ):
            return
        core = self.core
        ledger = core.ledger
        running = sum(
            a.in_flight for i in ledger.ongoing_ids(inst_name) if (a := ledger.get(i)) is not None
        )
        core.observations.record(
            inst_name,
            observation(
                t_sent_s=outcome.t_sent_s,
                first_data_s=outcome.first_data_s,
                end_s=core.clock(),
                prompt_tokens=usage.prompt_tokens or 0,
                cached_tokens=usage.cached_tokens or 0,
                completion_tokens=usage.completion_tokens or 0,
                running=max(running, 1),
                active_context_tokens=ledger.usage_tokens(inst_name),
            ),
        )

    def _place(self, agent: Agent) -> None:
        core = self.core
        inst = core.pool.get(agent.instance)
        if inst is not None and inst.eligible:
            core.placement.maybe_reassign(agent)
            return
        was_admitted = agent.admitted and inst is not None
        target = core.placement.choose(agent)
        if was_admitted:
            core.ledger.set_ongoing(agent, target.name)
        else:
            agent.instance = target.name
            agent.admitted = False

    async def _forward(
        self,
        request: web.Request,
        agent: Agent,
        body: bytes,
        headers: dict[str, str],
        inject: bool,
        finished: list[_Outcome],
    ) -> tuple[web.StreamResponse, _Outcome]:
        core = self.core
        tried: set[str] = set()
        last_error = "no attempt"
        attempts = core.config.max_attempts
        for attempt in range(attempts):
            inst = core.pool.get(agent.instance)
            if inst is None:
                break
            tried.add(inst.name)
            t_sent = core.clock()
            try:
                resp = await self.session.request(
                    request.method, inst.base_url + request.path_qs, data=body,
                    headers=headers, timeout=self._upstream_timeout,
                )  # fmt: skip
            except aiohttp.SocketTimeoutError:
                self.breakers.failure(inst, "timeout")
                raise UpstreamTimeoutError(
                    f"instance {inst.name} sent no response within {self.timeouts.first_byte_s}s"
                ) from None
            except aiohttp.ClientConnectorError as exc:
                # Refused / unreachable: nothing was sent, so a retry cannot duplicate.
                last_error = type(exc).__name__
                core.mark_health(inst, ok=False)
                if attempt + 1 < attempts:
                    self._retry_move(agent, inst.name, "connect", tried)
                continue
            except aiohttp.ClientError as exc:
                # Reset or closed after (part of) the request went out: it may be
                # running on the backend; answering 502 beats generating twice.
                self.breakers.failure(inst, type(exc).__name__)
                raise UpstreamError(
                    f"instance {inst.name} dropped the connection ({type(exc).__name__})"
                ) from None
            core.metrics.child(core.metrics.ttfb, inst.name).observe(core.clock() - t_sent)
            if resp.status >= 500:
                self.breakers.failure(inst, f"http_{resp.status}")
                if resp.status == 503 and attempt + 1 < attempts:
                    resp.close()  # not ready: it did not run the request
                    last_error = "HTTP 503"
                    self._retry_move(agent, inst.name, "http_503", tried)
                    continue
            else:
                self.breakers.success(inst)
            done = False
            try:
                result = await self._relay(request, resp, inject, headers["X-Request-Id"], finished)
                result[1].t_sent_s = t_sent
                done = True
                return result
            finally:
                if done:
                    resp.release()
                else:
                    resp.close()
        raise UpstreamError(f"no backend could serve the request ({last_error})", retry_after_s=2)

    def _retry_move(self, agent: Agent, source: str, reason: str, tried: set[str]) -> None:
        core = self.core
        core.metrics.retries.labels(source, reason).inc()
        try:
            target = core.placement.choose(agent, exclude=tried)
        except RouterError:
            return
        if agent.admitted:
            core.ledger.set_ongoing(agent, target.name)
            core.metrics.reassignments.labels(source, target.name, "retry").inc()
        else:
            agent.instance = target.name
        log.info("upstream_retry", agent=agent.agent_id, source=source, target=target.name,
                 reason=reason)  # fmt: skip

    async def _relay(
        self,
        request: web.Request,
        resp: aiohttp.ClientResponse,
        inject: bool,
        request_id: str,
        finished: list[_Outcome],
    ) -> tuple[web.StreamResponse, _Outcome]:
        """Relay the response; ``finished`` gets the outcome as soon as the upstream's
        final usage has arrived (before our end of stream)."""
        headers = {k: v for k, v in resp.headers.items() if k.lower() not in _DROP_RESPONSE}
        if "X-Request-Id" not in resp.headers:
            headers["X-Request-Id"] = request_id
        idle_s = self.timeouts.idle_stream_s
        if not resp.content_type.startswith("text/event-stream"):
            try:
                data = await resp.read()
            except (aiohttp.ClientError, TimeoutError) as exc:
                raise UpstreamError(f"upstream body failed: {type(exc).__name__}") from None
            usage = usage_from_body(data) if resp.status == 200 else None
            out = web.Response(status=resp.status, body=data, headers=headers)
            return out, _Outcome(resp.status, usage, max(1, len(data) // 8))
        out_stream = web.StreamResponse(status=resp.status, headers=headers)
        await out_stream.prepare(request)
        filt = SseUsageFilter(strip_usage_event=inject)
        loop = asyncio.get_running_loop()
        read = resp.content.readany
        next_reschedule = loop.time() + _RESCHEDULE_EVERY_S
        first_data_s: float | None = None
        writing = False
        try:
            # One timer bounds both sides: an upstream that goes quiet and a client
            # that stops reading (its write never drains) are dropped after idle_s.
            async with asyncio.timeout(idle_s) as idle:
                while chunk := await read():
                    if first_data_s is None:
                        first_data_s = self.core.clock()
                    data = filt.feed(chunk)
                    if not finished and filt.usage.complete and resp.status == 200:
                        est = filt.estimated_completion_tokens()
                        finished.append(_Outcome(resp.status, filt.usage, est, first_data_s))
                    if data:
                        writing = True
                        await out_stream.write(data)
                        writing = False
                    now = loop.time()
                    if now >= next_reschedule:  # idle bound exact to within a second
                        idle.reschedule(now + idle_s)
                        next_reschedule = now + _RESCHEDULE_EVERY_S
            rest = filt.flush()
            if rest:
                writing = True
                await out_stream.write(rest)
                writing = False
        except (aiohttp.ClientError, TimeoutError, ConnectionResetError) as exc:
            # aiohttp reports a client that went away as ClientConnectionResetError,
            # a ClientError too: who failed is told by what we were doing.
            if writing and isinstance(exc, ConnectionResetError):
                log.info("client_disconnected", path=request.path)
                if not filt.usage.complete:
                    return out_stream, _Outcome(499, None, 0)
                # The upstream finished (its usage arrived) and the client left as
                # the last bytes went out: the work was done, so it is accounted.
            elif writing and isinstance(exc, TimeoutError):
                log.info("slow_client_dropped", path=request.path, idle_s=idle_s)
                if request.transport is not None:
                    request.transport.abort()
                return out_stream, _Outcome(499, None, 0)
            else:
                log.warning("upstream_stream_failed", error=type(exc).__name__)
                anthropic = request.path == "/v1/messages"
                with contextlib.suppress(ConnectionResetError, TimeoutError):
                    async with asyncio.timeout(_ERROR_WRITE_S):
                        await out_stream.write(sse_error_event("upstream stream failed", anthropic))
                        await out_stream.write_eof()
                return out_stream, _Outcome(502, None, 0)
        else:
            with contextlib.suppress(ConnectionResetError):
                # A client that read [DONE] may close before our end of stream: the
                # request is complete all the same and must be accounted.
                await out_stream.write_eof()
        usage = filt.usage if filt.usage.complete else None
        est = filt.estimated_completion_tokens()
        return out_stream, _Outcome(resp.status, usage, est, first_data_s)

    def _account(
        self, agent: Agent, route: str, stream: bool, t0: float, held_s: float,
        body_len: int, outcome: _Outcome,
    ) -> None:  # fmt: skip
        core = self.core
        m = core.metrics
        latency = core.clock() - t0
        m.child(m.requests, route, str(outcome.status)).inc()
        m.child(m.latency, route, "true" if stream else "false").observe(latency)
        if outcome.status != 200:
            return
        inst_name = agent.instance or ""
        usage = outcome.usage
        estimated = usage is None or not usage.complete
        if estimated:
            prompt = body_len // 4
            completion = outcome.estimated_completion
            m.usage_estimated.labels(inst_name).inc()
        else:
            assert usage is not None
            prompt = usage.prompt_tokens or 0
            completion = usage.completion_tokens or 0
        m.child(m.tokens, inst_name, "prompt").inc(prompt)
        m.child(m.tokens, inst_name, "completion").inc(completion)
        core.ledger.record_completion(
            agent, prompt_tokens=prompt, completion_tokens=completion,
            latency_s=latency, estimated=estimated,
        )  # fmt: skip
        core.energy.record(
            inst_name, ONE_TURN if agent.ephemeral else agent.agent_id, prompt,
            (usage.cached_tokens or 0) if usage is not None else 0, completion,
            t0 if outcome.t_sent_s is None else outcome.t_sent_s, outcome.first_data_s,
        )  # fmt: skip
        self._observe(inst_name, usage, outcome)
        inst = core.pool.get(agent.instance)
        if inst is not None and len(core.admission.queues.get(inst.name, ())):
            core.admission.pump(inst)

"""A stand-in for the Kairos router's lifecycle API and OpenAI surface, for tests.

It runs an aiohttp server on 127.0.0.1 (free port) in a background thread, so
a test can start ``id-tracker`` as a real subprocess and block on it while the
server answers. It implements the same contract as the real router for the
parts id-tracker touches — ``POST /kairos/v1/agents`` (signed identity tokens
from :mod:`kairos_common.identity`), ``POST /kairos/v1/agents/{id}/end``, the
control token, and ``/v1/chat/completions`` / ``/v1/models`` that attribute each
request to an agent by parsing its API key — and records every call. With
``GET /health`` it also serves as a fake vLLM backend *behind* the real router,
where it sees (and records) the user's real key that the router forwards. Waiting
helpers block on a condition variable with a bounded timeout, never sleep.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from aiohttp import web

from kairos_common.errors import IdentityError, WireFormatError
from kairos_common.identity import issue_token, new_agent_id, new_secret, parse_key, verify
from kairos_common.leader import not_leader_reply
from kairos_common.wire import (
    API_PREFIX,
    AgentEnd,
    AgentEndReply,
    AgentStart,
    AgentStarted,
    AgentSummary,
)

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class StartCall:
    agent_id: str
    start: AgentStart
    authorization: str | None


@dataclass(frozen=True, slots=True)
class EndCall:
    agent_id: str
    end: AgentEnd


@dataclass(frozen=True, slots=True)
class ApiCall:
    """One ``/v1`` request as a backend behind the router would see it."""

    path: str
    agent_id: str | None
    real_key: str | None
    via: str  # "authorization" or "x-api-key"


class StandInRouter:
    """Loopback lifecycle + OpenAI-ish server; use as a context manager.

    ``end_status`` forces every end call to answer that HTTP status (e.g. 503
    to exercise id-tracker's retries); ``start_status`` does the same for start.
    ``summary``, when given, answers an end call that asks for one (its
    ``agent_id`` replaced by the ending agent's); without it the stand-in answers
    as a router older than the summary does.

    ``standby_of`` (settable while it runs) makes it a pair's standby: every
    lifecycle call gets the ``not_leader`` 503, with ``X-Kairos-Leader`` naming
    that URL when it is not empty. ``peer``: a stand-in sharing its agents (a
    pair's shared state), so an end for an agent started there is accepted here.
    """

    def __init__(
        self,
        *,
        control_token: str | None = None,
        secret: bytes | None = None,
        start_status: int | None = None,
        end_status: int | None = None,
        idle_expiry_s: float = 1800.0,
        summary: AgentSummary | None = None,
        standby_of: str | None = None,
        peer: StandInRouter | None = None,
    ) -> None:
        self.standby_of = standby_of
        self.peer = peer
        self.control_token = control_token
        self.summary = summary
        self.secret = secret if secret is not None else new_secret()
        self.start_status = start_status
        self.end_status = end_status
        self.idle_expiry_s = idle_expiry_s
        self._cond = threading.Condition()
        self._starts: list[StartCall] = []
        self._ends: list[EndCall] = []
        self._api: list[ApiCall] = []
        self._end_attempts = 0
        self._start_attempts = 0
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._stopped: asyncio.Event | None = None
        self.port = 0

    # -- lifecycle ------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> StandInRouter:
        self.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    def start(self, timeout_s: float = 10.0) -> None:
        ready = threading.Event()
        errors: list[BaseException] = []
        self._thread = threading.Thread(
            target=self._serve, args=(ready, errors), name="stand-in-router", daemon=True
        )
        self._thread.start()
        if not ready.wait(timeout_s):
            raise TimeoutError("stand-in router did not start")
        if errors:
            raise errors[0]

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop serving: afterwards the port refuses connections."""
        if self._loop is None or self._stopped is None or self._thread is None:
            return
        self._loop.call_soon_threadsafe(self._stopped.set)
        self._thread.join(timeout_s)
        self._loop = None

    def _serve(self, ready: threading.Event, errors: list[BaseException]) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._main(ready))
        except BaseException as exc:  # reported to start()
            errors.append(exc)
            ready.set()
        finally:
            loop.close()

    async def _main(self, ready: threading.Event) -> None:
        self._stopped = asyncio.Event()
        app = web.Application()
        app.router.add_post(f"{API_PREFIX}/agents", self._agent_start)
        app.router.add_post(f"{API_PREFIX}/agents/{{agent_id}}/end", self._agent_end)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)  # lets it stand in for a vLLM backend too
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        addresses = self._runner.addresses
        self.port = int(addresses[0][1])
        ready.set()
        await self._stopped.wait()
        await self._runner.cleanup()

    # -- recorded calls ---------------------------------------------------------------

    @property
    def starts(self) -> list[StartCall]:
        with self._cond:
            return list(self._starts)

    @property
    def ends(self) -> list[EndCall]:
        with self._cond:
            return list(self._ends)

    @property
    def api_calls(self) -> list[ApiCall]:
        with self._cond:
            return list(self._api)

    @property
    def start_attempts(self) -> int:
        with self._cond:
            return self._start_attempts

    @property
    def end_attempts(self) -> int:
        with self._cond:
            return self._end_attempts

    def wait_for(self, probe: Callable[[], T | None], timeout_s: float = 10.0) -> T:
        """Block until ``probe()`` (called under the lock) is not None; bounded."""
        give_up = time.monotonic() + timeout_s
        with self._cond:
            while True:
                value = probe()
                if value is not None:
                    return value
                remaining = give_up - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError("stand-in router: condition not met in time")
                self._cond.wait(remaining)

    def wait_end(self, agent_id: str, timeout_s: float = 10.0) -> AgentEnd:
        return self.wait_for(
            lambda: next((e.end for e in self._ends if e.agent_id == agent_id), None), timeout_s
        )

    def wait_starts(self, count: int, timeout_s: float = 10.0) -> list[StartCall]:
        return self.wait_for(
            lambda: list(self._starts) if len(self._starts) >= count else None, timeout_s
        )

    def wait_start_attempts(self, count: int, timeout_s: float = 10.0) -> int:
        """Block until ``count`` agent-start calls arrived (even refused ones)."""
        return self.wait_for(
            lambda: self._start_attempts if self._start_attempts >= count else None, timeout_s
        )

    def _record(self, fn: Callable[[], None]) -> None:
        with self._cond:
            fn()
            self._cond.notify_all()

    # -- handlers -------------------------------------------------------------------

    def _authorised(self, request: web.Request) -> bool:
        if self.control_token is None:
            return True
        return request.headers.get("Authorization") == f"Bearer {self.control_token}"

    async def _agent_start(self, request: web.Request) -> web.Response:
        def count() -> None:
            self._start_attempts += 1

        self._record(count)
        if self.standby_of is not None:
            return self._not_leader()
        if not self._authorised(request):
            return web.json_response({"error": "bad control token"}, status=401)
        if self.start_status is not None:
            return web.json_response({"error": "forced"}, status=self.start_status)
        try:
            start = AgentStart.from_json(await request.json())
        except (WireFormatError, ValueError) as exc:
            return web.json_response({"error": str(exc)}, status=400)
        agent_id = new_agent_id()
        call = StartCall(agent_id, start, request.headers.get("Authorization"))
        self._record(lambda: self._starts.append(call))
        reply = AgentStarted(agent_id, issue_token(agent_id, self.secret), self.idle_expiry_s)
        return web.json_response(reply.to_json(), status=201)

    async def _agent_end(self, request: web.Request) -> web.Response:
        if not self._authorised(request):
            return web.json_response({"error": "bad control token"}, status=401)

        def count() -> None:
            self._end_attempts += 1

        self._record(count)
        if self.standby_of is not None:
            return self._not_leader()
        if self.end_status is not None:
            return web.json_response({"error": "forced"}, status=self.end_status)
        agent_id = request.match_info["agent_id"]
        known = self.starts + (self.peer.starts if self.peer is not None else [])
        if not any(s.agent_id == agent_id for s in known):
            return web.json_response({"error": "unknown agent"}, status=404)
        try:
            end = AgentEnd.from_json(await request.json())
        except (WireFormatError, ValueError) as exc:
            return web.json_response({"error": str(exc)}, status=400)
        self._record(lambda: self._ends.append(EndCall(agent_id, end)))
        if end.summary_wait_s > 0 and self.summary is not None:
            summary = dataclasses.replace(self.summary, agent_id=agent_id)
            return web.json_response(AgentEndReply(summary).to_json())
        return web.json_response({"ok": True})

    def _not_leader(self) -> web.Response:
        """A standby's answer (the router pair's contract, kairos_common.leader)."""
        status, headers, body = not_leader_reply(self.standby_of)
        return web.json_response(body, status=status, headers=headers)

    def _identify(self, request: web.Request) -> ApiCall | web.Response:
        auth = request.headers.get("Authorization", "")
        key, via = (auth[7:], "authorization") if auth.startswith("Bearer ") else (None, "")
        if key is None and "x-api-key" in request.headers:
            key, via = request.headers["x-api-key"], "x-api-key"
        try:
            parsed = parse_key(key)
            verify(parsed, self.secret)
        except IdentityError as exc:
            body = {"error": {"message": str(exc), "type": "invalid_request_error", "code": 401}}
            return web.json_response(body, status=401)
        return ApiCall(request.path, parsed.agent_id, parsed.real_key, via)

    async def _chat(self, request: web.Request) -> web.Response:
        call = self._identify(request)
        if isinstance(call, web.Response):
            return call
        self._record(lambda: self._api.append(call))
        body: dict[str, Any] = await request.json()
        return web.json_response(
            {
                "id": "chatcmpl-standin",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": body.get("model", "stand-in"),
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": f"hello {call.agent_id}"},
                        "finish_reason": "stop",
                    }
                ],
                "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8},
            }
        )

    async def _health(self, _request: web.Request) -> web.Response:
        return web.Response(text="")

    async def _models(self, request: web.Request) -> web.Response:
        call = self._identify(request)
        if isinstance(call, web.Response):
            return call
        self._record(lambda: self._api.append(call))
        return web.json_response(
            {"object": "list", "data": [{"id": "stand-in", "object": "model", "owned_by": "k"}]}
        )

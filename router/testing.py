"""Test helpers shipped with the package: a small fake OpenAI/vLLM-ish backend and
an in-process router runner, both on 127.0.0.1 with OS-assigned ports.

The fake backend is deliberately small (a full fake vLLM lives in the simulator).
Behaviour is a mutable :class:`FakeBehaviour` the test changes between requests:
usage on/off, injected 500s before the first byte, a dropped connection after it,
a gate that holds responses until the test opens it, and a ``/metrics`` page with
``vllm:cache_config_info{kv_cache_size_tokens=…}``.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from aiohttp import web

from kairos_common.credentials import ADMIN_FILE, LIFECYCLE_FILE, daemon_file, discover_credential
from router.app import (
    BREAKERS_KEY,
    CORE_KEY,
    CREDENTIALS_KEY,
    HEALTH_KEY,
    create_app,
    make_runner,
    publish_credentials,
)
from router.breaker import CircuitBreakers
from router.config import RouterConfig
from router.core import RouterCore
from router.health import HealthChecker
from router.secrets_store import RouterCredentials
from router.store import Changes, Snapshot


@dataclass
class FakeBehaviour:
    completion_tokens: int = 4
    prompt_tokens: int | None = None
    usage: bool = True
    fail_next: int = 0
    fail_status: int = 500
    drop_after_first_byte: bool = False
    stall_after_first_byte: bool = False
    gate: asyncio.Event | None = None
    hold_eof: asyncio.Event | None = None
    """Streams: every event sent, then wait for this before ending the response."""
    capacity_tokens: int | None = 100_000
    healthy: bool = True
    health_gate: asyncio.Event | None = None
    """``/health`` waits for this before answering (a probe that times out)."""
    model: str = "fake-model"
    api_key: str | None = None
    """Like ``vllm --api-key``: /v1/* answer 401 without ``Authorization: Bearer <key>``."""


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]


@dataclass
class FakeBackend:
    """OpenAI-compatible fake: chat, completions, responses, messages (and their token
    count), models, metrics."""

    behaviour: FakeBehaviour = field(default_factory=FakeBehaviour)
    received: list[Received] = field(default_factory=list)
    """Inference requests, in arrival order."""
    counted: list[Received] = field(default_factory=list)
    """``/v1/messages/count_tokens`` requests (tokenizations, not inference)."""
    record: bool = True
    cancelled: int = 0
    url: str = ""
    _runner: web.AppRunner | None = None

    def __post_init__(self) -> None:
        self.cancelled_event = asyncio.Event()
        self.arrived = asyncio.Condition()

    def app(self) -> web.Application:
        app = web.Application()
        for path in ("/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages"):
            app.router.add_post(path, self._infer)
        app.router.add_post("/v1/messages/count_tokens", self._count_tokens)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)
        app.router.add_get("/metrics", self._metrics)
        return app

    async def start(self, port: int = 0) -> str:
        self._runner = web.AppRunner(self.app(), handler_cancellation=True, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", port)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def wait_received(self, count: int, timeout_s: float = 5.0) -> None:
        """Wait (bounded) until ``count`` inference requests arrived."""
        async with asyncio.timeout(timeout_s), self.arrived:
            await self.arrived.wait_for(lambda: len(self.received) >= count)

    async def _health(self, _r: web.Request) -> web.Response:
        if self.behaviour.health_gate is not None:
            await self.behaviour.health_gate.wait()
        return web.Response(status=200 if self.behaviour.healthy else 503)

    def _unauthorised(self, request: web.Request) -> web.Response | None:
        key = self.behaviour.api_key
        if key is None or request.headers.get("Authorization") == f"Bearer {key}":
            return None
        return web.json_response({"error": "Unauthorized"}, status=401)

    async def _models(self, r: web.Request) -> web.Response:
        if (refused := self._unauthorised(r)) is not None:
            return refused
        return web.json_response(
            {"object": "list", "data": [{"id": self.behaviour.model, "object": "model"}]}
        )

    async def _metrics(self, _r: web.Request) -> web.Response:
        cap = self.behaviour.capacity_tokens
        model = f'model_name="{self.behaviour.model}"'
        lines = [
            "# TYPE vllm:num_requests_running gauge",
            f"vllm:num_requests_running{{{model}}} 0.0",
        ]
        if cap is not None:
            lines += [
                "# TYPE vllm:cache_config_info gauge",
                f'vllm:cache_config_info{{{model},block_size="16",'
                f'kv_cache_size_tokens="{cap}"}} 1.0',
            ]
        return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")

    async def _count_tokens(self, request: web.Request) -> web.Response:
        """vLLM's Anthropic token count: ``{"input_tokens": N}``, N as ``_infer``'s."""
        if (refused := self._unauthorised(request)) is not None:
            return refused
        body = await request.json()
        self.counted.append(Received(request.path, dict(request.headers), body))
        b = self.behaviour
        if b.fail_next > 0:
            b.fail_next -= 1
            return web.json_response({"error": {"message": "injected"}}, status=b.fail_status)
        prompt = b.prompt_tokens if b.prompt_tokens is not None else len(json.dumps(body)) // 4
        return web.json_response({"input_tokens": prompt})

    async def _infer(self, request: web.Request) -> web.StreamResponse:
        if (refused := self._unauthorised(request)) is not None:
            return refused
        body = await request.json()
        b = self.behaviour
        if self.record:
            async with self.arrived:
                self.received.append(Received(request.path, dict(request.headers), body))
                self.arrived.notify_all()
        headers = {"X-Request-Id": request.headers.get("X-Request-Id", "none")}
        if b.fail_next > 0:
            b.fail_next -= 1
            return web.json_response({"error": {"message": "injected"}}, status=b.fail_status)
        try:
            if b.gate is not None:
                await b.gate.wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            self.cancelled_event.set()
            raise
        prompt = b.prompt_tokens if b.prompt_tokens is not None else len(json.dumps(body)) // 4
        n = b.completion_tokens
        if body.get("stream"):
            return await self._stream(request, body, prompt, n, headers)
        return web.json_response(self._final(request.path, prompt, n), headers=headers)

    def _usage(self, path: str, prompt: int, n: int) -> dict[str, int]:
        if path in ("/v1/responses", "/v1/messages"):
            return {"input_tokens": prompt, "output_tokens": n}
        return {"prompt_tokens": prompt, "completion_tokens": n, "total_tokens": prompt + n}

    def _final(self, path: str, prompt: int, n: int) -> dict[str, Any]:
        text = "tok " * n
        out: dict[str, Any]
        if path == "/v1/chat/completions":
            msg = {"role": "assistant", "content": text}
            choice = {"index": 0, "message": msg, "finish_reason": "stop"}
            out = {"id": "chatcmpl-1", "object": "chat.completion", "choices": [choice]}
        elif path == "/v1/completions":
            choice = {"index": 0, "text": text, "finish_reason": "stop"}
            out = {"id": "cmpl-1", "object": "text_completion", "choices": [choice]}
        elif path == "/v1/responses":
            out = {"id": "resp-1", "object": "response", "status": "completed", "output": []}
        else:
            content = [{"type": "text", "text": text}]
            out = {"id": "msg-1", "type": "message", "role": "assistant", "content": content}
        out.update(created=int(time.time()), model=self.behaviour.model)
        if self.behaviour.usage:
            out["usage"] = self._usage(path, prompt, n)
        return out

    def _events(self, path: str, body: dict[str, Any], prompt: int, n: int) -> list[str]:
        b = self.behaviour
        if path == "/v1/messages":
            start = {"type": "message_start", "message": {"usage": {"input_tokens": prompt}}}
            delta = {"type": "content_block_delta", "delta": {"type": "text_delta", "text": "t"}}
            end = {"type": "message_delta", "usage": {"output_tokens": n}}
            items = [start] + [delta] * n + [end, {"type": "message_stop"}]
            return [f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in items]
        chat = path == "/v1/chat/completions"
        obj = "chat.completion.chunk" if chat else "text_completion"

        def chunk(choices: list[Any], **extra: Any) -> str:
            data = {"id": "c-1", "object": obj, "model": b.model, "choices": choices, **extra}
            return f"data: {json.dumps(data)}\n\n"

        piece = (
            (lambda t: {"index": 0, "delta": {"content": t}})
            if chat
            else (lambda t: {"index": 0, "text": t})
        )
        events = [chunk([piece("")])] + [chunk([piece("tok ")]) for _ in range(n)]
        events.append(chunk([{**piece(""), "finish_reason": "stop"}]))
        options = body.get("stream_options") or {}
        if b.usage and options.get("include_usage"):
            events.append(chunk([], usage=self._usage(path, prompt, n)))
        events.append("data: [DONE]\n\n")
        return events

    async def _stream(
        self, request: web.Request, body: dict[str, Any], prompt: int, n: int, hdr: dict[str, str]
    ) -> web.StreamResponse:
        resp = web.StreamResponse(headers={**hdr, "Content-Type": "text/event-stream"})
        await resp.prepare(request)
        events = self._events(request.path, body, prompt, n)
        if self.behaviour.drop_after_first_byte:
            await resp.write(events[0].encode())
            assert request.transport is not None
            request.transport.close()
            return resp
        if self.behaviour.stall_after_first_byte:
            await resp.write(events[0].encode())
            await asyncio.Event().wait()  # until the router gives up (cancelled)
        for event in events:
            await resp.write(event.encode())
        if self.behaviour.hold_eof is not None:
            await self.behaviour.hold_eof.wait()
        await resp.write_eof()
        return resp


class MemoryStore:
    """A shared store in this process's memory, with the Redis store's semantics
    for a batch (tests of what a takeover carries over, without a Redis)."""

    kind = "memory"
    shared = True

    def __init__(self) -> None:
        self.snapshot = Snapshot()
        self.writes = 0

    async def load(self) -> Snapshot:
        s = self.snapshot
        return Snapshot(
            agents=[dict(r) for r in s.agents],
            queues={k: list(v) for k, v in s.queues.items()},
            instances={k: dict(v) for k, v in s.instances.items()},
            records=[dict(r) for r in s.records],
        )

    async def write(self, changes: Changes) -> None:
        s = self.snapshot if not changes.full else Snapshot()
        agents = {r["agent_id"]: r for r in s.agents} | {r["agent_id"]: r for r in changes.rows}
        for agent_id in changes.deleted:
            agents.pop(agent_id, None)
        queues = s.queues | {k: v for k, v in changes.queues.items() if v}
        instances = s.instances | changes.instances
        for name in [*[k for k, v in changes.queues.items() if not v], *changes.removed_instances]:
            queues.pop(name, None)
        for name in changes.removed_instances:
            instances.pop(name, None)
        records = {r["agent_id"]: r for r in s.records} | changes.records
        for agent_id in changes.records_done:
            records.pop(agent_id, None)
        self.snapshot = Snapshot(list(agents.values()), queues, instances, list(records.values()))
        self.writes += 1

    async def close(self) -> None:
        return None

    def describe(self) -> dict[str, object]:
        return {"kind": self.kind, "reachable": True}


@dataclass
class RunningRouter:
    """A router app served in-process on 127.0.0.1 (stopped with :meth:`stop`)."""

    url: str
    core: RouterCore
    health: HealthChecker
    runner: web.AppRunner
    credentials: RouterCredentials
    breakers: CircuitBreakers

    @property
    def admin_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.credentials.admin.decode()}"}

    @property
    def lifecycle_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.credentials.lifecycle.decode()}"}

    def daemon_headers(self, instance: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.credentials.daemon_token(instance).decode()}"}

    async def stop(self) -> None:
        await self.runner.cleanup()


def role_headers(url: str, method: str) -> dict[str, str]:
    """The credential a well-behaved caller of ``method url`` would send: admin for
    ``/admin``, the instance's daemon for decisions, lifecycle for agent writes,
    none for reads. Found through the router's published files
    (:func:`kairos_common.credentials.discover_credential`), as clients do."""
    path = urlsplit(url).path
    if method == "GET":
        return {}
    if "/admin/" in path or path.endswith("/admin"):
        name = ADMIN_FILE
    elif path.endswith("/decision"):
        name = daemon_file(path.split("/")[-2])
    else:
        name = LIFECYCLE_FILE
    token = discover_credential(url, name)
    return {"Authorization": f"Bearer {token}"} if token else {}


async def start_router(
    backends: list[str],
    state_dir: Path,
    *,
    clock: Callable[[], float] = time.monotonic,
    **overrides: Any,
) -> RunningRouter:
    """Start a router without background timers (tests drive health checks)."""
    config = RouterConfig(backends=tuple(backends), state_dir=state_dir, **overrides)
    app = create_app(config, clock=clock, background=False)
    runner = make_runner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    publish_credentials(app, port)
    return RunningRouter(
        url=f"http://127.0.0.1:{port}",
        core=app[CORE_KEY],
        health=app[HEALTH_KEY],
        runner=runner,
        credentials=app[CREDENTIALS_KEY],
        breakers=app[BREAKERS_KEY],
    )

"""The aiohttp application: routes, error middleware, background tasks, lifecycle.

:func:`create_app` is the one place the router is assembled (the composition
root): :class:`RouterCore` builds the state services, and this function hands each
HTTP component — proxy, health checker, circuit breakers, public, control and admin
APIs — exactly the services, settings and narrow core operations
(:mod:`router.ports`) it uses. No component below this module sees the core.
The CLI and the tests both use it (tests through :mod:`router.testing`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import resource
import secrets
import socket
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import aiohttp
import structlog
from aiohttp import web

from kairos_common.credentials import read_credential
from reporting.records import JsonlWriter
from router.admin_api import AdminApi
from router.auth import ControlAuth
from router.breaker import CircuitBreakers
from router.cells import CellGuard, CellRoom
from router.config import RouterConfig
from router.control_api import ControlApi
from router.core import RouterCore
from router.errors import RouterError, StateStoreError
from router.fast_http import FastHttpConfig
from router.health import HealthChecker
from router.identity_mw import IdentityResolver
from router.leadership import UNGATED_PATHS, LeaderGate, ready_body
from router.lease import LeaseKeeper, LeaseMetrics, LeaseTiming
from router.openai_errors import (
    as_response,
    error_parts,
    from_router_error,
    internal_error_parts,
)
from router.ports import Persist
from router.proxy import ROUTES, Proxy, ProxyLimits
from router.public_api import PublicApi
from router.redis_store import RedisStore
from router.secrets_store import RouterCredentials, load_or_create_secret
from router.server_limits import LimitedRunner, http_logger
from router.store import SqliteStore, StateStore
from router.token_count import TokenCountApi
from router.trace_recorder import TraceRecorder
from router.upstream import UpstreamClient

log = structlog.get_logger("kairos.router")
CORE_KEY = web.AppKey("kairos_core", RouterCore)
HEALTH_KEY = web.AppKey("kairos_health", HealthChecker)
CREDENTIALS_KEY = web.AppKey("kairos_credentials", RouterCredentials)
BREAKERS_KEY = web.AppKey("kairos_breakers", CircuitBreakers)
PROXY_KEY = web.AppKey("kairos_proxy", Proxy)
GATE_KEY = web.AppKey("kairos_gate", LeaderGate)
MAINTENANCE_INTERVAL_S = 1.0
UPSTREAM_KEEPALIVE_S = 4.0
"""Idle upstream connections are dropped after this, under uvicorn's (vLLM's) 5 s."""


@web.middleware
async def error_middleware(
    request: web.Request, handler: Callable[[web.Request], Any]
) -> web.StreamResponse:
    """Every failure becomes an OpenAI/Anthropic-style error body, never a traceback."""
    anthropic = request.path.startswith("/v1/messages")
    try:
        resp: web.StreamResponse = await handler(request)
        return resp
    except RouterError as exc:
        return from_router_error(exc, anthropic=anthropic)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        message = "unknown route" if exc.status == 404 else (exc.reason or "error")
        return as_response(
            error_parts(
                exc.status,
                f"{message}: {request.method} {request.path}",
                code="not_found" if exc.status == 404 else None,
                anthropic=anthropic,
            )
        )
    except (asyncio.CancelledError, ConnectionResetError):
        raise
    except Exception:
        log.exception("unhandled_error", path=request.path)
        return as_response(internal_error_parts(anthropic))


def resolve_config(config: RouterConfig) -> tuple[RouterConfig, bytes | None, StateStore, Any]:
    """Fill in state-dir defaults: secret, admin token, store and records writer."""
    state = config.resolved_state_dir()
    state.mkdir(parents=True, exist_ok=True)
    secret = None
    if config.signing:
        secret = load_or_create_secret(config.signing_secret_file or state / "signing.key")
    if config.control_token is None and config.control_token_file is not None:
        config = dataclasses.replace(
            config, control_token=read_credential(config.control_token_file)
        )
    store: StateStore
    if config.shared_store:
        store = RedisStore(
            config.store, prefix=config.store_prefix, timeout_s=config.store_timeout_s
        )
    else:
        store = SqliteStore(state / "router.sqlite3")
    records = JsonlWriter(config.records or state / "agents.jsonl")
    return config, secret, store, records


def router_id(config: RouterConfig) -> str:
    """A name for this router process in the lease (host, port, pid, a random tag)."""
    return f"{socket.gethostname()}:{config.port}:{os.getpid()}:{secrets.token_hex(3)}"


def leader_middleware(gate: LeaderGate) -> Any:
    """A standby answers every route but liveness, readiness and metrics with 503
    ``not_leader`` (kairos_common.wire); the error middleware shapes the body."""

    @web.middleware
    async def middleware(
        request: web.Request, handler: Callable[[web.Request], Any]
    ) -> web.StreamResponse:
        if request.path not in UNGATED_PATHS:
            gate.check()
        resp: web.StreamResponse = await handler(request)
        return resp

    return middleware


def create_app(
    config: RouterConfig,
    *,
    clock: Callable[[], float] = time.monotonic,
    wall_clock: Callable[[], float] = time.time,
    background: bool = True,
) -> web.Application:
    """Build the router app; ``background=False`` leaves health/maintenance loops off
    (tests drive them explicitly instead of waiting on timers)."""
    config, secret, store, records = resolve_config(config)
    credentials = RouterCredentials(config.resolved_credentials_dir(), config.control_token)
    gate = LeaderGate.standby("starting", clock) if store.shared else LeaderGate(clock)
    core = RouterCore(
        config, secret=secret, store=store, records=records, clock=clock, wall_clock=wall_clock
    )
    pool = core.pool
    for inst in pool:
        credentials.write_daemon_file(inst.name)
    trace = None
    if config.trace.path is not None:  # agent traces for kairos whatif (off by default)
        trace = TraceRecorder(config.trace, clock=clock, wall_clock=wall_clock, run=config.run)
        core.ledger.on_remove.append(trace.agent_left)
    auth = ControlAuth(
        credentials,
        lambda: [i.name for i in pool],
        loopback_reads=config.control_token is None,
    )
    middlewares = [error_middleware]
    if store.shared:
        middlewares.append(leader_middleware(gate))
    app = web.Application(client_max_size=config.max_body_bytes, middlewares=middlewares)
    app[CORE_KEY] = core
    app[GATE_KEY] = gate
    app[CREDENTIALS_KEY] = credentials
    pump = core.admission.pump
    breakers = CircuitBreakers(pool, core, pump, clock, config.timeouts)
    app[BREAKERS_KEY] = breakers
    cell_guard = CellGuard(config.cell)
    cell_room = CellRoom(
        config.cell, core.admission, core.ledger, clock, config.cell_start_reserve_s
    )
    identity = IdentityResolver(secret, config.identity_header, config.anonymous, cell_guard)
    proxy = Proxy(
        pool=pool,
        ledger=core.ledger,
        agents=core.agents,
        placement=core.placement,
        admission=core.admission,
        energy=core.energy,
        observations=core.observations,
        metrics=core.metrics,
        identity=identity,
        breakers=breakers,
        health=core,
        clock=clock,
        limits=ProxyLimits.from_config(config),
        gate=gate,
        trace=trace,
    )
    for path in ROUTES:
        app.router.add_post(path, proxy.handle)
    app[PROXY_KEY] = proxy

    def upstream() -> aiohttp.ClientSession:
        return proxy.session  # opened at start-up, after the wiring

    keeper: LeaseKeeper | None = None
    if isinstance(store, RedisStore):

        async def share_secrets(shared: RedisStore) -> None:
            # Identities minted by any router of the pair verify on every one, and
            # each accepts the others' credentials (by digest).
            if secret is not None:
                common = bytes.fromhex(await shared.share_secret(secret.hex()))
                identity.secret = core.agents.secret = common
            names = [i.name for i in pool]
            auth.shared_digests = await shared.share_credentials(credentials.digests(names))

        keeper = LeaseKeeper(
            store,
            gate,
            core,
            router_id=router_id(config),
            advertise_url=(config.advertise_url or "").rstrip("/"),
            timing=LeaseTiming(config.leader_lease_s, config.store_flush_interval_s),
            metrics=LeaseMetrics(core.metrics.registry),
            share_secrets=share_secrets,
            clock=clock,
        )
        core.on_fenced = keeper.on_fenced
        core.ledger.on_assign.append(keeper.kick)
        core.journal.on_written = keeper.kick

    def readiness() -> dict[str, object]:
        detail = keeper.detail() if keeper is not None else {}
        return ready_body(gate, store.describe(), **detail)

    public = PublicApi(
        pool=pool,
        listing=core,
        metrics=core.metrics,
        identity=identity,
        identity_header=config.identity_header,
        timeouts=config.timeouts,
        session=upstream,
        readiness=readiness,
    )
    control = ControlApi(
        auth,
        agents=core.agents,
        pool=pool,
        ledger=core.ledger,
        admission=core.admission,
        energy=core.energy,
        fleet=core.fleet,
        listing=core,
        persist=core.persist,
        wall_clock=wall_clock,
        watch=core.watch,
        cell_room=cell_room,
        cell_guard=cell_guard,
    )
    tokens = TokenCountApi(
        pool=pool,
        instance_of=lambda agent_id: a.instance if (a := core.ledger.get(agent_id)) else None,
        identity=identity,
        identity_header=config.identity_header,
        metrics=core.metrics,
        timeouts=config.timeouts,
        max_body_bytes=config.max_body_bytes,
        session=upstream,
    )
    app.router.add_routes(public.routes())
    app.router.add_routes(tokens.routes())
    app.router.add_routes(control.routes())
    app.router.add_routes(cell_room.routes())
    app.router.add_routes(AdminApi(core, auth).routes())
    health = HealthChecker(pool, core, pump, clock, config.timeouts, upstream)
    app[HEALTH_KEY] = health

    async def lifecycle(app: web.Application) -> AsyncIterator[None]:
        # Pooled upstream connections are dropped after 4 s idle, before uvicorn's
        # (vLLM's server) 5 s keep-alive closes them: a request sent on a connection
        # the backend is closing fails in a way that cannot be safely retried.
        connector = aiohttp.TCPConnector(
            limit=0, ttl_dns_cache=300, keepalive_timeout=UPSTREAM_KEEPALIVE_S
        )
        # No cookie jar: a backend's Set-Cookie must not be replayed on every other
        # agent's requests (a client's own Cookie header is forwarded as sent).
        session = aiohttp.ClientSession(
            connector=connector, auto_decompress=False, cookie_jar=aiohttp.DummyCookieJar()
        )
        proxy.session = session
        # The inference requests' own client (router/upstream.py), same idle bound.
        upstream_client = UpstreamClient(
            connect_timeout_s=config.timeouts.connect_s, keepalive_s=UPSTREAM_KEEPALIVE_S
        )
        proxy.upstream = upstream_client
        restored = 0 if keeper is not None else await core.restore()
        log.info("router_started", instances=len(core.pool), restored_agents=restored,
                 signing=secret is not None, store=store.kind)  # fmt: skip
        tasks: list[asyncio.Task[None]] = []
        if keeper is not None:
            keeper.start()  # the election is not a timer tests drive: always on
        if background:
            tasks.append(asyncio.create_task(health.run()))
            steps = (breakers.tick, core.agents.expire_idle, core.admission.pump_all,
                     core.energy.release)  # fmt: skip
            persist = None if keeper is not None else core.persist  # the keeper flushes
            tasks.append(asyncio.create_task(_maintenance(steps, persist, gate)))
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            credentials.unpublish()
            if keeper is not None:
                await keeper.stop()
            else:
                try:
                    await core.persist()
                except RouterError as exc:
                    log.error("final_persist_failed", error=str(exc))
            await session.close()
            await upstream_client.close()
            if core.store is not None:
                await core.store.close()
            core.energy.close()  # parked agent records, with the energy known by now
            records.close()
            if trace is not None:
                trace.close()  # live agents' sessions so far, marked not ended

    app.cleanup_ctx.append(lifecycle)
    return app


async def _maintenance(
    steps: Sequence[Callable[[], object]], persist: Persist | None, gate: LeaderGate
) -> None:
    """Once a second, while this router leads: ``steps`` (breakers half-opening, idle
    expiry, local admission after a daemon goes stale, energy release), then
    persistence (``persist``; None: a lease keeper's flusher writes instead).

    A failing write (full disk, read-only state directory) is logged once, when it
    starts failing, and once when it recovers; the unsaved changes stay queued.
    """
    failing = False
    while True:
        await asyncio.sleep(MAINTENANCE_INTERVAL_S)
        if not gate.serving():
            continue
        try:
            for step in steps:
                step()
        except Exception:
            log.exception("maintenance_failed")
        if persist is None:
            continue
        try:
            await persist()
        except StateStoreError as exc:
            if not failing:
                log.error(
                    "persist_failed", error=str(exc), hint="changes kept; retried each second"
                )
            failing = True
        else:
            if failing:
                log.info("persist_recovered")
            failing = False


def make_runner(app: web.Application) -> web.AppRunner:
    """The app's runner with the router's connection limit and header read bound,
    and the inference routes on their own protocol unless ``fast_http`` is off."""
    cfg = app[CORE_KEY].config
    fast = None
    if cfg.fast_http:
        fast = FastHttpConfig(
            serve=app[PROXY_KEY].serve,
            routes=frozenset(ROUTES),
            max_body_bytes=cfg.max_body_bytes,
            keepalive_s=cfg.timeouts.header_read_s,
        )
    return LimitedRunner(
        app,
        max_connections=cfg.max_connections,
        fast=fast,
        handler_cancellation=True,
        access_log=None,
        keepalive_timeout=cfg.timeouts.header_read_s,
        logger=http_logger(),
    )


def raise_nofile_limit() -> int:
    """Raise the soft RLIMIT_NOFILE to the hard limit (one descriptor per stream, twice).

    Returns the soft limit now in force; a refusal leaves the limit as it was.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
    return soft


def publish_credentials(app: web.Application, port: int) -> None:
    """Make the credentials discoverable by local clients of ``port`` (after binding)."""
    app[CREDENTIALS_KEY].publish(port)

"""The aiohttp application: routes, error middleware, background tasks, lifecycle.

:func:`create_app` is the one place the router is assembled; the CLI and the
tests both use it (tests through :mod:`router.testing`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import resource
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import structlog
from aiohttp import web

from kairos_common.credentials import read_credential
from reporting.records import JsonlWriter
from router.admin_api import AdminApi
from router.auth import ControlAuth
from router.breaker import CircuitBreakers
from router.config import RouterConfig
from router.control_api import ControlApi
from router.core import RouterCore
from router.errors import RouterError, StateStoreError
from router.health import HealthChecker
from router.identity_mw import upstream_headers
from router.openai_errors import error_response, from_router_error
from router.proxy import ROUTES, Proxy
from router.secrets_store import RouterCredentials, load_or_create_secret
from router.server_limits import LimitedRunner, http_logger
from router.store import StateStore

log = structlog.get_logger("kairos.router")
CORE_KEY = web.AppKey("kairos_core", RouterCore)
HEALTH_KEY = web.AppKey("kairos_health", HealthChecker)
CREDENTIALS_KEY = web.AppKey("kairos_credentials", RouterCredentials)
BREAKERS_KEY = web.AppKey("kairos_breakers", CircuitBreakers)
MAINTENANCE_INTERVAL_S = 1.0


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
        return error_response(
            exc.status,
            f"{message}: {request.method} {request.path}",
            code="not_found" if exc.status == 404 else None,
            anthropic=anthropic,
        )
    except (asyncio.CancelledError, ConnectionResetError):
        raise
    except Exception:
        log.exception("unhandled_error", path=request.path)
        return error_response(
            500, "internal router error", err_type="server_error", code="internal_error",
            anthropic=anthropic,
        )  # fmt: skip


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
    store = StateStore(state / "router.sqlite3")
    records = JsonlWriter(config.records or state / "agents.jsonl")
    return config, secret, store, records


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
    core = RouterCore(
        config, secret=secret, store=store, records=records, clock=clock, wall_clock=wall_clock
    )
    for inst in core.pool:
        credentials.write_daemon_file(inst.name)
    auth = ControlAuth(
        credentials,
        lambda: [i.name for i in core.pool],
        loopback_reads=config.control_token is None,
    )
    app = web.Application(client_max_size=config.max_body_bytes, middlewares=[error_middleware])
    app[CORE_KEY] = core
    app[CREDENTIALS_KEY] = credentials
    proxy = Proxy(core)
    app[BREAKERS_KEY] = proxy.breakers
    for path in ROUTES:
        app.router.add_post(path, proxy.handle)
    _add_routes(app, core, proxy, auth)
    health = HealthChecker(core, lambda: proxy.session)
    app[HEALTH_KEY] = health

    async def lifecycle(app: web.Application) -> AsyncIterator[None]:
        # Pooled upstream connections are dropped after 4 s idle, before uvicorn's
        # (vLLM's server) 5 s keep-alive closes them: a request sent on a connection
        # the backend is closing fails in a way that cannot be safely retried.
        connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300, keepalive_timeout=4.0)
        session = aiohttp.ClientSession(connector=connector, auto_decompress=False)
        proxy.session = session
        restored = await core.restore()
        log.info("router_started", instances=len(core.pool), restored_agents=restored,
                 signing=secret is not None)  # fmt: skip
        tasks: list[asyncio.Task[None]] = []
        if background:
            tasks.append(asyncio.create_task(health.run()))
            tasks.append(asyncio.create_task(_maintenance(core, proxy.breakers.tick)))
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            credentials.unpublish()
            try:
                await core.persist()
            except RouterError as exc:
                log.error("final_persist_failed", error=str(exc))
            await session.close()
            if core.store is not None:
                await core.store.close()
            core.energy.close()  # parked agent records, with the energy known by now
            records.close()

    app.cleanup_ctx.append(lifecycle)
    return app


async def _maintenance(core: RouterCore, tick_breakers: Callable[[], None]) -> None:
    """Idle expiry, local admission after a daemon goes stale, and persistence.

    A failing write (full disk, read-only state directory) is logged once, when it
    starts failing, and once when it recovers; the unsaved changes stay queued.
    """
    failing = False
    while True:
        await asyncio.sleep(MAINTENANCE_INTERVAL_S)
        try:
            tick_breakers()
            core.agents.expire_idle()
            core.admission.pump_all()
            core.energy.release()
        except Exception:
            log.exception("maintenance_failed")
        try:
            await core.persist()
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
    """The app's runner with the router's connection limit and header read bound."""
    cfg = app[CORE_KEY].config
    return LimitedRunner(
        app,
        max_connections=cfg.max_connections,
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


def _add_routes(app: web.Application, core: RouterCore, proxy: Proxy, auth: ControlAuth) -> None:
    async def health(_request: web.Request) -> web.Response:
        eligible = core.pool.eligible()
        return web.json_response(
            {"status": "ok" if eligible else "unavailable", "instances": core.instances_json()},
            status=200 if eligible else 503,
        )

    async def metrics(_request: web.Request) -> web.Response:
        return web.Response(body=core.metrics.render(), content_type="text/plain", charset="utf-8")

    async def models(request: web.Request) -> web.Response:
        return await _merged_models(request, core, proxy)

    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/v1/models", models)
    app.router.add_routes(ControlApi(core, auth).routes())
    app.router.add_routes(AdminApi(core, auth).routes())


async def _merged_models(request: web.Request, core: RouterCore, proxy: Proxy) -> web.Response:
    """``/v1/models`` of every eligible instance, merged by model id."""
    cfg = core.config
    ident = proxy.identity.resolve(request.headers)
    headers = upstream_headers(request.headers, ident, cfg.identity_header, "models")
    timeout = aiohttp.ClientTimeout(total=cfg.timeouts.health_timeout_s * 2)

    async def fetch(url: str) -> tuple[int, Any]:
        try:
            async with proxy.session.get(
                url + "/v1/models", headers=headers, timeout=timeout
            ) as resp:
                return resp.status, await resp.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return 0, None

    results = await asyncio.gather(*(fetch(i.base_url) for i in core.pool.eligible()))
    merged: dict[str, Any] = {}
    for status, body in results:
        if status == 401:
            return error_response(401, "backend rejected the API key", code="invalid_api_key",
                                  err_type="authentication_error")  # fmt: skip
        if status == 200 and isinstance(body, dict) and isinstance(body.get("data"), list):
            for model in body["data"]:
                if isinstance(model, dict) and isinstance(model.get("id"), str):
                    merged.setdefault(model["id"], model)
    if not merged and not any(s == 200 for s, _ in results):
        return error_response(503, "no backend answered /v1/models", err_type="server_error",
                              code="no_healthy_backend")  # fmt: skip
    return web.json_response({"object": "list", "data": list(merged.values())})

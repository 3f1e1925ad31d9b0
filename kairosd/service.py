"""Assemble and run one daemon: the single place where objects are built.

Exit codes of :func:`serve` (and so of ``kairosd run``): 0 clean stop,
1 unexpected error, 2 bad configuration, 3 clock control required but not
permitted, 4 no usable GPU. Clocks are reset on every path out.
"""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Callable

import aiohttp
import structlog

from controllers.errors import ControllerError
from kairos_common.cli import listen_error
from kairosd.config import KairosdConfig
from kairosd.errors import (
    EXIT_CONFIG,
    EXIT_ERROR,
    EXIT_NO_CONTROL,
    EXIT_NO_GPU,
    EXIT_OK,
    GpuError,
    GpuPermissionError,
)
from kairosd.gpu.base import GpuBackend
from kairosd.gpu.opening import open_backend
from kairosd.gpu_reset import reset_clocks
from kairosd.health_server import HealthServer
from kairosd.loop import Daemon
from kairosd.metrics import DaemonMetrics
from kairosd.router_client import RouterClient
from kairosd.sdnotify import Notifier
from kairosd.startup import build_controller, prepare_backend
from kairosd.vllm_client import VllmClient
from reporting.records import JsonlWriter

log = structlog.get_logger()


async def serve(
    config: KairosdConfig,
    stop: asyncio.Event,
    *,
    notifier: Notifier | None = None,
    on_ready: Callable[[Daemon, int | None], None] | None = None,
) -> int:
    """Run until ``stop`` is set; returns the process exit code."""
    notifier = notifier or Notifier(os.environ.get("NOTIFY_SOCKET"))
    try:
        token = config.resolved_router_token()
    except ValueError as exc:
        log.error("bad_config", error=str(exc))
        return EXIT_CONFIG
    async with aiohttp.ClientSession() as session:
        try:
            backend: GpuBackend = await open_backend(
                config.gpu_backend,
                vllm_url=config.sim_gpu_url or config.vllm_url,
                gpus=config.gpus,
                timeout_s=config.gpu_timeout_s,
                session=session,
            )
        except GpuError as exc:
            log.error("gpu_unavailable", error=str(exc), backend=config.gpu_backend)
            return EXIT_NO_GPU
        try:
            return await _serve_with(config, stop, backend, session, notifier, on_ready, token)
        finally:
            await backend.close()


async def _serve_with(
    config: KairosdConfig,
    stop: asyncio.Event,
    backend: GpuBackend,
    session: aiohttp.ClientSession,
    notifier: Notifier,
    on_ready: Callable[[Daemon, int | None], None] | None,
    token: str | None,
) -> int:
    try:
        backend = await prepare_backend(backend, require_control=config.require_control)
        controller = await build_controller(backend, config)
    except GpuPermissionError as exc:
        log.error("gpu_control_required_but_denied", error=str(exc))
        return EXIT_NO_CONTROL
    except GpuError as exc:
        log.error("gpu_unavailable", error=str(exc))
        await reset_clocks(backend)
        return EXIT_NO_GPU
    except ControllerError as exc:
        log.error("bad_control_config", error=str(exc))
        await reset_clocks(backend)
        return EXIT_CONFIG
    router = None
    if config.router_url:
        router = RouterClient(
            session,
            config.router_url,
            config.instance,
            config.http_timeout_s,
            token,
            token_source=config.resolved_router_token,
        )
    try:
        sink = JsonlWriter(config.report_path) if config.report_path else None
    except OSError as exc:
        log.error("cannot_open_power_report", path=str(config.report_path), error=str(exc))
        await reset_clocks(backend)
        return EXIT_CONFIG
    metrics = DaemonMetrics(config.instance)
    daemon = Daemon(
        config,
        backend=backend,
        controller=controller,
        vllm=VllmClient(session, config.vllm_url, config.http_timeout_s),
        router=router,
        sink=sink,
        metrics=metrics,
        notifier=notifier,
        daemon_id=f"{config.instance}@{socket.gethostname()}:{os.getpid()}",
    )
    server = None
    code = EXIT_OK
    try:
        port = None
        if config.listen_port is not None:
            server = HealthServer(metrics, daemon.health, config.listen_host, config.listen_port)
            try:
                port = await server.start()
            except OSError as exc:
                msg = listen_error(config.listen_host, config.listen_port, exc, "--listen-port")
                log.error("cannot_listen", error=msg)
                server, code = None, EXIT_CONFIG
                return code
        log.info(
            "kairosd_started",
            instance=config.instance,
            mode=daemon.mode,
            backend=backend.name,
            controls_clocks=backend.controls,
            policy=controller.name,
            epoch_s=config.epoch_s,
            listen=f"{config.listen_host}:{port}" if port is not None else None,
            report=str(config.report_path) if config.report_path else None,
        )
        if config.standalone:
            log.warning("standalone_mode", detail="no router: U from vLLM KV usage, no SLO boost")
        notifier.ready(daemon.status_line())
        if on_ready is not None:
            on_ready(daemon, port)
        await daemon.run_forever(stop)
    except GpuPermissionError as exc:
        log.error("gpu_control_required_but_denied", error=str(exc))
        code = EXIT_NO_CONTROL
    except Exception as exc:
        # One line in the journal; the traceback only when debugging (docs/kairosd.md).
        log.error(
            "kairosd_crashed",
            error=f"{type(exc).__name__}: {exc}",
            exc_info=config.log_level == "debug",
        )
        code = EXIT_ERROR
    finally:
        reset_ok = await asyncio.shield(daemon.shutdown())
        if sink is not None:
            sink.close()
        if server is not None:
            await server.stop()
        log.info("kairosd_stopped", clocks_reset=reset_ok, exit_code=code)
    return code

"""``kairos fake-vllm``: run one fake vLLM server with a simulated GPU.

aiohttp and the server module are imported only when the command runs: every
``kairos`` invocation registers this command, and importing them cost ``kairos
sim`` about half a second of start-up (docs/simulator.md, "Speed").
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from pathlib import Path
from typing import TYPE_CHECKING

import structlog
import typer

from kairos_common.cli import (
    LogJsonOpt,
    LogLevelOpt,
    check_can_listen,
    check_log_level,
    check_port,
    check_positive,
    fail,
    listen_error,
)
from kairos_common.errors import ConfigError
from kairos_common.logs import configure_logging
from simulator.errors import SimulatorError
from simulator.presets import DEFAULT_MODEL, DEFAULT_PRESET, PRESET_NAMES

if TYPE_CHECKING:
    from simulator.fakevllm import FakeVllm

PROG = "kairos fake-vllm"


async def serve(fake: FakeVllm, host: str, port: int, port_file: Path | None) -> None:
    """Serve until SIGTERM/SIGINT; write the bound port to ``port_file``."""
    from aiohttp import web

    from simulator.fakevllm import make_app

    runner = web.AppRunner(make_app(fake), handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    server = site._server
    sockets = getattr(server, "sockets", None) or []
    bound = sockets[0].getsockname()[1] if sockets else port
    if port_file is not None:
        tmp = port_file.with_suffix(".tmp")
        tmp.write_text(f"{bound}\n")
        tmp.replace(port_file)
    structlog.get_logger("fake-vllm").info(
        "fake_vllm_listening",
        url=f"http://{host}:{bound}",
        model=fake.config.model,
        preset=fake.preset.name,
        speedup=fake.config.speedup,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        with contextlib.suppress(Exception):
            await runner.cleanup()


def register(app: typer.Typer) -> None:
    @app.command("fake-vllm")
    def fake_vllm(
        host: str = typer.Option("127.0.0.1", help="Address to listen on."),
        port: int = typer.Option(8000, help="Port to listen on (0 = pick a free port)."),
        port_file: Path | None = typer.Option(
            None, help="Write the bound port to this file once listening (for port 0)."
        ),
        model: str = typer.Option(
            DEFAULT_MODEL, help="Served model name (as `vllm serve --served-model-name`)."
        ),
        preset: str = typer.Option(
            DEFAULT_PRESET, help=f"Hardware/model preset: {', '.join(PRESET_NAMES)}."
        ),
        speedup: float = typer.Option(
            1.0, help="Simulated seconds per real second (10 = ten times faster than real)."
        ),
        api_key: str | None = typer.Option(
            None, envvar="VLLM_API_KEY", help="Require this Bearer key on /v1/* (like vLLM)."
        ),
        enable_prompt_tokens_details: bool = typer.Option(
            False, help="Report usage.prompt_tokens_details.cached_tokens (like vLLM's flag)."
        ),
        disable_log_stats: bool = typer.Option(
            False, help="Export no vllm:* metrics (like vLLM's --disable-log-stats)."
        ),
        kv_capacity_tokens: int | None = typer.Option(
            None, help="Override the preset's KV cache capacity in tokens."
        ),
        kv_offloading_size: float = typer.Option(
            0.0,
            help="GiB of CPU KV tier, like vLLM's --kv-offloading-size (0: none).",
        ),
        log_level: LogLevelOpt = None,
        log_json: LogJsonOpt = None,
    ) -> None:
        """Run a fake vLLM OpenAI server whose timing and power come from the simulator.

        It also hosts a simulated GPU under /kairos-sim/gpus that
        `kairosd --gpu-backend sim` controls.
        """
        from simulator.fakevllm import FakeVllm, FakeVllmConfig

        try:
            configure_logging(check_log_level(log_level) or "info", log_json)
            check_positive(speedup, "--speedup", " of simulated seconds per real second")
            if kv_capacity_tokens is not None and kv_capacity_tokens <= 0:
                raise ConfigError(f"--kv-capacity-tokens {kv_capacity_tokens}: expected > 0")
            check_port(port, "--port")
            if port_file is not None and not port_file.parent.is_dir():
                raise ConfigError(f"--port-file {port_file}: its directory does not exist")
            cfg = FakeVllmConfig(
                model=model,
                preset=preset,
                speedup=speedup,
                api_key=api_key,
                enable_prompt_tokens_details=enable_prompt_tokens_details,
                disable_log_stats=disable_log_stats,
                kv_capacity_tokens=kv_capacity_tokens,
                kv_offloading_size_gib=kv_offloading_size,
            )
            fake = FakeVllm(cfg)
            check_can_listen(host, port, "--port")
        except (ConfigError, SimulatorError) as exc:
            fail(PROG, str(exc))
        try:
            asyncio.run(serve(fake, host, port, port_file))
        except OSError as exc:  # lost the race for the port after the check above
            fail(PROG, listen_error(host, port, exc))

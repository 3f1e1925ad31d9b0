"""``kairos-router`` command line (typer).

``kairos-router run --backend URL [--backend URL …] [--host H] [--port P] [--config FILE]``
(docs/design.md §4). Every flag overrides the TOML file and ``KAIROS_ROUTER_*`` env vars.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import structlog
import typer
from aiohttp import web

from kairos_common.cli import (
    EXIT_USAGE,
    LogJsonOpt,
    LogLevelOpt,
    VersionOpt,
    check_can_listen,
    check_log_level,
    fail,
    listen_error,
    make_app,
    run_app,
)
from kairos_common.config import load_config
from kairos_common.credentials import DAEMON_KEY_FILE, read_credential, safe_instance_file_name
from kairos_common.errors import ConfigError
from kairos_common.logs import configure_logging
from router.app import create_app, make_runner, publish_credentials, raise_nofile_limit
from router.config import ENV_PREFIX, RETIRED, RouterConfig
from router.errors import RouterError
from router.secrets_store import derive_daemon_token

app = make_app("Kairos agent-aware OpenAI-compatible router.", no_args_is_help=True)
PROG = "kairos-router"


@app.callback()
def _root(version: VersionOpt = False) -> None:
    """Kairos agent-aware, power-aware OpenAI-compatible router (paper §6.1, §6.3)."""


@app.command()
def run(
    backend: Annotated[
        list[str] | None,
        typer.Option(
            "--backend",
            "-b",
            help="vLLM base URL (http://host:port), repeatable; NAME=URL names the instance "
            "(default names i0, i1, … in order; a kairosd uses this name or host:port).",
        ),
    ] = None,
    host: Annotated[
        str | None, typer.Option(help="Address to listen on (default 127.0.0.1).")
    ] = None,
    port: Annotated[int | None, typer.Option(help="Port to listen on (default 24157).")] = None,
    config: Annotated[
        Path | None, typer.Option("--config", "-c", help="TOML config file (see docs/router.md).")
    ] = None,
    state_dir: Annotated[
        Path | None,
        typer.Option(
            help="Directory for the signing secret, SQLite ledger state and agent records "
            "(default $XDG_STATE_HOME/kairos/router)."
        ),
    ] = None,
    placement: Annotated[
        str | None,
        typer.Option(
            help="Placement policy: consolidating (default), round-robin, least-context, confident."
        ),
    ] = None,
    signing_secret_file: Annotated[
        Path | None,
        typer.Option(help="HMAC secret for agent identities (created if missing)."),
    ] = None,
    no_signing: Annotated[
        bool, typer.Option("--no-signing", help="Accept unsigned identities (testing only).")
    ] = False,
    control_token_file: Annotated[
        Path | None,
        typer.Option(
            help="File with the bearer token required by the /kairos/v1 control API; without "
            "one only loopback peers may call it (env KAIROS_ROUTER_CONTROL_TOKEN also works)."
        ),
    ] = None,
    records: Annotated[
        Path | None,
        typer.Option(help="Per-agent completion records JSONL (default STATE_DIR/agents.jsonl)."),
    ] = None,
    trace_file: Annotated[
        Path | None,
        typer.Option(
            help="Record every agent's program (token counts and times, never text) to this "
            "JSONL file for kairos whatif (config [trace] path; off by default)."
        ),
    ] = None,
    capacity_tokens: Annotated[
        int | None,
        typer.Option(
            help="Fallback KV capacity U_max per instance when neither kairosd nor vLLM "
            "/metrics provide one."
        ),
    ] = None,
    anonymous: Annotated[
        str | None,
        typer.Option(
            help="Requests without identity: one-turn (each request is an agent, default) "
            "or api-key (one agent per API key)."
        ),
    ] = None,
    run_label: Annotated[
        str | None,
        typer.Option("--run", help="Label written into every agent record ('run' field)."),
    ] = None,
    idle_expiry_s: Annotated[
        float | None,
        typer.Option(help="End agents idle this long without an end signal (default 1800)."),
    ] = None,
    cell: Annotated[
        str | None,
        typer.Option(
            help="The cell this router serves in a fleet split into cells (docs/cells.md): "
            "agent ids carry it, identities of other cells are refused. Default: none."
        ),
    ] = None,
    store: Annotated[
        str | None,
        typer.Option(
            help="State store: sqlite (default, a file in --state-dir) or redis://HOST:PORT/DB "
            "(shared by routers that elect a leader; docs/scale-out.md)."
        ),
    ] = None,
    advertise_url: Annotated[
        str | None,
        typer.Option(
            help="This router's URL as clients should reach it (stored with the lease; "
            "standbys name it in X-Kairos-Leader)."
        ),
    ] = None,
    log_level: LogLevelOpt = None,
    log_json: LogJsonOpt = None,
    log_console: Annotated[
        bool, typer.Option("--log-console", hidden=True, help="Old spelling of --log-text.")
    ] = False,
) -> None:
    """Start the router in front of vLLM instances."""
    overrides: dict[str, Any] = {
        "host": host,
        "port": port,
        "state_dir": state_dir,
        "signing_secret_file": signing_secret_file,
        "control_token_file": control_token_file,
        "records": records,
        "run": run_label,
        "anonymous": anonymous,
        "idle_expiry_s": idle_expiry_s,
        "cell": cell,
        "store": store,
        "advertise_url": advertise_url,
        "log_level": log_level,
        "log_json": False if log_console else log_json,
    }
    if backend:
        overrides["backends"] = list(backend)
    if no_signing:
        overrides["signing"] = False
    if placement is not None:
        overrides["placement"] = {"policy": placement}
    if capacity_tokens is not None:
        overrides["admission"] = {"capacity_tokens": capacity_tokens}
    if trace_file is not None:
        overrides["trace"] = {"path": trace_file}
    try:
        check_log_level(log_level)
        cfg = load_config(
            RouterConfig, path=config, env_prefix=ENV_PREFIX, overrides=overrides, retired=RETIRED
        )
        if not cfg.backends:
            raise ConfigError("no backend: pass --backend URL or set backends in the config")
        check_can_listen(cfg.host, cfg.port, "--port")
        configure_logging(cfg.log_level, cfg.log_json)
        factory = loop_factory(cfg.event_loop)
        application = create_app(cfg)
    except (ConfigError, RouterError, ValueError) as exc:
        fail(PROG, str(exc), EXIT_USAGE)
    except OSError as exc:  # a state dir, records or secret path that cannot be used
        fail(PROG, f"cannot use {exc.filename}: {exc.strerror or exc}", EXIT_USAGE)
    try:
        with asyncio.Runner(loop_factory=factory) as runner:
            runner.run(serve(application, cfg.host, cfg.port))
    except OSError as exc:  # lost the race for the port after the check above
        fail(PROG, listen_error(cfg.host, cfg.port, exc), EXIT_USAGE)


@app.command("daemon-token")
def daemon_token(
    instance: Annotated[str, typer.Argument(help="The instance name (a backend NAME).")],
    credentials_dir: Annotated[
        Path,
        typer.Option(
            help="The routers' credentials folder (its daemon.key is used, nothing is written)."
        ),
    ] = Path("/var/lib/kairos-router/credentials"),
) -> None:
    """Print the daemon credential of INSTANCE, for its kairosd on another host.

    Routers that share ``daemon.key`` (a pair, or cells whose credentials come from
    one Secret) all accept it. Where the router writes its credential files itself,
    ``credentials/daemon-NAME.token`` holds the same value.
    """
    try:
        key = read_credential(credentials_dir / DAEMON_KEY_FILE).encode()
    except ConfigError as exc:
        fail(PROG, str(exc), EXIT_USAGE)
    if not safe_instance_file_name(instance):
        fail(PROG, f"instance {instance!r}: not a usable instance name", EXIT_USAGE)
    typer.echo(derive_daemon_token(key, instance).decode())


def loop_factory(choice: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The event loop the router runs on (config ``event_loop``); None: asyncio's.

    uvloop (libuv) runs the same aiohttp code with 7-13% fewer instructions per
    proxied request (docs/router.md, overhead benchmark), so ``auto`` takes it
    whenever it is installed.
    """
    if choice == "asyncio":
        return None
    try:
        import uvloop  # optional dependency (extra "fast")
    except ImportError:
        if choice == "uvloop":
            raise ConfigError(
                "event_loop = uvloop but uvloop is not installed "
                "(pip install 'kairos-sidecar[fast]')"
            ) from None
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


async def serve(application: web.Application, host: str, port: int) -> None:
    """Serve until SIGTERM/SIGINT; logs ``listening`` only once the socket is bound
    (scripts and tests wait for that line), then shuts down cleanly (state persisted)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    raise_nofile_limit()
    runner = make_runner(application)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port, shutdown_timeout=10.0)
        await site.start()
        bound = [a for a in runner.addresses if isinstance(a, tuple)]
        actual_port = bound[0][1] if bound else port
        publish_credentials(application, actual_port)
        structlog.get_logger("kairos.router").info("listening", host=host, port=actual_port)
        await stop.wait()
        structlog.get_logger("kairos.router").info("shutting_down")
    finally:
        await runner.cleanup()


def main(argv: list[str] | None = None) -> None:
    """Entry point ``kairos-router``: one error-reporting path (kairos_common.cli.run_app)."""
    run_app(app, PROG, argv)


if __name__ == "__main__":
    main()

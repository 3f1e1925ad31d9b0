"""``id-tracker`` command line: ``id-tracker [OPTIONS] -- CMD [ARGS]...``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import structlog
import typer

from idtracker import config as config_mod
from idtracker.errors import ConfigurationError, IdTrackerError, RegistrationError
from idtracker.launch import LaunchRequest, launch
from idtracker.supervisor import SignalGate
from kairos_common.cli import (
    CONTEXT_SETTINGS,
    LogJsonOpt,
    VersionOpt,
    check_log_level,
    check_slo,
    make_app,
    run_app,
)
from kairos_common.errors import ConfigError
from kairos_common.logs import configure_logging

# Nothing imported here may start a thread: signals are blocked per thread, and a
# thread created before SignalGate.block() (e.g. numpy's OpenBLAS pool) would keep
# SIGTERM & co. unblocked and let the kernel deliver them there, killing id-tracker
# instead of reaching sigwaitinfo. kairos_common.wire imports only the standard
# library (tests/common/test_import_cost.py checks that none of these loads numpy).

HELP = (
    "Launch an agent program under a fresh Kairos agent identity.\n\n"
    "Registers the agent with the Kairos router, runs CMD with OPENAI_BASE_URL (and the "
    "LiteLLM / Anthropic equivalents) pointing at the router and an API key that carries "
    "the identity, forwards signals, reports the agent's end, and exits with CMD's status.\n\n"
    "Exit status: CMD's own (128+N if signal N killed it). Before CMD runs: 69 router "
    "unreachable, 76 unexpected router reply, 77 control token refused, 78 bad "
    "configuration, 126/127 CMD not executable / not found. See docs/idtracker.md."
)

app = make_app()
PROG = "id-tracker"


@app.command(help=HELP, context_settings={**CONTEXT_SETTINGS, "allow_interspersed_args": False})
def run(
    cmd: Annotated[
        list[str],
        typer.Argument(
            metavar="-- CMD [ARGS]...",
            help="The agent program and its arguments (put them after --).",
            show_default=False,
        ),
    ],
    router_url: Annotated[
        list[str] | None,
        typer.Option(
            "--router-url",
            help="Router base URL, e.g. http://127.0.0.1:24157 (a trailing /v1 is accepted). "
            "Repeat it for a router pair, front balancer first: the agent gets the first, "
            "start and end follow the leader over all. Env KAIROS_ROUTER_URL "
            "(comma-separated); default http://127.0.0.1:24157.",
            show_default=False,
        ),
    ] = None,
    name: Annotated[
        str | None,
        typer.Option("--name", help="Agent name shown by the router (default: from CMD)."),
    ] = None,
    slo: Annotated[
        float | None,
        typer.Option(
            "--slo",
            help="This agent's throughput SLO in decode tokens/s (default: the router's).",
        ),
    ] = None,
    fail_open: Annotated[
        bool | None,
        typer.Option(
            "--fail-open/--fail-closed",
            help="If the router cannot register the agent, run CMD anyway, UNTAGGED and with "
            "an unchanged environment (a warning says so), instead of exiting 69/76/77. "
            "Env KAIROS_FAIL_OPEN. Default: fail closed.",
            show_default=False,
        ),
    ] = None,
    control_token: Annotated[
        str | None,
        typer.Option(
            "--control-token",
            help="Lifecycle credential for the router's control API. Visible in `ps`: "
            "prefer KAIROS_CONTROL_TOKEN or --control-token-file. Never passed to CMD.",
            show_default=False,
        ),
    ] = None,
    control_token_file: Annotated[
        Path | None,
        typer.Option(
            "--control-token-file",
            help="File holding the lifecycle (or admin) credential (env "
            "KAIROS_CONTROL_TOKEN_FILE). Default: the credential a local router published. "
            "Never passed to CMD.",
            show_default=False,
        ),
    ] = None,
    config: Annotated[
        Path | None,
        typer.Option(
            "--config",
            help="TOML config file (env KAIROS_IDTRACKER_CONFIG; default "
            "~/.config/kairos/id-tracker.toml or /etc/kairos/id-tracker.toml if present).",
            show_default=False,
        ),
    ] = None,
    start_timeout_s: Annotated[
        float | None,
        typer.Option(
            "--start-timeout-s",
            help="How long to retry agent registration before giving up. Default 5.",
            show_default=False,
        ),
    ] = None,
    end_timeout_s: Annotated[
        float | None,
        typer.Option(
            "--end-timeout-s",
            help="How long to retry reporting the agent's end (backoff) before warning and "
            "exiting with CMD's status anyway. Default 15.",
            show_default=False,
        ),
    ] = None,
    kill_grace_s: Annotated[
        float | None,
        typer.Option(
            "--kill-grace-s",
            help="After forwarding SIGTERM, how long CMD may take to exit before SIGKILL. "
            "Default 10.",
            show_default=False,
        ),
    ] = None,
    summary: Annotated[
        bool | None,
        typer.Option(
            "--summary/--no-summary",
            help="When CMD ends, print what the run cost on stderr: requests, output "
            "tokens, throughput against the SLO, time held, and the GPU energy the router "
            "attributed to it (env KAIROS_SUMMARY). Default: off.",
            show_default=False,
        ),
    ] = None,
    summary_wait_s: Annotated[
        float | None,
        typer.Option(
            "--summary-wait-s",
            help="How long the end call may wait for the run's last joules to be "
            "attributed (an epoch or two after its last request), 0-60. Default 15.",
            show_default=False,
        ),
    ] = None,
    log_level: Annotated[
        str | None,
        typer.Option(
            "--log-level",
            help="id-tracker's own log level on stderr (env KAIROS_LOG_LEVEL). Default "
            "warning, so a healthy run prints nothing.",
            show_default=False,
        ),
    ] = None,
    log_json: LogJsonOpt = None,
    version: VersionOpt = False,
) -> None:
    """Launch CMD under a new agent identity."""
    gate = SignalGate()
    gate.block()  # first: threads started from here on inherit the blocked mask

    configure_logging(log_level or "warning", log_json)
    log = structlog.get_logger()
    try:
        try:
            check_slo(slo)
            check_log_level(log_level)
        except ConfigError as exc:
            raise ConfigurationError(str(exc)) from None
        cfg = config_mod.load(
            path=config,
            overrides={
                "router_url": tuple(router_url) if router_url else None,
                "fail_open": fail_open,
                "control_token": control_token,
                "control_token_file": control_token_file,
                "start_timeout_s": start_timeout_s,
                "end_timeout_s": end_timeout_s,
                "kill_grace_s": kill_grace_s,
                "log_level": log_level,
                "summary": summary,
                "summary_wait_s": summary_wait_s,
            },
        )
        configure_logging(cfg.log_level, log_json)
        req = LaunchRequest(
            cmd=list(cmd),
            router_urls=config_mod.normalise_router_urls(cfg.router_url),
            name=name,
            slo_tok_s=slo,
            fail_open=cfg.fail_open,
            control_token=config_mod.resolve_control_token(cfg),
            start_timeout_s=cfg.start_timeout_s,
            end_timeout_s=cfg.end_timeout_s,
            request_timeout_s=cfg.request_timeout_s,
            kill_grace_s=cfg.kill_grace_s,
            summary=cfg.summary,
            summary_wait_s=cfg.summary_wait_s,
        )
        code = launch(req, gate)
    except IdTrackerError as exc:
        hint = (
            " (--fail-open runs the agent untagged)" if isinstance(exc, RegistrationError) else ""
        )
        log.error(f"id-tracker: {exc}{hint}", exit_code=exc.exit_code)
        raise typer.Exit(exc.exit_code) from None
    raise typer.Exit(code)


def main(argv: list[str] | None = None) -> None:
    """Entry point ``id-tracker``: one error-reporting path (kairos_common.cli.run_app)."""
    run_app(app, PROG, argv)

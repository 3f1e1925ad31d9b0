"""Command-line plumbing shared by the four Kairos programs.

``kairosd``, ``kairos-router``, ``id-tracker`` and ``kairos`` are used side by
side by the same operator, so they answer in one dialect: ``-h``/``--help``,
``--version`` (the installed distribution's version, identical everywhere),
``--log-json/--log-text``, ``--gpus 0,1``, an SLO that must be a positive
number of tokens/s — and one error-reporting path, :func:`run_app`:

* bad input (a flag, a config value, a path, a URL, a port in use) prints ONE
  line ``<prog>: <the input>: <what is expected>`` on stderr and exits
  :data:`EXIT_USAGE` (2), so systemd's ``RestartPreventExitStatus=2`` stops a
  restart loop that could never succeed;
* anything unexpected prints one line naming the error and exits
  :data:`EXIT_ERROR` (1); the traceback is shown only with ``--log-level debug``.

Each program may document further codes of its own (kairosd 3/4, id-tracker's
sysexits), raised as ``typer.Exit(code)`` after printing their own line.
"""

from __future__ import annotations

import errno
import math
import socket
import sys
import traceback
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as dist_version
from typing import Annotated, Any, NoReturn
from urllib.parse import urlsplit

import typer
import typer.main
from typer import _click as click
from typer._click import exceptions as click_exc

from kairos_common.errors import ConfigError

DISTRIBUTION = "kairos-sidecar"
EXIT_OK, EXIT_ERROR, EXIT_USAGE = 0, 1, 2

CONTEXT_SETTINGS: dict[str, Any] = {
    "help_option_names": ["-h", "--help"],
    # Help text is read in terminals and pasted into tickets: wide enough that
    # env names and URLs are never cut mid-word at 80 columns.
    "max_content_width": 100,
}


def make_app(help_text: str | None = None, **kwargs: Any) -> typer.Typer:
    """A Typer app in the shared dialect: ``-h``, plain help text (no boxes that
    cut env names and URLs at 80 columns, no ``<bool>`` placeholders), no shell
    completion, errors left to :func:`run_app`."""
    return typer.Typer(
        help=help_text,
        add_completion=False,
        pretty_exceptions_enable=False,
        context_settings=CONTEXT_SETTINGS,
        rich_markup_mode=None,
        **kwargs,
    )


def version() -> str:
    """The installed distribution's version (the same string for every program)."""
    try:
        return dist_version(DISTRIBUTION)
    except PackageNotFoundError:  # running from a checkout that was never installed
        return "0+unknown"


def _show_version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value and not ctx.resilient_parsing:
        typer.echo(f"{ctx.find_root().info_name} {version()}")
        raise typer.Exit(EXIT_OK)


VersionOpt = Annotated[
    bool,
    typer.Option(
        "--version",
        callback=_show_version,
        is_eager=True,
        expose_value=True,
        help="Print the version and exit.",
    ),
]
LogLevelOpt = Annotated[
    str | None,
    typer.Option(
        "--log-level",
        help="debug, info, warning or error (debug also shows tracebacks).",
        show_default=False,
    ),
]
LogJsonOpt = Annotated[
    bool | None,
    typer.Option(
        "--log-json/--log-text",
        help="Log format. Default: JSON under systemd or off a terminal, text on a terminal.",
        show_default=False,
    ),
]
LOG_LEVELS = ("debug", "info", "warning", "error")


def fail(prog: str, message: str, code: int = EXIT_USAGE) -> NoReturn:
    """Print ``prog: message`` as one line on stderr and exit with ``code``."""
    typer.echo(f"{prog}: {_one_line(message)}", err=True)
    raise typer.Exit(code)


def _one_line(message: str) -> str:
    return " ".join(message.split())


def check_log_level(value: str | None, flag: str = "--log-level") -> str | None:
    """``value`` lower-cased if it is a known level, else :class:`ConfigError`."""
    if value is None:
        return None
    if value.lower() not in LOG_LEVELS:
        raise ConfigError(f"{flag} {value!r}: expected one of {', '.join(LOG_LEVELS)}")
    return value.lower()


def parse_gpus(raw: str | None, flag: str = "--gpus") -> tuple[int, ...] | None:
    """``"0,1"`` → ``(0, 1)``: GPU indices of one instance, non-negative, no repeats."""
    if raw is None:
        return None
    parts = [p.strip() for p in raw.split(",") if p.strip()]
    try:
        gpus = tuple(int(p) for p in parts)
    except ValueError:
        gpus = ()
    if not gpus or any(g < 0 for g in gpus) or len(set(gpus)) != len(gpus):
        raise ConfigError(
            f"{flag} {raw!r}: expected distinct non-negative GPU indices like 0 or 0,1"
        )
    return gpus


def check_slo(value: float | None, flag: str = "--slo") -> float | None:
    """An SLO is a positive, finite number of decode tokens/s (paper Eq. 4)."""
    return check_positive(value, flag, " of tokens/s, e.g. 20")


def check_positive(value: float | None, flag: str, unit: str = "") -> float | None:
    """``value`` unless it is zero, negative, NaN or infinite."""
    if value is not None and not (math.isfinite(value) and value > 0):
        raise ConfigError(f"{flag} {value:g}: expected a positive number{unit}")
    return value


def check_fixed_clock(policy: str, clocks_mhz: Sequence[int], where: str) -> None:
    """``fixed:MHZ`` must lie within the GPU's clock range: a clock outside it
    would silently become the nearest end (``fixed:5`` running at 210 MHz)."""
    raw = policy.removeprefix("fixed:")
    if raw == policy or not raw.isdigit() or not clocks_mhz:
        return  # not a fixed clock, or malformed: the controller registry names that error
    lo, hi = min(clocks_mhz), max(clocks_mhz)
    if not lo <= int(raw) <= hi:
        raise ConfigError(f"policy {policy!r}: the clocks of {where} are {lo}-{hi} MHz")


def check_http_url(url: str, what: str) -> str:
    """``url`` without a trailing ``/`` if it is ``http(s)://host[:port]`` (port 1–65535)."""
    clean = url.strip().rstrip("/")
    expected = "expected http(s)://host:port, e.g. http://127.0.0.1:8000"
    parts = urlsplit(clean)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"{what} {url!r}: {expected}")
    try:
        port = parts.port
    except ValueError:
        port = -1
    if port is not None and not 1 <= port <= 65535:
        raise ConfigError(f"{what} {url!r}: port must be 1-65535")
    if parts.query or parts.fragment:
        raise ConfigError(f"{what} {url!r}: must not have a query or fragment")
    return clean


def check_port(port: int | None, what: str) -> int | None:
    """A TCP port to listen on: 0 (any free port) to 65535."""
    if port is not None and not 0 <= port <= 65535:
        raise ConfigError(f"{what} {port}: expected 0-65535 (0 = any free port)")
    return port


def check_can_listen(host: str, port: int | None, what: str) -> None:
    """Fail fast, before any other start-up work, if ``host:port`` cannot be bound.

    Binding again moments later can still race with another process, so the
    real bind stays the authority; this turns the common case (a second
    instance on the default port) into one clear line instead of a crash.
    """
    if port is None or port == 0:
        return
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise ConfigError(f"{what} {host!r}: cannot resolve: {exc.strerror or exc}") from None
    family, kind, proto, _, addr = infos[0]
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(addr)
        except OSError as exc:
            raise ConfigError(listen_error(host, port, exc, what)) from None


def listen_error(host: str, port: int, exc: OSError, what: str = "--port") -> str:
    """The one line for a failed bind, with the fix."""
    if exc.errno == errno.EADDRINUSE:
        return (
            f"cannot listen on {host}:{port}: the port is already in use "
            f"(another instance?); choose another with {what} (0 = any free port)"
        )
    return f"cannot listen on {host}:{port}: {exc.strerror or exc}"


def _debug_requested(args: Sequence[str]) -> bool:
    for i, arg in enumerate(args):
        if arg == "--":
            return False
        if arg == "--log-level=debug" or (
            arg == "--log-level" and i + 1 < len(args) and args[i + 1].lower() == "debug"
        ):
            return True
    return False


def _missing(ctx: click.Context) -> str:
    """What a bare invocation lacks: a subcommand, or the command's arguments."""
    names = getattr(ctx.command, "commands", None)
    if names:
        return f"missing a command: one of {', '.join(sorted(names))}"
    required = [p.name or "?" for p in ctx.command.params if p.required]
    return f"missing {', '.join(required) or 'arguments'}"


def run_app(app: typer.Typer, prog: str, argv: Sequence[str] | None = None) -> NoReturn:
    """Run ``app`` as ``prog`` with the shared error-reporting path, then exit."""
    args = list(sys.argv[1:] if argv is None else argv)
    command = typer.main.get_command(app)
    try:
        rv = command.main(args=args, prog_name=prog, standalone_mode=False)
        code = rv if isinstance(rv, int) else EXIT_OK
    except click_exc.NoArgsIsHelpError as exc:
        typer.echo(f"{prog}: {_missing(exc.ctx)} (see '{exc.ctx.command_path} -h')", err=True)
        code = EXIT_USAGE
    except typer.Exit as exc:
        code = exc.exit_code
    except click.ClickException as exc:
        hint = ""
        ctx = getattr(exc, "ctx", None)
        if isinstance(exc, click_exc.UsageError) and ctx is not None:
            hint = f" (see '{ctx.command_path} -h')"
        typer.echo(f"{prog}: {_one_line(exc.format_message())}{hint}", err=True)
        code = exc.exit_code
    except (typer.Abort, KeyboardInterrupt):
        typer.echo(f"{prog}: interrupted", err=True)
        code = 130
    except ConfigError as exc:  # raised past a command's own handler: still bad input
        typer.echo(f"{prog}: {_one_line(str(exc))}", err=True)
        code = EXIT_USAGE
    except Exception as exc:
        if _debug_requested(args):
            traceback.print_exc()
        typer.echo(
            f"{prog}: unexpected error: {type(exc).__name__}: {_one_line(str(exc))} "
            "(rerun with --log-level debug for the traceback)",
            err=True,
        )
        code = EXIT_ERROR
    sys.exit(code)

"""structlog set-up shared by every process: JSON under systemd or when not on a
TTY, coloured key=value on a terminal, secrets redacted in both.

Call :func:`configure_logging` once from a CLI entry point; libraries only call
``structlog.get_logger()``.
"""

from __future__ import annotations

import logging
import os
import re
import sys
from collections.abc import MutableMapping
from typing import Any

import structlog

# Key names that hold secrets: "token"/"secret" as a whole word at the end of the
# key (control_token, signing_secret) but not counts such as capacity_tokens.
_SECRET_KEYS = re.compile(
    r"(^|[_-])(authorization|api[_-]?key|apikey|token|secret|password|credentials?)$", re.I
)
_KAIROS_KEY = re.compile(r"kairos1\.[A-Za-z0-9_-]+\.[A-Za-z0-9_=-]+(\.[A-Za-z0-9_=-]*)?")
_BEARER = re.compile(r"(Bearer\s+)\S+", re.I)


def redact_value(value: str) -> str:
    """Mask identity keys and bearer tokens inside a free-form string."""
    value = _KAIROS_KEY.sub("kairos1.<redacted>", value)
    return _BEARER.sub(r"\1<redacted>", value)


def redact_secrets(
    _logger: Any, _method: str, event_dict: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    """structlog processor: never let an API key or token reach a log line."""
    for key, value in list(event_dict.items()):
        if _SECRET_KEYS.search(key):
            event_dict[key] = "<redacted>"
        elif isinstance(value, str):
            event_dict[key] = redact_value(value)
    return event_dict


def want_json(explicit: bool | None = None) -> bool:
    """JSON when asked, under systemd (``JOURNAL_STREAM``/``INVOCATION_ID``), or off a TTY."""
    if explicit is not None:
        return explicit
    if os.environ.get("JOURNAL_STREAM") or os.environ.get("INVOCATION_ID"):
        return True
    return not sys.stderr.isatty()


def _stderr_logger(*_args: Any) -> structlog.PrintLogger:
    """A logger on the *current* ``sys.stderr``, looked up when a logger is made.

    Binding the stream object once would keep writing to whatever stderr was at
    configuration time — e.g. a CLI test runner's capture buffer that has since
    been closed — and every later log line would raise.
    """
    return structlog.PrintLogger(file=sys.stderr)


def configure_logging(level: str = "info", json: bool | None = None) -> None:
    """Configure structlog (and stdlib logging) for a Kairos process."""
    lvl = logging.getLevelName(level.upper())
    if not isinstance(lvl, int):
        lvl = logging.INFO
    logging.basicConfig(level=lvl, stream=sys.stderr, format="%(message)s")
    renderer: Any = (
        structlog.processors.JSONRenderer()
        if want_json(json)
        else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            # Tracebacks are rendered to text first, so redaction covers them too.
            structlog.processors.format_exc_info,
            redact_secrets,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(lvl),
        logger_factory=_stderr_logger,
        cache_logger_on_first_use=False,
    )

"""An inbound connection limit for the aiohttp server.

aiohttp has no limit of its own: every accepted socket gets a handler and a
file descriptor. :class:`LimitedRunner` builds a :class:`LimitedServer` that
answers connections beyond ``max_connections`` with a fixed ``503`` (an
OpenAI-style error body, ``Connection: close``) and closes them at once, so a
flood of idle sockets cannot exhaust the router's descriptors while the
connections already open keep being served.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestHandler

from kairos_common.logs import redact_value

_BODY = json.dumps(
    {
        "error": {
            "message": "router connection limit reached; retry shortly",
            "type": "server_error",
            "param": None,
            "code": "too_many_connections",
        }
    }
).encode()
REFUSAL = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
    b"Retry-After: 1\r\nConnection: close\r\nContent-Length: "
    + str(len(_BODY)).encode()
    + b"\r\n\r\n"
    + _BODY
)


class LimitedServer(web.Server):
    """``web.Server`` that refuses connections above ``max_connections``."""

    max_connections: int = 1 << 30
    refused: int = 0

    def connection_made(self, handler: RequestHandler, transport: asyncio.Transport) -> None:
        super().connection_made(handler, transport)
        if len(self._connections) > self.max_connections:
            self.refused += 1
            transport.write(REFUSAL)
            transport.close()


class LimitedRunner(web.AppRunner):
    """``web.AppRunner`` whose server is a :class:`LimitedServer`."""

    def __init__(self, app: web.Application, *, max_connections: int, **kwargs: Any) -> None:
        super().__init__(app, **kwargs)
        self._max_connections = max_connections

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        # aiohttp builds the Server inside Application._make_handler (private); it
        # has no __slots__, so re-classing it adds the limit without copying that code.
        server.__class__ = LimitedServer
        assert isinstance(server, LimitedServer)
        server.max_connections = self._max_connections
        return server


class _BadHttpFilter(logging.Filter):
    """aiohttp logs a client's malformed HTTP (a 400 it already answered) as an
    ERROR with a traceback; it is the client's fault, so one warning line instead."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError):
            record.exc_info = None
            record.exc_text = None
            record.levelno, record.levelname = logging.WARNING, "WARNING"
            message = redact_value(str(exc.message)[:200])
            record.msg, record.args = "bad_http_request: %s", (message,)
        return True


def http_logger() -> logging.Logger:
    """The logger for the router's aiohttp server (malformed requests, one line each)."""
    logger = logging.getLogger("kairos.router.http")
    if not any(isinstance(f, _BadHttpFilter) for f in logger.filters):
        logger.addFilter(_BadHttpFilter())
    return logger

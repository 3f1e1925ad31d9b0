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
from router.fast_http import FastHttpConfig, FastProtocol

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
    """``web.Server`` that refuses connections above ``max_connections`` and, when
    given a :class:`FastHttpConfig`, starts every connection on the inference
    routes' own protocol (:mod:`router.fast_http`), which hands it back here
    (:meth:`fallback`) for anything else."""

    max_connections: int = 1 << 30
    refused: int = 0
    fast: FastHttpConfig | None = None
    _fast_connections: set[FastProtocol]

    def __call__(self) -> Any:
        if self.fast is None:
            return super().__call__()
        return FastProtocol(self.fast, self)

    def fallback(self) -> asyncio.Protocol:
        """A new aiohttp handler for a connection the fast path hands over."""
        handler: RequestHandler = super().__call__()
        return handler

    def _open(self) -> int:
        return len(self._connections) + len(self._fast_connections)

    def _refuse(self, transport: asyncio.Transport) -> None:
        self.refused += 1
        transport.write(REFUSAL)
        transport.close()

    def connection_made(self, handler: RequestHandler, transport: asyncio.Transport) -> None:
        super().connection_made(handler, transport)
        if self._open() > self.max_connections:
            self._refuse(transport)

    def fast_made(self, proto: FastProtocol, transport: asyncio.Transport) -> bool:
        self._fast_connections.add(proto)
        if self._open() > self.max_connections:
            self._refuse(transport)
            return False
        return True

    def fast_lost(self, proto: FastProtocol) -> None:
        self._fast_connections.discard(proto)

    def pre_shutdown(self) -> None:
        super().pre_shutdown()
        for proto in list(self._fast_connections):
            proto.close_when_idle()

    async def shutdown(self, timeout: float | None = None) -> None:  # noqa: ASYNC109 (aiohttp's)
        """aiohttp's connections and the fast path's finish within ``timeout``;
        what is still running then is cut (as aiohttp cancels its handlers)."""
        fast = list(self._fast_connections)
        tasks = [p.task for p in fast if p.task is not None]

        async def fast_done() -> None:
            if tasks:
                await asyncio.wait(tasks, timeout=timeout)
            for proto in fast:
                if proto.task is not None:
                    proto.abort()  # still answering past the bound (answered ones closed)

        await asyncio.gather(super().shutdown(timeout), fast_done())


class LimitedRunner(web.AppRunner):
    """``web.AppRunner`` whose server is a :class:`LimitedServer`."""

    def __init__(
        self,
        app: web.Application,
        *,
        max_connections: int,
        fast: FastHttpConfig | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(app, **kwargs)
        self._max_connections = max_connections
        self._fast = fast

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        # aiohttp builds the Server inside Application._make_handler (private); it
        # has no __slots__, so re-classing it adds the limit without copying that code.
        server.__class__ = LimitedServer
        assert isinstance(server, LimitedServer)
        server.max_connections = self._max_connections
        server.fast = self._fast
        server._fast_connections = set()
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

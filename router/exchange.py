"""One inbound inference request and the means to answer it, whichever server took it.

The proxy (:mod:`router.proxy`) and the relay (:mod:`router.relay`) read the
request and write the answer only through :class:`Exchange`, so the same code
runs behind aiohttp's server (:class:`AiohttpExchange`, every route) and behind
the hot path's own HTTP/1.1 protocol (:mod:`router.fast_http`, the inference
routes when a request arrives whole). Neither side knows which one it has.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Protocol

from aiohttp import web

from router.json_body import read_body


class Exchange(Protocol):
    """What the proxy needs of an inbound request and its response.

    ``send`` writes a whole response at once and returns quietly if the client
    has gone (the request is accounted all the same); ``start``/``write``/``end``
    stream one (chunked), and there a client that has gone raises
    ``ConnectionResetError``, which the relay tells apart from upstream failures.
    """

    method: str
    path: str
    path_qs: str
    headers: Mapping[str, str]

    async def read_body(self, limit: int, timeout_s: float) -> bytes: ...

    async def send(self, status: int, headers: Mapping[str, str], body: bytes) -> None: ...

    async def start(self, status: int, headers: Mapping[str, str]) -> None: ...

    async def write(self, data: bytes) -> None: ...

    async def end(self) -> None: ...

    def abort(self) -> None: ...


class AiohttpExchange:
    """An :class:`Exchange` over an aiohttp request; ``response`` is what the
    handler returns to aiohttp (already sent, which aiohttp leaves alone)."""

    __slots__ = ("headers", "method", "path", "path_qs", "request", "response")

    def __init__(self, request: web.Request) -> None:
        self.request = request
        self.method = request.method
        self.path = request.path
        self.path_qs = request.path_qs
        self.headers: Mapping[str, str] = request.headers
        self.response: web.StreamResponse | None = None

    async def read_body(self, limit: int, timeout_s: float) -> bytes:
        return await read_body(self.request, limit, timeout_s)

    async def send(self, status: int, headers: Mapping[str, str], body: bytes) -> None:
        out = web.Response(status=status, body=body, headers=headers)
        self.response = out
        # Sent now, not when the handler returns: the client has its answer while
        # the router accounts the request. A client gone by now changes nothing.
        with contextlib.suppress(ConnectionResetError):
            await out.prepare(self.request)
            await out.write_eof()

    async def start(self, status: int, headers: Mapping[str, str]) -> None:
        out = web.StreamResponse(status=status, headers=headers)
        self.response = out
        await out.prepare(self.request)

    async def write(self, data: bytes) -> None:
        assert self.response is not None
        await self.response.write(data)

    async def end(self) -> None:
        assert self.response is not None
        await self.response.write_eof()

    def abort(self) -> None:
        if self.request.transport is not None:
            self.request.transport.abort()

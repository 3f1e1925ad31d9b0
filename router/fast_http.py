"""The inference routes' own HTTP/1.1 protocol, beside aiohttp's server (docs/router.md).

Why: with every feature on, aiohttp's server cost about 35 µs of the router's CPU
a request (parser objects, request and response objects, routing, middleware,
a header multidict each way), about a quarter of the whole; a protocol on
``httptools`` (llhttp, as aiohttp and uvicorn use) costs a fraction of that.

What it takes: a ``POST`` to an inference route (:data:`router.proxy.ROUTES`,
no query string), HTTP/1.1, with a ``Content-Length`` body no larger than the
router's ``max_body_bytes`` and a head of at most :data:`MAX_HEAD_BYTES`; the
proxy starts on the head and reads the body within ``body_read_s`` (408), as
behind aiohttp. Everything else is handed to aiohttp: another route or method, a
chunked body, ``Expect``, ``Upgrade``, HTTP/1.0, anything llhttp rejects. The
connection's protocol then becomes aiohttp's ``RequestHandler``, fed every byte
received since the last answered request, and the connection stays with aiohttp.
So aiohttp's limits, timeouts and error answers apply to whatever this module
does not take, and this module implements only: framing by ``Content-Length``;
keep-alive with aiohttp's idle bound; pipelined requests answered in order
(reading paused above :data:`PAUSE_READING_BYTES`); a whole or chunked answer
with write flow control; and, as aiohttp's ``handler_cancellation``, the handler
cancelled when the client leaves. The proxy answers through :class:`router.exchange.Exchange`
and cannot tell the two servers apart.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass
from email.utils import formatdate
from http import HTTPStatus
from typing import Protocol, cast

import httptools
import structlog
from multidict import CIMultiDict, CIMultiDictProxy

from router.errors import BodyTooLargeError, RequestTimeoutError
from router.openai_errors import internal_error_parts

log = structlog.get_logger("kairos.router.proxy")

MAX_HEAD_BYTES = 8190
"""A longer head goes to aiohttp, whose line and field limits (8190) then apply."""
PAUSE_READING_BYTES = 1 << 16
"""Pipelined bytes buffered while a request is answered before reading pauses."""
_REASONS = {s.value: s.phrase.encode() for s in HTTPStatus}
_CHUNKED = b"Transfer-Encoding: chunked\r\n"
_CLOSE = b"Connection: close\r\n"
_LAST_CHUNK = b"0\r\n\r\n"


@dataclass(frozen=True, slots=True)
class FastHttpConfig:
    """What the protocol serves and with which bounds (built by the runner)."""

    serve: Callable[[FastExchange], Awaitable[None]]
    routes: Collection[str]
    max_body_bytes: int
    keepalive_s: float


class ConnectionHost(Protocol):
    """The server side the protocol reports to (:class:`router.server_limits.LimitedServer`)."""

    def fast_made(self, proto: FastProtocol, transport: asyncio.Transport) -> bool: ...

    def fast_lost(self, proto: FastProtocol) -> None: ...

    def fallback(self) -> asyncio.Protocol: ...


@dataclass(frozen=True, slots=True)
class RequestHead:
    """A request head the fast path takes."""

    path: str
    headers: CIMultiDictProxy[str]
    content_length: int
    keep_alive: bool


class _HeadParts:
    """httptools callbacks collecting one head (fed whole, so spans are whole)."""

    __slots__ = ("complete", "headers", "url")

    def __init__(self) -> None:
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.complete = False

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        self.complete = True


def parse_head(head: bytes, routes: Collection[str], max_body_bytes: int) -> RequestHead | None:
    """The head if the fast path takes its request, else None (aiohttp's then)."""
    parts = _HeadParts()
    parser = httptools.HttpRequestParser(parts)
    try:
        parser.feed_data(head)
    except (httptools.HttpParserError, httptools.HttpParserUpgrade):
        return None
    if (
        not parts.complete
        or parser.get_method() != b"POST"
        or parser.get_http_version() != "1.1"
        or parser.should_upgrade()
    ):
        return None
    url = parts.url
    if b"?" in url or b"%" in url or b"#" in url or not url.isascii():
        return None
    path = url.decode("ascii")
    if path not in routes:
        return None
    length = -1
    headers: CIMultiDict[str] = CIMultiDict()
    for raw_name, raw_value in parts.headers:
        name = raw_name.decode("utf-8", "surrogateescape")
        lname = name.lower()
        if lname == "content-length":
            length = int(raw_value)  # llhttp has checked it: digits, one value
        elif lname in ("transfer-encoding", "expect", "upgrade"):
            return None
        headers.add(name, raw_value.decode("utf-8", "surrogateescape"))
    if length < 0 or length > max_body_bytes:
        return None
    return RequestHead(path, CIMultiDictProxy(headers), length, parser.should_keep_alive())


class FastExchange:
    """An :class:`router.exchange.Exchange` over one request of a :class:`FastProtocol`."""

    __slots__ = (
        "_arrived", "_body", "_proto", "complete", "content_length", "headers", "keep_alive",
        "method", "path", "path_qs", "started",
    )  # fmt: skip

    def __init__(self, proto: FastProtocol, head: RequestHead) -> None:
        self._proto = proto
        self._body: bytes | None = None
        self._arrived: asyncio.Future[None] | None = None
        self.content_length = head.content_length
        self.method = "POST"
        self.path = head.path
        self.path_qs = head.path
        self.headers: Mapping[str, str] = head.headers
        self.keep_alive = head.keep_alive
        self.started = False
        self.complete = False

    @property
    def body_received(self) -> bool:
        return self._body is not None

    def body_arrived(self, body: bytes) -> None:
        self._body = body
        if self._arrived is not None and not self._arrived.done():
            self._arrived.set_result(None)

    async def read_body(self, limit: int, timeout_s: float) -> bytes:
        if self.content_length > limit:
            raise BodyTooLargeError(f"request body exceeds {limit} bytes")
        if self._body is None:
            self._arrived = asyncio.get_running_loop().create_future()
            try:
                async with asyncio.timeout(timeout_s):
                    await self._arrived
            except TimeoutError:
                msg = f"request body not received within {timeout_s:g}s"
                raise RequestTimeoutError(msg) from None
        assert self._body is not None
        return self._body

    async def send(self, status: int, headers: Mapping[str, str], body: bytes) -> None:
        head = self._head(status, headers, b"Content-Length: %d\r\n" % len(body))
        self.started = True
        proto = self._proto
        if proto.closed:
            return  # the client has gone: nothing to tell it
        proto.write(head + body)
        self.complete = True

    async def start(self, status: int, headers: Mapping[str, str]) -> None:
        head = self._head(status, headers, _CHUNKED)
        self.started = True
        self._check_open()
        self._proto.write(head)

    async def write(self, data: bytes) -> None:
        if not data:
            return
        self._check_open()
        proto = self._proto
        proto.write(b"%x\r\n%b\r\n" % (len(data), data))
        await proto.drain()

    async def end(self) -> None:
        self._check_open()
        self._proto.write(_LAST_CHUNK)
        self.complete = True

    def abort(self) -> None:
        self._proto.abort()

    def _check_open(self) -> None:
        if self._proto.closed:
            raise ConnectionResetError("client connection lost")

    def _head(self, status: int, headers: Mapping[str, str], framing: bytes) -> bytes:
        lines = [b"HTTP/1.1 %d %b\r\n" % (status, _REASONS.get(status, b"Unknown"))]
        for name, value in headers.items():
            if "\r" in value or "\n" in value or "\r" in name or "\n" in name:
                raise ValueError(f"newline in response header {name!r}")
            lines.append(f"{name}: {value}\r\n".encode("utf-8", "surrogateescape"))
        lines.append(framing)
        lines.append(self._proto.date_line())
        if not self.keep_alive:
            lines.append(_CLOSE)
        lines.append(b"\r\n")
        return b"".join(lines)


class FastProtocol(asyncio.Protocol):
    """One client connection on the fast path (see the module docstring)."""

    def __init__(self, config: FastHttpConfig, host: ConnectionHost) -> None:
        self._config = config
        self._host = host
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        self._buf = bytearray()
        self.task: asyncio.Task[None] | None = None
        self.closed = False
        self._reading_paused = False
        self._writing_paused = False
        self._drain: asyncio.Future[None] | None = None
        self._awaiting_body: FastExchange | None = None
        self._idle: asyncio.TimerHandle | None = None
        self._idle_deadline: float | None = None  # None: a request is being answered
        self._close_when_idle = False
        self._date_s = -1
        self._date = b""

    # -- asyncio callbacks ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self._transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        if self._host.fast_made(self, transport):
            self._arm_idle()

    def data_received(self, data: bytes) -> None:
        self._buf += data
        if self.task is not None:
            ex = self._awaiting_body
            if ex is not None:
                self._take_body(ex)
            elif len(self._buf) > PAUSE_READING_BYTES and not self._reading_paused:
                # answering: pipelined bytes wait their turn
                self._reading_paused = True
                assert self._transport is not None
                self._transport.pause_reading()
            return
        self._next()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._stop_idle_timer()
        if self.task is not None:
            self.task.cancel()  # the client left: the proxy unwinds (handler_cancellation)
        if self._drain is not None and not self._drain.done():
            self._drain.set_exception(ConnectionResetError("client connection lost"))
        self._host.fast_lost(self)

    def pause_writing(self) -> None:
        self._writing_paused = True

    def resume_writing(self) -> None:
        self._writing_paused = False
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)
        self._drain = None

    # -- used by FastExchange ------------------------------------------------------------

    def write(self, data: bytes) -> None:
        assert self._transport is not None
        self._transport.write(data)

    async def drain(self) -> None:
        if self.closed:
            raise ConnectionResetError("client connection lost")
        if self._writing_paused:
            self._drain = self._loop.create_future()
            await self._drain

    def abort(self) -> None:
        if self._transport is not None:
            self._transport.abort()

    def date_line(self) -> bytes:
        now = int(time.time())
        if now != self._date_s:
            self._date_s = now
            self._date = b"Date: " + formatdate(now, usegmt=True).encode() + b"\r\n"
        return self._date

    # -- shutdown ------------------------------------------------------------------------

    def close_when_idle(self) -> None:
        """Close now if idle, else once the request being answered is answered."""
        self._close_when_idle = True
        if self.task is None and self._transport is not None:
            self._transport.close()

    # -- requests ------------------------------------------------------------------------

    def _next(self) -> None:
        """Answer the next buffered request, wait for the rest of its head (within
        the idle bound, not re-armed by each piece), or hand the connection to aiohttp."""
        buf = self._buf
        end = buf.find(b"\r\n\r\n", 0, MAX_HEAD_BYTES + 4)
        if end < 0:
            if len(buf) > MAX_HEAD_BYTES or b"\n\n" in buf:  # too long, or bare LFs
                self._hand_off()
            elif self._idle_deadline is None:
                self._arm_idle()
            return
        cfg = self._config
        head = parse_head(bytes(buf[: end + 4]), cfg.routes, cfg.max_body_bytes)
        if head is None:
            self._hand_off()
            return
        self._cancel_idle()
        del buf[: end + 4]
        ex = FastExchange(self, head)
        self._take_body(ex)
        self.task = self._loop.create_task(self._run(ex))

    def _take_body(self, ex: FastExchange) -> None:
        """Hand ``ex`` its body once all of it is buffered (later bytes are pipelined)."""
        n = ex.content_length
        buf = self._buf
        if len(buf) < n:
            self._awaiting_body = ex
            return
        self._awaiting_body = None
        body = bytes(buf[:n])
        del buf[:n]
        ex.body_arrived(body)

    async def _run(self, ex: FastExchange) -> None:
        try:
            await self._config.serve(ex)
        except asyncio.CancelledError:
            return  # the client left; the connection is gone
        except Exception:
            log.exception("unhandled_error", path=ex.path)
            if not ex.started:
                await ex.send(*internal_error_parts(anthropic=ex.path == "/v1/messages"))
        finally:
            self.task = None
            self._awaiting_body = None
        self._answered(ex)

    def _answered(self, ex: FastExchange) -> None:
        if self.closed:
            return
        assert self._transport is not None
        if not ex.complete:
            self._transport.abort()  # a half-sent answer must not look complete
        elif not ex.keep_alive or self._close_when_idle or not ex.body_received:
            # (a body that never came in full leaves the stream out of step: closed)
            self._transport.close()
        else:
            if self._reading_paused:
                self._reading_paused = False
                self._transport.resume_reading()
            if self._buf:
                self._next()
            else:
                self._arm_idle()

    def _hand_off(self) -> None:
        """Give the connection, with every byte not yet answered, to aiohttp."""
        transport = self._transport
        assert transport is not None and self.task is None
        self._stop_idle_timer()
        self._host.fast_lost(self)
        handler = self._host.fallback()
        transport.set_protocol(handler)
        handler.connection_made(transport)
        if self._reading_paused:
            self._reading_paused = False
            transport.resume_reading()
        if self._writing_paused:
            handler.pause_writing()
        data, self._buf = bytes(self._buf), bytearray()
        if data and not transport.is_closing():
            handler.data_received(data)

    def _arm_idle(self) -> None:
        # One timer a connection, not one a request: it only moves the deadline
        # while requests keep coming, and is re-armed for the rest when it fires.
        self._idle_deadline = self._loop.time() + self._config.keepalive_s
        if self._idle is None:
            self._idle = self._loop.call_at(self._idle_deadline, self._idle_check)

    def _cancel_idle(self) -> None:
        self._idle_deadline = None

    def _stop_idle_timer(self) -> None:
        self._idle_deadline = None
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None

    def _idle_check(self) -> None:
        self._idle = None
        deadline = self._idle_deadline
        if deadline is None:
            return  # answering: the answer re-arms it
        if self._loop.time() < deadline:
            self._idle = self._loop.call_at(deadline, self._idle_check)
        elif self.task is None and self._transport is not None:
            self._transport.close()

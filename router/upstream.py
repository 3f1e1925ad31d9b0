"""The hot path's HTTP/1.1 client: pooled keep-alive connections to the backends.

Why not aiohttp's ``ClientSession`` here (it still serves the health checks and
key probes): measured on the shared router harness (docs/router.md), a
bare aiohttp proxy spent 173 µs of CPU a request and 96 µs with this client in
place of ``ClientSession``, the server side unchanged. ``ClientSession.request``
builds a request object, a URL, header multidicts, a response object, a stream
reader, tracing hooks and per-read timers; the router needs a request line, a
header block and the body bytes handed over as they arrive. Parsing is
``httptools`` (llhttp, Node.js's parser, as uvicorn uses it): this module only
pools connections, writes the request and bounds the waits.

What it keeps of aiohttp's behaviour, because the proxy relies on it:

* idle connections are dropped after ``keepalive_s`` (4 s, under uvicorn's 5 s),
  so a request is not sent on a connection the backend is closing;
* a failure to connect is told apart (:class:`TransportConnectError`: nothing was
  sent, a retry cannot duplicate) from a connection that broke after the request
  went out (:class:`TransportClosedError`) and from a backend silent for longer
  than the read bound (:class:`TransportTimeoutError`, per read, like aiohttp's
  ``sock_read``);
* a response body is handed over as it arrives, and reading from the backend
  pauses while more than ``_PAUSE_BYTES`` wait for a slow client;
* a connection is reused only after a complete response the backend keeps alive;
  a response abandoned half-way (client gone, error) closes its connection, which
  is how vLLM learns to abort the request.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import cast
from urllib.parse import urlsplit

import httptools

from router.errors import (
    TransportClosedError,
    TransportConnectError,
    TransportRequestError,
    TransportTimeoutError,
)

_PAUSE_BYTES = 1 << 20
_BAD_HEADER_CHARS = ("\r", "\n", "\0")


@dataclass(frozen=True, slots=True)
class _Origin:
    """Where one base URL's requests go, parsed once."""

    host: str
    port: int
    tls: bool
    host_header: str
    path_prefix: str


def _origin(base_url: str) -> _Origin:
    parts = urlsplit(base_url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise TransportConnectError(f"unsupported upstream URL {base_url!r}")
    tls = parts.scheme == "https"
    port = parts.port or (443 if tls else 80)
    netloc = parts.netloc.rpartition("@")[2]  # never send userinfo as the Host
    return _Origin(parts.hostname, port, tls, netloc, parts.path.rstrip("/"))


def request_head(
    method: str, target: str, host_header: str, headers: Mapping[str, str], body_len: int
) -> bytes:
    """The request line and header block; a CR, LF or NUL in any part is refused
    (header injection: the values come from the client's request)."""
    parts = [method, " ", target, " HTTP/1.1\r\nHost: ", host_header, "\r\n"]
    for name, value in headers.items():
        parts += (name, ": ", value, "\r\n")
    # What came from outside (method, target, names, values), checked in one pass.
    fields = "".join((method, target, *parts[6::2]))
    for ch in _BAD_HEADER_CHARS:
        if ch in fields:
            raise TransportRequestError("request line or header contains a control character")
    parts.append(f"Content-Length: {body_len}\r\n\r\n")
    return "".join(parts).encode("utf-8", "surrogateescape")


class UpstreamResponse:
    """One response being received: status and headers, then the body as it comes."""

    def __init__(self, conn: _Connection, read_timeout_s: float) -> None:
        self._conn = conn
        self._loop = conn.loop
        self._read_timeout_s = read_timeout_s
        self.status = 0
        self.headers: list[tuple[str, str]] = []
        self._by_name: dict[str, str] = {}  # lower-case name → value, for lookups
        self._chunks: list[bytes] = []
        self._buffered = 0
        self._paused = False
        self._headers_done = False
        self.complete = False
        self._error: Exception | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self.last_rx_s = self._loop.time()

    # ------------------------------------------------------ from the protocol
    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def on_header(self, name: bytes, value: bytes) -> None:
        header = (name.decode("latin-1"), value.decode("latin-1"))
        self.headers.append(header)
        self._by_name.setdefault(header[0].lower(), header[1])  # the first one counts

    def on_headers(self, status: int) -> None:
        self.status = status
        self._headers_done = True
        self._wake()

    def on_body(self, data: bytes) -> None:
        self._chunks.append(data)
        self._buffered += len(data)
        if self._buffered > _PAUSE_BYTES and not self._paused:
            self._paused = True
            self._conn.pause_reading()
        self._wake()

    def on_complete(self) -> None:
        self.complete = True
        self._wake()

    def on_lost(self, exc: Exception | None) -> None:
        framed = "content-length" in self._by_name or "transfer-encoding" in self._by_name
        if self._headers_done and not framed and not self.complete:
            self.complete = True  # a body delimited by the end of the connection
        elif not self.complete:
            why = f" ({type(exc).__name__})" if exc is not None else ""
            self._error = TransportClosedError(f"upstream closed the connection{why}")
        self._wake()

    def on_error(self, exc: Exception) -> None:
        self._error = exc
        self._wake()

    # ---------------------------------------------------------- for readers
    async def _wait(self) -> None:
        """Wait for the protocol's next event, bounded by the read timeout since
        the last byte arrived (aiohttp's ``sock_read``)."""
        if self._error is not None:
            raise self._error
        loop = self._loop
        waiter = self._waiter = loop.create_future()
        self._timer = loop.call_at(self.last_rx_s + self._read_timeout_s, self._check_idle)
        try:
            await waiter
        finally:
            self._timer.cancel()
            self._waiter = None
        if self._error is not None:
            raise self._error

    def _check_idle(self) -> None:
        waiter = self._waiter
        if waiter is None or waiter.done():
            return
        deadline = self.last_rx_s + self._read_timeout_s
        if self._loop.time() < deadline:
            # Bytes arrived since the timer was set without completing what is
            # awaited: the bound runs from the last of them.
            self._timer = self._loop.call_at(deadline, self._check_idle)
            return
        self._error = TransportTimeoutError(f"upstream sent nothing for {self._read_timeout_s:g}s")
        waiter.set_result(None)

    async def start(self) -> None:
        """Wait for the status line and headers."""
        while not self._headers_done:
            await self._wait()

    @property
    def content_type(self) -> str:
        value = self._by_name.get("content-type", "application/octet-stream")
        return value.partition(";")[0].strip().lower()

    def has_header(self, name: str) -> bool:
        return name.lower() in self._by_name

    async def read(self) -> bytes:
        """The whole body (taken as it arrives, so a large one never pauses reading)."""
        parts: list[bytes] = []
        while True:
            if self._chunks:
                parts.append(self._take())
            if self.complete:
                return parts[0] if len(parts) == 1 else b"".join(parts)
            await self._wait()

    async def readany(self) -> bytes:
        """Whatever body bytes have arrived (waiting for some); ``b""`` at the end."""
        while not self._chunks:
            if self.complete:
                return b""
            await self._wait()
        return self._take()

    def _take(self) -> bytes:
        chunks = self._chunks
        data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        self._chunks = []
        self._buffered = 0
        if self._paused:
            self._paused = False
            self._conn.resume_reading()
        return data

    def release(self) -> None:
        """Done with the response: the connection goes back to the pool if the
        response was complete and the backend keeps it alive, else it closes."""
        self._conn.finish(self, reuse=self.complete and self._error is None)

    def close(self) -> None:
        """Abandon the response: the connection closes (vLLM aborts the request)."""
        self._conn.finish(self, reuse=False)


class _Connection(asyncio.Protocol):
    """One keep-alive connection; at most one request on it at a time."""

    def __init__(self, client: UpstreamClient, origin: _Origin) -> None:
        self.client = client
        self.origin = origin
        self.loop = asyncio.get_running_loop()
        self._parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.idle_since_s = 0.0
        self.response: UpstreamResponse | None = None

    # ---------------------------------------------------------- protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, only alike.
        self.transport = cast(asyncio.Transport, transport)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            # Requests go out in one write and must not wait for an ACK (Nagle).
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.client.forget(self)
        resp = self.response
        if resp is not None:
            resp.on_lost(exc)

    def data_received(self, data: bytes) -> None:
        resp = self.response
        if resp is None:  # bytes nobody asked for: the connection cannot be trusted
            self.abort()
            return
        resp.last_rx_s = self.loop.time()
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            resp.on_error(TransportClosedError(f"malformed upstream response ({exc})"))
            self.abort()

    # ------------------------------------------------- parser callbacks
    def on_message_begin(self) -> None:
        resp = self.response
        if resp is None or resp.complete:
            # A second answer to one request: whatever follows cannot be trusted.
            self.closed = True

    def on_header(self, name: bytes, value: bytes) -> None:
        resp = self.response
        if resp is not None and not resp.complete:
            resp.on_header(name, value)

    def on_headers_complete(self) -> None:
        resp = self.response
        if resp is not None and not resp.complete:
            resp.on_headers(self._parser.get_status_code())

    def on_body(self, body: bytes) -> None:
        resp = self.response
        if resp is not None and not resp.complete:
            resp.on_body(body)

    def on_message_complete(self) -> None:
        resp = self.response
        if resp is not None:
            resp.on_complete()
            if not self._parser.should_keep_alive():
                self.closed = True  # served, but not to be reused

    # ------------------------------------------------------------- use
    def send(self, head: bytes, body: bytes, read_timeout_s: float) -> UpstreamResponse:
        resp = self.response = UpstreamResponse(self, read_timeout_s)
        assert self.transport is not None
        if len(body) < 65536:
            self.transport.write(head + body)  # one send for the usual request
        else:
            self.transport.writelines((head, body))
        return resp

    def pause_reading(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.resume_reading()

    def finish(self, resp: UpstreamResponse, *, reuse: bool) -> None:
        if self.response is not resp:
            return  # released twice
        self.response = None
        if reuse and not self.closed:
            self.idle_since_s = self.loop.time()
            self.client.park(self)
        else:
            self.abort()

    def abort(self) -> None:
        self.closed = True
        self.client.forget(self)
        if self.transport is not None:
            self.transport.abort()


class UpstreamClient:
    """Keep-alive connections per backend origin, for the proxy's requests."""

    def __init__(self, *, connect_timeout_s: float, keepalive_s: float = 4.0) -> None:
        self.connect_timeout_s = connect_timeout_s
        self.keepalive_s = keepalive_s
        self._origins: dict[str, _Origin] = {}
        self._idle: dict[_Origin, list[_Connection]] = {}
        self._live: set[_Connection] = set()
        self._ssl: ssl.SSLContext | None = None

    async def request(
        self,
        method: str,
        base_url: str,
        path_qs: str,
        headers: Mapping[str, str],
        body: bytes,
        *,
        read_timeout_s: float,
    ) -> UpstreamResponse:
        """Send the request and wait for the response's headers.

        Raises :class:`TransportConnectError` when no connection could be made
        (nothing sent), :class:`TransportClosedError` when the connection broke
        after the request went out, :class:`TransportTimeoutError` when the
        backend sent nothing within ``read_timeout_s``, and
        :class:`TransportRequestError` for a header with a control character.
        """
        origin = self._origins.get(base_url)
        if origin is None:
            if len(self._origins) > 256:
                self._origins.clear()
            origin = self._origins[base_url] = _origin(base_url)
        head = request_head(method, origin.path_prefix + path_qs, origin.host_header, headers,
                            len(body))  # fmt: skip
        conn = self._pooled(origin) or await self._connect(origin)
        resp = conn.send(head, body, read_timeout_s)
        try:
            await resp.start()
        except BaseException:
            resp.close()
            raise
        return resp

    def _pooled(self, origin: _Origin) -> _Connection | None:
        idle = self._idle.get(origin)
        if not idle:
            return None
        oldest_ok = asyncio.get_running_loop().time() - self.keepalive_s
        while idle:
            conn = idle.pop()  # most recent first: the others age out
            transport = conn.transport
            if (
                not conn.closed
                and conn.idle_since_s >= oldest_ok
                and transport is not None
                and not transport.is_closing()
            ):
                return conn
            conn.abort()
        return None

    async def _connect(self, origin: _Origin) -> _Connection:
        loop = asyncio.get_running_loop()
        tls: ssl.SSLContext | None = None
        if origin.tls:
            tls = self._ssl = self._ssl or ssl.create_default_context()
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                _, conn = await loop.create_connection(
                    lambda: _Connection(self, origin), origin.host, origin.port, ssl=tls,
                    server_hostname=origin.host if tls else None,
                )  # fmt: skip
        except (OSError, TimeoutError, ssl.SSLError) as exc:
            raise TransportConnectError(
                f"cannot connect to {origin.host}:{origin.port} ({type(exc).__name__})"
            ) from None
        self._live.add(conn)
        return conn

    def park(self, conn: _Connection) -> None:
        """Back to the pool; the oldest idle connection goes if it has aged out.

        Reuse is most-recent-first, so after a burst the pool's bottom holds
        connections nobody takes; dropping one per return keeps the pool near
        the concurrency actually in use without a sweeping timer.
        """
        idle = self._idle.setdefault(conn.origin, [])
        if idle and (idle[0].closed or idle[0].idle_since_s < conn.idle_since_s - self.keepalive_s):
            idle.pop(0).abort()
        idle.append(conn)

    def forget(self, conn: _Connection) -> None:
        self._live.discard(conn)

    @property
    def open_connections(self) -> int:
        """Connections open now, idle or serving (for tests and metrics)."""
        return len(self._live)

    async def close(self) -> None:
        """Close every connection (shutdown)."""
        for conn in list(self._live):
            conn.abort()
        self._live.clear()
        self._idle.clear()
        await asyncio.sleep(0)  # let the transports' connection_lost run

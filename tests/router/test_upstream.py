"""The hot path's upstream client (router/upstream.py) against scripted backends.

Each backend is a real TCP server on 127.0.0.1 whose handler writes raw bytes, so
the tests pin down the wire behaviour the proxy relies on: keep-alive reuse, the
three failure kinds, bodies by length, chunks and end of connection, header
injection refused, and abandoning a response closing its connection.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import pytest

from router.errors import (
    TransportClosedError,
    TransportConnectError,
    TransportRequestError,
    TransportTimeoutError,
)
from router.testing import start_router
from router.upstream import UpstreamClient, UpstreamResponse, request_head

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
JSON_OK = (
    b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 12\r\n\r\n{"ok": true}'
)


async def read_request(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """One request: its head and its body (by Content-Length)."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    return head, await reader.readexactly(length)


def answer_then_wait(data: bytes) -> Handler:
    """A backend that answers the first request with ``data``, then waits for the
    client to close the connection."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(data)
        await writer.drain()
        await reader.read()

    return serve


@asynccontextmanager
async def backend(handler: Handler) -> AsyncIterator[tuple[str, list[int]]]:
    """A scripted server; yields its URL and the list of connections it accepted."""
    accepted: list[int] = []

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(1)
        try:
            await handler(reader, writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", accepted
    finally:
        server.close()
        await server.wait_closed()


@asynccontextmanager
async def client(**kw: float) -> AsyncIterator[UpstreamClient]:
    c = UpstreamClient(connect_timeout_s=kw.pop("connect_timeout_s", 2.0), **kw)
    try:
        yield c
    finally:
        await c.close()


async def post(c: UpstreamClient, url: str, body: bytes = b"{}", **kw: float) -> UpstreamResponse:
    return await c.request(
        "POST", url, "/v1/chat/completions", {"Content-Type": "application/json"}, body,
        read_timeout_s=kw.get("read_timeout_s", 5.0),
    )  # fmt: skip


async def read_twice_on_new_connections(
    c: UpstreamClient, url: str, accepted: list[int], body: bytes
) -> None:
    """Two requests, each answered ``body``, on two connections: the first not reused."""
    for _ in range(2):
        resp = await post(c, url)
        assert await resp.read() == body
        resp.release()
    assert len(accepted) == 2


async def test_keep_alive_reuses_one_connection_and_sends_the_request_as_given() -> None:
    seen: list[tuple[bytes, bytes]] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for _ in range(3):
            seen.append(await read_request(reader))
            writer.write(JSON_OK)
            await writer.drain()

    async with backend(serve) as (url, accepted), client() as c:
        for i in range(3):
            resp = await post(c, url, b'{"n": %d}' % i)
            assert resp.status == 200
            assert resp.content_type == "application/json"
            assert await resp.read() == b'{"ok": true}'
            resp.release()
        assert len(accepted) == 1
        assert c.open_connections == 1
    head, body = seen[2]
    assert head.startswith(b"POST /v1/chat/completions HTTP/1.1\r\n")
    assert f"Host: {url.removeprefix('http://')}\r\n".encode() in head
    assert b"Content-Length: 8\r\n" in head
    assert body == b'{"n": 2}'


async def test_chunked_body_arrives_piece_by_piece_and_ends_with_empty_bytes() -> None:
    release = asyncio.Event()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream; charset=utf-8\r\n"
            b"Transfer-Encoding: chunked\r\nX-Request-Id: r1\r\n\r\n6\r\ndata: \r\n"
        )
        await writer.drain()
        await release.wait()
        writer.write(b"5\r\nhello\r\n0\r\n\r\n")
        await writer.drain()
        await reader.read()  # until the client closes

    async with backend(serve) as (url, _), client() as c:
        resp = await post(c, url)
        assert resp.content_type == "text/event-stream"
        assert resp.has_header("x-request-id")
        assert await resp.readany() == b"data: "
        release.set()
        assert await resp.readany() == b"hello"
        assert await resp.readany() == b""
        resp.release()
        assert c.open_connections == 1  # complete and kept alive: pooled


async def test_connection_close_answer_and_eof_delimited_body() -> None:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nuntil the end")
        await writer.drain()

    async with backend(serve) as (url, accepted), client() as c:
        await read_twice_on_new_connections(c, url, accepted, b"until the end")


async def test_refused_connection_is_a_connect_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: refused
        async with client() as c:
            with pytest.raises(TransportConnectError):
                await post(c, f"http://127.0.0.1:{port}")


async def test_backend_closing_after_the_request_is_a_closed_error() -> None:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)

    async with backend(serve) as (url, _), client() as c:
        with pytest.raises(TransportClosedError):
            await post(c, url)
        assert c.open_connections == 0


async def test_malformed_answer_is_a_closed_error() -> None:
    async with backend(answer_then_wait(b"NOT HTTP AT ALL\r\n\r\n")) as (url, _), client() as c:
        with pytest.raises(TransportClosedError, match="malformed"):
            await post(c, url)


async def test_silent_backend_times_out_per_read() -> None:
    half = answer_then_wait(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhalf")
    async with backend(half) as (url, _), client() as c:
        resp = await post(c, url, read_timeout_s=0.1)
        assert resp.status == 200
        with pytest.raises(TransportTimeoutError):
            await resp.read()
        resp.close()
        assert c.open_connections == 0


async def test_header_injection_is_refused_before_anything_is_sent() -> None:
    with pytest.raises(TransportRequestError, match="control character"):
        request_head("POST", "/v1/x", "h:1", {"X-Evil": "a\r\nHost: other"}, 0)
    with pytest.raises(TransportRequestError, match="control character"):
        request_head("POST", "/v1/x HTTP/1.1\r\nX: y", "h:1", {}, 0)
    ok = request_head("POST", "/v1/x?a=1", "h:1", {"Authorization": "Bearer k"}, 3)
    assert ok == (
        b"POST /v1/x?a=1 HTTP/1.1\r\nHost: h:1\r\nAuthorization: Bearer k\r\n"
        b"Content-Length: 3\r\n\r\n"
    )


async def test_idle_connections_past_keepalive_are_not_reused() -> None:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await read_request(reader)
            writer.write(JSON_OK)
            await writer.drain()

    async with backend(serve) as (url, accepted), client(keepalive_s=0.0) as c:
        for _ in range(2):
            resp = await post(c, url)
            await resp.read()
            resp.release()
        assert len(accepted) == 2


async def test_abandoning_a_response_closes_its_connection() -> None:
    gone = asyncio.Event()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n")
        await writer.drain()
        assert await reader.read() == b""  # the client hung up: vLLM would abort
        gone.set()

    async with backend(serve) as (url, _), client() as c:
        resp = await post(c, url)
        assert await resp.readany() == b"abc"
        resp.close()
        await asyncio.wait_for(gone.wait(), 5)
        assert c.open_connections == 0


class _Conn:
    """What a response asks of its connection, counted."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.paused = 0
        self.resumed = 0

    def pause_reading(self) -> None:
        self.paused += 1

    def resume_reading(self) -> None:
        self.resumed += 1


async def test_a_slow_reader_pauses_the_backend_connection_until_it_reads() -> None:
    conn = _Conn()
    resp = UpstreamResponse(conn, 5.0)  # type: ignore[arg-type]
    resp.on_headers(200)
    resp.on_body(b"x" * (1 << 19))
    assert conn.paused == 0
    resp.on_body(b"x" * (1 << 20))  # 1.5 MiB waiting for the client: stop reading
    resp.on_body(b"x")
    assert (conn.paused, conn.resumed) == (1, 0)
    assert len(await resp.readany()) == (1 << 19) + (1 << 20) + 1
    assert (conn.paused, conn.resumed) == (1, 1)


async def test_large_body_arrives_whole() -> None:
    total = 3 << 20
    head = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % total
    serve = answer_then_wait(head + b"x" * total)

    async with backend(serve) as (url, _), client() as c:
        resp = await post(c, url, b"y" * (100 << 10))  # a body past the one-write size
        assert len(await resp.read()) == total
        resp.release()


async def test_a_second_answer_to_one_request_never_leaks_and_poisons_the_connection() -> None:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await read_request(reader)
            writer.write(JSON_OK + b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nextra")
            await writer.drain()

    async with backend(serve) as (url, accepted), client() as c:
        await read_twice_on_new_connections(c, url, accepted, b'{"ok": true}')


async def test_a_refused_backend_is_not_named_to_the_client(tmp_path: Path) -> None:
    """The 502 after every connect failed says so without the backend's address."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
        router = await start_router([dead], tmp_path)
        try:
            async with (
                aiohttp.ClientSession() as session,
                session.post(router.url + "/v1/chat/completions", json={"model": "m"}) as r,
            ):
                assert r.status == 502
                text = await r.text()
        finally:
            await router.stop()
    assert "connection failed" in text
    assert dead.removeprefix("http://") not in text

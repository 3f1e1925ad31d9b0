"""``router/fast_http.py``: the inference routes' own HTTP/1.1 protocol.

Unit tests drive :class:`FastProtocol` with a recording transport (bytes in any
split, deterministic); the end-to-end tests run a real router and check what a
client sees on one connection that mixes the fast path and aiohttp.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import httptools
import openai
import pytest

from router.errors import RouterError
from router.fast_http import (
    MAX_HEAD_BYTES,
    PAUSE_READING_BYTES,
    FastExchange,
    FastHttpConfig,
    FastProtocol,
)
from router.openai_errors import router_error_parts
from router.testing import FakeBackend, RunningRouter
from tests.router.conftest import StartRouter

ROUTE = "/v1/chat/completions"
MESSAGES = "/v1/messages"


class RecordingTransport(asyncio.Transport):
    """A transport that records what is written and how it ends."""

    def __init__(self) -> None:
        super().__init__()
        self.out = bytearray()
        self.closed = asyncio.Event()
        self.aborted = False
        self.reading = True
        self.protocol: asyncio.BaseProtocol | None = None

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.out += data

    def close(self) -> None:
        self.closed.set()

    def abort(self) -> None:
        self.aborted = True
        self.closed.set()

    def is_closing(self) -> bool:
        return self.closed.is_set()

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self.protocol = protocol

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default


class RecordingProtocol(asyncio.Protocol):
    """Stands in for aiohttp's handler: records the connection it was handed."""

    def __init__(self) -> None:
        self.transport: asyncio.BaseTransport | None = None
        self.received = bytearray()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.received += data


class Host:
    def __init__(self, refuse: bool = False) -> None:
        self.refuse = refuse
        self.open: set[FastProtocol] = set()
        self.fallbacks: list[RecordingProtocol] = []

    def fast_made(self, proto: FastProtocol, transport: asyncio.Transport) -> bool:
        self.open.add(proto)
        return not self.refuse

    def fast_lost(self, proto: FastProtocol) -> None:
        self.open.discard(proto)

    def fallback(self) -> asyncio.Protocol:
        self.fallbacks.append(RecordingProtocol())
        return self.fallbacks[-1]


Serve = Callable[[FastExchange], Awaitable[None]]


async def echo(ex: FastExchange) -> None:
    """Answers with the body it read and the request's X-Request-Id."""
    body = await ex.read_body(1 << 20, 5.0)
    rid = ex.headers.get("X-Request-Id", "")
    await ex.send(200, {"Content-Type": "application/json", "X-Request-Id": rid}, body)


def connect(serve: Serve = echo, keepalive_s: float = 30.0, **host: Any) -> tuple[
    FastProtocol, RecordingTransport, Host
]:  # fmt: skip
    routes = frozenset({ROUTE, MESSAGES})
    config = FastHttpConfig(serve=serve, routes=routes, max_body_bytes=1 << 20,
                            keepalive_s=keepalive_s)  # fmt: skip
    h = Host(**host)
    proto = FastProtocol(config, h)
    transport = RecordingTransport()
    proto.connection_made(transport)
    return proto, transport, h


def request(body: bytes = b'{"a":1}', path: str = ROUTE, extra: str = "", rid: str = "") -> bytes:
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n"
    if rid:
        head += f"X-Request-Id: {rid}\r\n"
    return (head + extra + "\r\n").encode() + body


class Responses:
    """httptools callbacks: every complete response on the wire, in order."""

    def __init__(self) -> None:
        self.done: list[dict[str, Any]] = []
        self._headers: dict[str, str] = {}
        self._body = bytearray()
        self.parser = httptools.HttpResponseParser(self)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers[name.decode().lower()] = value.decode()

    def on_body(self, body: bytes) -> None:
        self._body += body

    def on_message_complete(self) -> None:
        status = self.parser.get_status_code()
        self.done.append({"status": status, "headers": self._headers, "body": bytes(self._body)})
        self._headers, self._body = {}, bytearray()


def responses(wire: bytes) -> list[dict[str, Any]]:
    """Every complete response in ``wire``, in order."""
    got = Responses()
    got.parser.feed_data(wire)
    return got.done


async def until(predicate: Callable[[], bool], timeout_s: float = 5.0) -> None:
    """Yield to the loop until ``predicate`` holds (bounded)."""
    async with asyncio.timeout(timeout_s):
        while not predicate():
            await asyncio.sleep(0)


# ---------------------------------------------------------------------------- unit


async def test_keep_alive_requests_are_answered_on_one_connection() -> None:
    proto, transport, _ = connect()
    proto.data_received(request(b'{"n":1}', rid="one"))
    await until(lambda: len(responses(bytes(transport.out))) == 1)
    proto.data_received(request(b'{"n":2}', rid="two"))
    await until(lambda: len(responses(bytes(transport.out))) == 2)
    first, second = responses(bytes(transport.out))
    assert (first["body"], first["headers"]["x-request-id"]) == (b'{"n":1}', "one")
    assert (second["body"], second["headers"]["x-request-id"]) == (b'{"n":2}', "two")
    assert "date" in first["headers"] and first["headers"]["content-length"] == "7"
    assert not transport.closed.is_set()


async def test_pipelined_requests_are_answered_in_order_one_at_a_time() -> None:
    running: list[str] = []
    overlap: list[bool] = []

    async def serve(ex: FastExchange) -> None:
        running.append("x")
        overlap.append(len(running) > 1)
        await asyncio.sleep(0)  # give the second request a chance to start early
        await echo(ex)
        running.pop()

    proto, transport, _ = connect(serve)
    proto.data_received(request(b"[1]", rid="a") + request(b"[2]", rid="b"))
    await until(lambda: len(responses(bytes(transport.out))) == 2)
    got = [r["headers"]["x-request-id"] for r in responses(bytes(transport.out))]
    assert got == ["a", "b"] and overlap == [False, False]


async def test_a_body_arriving_in_pieces_is_awaited_whole() -> None:
    proto, transport, _ = connect()
    wire = request(b'{"prompt":"' + b"x" * 5000 + b'"}')
    for i in range(0, len(wire), 700):
        proto.data_received(wire[i : i + 700])
    await until(lambda: len(responses(bytes(transport.out))) == 1)
    assert responses(bytes(transport.out))[0]["body"] == wire[wire.index(b"\r\n\r\n") + 4 :]


async def test_a_body_that_does_not_arrive_is_a_408_and_the_connection_closes() -> None:
    async def serve(ex: FastExchange) -> None:
        try:
            await ex.read_body(1 << 20, 0.0)
        except RouterError as exc:
            await ex.send(*router_error_parts(exc))

    proto, transport, _ = connect(serve)
    proto.data_received(request(b'{"a":1}')[:-3])  # the head and part of the body
    await transport.closed.wait()
    (answer,) = responses(bytes(transport.out))
    assert answer["status"] == 408 and json.loads(answer["body"])["error"]["type"]
    assert not transport.aborted  # closed after the answer, not cut


@pytest.mark.parametrize(
    "wire",
    [
        b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n",
        request(path="/kairos/v1/agents"),
        request(path=ROUTE + "?x=1"),
        b"POST " + ROUTE.encode() + b" HTTP/1.0\r\nContent-Length: 2\r\n\r\n{}",
        b"POST " + ROUTE.encode() + b" HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n",
        request(extra="Expect: 100-continue\r\n"),
        request(b"x" * ((1 << 20) + 1)),
        b"POST " + ROUTE.encode() + b" HTTP/1.1\r\nBad Header\r\n\r\n",
        b"POST " + ROUTE.encode() + b" HTTP/1.1\r\nX: " + b"a" * MAX_HEAD_BYTES + b"\r\n\r\n",
        b"POST " + ROUTE.encode() + b" HTTP/1.1\nContent-Length: 2\n\n{}",
        request(extra="Transfer-Encoding: chunked\r\n"),
        request(extra="Content-Length: 9\r\n"),
    ],
    ids=[
        "get",
        "control-route",
        "query",
        "http10",
        "chunked",
        "expect",
        "too-large",
        "malformed",
        "long-head",
        "bare-lf",
        "cl-and-te",
        "two-cl",
    ],
)
async def test_anything_else_is_handed_to_aiohttp_with_every_byte(wire: bytes) -> None:
    served: list[str] = []

    async def serve(ex: FastExchange) -> None:
        served.append(ex.path)

    proto, transport, host = connect(serve)
    proto.data_received(wire)
    (handler,) = host.fallbacks
    assert transport.protocol is handler and handler.transport is transport
    assert bytes(handler.received) == wire and served == [] and not host.open


async def test_hand_off_after_answered_requests_passes_only_what_is_unanswered() -> None:
    proto, transport, host = connect()
    health = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
    proto.data_received(request(rid="fast") + health)
    await until(lambda: bool(host.fallbacks))
    assert [r["headers"]["x-request-id"] for r in responses(bytes(transport.out))] == ["fast"]
    assert bytes(host.fallbacks[0].received) == health


async def test_the_client_leaving_cancels_the_handler() -> None:
    started, cancelled = asyncio.Event(), asyncio.Event()

    async def serve(ex: FastExchange) -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    proto, _, host = connect(serve)
    proto.data_received(request())
    await started.wait()
    proto.connection_lost(None)
    await asyncio.wait_for(cancelled.wait(), 5.0)
    assert not host.open


async def test_connection_close_is_honoured() -> None:
    proto, transport, _ = connect()
    proto.data_received(request(extra="Connection: close\r\n"))
    await transport.closed.wait()
    (answer,) = responses(bytes(transport.out))
    assert answer["headers"]["connection"] == "close" and not transport.aborted


async def test_a_streamed_answer_is_valid_chunked_http() -> None:
    async def serve(ex: FastExchange) -> None:
        await ex.read_body(1 << 20, 5.0)
        await ex.start(200, {"Content-Type": "text/event-stream"})
        for i in range(3):
            await ex.write(f"data: {i}\n\n".encode())
        await ex.write(b"")  # nothing to send is not the last chunk
        await ex.end()

    proto, transport, _ = connect(serve)
    proto.data_received(request())
    await until(lambda: len(responses(bytes(transport.out))) == 1)
    (answer,) = responses(bytes(transport.out))
    assert answer["headers"]["transfer-encoding"] == "chunked"
    assert answer["body"] == b"data: 0\n\ndata: 1\n\ndata: 2\n\n"


async def test_a_write_waits_while_the_client_reads_slowly() -> None:
    wrote = asyncio.Event()

    async def serve(ex: FastExchange) -> None:
        await ex.read_body(1 << 20, 5.0)
        await ex.start(200, {"Content-Type": "text/event-stream"})
        await ex.write(b"data: 1\n\n")
        wrote.set()
        await ex.end()

    proto, transport, _ = connect(serve)
    proto.pause_writing()
    proto.data_received(request())
    await until(lambda: b"data: 1" in transport.out)
    await asyncio.sleep(0)
    assert not wrote.is_set()  # held until the transport drains
    proto.resume_writing()
    await asyncio.wait_for(wrote.wait(), 5.0)


async def test_pipelined_bytes_beyond_the_bound_pause_reading() -> None:
    release = asyncio.Event()

    async def serve(ex: FastExchange) -> None:
        await release.wait()
        await echo(ex)

    proto, transport, _ = connect(serve)
    proto.data_received(request())
    proto.data_received(request(b"y" * PAUSE_READING_BYTES))
    assert not transport.reading
    release.set()
    await until(lambda: transport.reading)


async def test_an_idle_connection_is_closed_after_the_keepalive_bound() -> None:
    _, transport, _ = connect(keepalive_s=0.0)
    await asyncio.wait_for(transport.closed.wait(), 5.0)
    assert not transport.aborted


@pytest.mark.parametrize(("path", "form"), [(ROUTE, "error"), (MESSAGES, "type")])
async def test_a_failing_handler_answers_500_without_detail(path: str, form: str) -> None:
    async def serve(ex: FastExchange) -> None:
        raise RuntimeError("secret detail")

    proto, transport, _ = connect(serve)
    proto.data_received(request(path=path))
    await until(lambda: len(responses(bytes(transport.out))) == 1)
    (answer,) = responses(bytes(transport.out))
    assert answer["status"] == 500 and b"secret" not in answer["body"]
    assert form in json.loads(answer["body"])  # the route's protocol form (Anthropic: "type")


async def test_a_header_with_a_newline_is_never_written() -> None:
    async def serve(ex: FastExchange) -> None:
        await ex.send(200, {"X-Evil": "a\r\nSet-Cookie: x=1"}, b"{}")

    proto, transport, _ = connect(serve)
    proto.data_received(request())
    await until(lambda: len(responses(bytes(transport.out))) == 1)
    (answer,) = responses(bytes(transport.out))
    assert answer["status"] == 500 and b"Set-Cookie" not in transport.out


async def test_a_refused_connection_is_left_to_the_host() -> None:
    proto, _, _ = connect(refuse=True)
    assert proto._idle is None  # no idle timer: the host answered and closed it


# ---------------------------------------------------------------------- end to end


async def _raw(url: str, wire: bytes, count: int) -> list[dict[str, Any]]:
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(wire)
        got = bytearray()
        async with asyncio.timeout(10):
            while len(responses(bytes(got))) < count:
                chunk = await reader.read(65536)
                assert chunk, "connection closed early"
                got += chunk
        return responses(bytes(got))
    finally:
        writer.close()


async def test_one_connection_mixes_the_fast_path_and_aiohttp(router: RunningRouter) -> None:
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()
    health = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
    chat = request(body, extra="Authorization: Bearer sk-test\r\n")
    fast, slow, after = await _raw(router.url, chat + health + chat, 3)
    assert "server" not in fast["headers"]  # answered by router/fast_http.py
    assert json.loads(fast["body"])["usage"]["completion_tokens"] > 0
    assert "aiohttp" in slow["headers"]["server"] and json.loads(slow["body"])["status"] == "ok"
    assert json.loads(after["body"])["usage"] == json.loads(fast["body"])["usage"]


async def test_the_openai_client_gets_the_same_answers_with_fast_http_off(
    make_router: StartRouter, backend: FakeBackend
) -> None:
    seen = []
    for fast_http in (True, False):
        router = await make_router([backend.url], fast_http=fast_http)
        client = openai.AsyncOpenAI(base_url=router.url + "/v1", api_key="sk-test", max_retries=0)
        msgs: Any = [{"role": "user", "content": "hi"}]
        raw = await client.chat.completions.with_raw_response.create(model="m", messages=msgs)
        stream = await client.chat.completions.create(model="m", messages=msgs, stream=True)
        text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
        with pytest.raises(openai.BadRequestError) as bad:
            await client.chat.completions.create(
                model="m", messages=msgs, extra_body={"stream": "yes"}
            )
        await client.close()
        answer = raw.parse().choices[0].message.content
        seen.append((answer, text, bad.value.body, "server" in raw.headers))
    (*fast, fast_server), (*slow, slow_server) = seen
    assert fast == slow and fast[1]
    assert not fast_server and slow_server  # each answered by the server it names


async def test_a_graceful_stop_finishes_a_request_in_flight_on_the_fast_path(
    make_router: StartRouter, backend: FakeBackend
) -> None:
    gate = asyncio.Event()
    backend.behaviour.gate = gate  # the backend answers once the gate opens
    router = await make_router([backend.url])
    client = openai.AsyncOpenAI(base_url=router.url + "/v1", api_key="sk-test", max_retries=0)
    msgs: Any = [{"role": "user", "content": "hi"}]
    create = client.chat.completions.with_raw_response.create
    raw = asyncio.create_task(create(model="m", messages=msgs))
    await backend.wait_received(1)
    stopping = asyncio.create_task(router.runner.cleanup())
    await asyncio.sleep(0)
    gate.set()
    answer = await asyncio.wait_for(raw, 10.0)
    await asyncio.wait_for(stopping, 15.0)
    await client.close()
    assert answer.parse().choices[0].message.content and "server" not in answer.headers


@pytest.mark.parametrize("extra", ["Transfer-Encoding: chunked\r\n", "Content-Length: 9\r\n"])
async def test_ambiguous_framing_is_refused_by_aiohttp(router: RunningRouter, extra: str) -> None:
    (answer,) = await _raw(router.url, request(b"{}", extra=extra), 1)
    assert answer["status"] == 400 and "server" in answer["headers"]

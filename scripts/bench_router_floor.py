"""The floor for an aiohttp router: a bare reverse proxy, for the router's side-by-side benchmark.

It relays every request to one backend with the same stack the Kairos router is
built on (aiohttp's server, the hot path's upstream client ``router.upstream``,
uvloop) and does nothing else:
no identity, ledger, admission, usage, metrics or records. Whatever this costs
per request, no aiohttp router can cost less, so the gap between it and
``kairos-router`` is the router's own work and the gap between it and the Rust
vllm-router is the HTTP stack's. Not a product: a measuring stick, used by
``scripts/bench_router_sidebyside.py --floor``.

    .venv/bin/python scripts/bench_router_floor.py http://127.0.0.1:8000 18002
"""

from __future__ import annotations

import sys

import uvloop
from aiohttp import web

from router.upstream import UpstreamClient

JSON = "application/json"
SSE = "text/event-stream"


def make_app(backend_url: str) -> web.Application:
    app = web.Application()
    clients: list[UpstreamClient] = []

    async def open_client(_: web.Application) -> None:
        clients.append(UpstreamClient(connect_timeout_s=5.0))

    async def close_client(_: web.Application) -> None:
        for client in clients:
            await client.close()

    async def relay(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        upstream = await clients[0].request(
            request.method, backend_url, request.path_qs, {"Content-Type": JSON}, body,
            read_timeout_s=60.0,
        )  # fmt: skip
        try:
            if not upstream.content_type.startswith(SSE):
                data = await upstream.read()
                return web.Response(body=data, status=upstream.status, content_type=JSON)
            response = web.StreamResponse(status=upstream.status, headers={"Content-Type": SSE})
            await response.prepare(request)
            while chunk := await upstream.readany():
                await response.write(chunk)
            await response.write_eof()
            return response
        finally:
            upstream.release()

    app.on_startup.append(open_client)
    app.on_cleanup.append(close_client)
    app.router.add_route("*", "/{tail:.*}", relay)
    return app


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    uvloop.install()
    web.run_app(make_app(argv[0]), host="127.0.0.1", port=int(argv[1]), access_log=None, print=None)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""The floor for an aiohttp router: a bare reverse proxy, for issue 18's side by side.

It relays every request to one backend with the same stack the Kairos router is
built on (aiohttp's server and ``ClientSession``, uvloop) and does nothing else:
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
from aiohttp import ClientSession, TCPConnector, web

JSON = "application/json"
SSE = "text/event-stream"


def make_app(backend_url: str) -> web.Application:
    app = web.Application()
    sessions: list[ClientSession] = []

    async def open_session(_: web.Application) -> None:
        sessions.append(ClientSession(connector=TCPConnector(limit=0), auto_decompress=False))

    async def close_session(_: web.Application) -> None:
        for session in sessions:
            await session.close()

    async def relay(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        url = backend_url + request.path_qs
        async with sessions[0].request(
            request.method, url, data=body, headers={"Content-Type": JSON}
        ) as upstream:
            if not upstream.headers.get("Content-Type", "").startswith(SSE):
                data = await upstream.read()
                return web.Response(body=data, status=upstream.status, content_type=JSON)
            response = web.StreamResponse(status=upstream.status, headers={"Content-Type": SSE})
            await response.prepare(request)
            async for chunk in upstream.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
            return response

    app.on_startup.append(open_session)
    app.on_cleanup.append(close_session)
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

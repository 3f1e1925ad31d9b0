"""kairosd against a router that wants a control token says which setting to use."""

from __future__ import annotations

import aiohttp
import pytest
from aiohttp import web

from kairosd.errors import RouterInputError
from kairosd.router_client import RouterClient


async def _refuse(_req: web.Request) -> web.Response:
    return web.json_response({"error": "unauthorized"}, status=401)


@pytest.mark.parametrize(("token", "why"), [(None, "wants a token"), ("x", "refused")])
async def test_401_names_the_token_setting(token: str | None, why: str) -> None:
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", _refuse)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        async with aiohttp.ClientSession() as session:
            client = RouterClient(session, f"http://127.0.0.1:{port}", "i0", 2.0, token)
            with pytest.raises(RouterInputError) as info:
                await client.state()
    finally:
        await runner.cleanup()
    assert "KAIROSD_ROUTER_TOKEN" in str(info.value) and why in str(info.value)

"""Two routers on one real Redis, in this process: one leads, the other stands by
and answers the contract of kairos_common.wire (readiness 503, ``not_leader`` on
every other route with Retry-After and the leader's URL); when the leader stops,
the standby takes over its agents, its identities and its credentials."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from kairos_common.wire import (
    LEADER_HEADER,
    NOT_LEADER_CODE,
    READY_PATH,
    ROLE_LEADER,
    ROLE_STANDBY,
    is_not_leader,
)
from router.testing import FakeBackend, RunningRouter, start_router
from tests.router.conftest import backend  # noqa: F401 (a fixture)
from tests.scaleout.services import RedisServer

pytestmark = pytest.mark.scaleout
CHAT = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}


async def _ready(session: aiohttp.ClientSession, url: str) -> tuple[int, dict[str, Any]]:
    async with session.get(url + READY_PATH) as resp:
        return resp.status, await resp.json()


async def _until_ready(session: aiohttp.ClientSession, url: str, timeout_s: float = 10) -> None:
    async with asyncio.timeout(timeout_s):
        while (await _ready(session, url))[0] != 200:
            await asyncio.sleep(0.05)


async def test_standby_refuses_then_takes_over_agents_identities_and_credentials(
    redis: RedisServer,
    backend: FakeBackend,  # noqa: F811 (the fixture imported above)
    tmp_path: Path,
) -> None:
    common = {"store": redis.url, "leader_lease_s": 1.0}
    a = await start_router([backend.url], tmp_path / "a", advertise_url="http://a.example:1",
                           **common)  # fmt: skip
    b: RunningRouter | None = None
    async with aiohttp.ClientSession() as s:
        try:
            await _until_ready(s, a.url)
            b = await start_router([backend.url], tmp_path / "b", **common)
            async with asyncio.timeout(5):  # until b has looked at the lease once
                while "leader_url" not in (body := (await _ready(s, b.url))[1]):
                    await asyncio.sleep(0.02)
            status, body = await _ready(s, b.url)
            assert (status, body["ready"], body["role"]) == (503, False, ROLE_STANDBY)
            assert body["store"]["kind"] == "redis" and body["store"]["reachable"] is True
            assert body["leader_url"] == "http://a.example:1"
            status, body = await _ready(s, a.url)
            assert (status, body["role"]) == (200, ROLE_LEADER)
            async with s.get(b.url + "/health") as resp:
                assert resp.status == 200  # liveness is not readiness

            async with s.post(a.url + "/kairos/v1/agents", json={"name": "n"},
                              headers=a.lifecycle_headers) as resp:  # fmt: skip
                started = await resp.json()
            token = started["token"]
            auth = {"Authorization": f"Bearer {token}"}
            for path, kw in (("/v1/chat/completions", {"json": CHAT, "headers": auth}),
                             ("/kairos/v1/agents", {"json": {}, "headers": a.lifecycle_headers}),
                             ("/v1/models", {})):  # fmt: skip
                method = s.get if path == "/v1/models" else s.post
                async with method(b.url + path, **kw) as resp:
                    body = await resp.json()
                    assert resp.status == 503 and is_not_leader(resp.status, body), path
                    assert body["error"]["code"] == NOT_LEADER_CODE
                    assert resp.headers["Retry-After"] == "1"
                    assert resp.headers[LEADER_HEADER] == "http://a.example:1"
            async with s.post(a.url + "/v1/chat/completions", json=CHAT, headers=auth) as resp:
                assert resp.status == 200

            await a.stop()  # a clean stop writes its changes and hands the lease over
            await _until_ready(s, b.url, timeout_s=5)
            agent = started["agent_id"]
            # a's lifecycle credential works on b (the store keeps its digest) ...
            async with s.get(b.url + f"/kairos/v1/agents/{agent}",
                             headers=a.lifecycle_headers) as resp:  # fmt: skip
                status = await resp.json()
            assert status["turns"] == 1 and status["instance"] == "i0"
            # ... and so does the identity a minted (the signing secret is shared)
            async with s.post(b.url + "/v1/chat/completions", json=CHAT, headers=auth) as resp:
                assert resp.status == 200
            async with s.post(b.url + f"/kairos/v1/agents/{agent}/end",
                              json={"exit_code": 0, "end_key": started["end_key"]},
                              headers=a.lifecycle_headers) as resp:  # fmt: skip
                assert resp.status == 200
        finally:
            for r in (a, b):
                if r is not None:
                    await r.stop()

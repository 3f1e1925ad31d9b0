"""Control-plane attacks (docs/reliability.md) against a real router on 127.0.0.1 → refused."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from kairos_common.identity import compose_key
from kairos_common.testing import decision
from router.testing import FakeBackend, RunningRouter, start_router

ADMIN = "/kairos/v1/admin/instances"


@pytest.fixture
async def router(backends: list[FakeBackend], tmp_path: Path) -> AsyncIterator[RunningRouter]:
    r = await start_router([b.url for b in backends], tmp_path / "state")
    yield r
    await r.stop()


async def call(
    method: str, url: str, body: Any = None, headers: dict[str, str] | None = None
) -> tuple[int, Any]:
    async with (
        aiohttp.ClientSession() as s,
        s.request(method, url, json=body, headers=headers or {}) as resp,
    ):
        text = await resp.text()
        try:
            return resp.status, json.loads(text)
        except ValueError:
            return resp.status, text


def _decision(instance: str, epoch: int, **extra: Any) -> dict[str, Any]:
    body = decision(
        instance, epoch, daemon_id="d", start_unix_s=time.time() - 10, valid_for_s=30.0
    ).to_json()
    for name, value in extra.items():  # the admission and measured parts' fields by name
        part = next((p for p in ("admission", "measured") if name in body[p]), None)
        if part is not None:
            body[part][name] = value
        elif name == "measured_power_w":
            body["measured"]["power_w"] = value
        else:
            body[name] = value
    return body


async def test_an_agent_on_loopback_cannot_add_a_backend(
    router: RunningRouter, backends: list[FakeBackend]
) -> None:
    evil = {"name": "evil", "url": "http://127.0.0.1:9"}
    assert (await call("POST", router.url + ADMIN, evil))[0] == 401
    # The agent's own identity key is not a control credential.
    status, body = await call(
        "POST", router.url + "/kairos/v1/agents", {}, router.lifecycle_headers
    )
    key = compose_key(body["token"], "sk-user")
    headers = {"Authorization": f"Bearer {key}"}
    assert (await call("POST", router.url + ADMIN, evil, headers))[0] == 401
    assert (await call("POST", router.url + ADMIN + "/i0/drain", {}, headers))[0] == 401
    # Nor is the lifecycle credential, nor a daemon's.
    assert (await call("POST", router.url + ADMIN, evil, router.lifecycle_headers))[0] == 403
    daemon = router.daemon_headers("i0")
    assert (await call("DELETE", router.url + ADMIN + "/i1", None, daemon))[0] == 403
    assert [i.name for i in router.core.pool] == ["i0", "i1"]
    # The admin may.
    status, _ = await call("POST", router.url + ADMIN + "/i1/drain", {}, router.admin_headers)
    assert status == 200


async def test_agent_lifecycle_needs_the_lifecycle_or_admin_credential(
    router: RunningRouter,
) -> None:
    url = router.url + "/kairos/v1/agents"
    assert (await call("POST", url, {}))[0] == 401
    assert (await call("POST", url, {}, router.daemon_headers("i0")))[0] == 403
    status, body = await call("POST", url, {}, router.lifecycle_headers)
    assert status == 200
    end = f"{url}/{body['agent_id']}/end"
    assert (await call("POST", end, {"exit_code": 0}))[0] == 401
    assert (await call("POST", end, {"exit_code": 0}, router.admin_headers))[0] == 200


async def test_an_agent_holding_the_lifecycle_credential_cannot_end_another(
    router: RunningRouter,
) -> None:
    """Agents run as the id-trackers' user and may read the lifecycle credential;
    ending an agent also needs its end key, which only its own id-tracker holds."""
    url = router.url + "/kairos/v1/agents"
    _, victim = await call("POST", url, {"name": "victim"}, router.lifecycle_headers)
    _, other = await call("POST", url, {"name": "attacker"}, router.lifecycle_headers)
    end = f"{url}/{victim['agent_id']}/end"
    life = router.lifecycle_headers
    for body in (
        {"exit_code": 0},
        {"exit_code": 0, "end_key": other["end_key"]},  # another agent's key
        {"exit_code": 0, "end_key": victim["token"]},  # its identity token is not its end key
        {"exit_code": 0, "end_key": "é" * 43},
    ):
        assert (await call("POST", end, body, life))[0] == 403
    assert router.core.ledger.get(victim["agent_id"]) is not None
    ok = {"exit_code": 0, "end_key": victim["end_key"]}
    assert (await call("POST", end, ok, life))[0] == 200
    assert router.core.ledger.get(victim["agent_id"]) is None


async def test_a_decision_is_accepted_only_from_its_own_daemon(router: RunningRouter) -> None:
    url = router.url + "/kairos/v1/instances/i0/decision"
    assert (await call("POST", url, _decision("i0", 1)))[0] == 401
    assert (await call("POST", url, _decision("i0", 1), router.admin_headers))[0] == 403
    assert (await call("POST", url, _decision("i0", 1), router.lifecycle_headers))[0] == 403
    assert (await call("POST", url, _decision("i0", 1), router.daemon_headers("i1")))[0] == 403
    status, ack = await call("POST", url, _decision("i0", 1), router.daemon_headers("i0"))
    assert status == 200 and ack["accepted"] is True


@pytest.mark.parametrize(
    "extra",
    [
        {"daemon_start_unix_s": 1e300},
        {"daemon_start_unix_s": time.time() + 30 * 86400},
        {"valid_for_s": 1e300},
        {"capacity_tokens": -1},
        {"measured_power_w": 1e300},
    ],
)
async def test_absurd_decisions_are_400_and_change_nothing(
    router: RunningRouter, extra: dict[str, Any]
) -> None:
    url = router.url + "/kairos/v1/instances/i0/decision"
    headers = router.daemon_headers("i0")
    status, body = await call("POST", url, _decision("i0", 5, **extra), headers)
    assert status == 400 and body["error"]["type"] == "invalid_request_error"
    # The real daemon's next decision is still applied (not made "stale" forever).
    status, ack = await call("POST", url, _decision("i0", 1), headers)
    assert status == 200 and ack["accepted"] is True
    inst = router.core.pool.get("i0")
    assert inst is not None and inst.daemon_capacity_tokens != -1


@pytest.mark.parametrize(
    "auth",
    ["Bearer é", "Bearer \u2603snow", "Basic Zm9vOmJhcg==", "Bearer " + "a" * 100_00, "Bearer"],
)
async def test_malformed_credentials_are_401_never_500(router: RunningRouter, auth: str) -> None:
    headers = {"Authorization": auth}
    for method, path in (
        ("POST", "/kairos/v1/agents"),
        ("POST", ADMIN),
        ("GET", "/kairos/v1/fleet"),
    ):
        status, body = await call(method, router.url + path, {}, headers)
        # aiohttp itself answers 400 to a header line over 8 KiB, before any handler
        assert status in (400, 401), (method, path, status, body)


async def test_router_writes_default_credentials_and_publishes_them(router: RunningRouter) -> None:
    folder = router.credentials.folder
    for name in ("admin.token", "lifecycle.token", "daemon.key", "daemon-i0.token"):
        assert (folder / name).stat().st_mode & 0o077 == 0, name
    status, _ = await call(
        "POST", router.url + ADMIN, {"name": "gpu9", "url": "http://127.0.0.1:9"},
        router.admin_headers,
    )  # fmt: skip
    assert status == 200
    assert (folder / "daemon-gpu9.token").read_text().strip() == (
        router.credentials.daemon_token("gpu9").decode()
    )

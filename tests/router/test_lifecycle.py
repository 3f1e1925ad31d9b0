"""Agent lifecycle: status, end, idle expiry, completion records, metrics names."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import openai

from kairos_common.testing import ManualClock
from reporting.records import AgentRecord, read_records
from router.testing import FakeBackend
from tests.router.conftest import (
    CHAT,
    StartRouter,
    agent_key,
    control,
    end_body,
    start_agent,
)


async def test_end_writes_record_and_frees_context(
    make_router: StartRouter, backend: FakeBackend, tmp_path: Path
) -> None:
    records = tmp_path / "agents.jsonl"
    router = await make_router([backend.url], records=records, run="deploy-7")
    backend.behaviour.prompt_tokens = 100
    parent = await start_agent(router.url, name="lead")
    child = await start_agent(router.url, parent_id=parent.split(".")[1], slo_tok_s=1.0)
    client = openai.AsyncOpenAI(base_url=router.url + "/v1", api_key=agent_key(child))
    for _ in range(2):
        await client.chat.completions.create(model="fake-model", messages=CHAT)
    await client.close()
    child_id = child.split(".")[1]
    status, info = await control("GET", f"{router.url}/kairos/v1/agents/{child_id}")
    assert status == 200
    assert info["state"] == "ongoing" and info["instance"] == "i0" and info["turns"] == 2
    assert info["context_tokens"] == 104 and info["throughput_tok_s"] > 0
    assert router.core.ledger.usage_tokens("i0") == 104  # the parent made no request yet
    status, _ = await control(
        "POST", f"{router.url}/kairos/v1/agents/{child_id}/end", end_body(router, child, 3)
    )
    assert status == 200
    assert router.core.ledger.usage_tokens("i0") == 0
    (rec,) = list(read_records([records]))
    assert isinstance(rec, AgentRecord)
    assert (rec.agent_id, rec.parent_id, rec.turns, rec.decode_tokens) == (
        child_id,
        parent.split(".")[1],
        2,
        8,
    )
    assert rec.exit_code == 3 and rec.instances == ("i0",) and rec.slo_met is True
    assert rec.run == "deploy-7"  # grouped with the daemons' records by `kairos report`
    status, body = await control("GET", f"{router.url}/kairos/v1/agents/{child_id}")
    assert status == 404 and body["error"]["code"] == "not_found"


async def test_idle_agents_expire(
    make_router: StartRouter, backend: FakeBackend, tmp_path: Path
) -> None:
    clock = ManualClock()
    records = tmp_path / "agents.jsonl"
    router = await make_router([backend.url], clock=clock, idle_expiry_s=60.0, records=records)
    token = await start_agent(router.url)
    client = openai.AsyncOpenAI(base_url=router.url + "/v1", api_key=agent_key(token))
    await client.chat.completions.create(model="fake-model", messages=CHAT)
    await client.close()
    clock.advance(59.0)
    assert router.core.agents.expire_idle() == []
    clock.advance(2.0)
    assert router.core.agents.expire_idle() == [token.split(".")[1]]
    lines = [json.loads(x) for x in records.read_text().splitlines()]
    assert lines[0]["end_reason"] == "expired"


async def test_metrics_and_health_endpoints(make_router: StartRouter, backend: FakeBackend) -> None:
    router = await make_router([backend.url])
    await router.health.check_once()
    client = openai.AsyncOpenAI(base_url=router.url + "/v1", api_key="sk")
    await client.chat.completions.create(model="fake-model", messages=CHAT)
    models = await client.models.list()
    await client.close()
    assert [m.id for m in models.data] == ["fake-model"]
    import aiohttp

    async with aiohttp.ClientSession() as s:
        async with s.get(router.url + "/metrics") as r:
            text = await r.text()
        async with s.get(router.url + "/health") as r:
            assert r.status == 200
    for name in (
        "kairos_router_requests_total",
        "kairos_router_request_duration_seconds_bucket",
        "kairos_router_overhead_seconds_bucket",
        "kairos_router_instance_usage_tokens",
        'kairos_router_instance_capacity_tokens{instance="i0"} 100000.0',
        "kairos_router_ongoing_agents",
        "kairos_router_pending_agents",
        "kairos_router_hold_wait_seconds",
        "kairos_router_reassignments_total",
        "kairos_router_agent_throughput_tokens_per_second",
    ):
        assert name in text, name
    backend.behaviour.healthy = False
    await router.health.check_once()
    await router.health.check_once()
    async with aiohttp.ClientSession() as s, s.get(router.url + "/health") as r:
        assert r.status == 503


async def test_models_merged_across_instances(
    make_router: StartRouter, backend: FakeBackend, backend2: FakeBackend
) -> None:
    backend2.behaviour.model = "other-model"
    router = await make_router([backend.url, backend2.url])
    client = openai.AsyncOpenAI(base_url=router.url + "/v1", api_key="sk")
    models = await client.models.list()
    await client.close()
    assert sorted(m.id for m in models.data) == ["fake-model", "other-model"]


async def test_end_during_a_request_waits_for_its_accounting(
    make_router: StartRouter, backend: FakeBackend, tmp_path: Path
) -> None:
    """A stream's last bytes reach the client before the router accounts the request,
    so id-tracker can report the agent's exit first (seen against the real vLLM,
    docs/real-engine.md): the end must wait for that request, not drop its tokens."""
    records = tmp_path / "agents.jsonl"
    router = await make_router([backend.url], records=records)
    token = await start_agent(router.url)
    agent_id = token.split(".")[1]
    client = openai.AsyncOpenAI(base_url=router.url + "/v1", api_key=agent_key(token))
    await client.chat.completions.create(model="fake-model", messages=CHAT)  # admitted
    backend.behaviour.gate = asyncio.Event()
    pending = asyncio.ensure_future(
        client.chat.completions.create(model="fake-model", messages=CHAT)
    )
    await backend.wait_received(2)
    end = end_body(router, token)
    status, _ = await control("POST", f"{router.url}/kairos/v1/agents/{agent_id}/end", end)
    assert status == 200
    assert not records.exists() or not records.read_text()  # not yet: a request is in flight
    backend.behaviour.gate.set()
    await pending
    await client.close()
    (rec,) = list(read_records([records]))
    assert isinstance(rec, AgentRecord)
    assert (rec.agent_id, rec.turns, rec.decode_tokens, rec.end_reason) == (agent_id, 2, 8, "exit")
    assert router.core.ledger.get(agent_id) is None

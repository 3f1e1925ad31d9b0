"""The agent host gives every agent its own identity with id-tracker's own code."""

from __future__ import annotations

import asyncio
import io
import json
import time

from idtracker.testing import StandInRouter
from simulator.agent_host import AgentHost, HostConfig, PlannedAgent, http_session
from simulator.workload import AgentProgram, Turn


def _program(name: str, turns: int, children: tuple[AgentProgram, ...] = ()) -> AgentProgram:
    turn = Turn(prompt_tokens=50, shared_prefix_tokens=0, output_tokens=5, think_s=0.0)
    return AgentProgram(agent_id=name, turns=(turn,) * turns, children=children)


def test_each_agent_registers_plays_under_its_key_and_reports_its_end() -> None:
    child = AgentProgram(
        agent_id="sub",
        turns=_program("sub", 1).turns,
        parent_id="top",
        offset_s=0.0,
    )
    plan = [PlannedAgent(0.0, _program("top", 2, (child,))), PlannedAgent(0.0, _program("b", 1))]
    report = io.StringIO()
    with StandInRouter() as router:
        cfg = HostConfig(router_url=router.url, speedup=20.0, stream=False, register_lead_s=0.0)

        async def run() -> list[int]:
            async with http_session() as http:
                return await AgentHost(cfg, report, http).run_plan(plan, time.time())

        codes = asyncio.run(run())
        starts = {s.start.name: s for s in router.wait_starts(3)}
        ends = {router.wait_end(s.agent_id).exit_code for s in starts.values()}
        calls = router.api_calls

    assert codes == [0, 0]
    assert ends == {0}
    assert starts["sub"].start.parent_id == starts["top"].agent_id  # nested like id-tracker
    assert starts["top"].start.parent_id is None
    chats = [c for c in calls if c.path.endswith("/chat/completions")]
    per_agent = {s.agent_id: 0 for s in starts.values()}
    for c in chats:
        assert c.real_key == "sk-kairos-demo"  # the user's key travels inside the identity
        per_agent[c.agent_id or ""] += 1
    assert per_agent == {
        starts["top"].agent_id: 2,
        starts["b"].agent_id: 1,
        starts["sub"].agent_id: 1,
    }
    rows = [json.loads(line) for line in report.getvalue().splitlines()]
    assert {r["agent"] for r in rows} == {"top", "b", "sub"}
    assert all(r["exit_code"] == 0 and r["late_s"] is not None for r in rows)

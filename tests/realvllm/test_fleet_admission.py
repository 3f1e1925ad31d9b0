"""Fleet admission against two real vLLM servers (issue 14; docs/control-law.md,
point 8): an agent held because its instance has no room is placed on the first
instance that has room, without waiting for its own to drain.

``kairos-router`` runs in front of two vLLM servers of 32 blocks × 128 tokens
(``U_max`` = 4096, learned from each server's ``cache_config_info``), with β = 0.5
and γ = 0.45 so that two ~1400-token contexts cannot share one. Agents under
``id-tracker`` with the real ``openai`` SDK:

* A takes its first turn and waits (gated on stdin): ~1400 tokens on ``i0``.
* C does the same. ``i0`` has no room for it, so Algorithm 2 places it on ``i1``.
* B's first prompt (~900 tokens) fits on no instance beside either: it is held.
* C takes its last turn and ends. ``i1`` is empty: B is placed there and served,
  while A still waits on ``i0``, which never had room for B.

vLLM's own ``prompt_tokens`` counters are the judge of where B's request ran. The
fake-backend twin of this test is ``tests/e2e/test_fleet_admission_e2e.py``; here
the capacities, the token counts and the contexts are the real engine's. Every wait
is on an observable event (an agent's line, a process exit, the router's table)
with a deadline; nothing sleeps.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.realvllm.conftest import SPEC
from tests.realvllm.engine import (
    AgentProc,
    Router,
    VllmServer,
    http,
    running_router,
    running_vllm,
    start_agent,
    wait_for,
)

pytestmark = [pytest.mark.realvllm, pytest.mark.e2e, pytest.mark.timeout(900)]

CAPACITY_TOKENS = 32 * 128
ADMISSION = """
[admission]
beta = 0.5
gamma = 0.45
"""
# Two turns: 800 words (~1050 tokens) and 350 output tokens (context ~1400), gated
# before the second, which is 10 words and 5 output tokens.
RESIDENT = ("turns", "2", "800", "10", "350,5", "--wait")
# One turn of 700 words (~920 tokens): fits an empty instance, not one beside ~1400.
NEWCOMER = ("turns", "1", "700", "0", "20")


@pytest.fixture(scope="module")
def second_vllm(vllm_workdir: Path, vllm: VllmServer) -> Iterator[VllmServer]:
    """A second server of the tier's spec (``i1``), beside the package's (``i0``)."""
    with running_vllm(vllm_workdir, SPEC, name="vllm-i1") as server:
        print(f"\nrealvllm: second vLLM up in {server.startup_s:.0f}s at {server.url}")
        yield server


def _table(router: Router) -> dict[str, dict[str, Any]]:
    return {i["name"]: i for i in router.instances()}


def _until(router: Router, what: str, ok: Any) -> dict[str, dict[str, Any]]:
    """Re-read the router's instance table until ``ok(table)``; bounded."""

    def probe() -> dict[str, dict[str, Any]] | None:
        table = _table(router)
        return table if ok(table) else None

    return wait_for(what, probe, timeout_s=60)


def _context(turn: dict[str, Any]) -> int:
    usage = turn["usage"]
    return int(usage["prompt_tokens"]) + int(usage["completion_tokens"])


def _first_turn(agent: AgentProc) -> dict[str, Any]:
    """A resident's first turn, then its gate."""
    turn = agent.line()
    assert agent.line() == {"ready": 1}
    return turn


def _ended(agent: AgentProc) -> tuple[list[dict[str, Any]], str]:
    """Every line to the agent's final report, its exit awaited; (turns, agent id)."""
    turns = []
    while "agent_id" not in (line := agent.line()):
        turns.append(line)
    assert agent.wait() == 0
    return turns, str(line["agent_id"])


def _prompt_tokens(server: VllmServer) -> int:
    total = server.wait_idle().prompt_tokens_total
    assert total is not None
    return total


def test_a_held_agent_is_placed_on_the_instance_that_frees_first(
    vllm: VllmServer, second_vllm: VllmServer, vllm_workdir: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    before = [_prompt_tokens(vllm), _prompt_tokens(second_vllm)]
    with (
        running_router(
            vllm_workdir, vllm.url, ADMISSION, name="router-fleet",
            more_backends=(second_vllm.url,),
        ) as router,
        contextlib.ExitStack() as stack,
    ):  # fmt: skip
        _until(router, "both capacities from vLLM's /metrics", lambda t: all(
            t[n]["capacity_tokens"] == CAPACITY_TOKENS for n in ("i0", "i1")))  # fmt: skip

        def launch(args: tuple[str, ...], seed: int) -> AgentProc:
            agent = start_agent(router, vllm_workdir, *args, env={"AGENT_SEED": str(seed)})
            stack.callback(agent.kill)
            return agent

        a = launch(RESIDENT, 0)
        a_first = _first_turn(a)
        a_context = _context(a_first)
        _until(router, "A's context on i0", lambda t: t["i0"]["usage_tokens"] == a_context)
        c = launch(RESIDENT, 5)
        c_context = _context(_first_turn(c))
        table = _until(router, "C's context on i1", lambda t: t["i1"]["usage_tokens"] == c_context)
        assert table["i0"]["usage_tokens"] == a_context  # i0 had no room for C
        assert min(a_context, c_context) > CAPACITY_TOKENS // 3  # no room for B beside either

        b = launch(NEWCOMER, 10)
        _until(router, "B held", lambda t: t["i0"]["pending"] + t["i1"]["pending"] == 1)
        c.release()
        _, c_id = _ended(c)
        b_turns, b_id = _ended(b)  # served while A still holds i0
        assert a.popen.poll() is None
        table = _table(router)
        assert table["i0"]["pending"] == table["i1"]["pending"] == 0
        assert table["i0"]["usage_tokens"] == a_context
        a.release()
        a_last, a_id = _ended(a)
        records = wait_for(
            "the three agents' records",
            lambda: (
                ((r := router.records_by_agent()) and {a_id, b_id, c_id} <= set(r) and r) or None
            ),
            timeout_s=30,
        )
        status, body = http("GET", router.url + "/metrics")
        moves = [line for line in router.proc.log_path.read_text().splitlines()
                 if "held_agent_moved" in line]  # fmt: skip
    after = [_prompt_tokens(vllm), _prompt_tokens(second_vllm)]
    served = [x - y for x, y in zip(after, before, strict=True)]
    with capsys.disabled():
        print(
            f"\nrealvllm fleet admission: A {a_context} tokens on i0, C {c_context} on i1; "
            f"B held {records[b_id]['pending_s']:.2f} s, placed on "
            f"{records[b_id]['instances']}; prompt tokens served by i0 / i1: {served}"
        )
    assert records[a_id]["instances"] == ["i0"]
    assert records[c_id]["instances"] == ["i1"]
    assert records[b_id]["instances"] == ["i1"]
    assert records[b_id]["pending_s"] > 0
    assert all(records[i]["end_reason"] == "exit" for i in (a_id, b_id, c_id))
    assert status == 200
    assert 'kairos_router_admissions_total{instance="i1",source="fleet"} 1.0' in body.decode()
    assert len(moves) == 1 and '"target": "i1"' in moves[0]
    # vLLM's own counters: i0 served A's two prompts and nothing else; B ran on i1.
    assert served[0] == sum(int(t["usage"]["prompt_tokens"]) for t in (a_first, *a_last))
    assert served[1] >= int(b_turns[0]["usage"]["prompt_tokens"])

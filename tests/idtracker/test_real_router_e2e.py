"""End to end with the real router: ``kairos-router run`` in front of a fake backend.

id-tracker registers with the real router, an ``openai``-SDK agent (and a
sub-agent it launches through a nested id-tracker) talk to the router, the
router forwards to the backend — the stand-in, here playing vLLM — and writes
per-agent records when id-tracker reports each agent's end.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from idtracker.testing import StandInRouter
from kairos_common.testing import free_port
from tests.idtracker.conftest import REPO, USER_KEY, agent, run_tracker

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]


def _router_cmd() -> list[str]:
    script = Path(sys.executable).parent / "kairos-router"
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "from router.cli import main; main()"]


@pytest.fixture
def backend() -> Iterator[StandInRouter]:
    """The fake vLLM behind the router: records the key each request arrives with."""
    with StandInRouter() as b:
        yield b


@pytest.fixture
def real_router(
    tmp_path: Path, base_env: dict[str, str], backend: StandInRouter
) -> Iterator[tuple[str, Path]]:
    """A ``kairos-router run`` process; yields its URL and its records file."""
    records = tmp_path / "agents.jsonl"
    port = free_port()
    proc = subprocess.Popen(
        [
            *_router_cmd(),
            "run",
            "--backend",
            backend.url,
            "--port",
            str(port),
            "--state-dir",
            str(tmp_path / "state"),
            "--records",
            str(records),
            "--log-level",
            "info",
            "--log-json",
        ],
        env=base_env,
        cwd=REPO,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    for line in proc.stderr:  # bounded by the test timeout; id-tracker retries the bind gap
        if '"listening"' in line:
            break
    else:
        pytest.fail(f"kairos-router exited with {proc.wait()} before listening")
    drain = threading.Thread(target=proc.stderr.read, daemon=True)  # keep the pipe flowing
    drain.start()
    try:
        yield f"http://127.0.0.1:{port}", records
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def test_agent_and_sub_agent_attributed_by_the_real_router(
    real_router: tuple[str, Path], base_env: dict[str, str], backend: StandInRouter
) -> None:
    url, records_path = real_router
    done = run_tracker(url, base_env, agent("openai_agent.py", "2", "3", "--nested"), "--slo", "30")
    assert done.returncode == 3, done.stderr
    sub, parent = (json.loads(line) for line in done.stdout.splitlines())
    assert parent["nested_rc"] == 5
    # the backend behind the router saw only the user's real key, never an identity
    calls = backend.api_calls
    assert len(calls) == 3
    assert {(c.agent_id, c.real_key) for c in calls} == {(None, USER_KEY)}
    records = {r["agent_id"]: r for r in map(json.loads, records_path.read_text().splitlines())}
    p, s = records[parent["agent_id"]], records[sub["agent_id"]]
    assert (p["turns"], p["exit_code"], p["end_reason"], p["slo_tok_s"]) == (2, 3, "error", 30.0)
    assert (s["turns"], s["exit_code"], s["parent_id"], s["name"]) == (
        1,
        5,
        parent["agent_id"],
        "sub-agent",
    )
    assert p["name"] == "python openai_agent.py" and p["parent_id"] is None


def test_summary_from_the_real_router_matches_its_record(
    real_router: tuple[str, Path], base_env: dict[str, str]
) -> None:
    url, records_path = real_router
    done = run_tracker(url, base_env, agent("openai_agent.py", "2", "0"), "--summary")
    assert done.returncode == 0, done.stderr
    (record,) = map(json.loads, records_path.read_text().splitlines())
    assert done.stderr == (
        f"id-tracker: agent python openai_agent.py ({record['agent_id']}) exit: 2 requests, "
        f"{record['decode_tokens']} output tokens, {record['throughput_tok_s']:.1f} tok/s, "
        f"SLO {record['slo_tok_s']:g} {'met' if record['slo_met'] else 'missed'}, held 0.0 s; "
        "energy not measured (no kairosd reports energy for its GPUs)\n"
    )

"""End to end on CPU: fake vLLMs, kairosd daemons, the router and agents
(two through the ``id-tracker`` CLI, the rest in the agent host under
id-tracker's identity code), as real processes on 127.0.0.1 (a short version of
``make demo``). Asserts that every component did its job.

The stack runs at the speed-up this machine holds and checks its own lag first:
on a machine too slow or busy for even that, every test fails with the
self-check's message instead of a verdict about Kairos."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from idtracker.summary import energy_text
from reporting.energy import energy_balance
from reporting.records import AgentRecord, EpochRecord, read_records
from simulator.demo_run import DemoConfig, PolicyResult, run_policies
from simulator.workload import AgentProgram
from tests.e2e.conftest import agent_program, require_valid

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]


def scripted_arrivals() -> list[tuple[float, AgentProgram]]:
    """Three phases on two 48k-token caches (simulated seconds):

    * 0–10 s: six large agents (≈17–20k tokens each) fill both caches past β;
    * 30 s: a burst of three small agents arrives while both instances defer:
      they must be held, then admitted once the large agents finish;
    * 90–250 s: moderate load (a few small, busy agents), where KAIROS can lower
      the clock and save energy against no-control on the same arrivals.
    """
    fill = [(2.0 * i, agent_program(f"fill-{i}", 17_000, 800, 4, 8.0)) for i in range(6)]
    burst = [(30.0 + i, agent_program(f"burst-{i}", 5_000, 400, 4, 5.0)) for i in range(3)]
    light = [
        (90.0 + 16.0 * i, agent_program(f"light-{i}", 3_000, 400, 8, 1.0, output=300))
        for i in range(10)
    ]
    return fill + burst + light


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, PolicyResult]:
    # Small KV caches (48k tokens per instance) so few agents reach pressure.
    cfg = DemoConfig(
        out_dir=tmp_path_factory.mktemp("e2e"),
        window_s=300.0,
        drain_s=60.0,
        speedup=20.0,
        seed=3,
        kv_capacity_tokens=48_000,
    )
    arrivals = scripted_arrivals()

    results = asyncio.run(run_policies(cfg, ["no-control", "kairos"], arrivals))
    return {r.policy: r for r in results}


def test_the_stack_kept_up_with_its_time_acceleration(runs: dict[str, PolicyResult]) -> None:
    require_valid(*runs.values())
    for res in runs.values():
        assert res.lag is not None and res.lag.arrival_s >= 0 and res.lag.step_s >= 0
        assert res.epochs  # the epoch lag was measured on real epochs


def test_agents_were_tagged_and_accounted(runs: dict[str, PolicyResult]) -> None:
    require_valid(*runs.values())
    for res in runs.values():
        assert res.driver.launched == 19
        assert len(res.driver.cli_agents) == 2  # through the real id-tracker CLI
        assert set(res.driver.cli_agents) <= set(res.driver.late_s)
        names = {a.name for a in res.agents}
        launched = set(res.driver.exit_codes) | set(res.driver.terminated_at_deadline)
        # every agent that finished has a router record under its id-tracker name
        finished = {aid for aid, code in res.driver.exit_codes.items() if code == 0}
        assert finished and finished <= names <= launched
        done = [a for a in res.agents if a.exit_code == 0]
        assert all(a.turns > 0 and a.decode_tokens > 0 and a.instances for a in done)
        assert len(done) == 19, f"{len(done)} of 19 agents done"


def test_clocks_moved_under_kairos_and_stayed_max_without_control(
    runs: dict[str, PolicyResult],
) -> None:
    require_valid(*runs.values())
    assert len(runs["no-control"].clocks_mhz) == 1
    assert len(runs["kairos"].clocks_mhz) >= 3


def test_admission_happened_under_pressure(runs: dict[str, PolicyResult]) -> None:
    require_valid(*runs.values())
    kairos, base = runs["kairos"], runs["no-control"]

    def peak(res: PolicyResult) -> float:
        return max(e.usage_tokens / e.capacity_tokens for e in res.epochs)

    # The same arrivals overfill the caches without admission control …
    assert peak(base) > 0.9
    # … while KAIROS holds newcomers back and admits them once there is room.
    assert kairos.max_pending >= 1
    assert kairos.admitted >= 1
    assert peak(kairos) < peak(base)


def test_kairos_uses_less_energy_on_the_same_arrivals(runs: dict[str, PolicyResult]) -> None:
    require_valid(*runs.values())
    base, kairos = runs["no-control"].summary, runs["kairos"].summary
    assert kairos.energy_j < base.energy_j
    assert kairos.avg_power_w < base.avg_power_w


def test_reports_parse_with_kairos_report(runs: dict[str, PolicyResult]) -> None:
    require_valid(*runs.values())
    workdir = runs["kairos"].workdir
    paths = [*sorted(workdir.glob("kairosd-*.jsonl")), workdir / "agents.jsonl"]
    records = list(read_records(paths))
    assert any(isinstance(r, EpochRecord) for r in records)
    assert any(isinstance(r, AgentRecord) for r in records)
    kairos_cli = Path(sys.executable).parent / "kairos"
    out = subprocess.run(
        [str(kairos_cli), "report", "--json", *map(str, paths)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    obj = json.loads(out.stdout)
    row = obj[0] if isinstance(obj, list) else obj
    assert row["policy"] == "kairos" and row["avg_power_w"] > 0
    assert runs["kairos"].plot is not None and runs["kairos"].plot.stat().st_size > 0


def test_every_agent_record_carries_energy_that_adds_up(runs: dict[str, PolicyResult]) -> None:
    """Energy per agent on real processes: the daemons' measured energy reaches the
    router, every agent record carries its share, and the parts add up (0.1 %)."""
    require_valid(*runs.values())
    for res in runs.values():
        paths = [*sorted(res.workdir.glob("kairosd-*.jsonl")), res.workdir / "agents.jsonl"]
        records = list(read_records(paths))
        balance = energy_balance(records)
        assert balance is not None, f"{res.policy}: the router wrote no energy records"
        assert balance.agents == len(res.agents) and balance.agents_with_energy == balance.agents
        done = [a for a in res.agents if a.exit_code == 0]
        assert all((a.energy_own_j or 0.0) > 0 for a in done), "a finished agent got no energy"
        assert balance.parts_error <= 1e-3, balance
        assert balance.daemon_error <= 1e-3, balance
        assert balance.own_j > 0.3 * balance.measured_j  # agents, not idle, drew most of it


def test_cli_agents_print_what_their_run_cost(runs: dict[str, PolicyResult]) -> None:
    """``id-tracker --summary`` on real processes: each CLI agent's last stderr line
    (in the agents' log) carries the energy of its router record, waited for until
    the daemons' measurements covered its last request."""
    require_valid(*runs.values())
    checked = 0
    for res in runs.values():
        log = (res.workdir / "agents.log").read_text(errors="replace")
        records = {a.agent_id: a for a in res.agents}
        for name in res.driver.cli_agents:
            rec = next(a for a in records.values() if a.name == name)
            if rec.exit_code != 0:
                continue  # stopped at the deadline: its line may say "so far"
            checked += 1
            assert rec.energy_j is not None and rec.energy_j > 0
            line = next(
                (ln for ln in log.splitlines() if ln.startswith(f"id-tracker: agent {name} (")),
                None,
            )
            assert line is not None, f"{res.policy}: no summary from {name}"
            assert f"({rec.agent_id}) exit: {rec.turns} requests" in line
            assert f"; energy {energy_text(rec.energy_j)} (" in line, line
    assert checked, "no CLI agent finished: no summary line was checked"

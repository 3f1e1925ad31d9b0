"""The router's ``confident`` placement (docs/beyond.md §3): newcomers go to an active
instance with room for them; an agent moves only when its instance is under pressure,
the target has room, the relief outweighs re-prefilling its context, and the case held
for ``confirm`` checks. Other policies keep Algorithm 3."""

from __future__ import annotations

from typing import Any

import pytest
from typer.testing import CliRunner

from controllers.confident_placement import ConfidentReassignmentConfig
from controllers.registry import PLACEMENT_NAMES
from kairos_common.config import load_config
from kairos_common.errors import ConfigError
from kairos_common.testing import ManualClock
from router.cli import app as router_cli
from router.config import ENV_PREFIX, AdmissionSettings, PlacementSettings, RouterConfig
from router.core import RouterCore
from router.ledger import Agent, Ledger
from router.placement_service import PlacementService
from router.testing import FakeBackend
from tests.router.conftest import StartRouter, instance_of, one_turn, start_agent

CAPACITY = 10_000


def _service(**settings: Any) -> tuple[PlacementService, Ledger]:
    config = RouterConfig(
        backends=tuple(f"i{i}=http://127.0.0.1:{i + 1}" for i in range(3)),  # never contacted
        placement=PlacementSettings(**settings),
        admission=AdmissionSettings(capacity_tokens=CAPACITY),
    )
    core = RouterCore(config, secret=None, store=None, records=None, clock=ManualClock())
    return core.placement, core.ledger


def _agent(ledger: Ledger, agent_id: str, context_tokens: int | None, turns: int = 0) -> Agent:
    return ledger.add(
        Agent(
            agent_id=agent_id,
            arrival_s=0.0,
            start_unix_s=0.0,
            context_tokens=context_tokens,
            turns=turns,
        )
    )


def _ongoing(
    ledger: Ledger, agent_id: str, instance: str, context_tokens: int, turns: int = 20
) -> Agent:
    agent = _agent(ledger, agent_id, context_tokens, turns)
    ledger.set_ongoing(agent, instance)
    return agent


def _requests(service: PlacementService, agent: Agent, count: int) -> list[str | None]:
    """``count`` requests of ``agent``: what reassignment returned on each."""
    return [service.maybe_reassign(agent) for _ in range(count)]


def _reassigned(service: PlacementService, reason: str, source: str, target: str) -> float:
    value = service.metrics.registry.get_sample_value(
        "kairos_router_reassignments_total",
        {"source": source, "target": target, "reason": reason},
    )
    return value or 0.0


# -- configuration ------------------------------------------------------------------------


def test_defaults_are_the_simulators() -> None:
    assert PlacementSettings().confident_reassignment() == ConfidentReassignmentConfig()


@pytest.mark.parametrize("name", PLACEMENT_NAMES)
def test_every_simulator_placement_name_builds_a_router(name: str) -> None:
    config = RouterConfig(backends=("http://127.0.0.1:1",), placement=PlacementSettings(name))
    core = RouterCore(config, secret=None, store=None, records=None)
    assert core.placement.policy.name == name
    assert (core.placement.confident is not None) == (name == "confident")


def test_unknown_policy_is_a_config_error_naming_the_choices() -> None:
    with pytest.raises(ConfigError) as err:
        load_config(
            RouterConfig,
            env_prefix=ENV_PREFIX,
            env={},
            overrides={"placement": {"policy": "bogus"}},
        )
    message = str(err.value)
    assert "placement" in message and "'bogus'" in message and "confident" in message


def test_unknown_policy_stops_the_router_at_start_up() -> None:
    args = ["run", "--backend", "http://127.0.0.1:1", "--placement", "bogus", "--no-signing"]
    result = CliRunner().invoke(router_cli, args)
    assert result.exit_code == 2
    assert "unknown placement policy 'bogus'" in result.output


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("hot", 1.5),
        ("hot", 0.0),
        ("cool", 0.9),  # above hot = 0.75
        ("cool", -0.1),
        ("recompute_factor", -1.0),
        ("confirm", 0),
        ("reassign_interval_requests", 0),
        ("theta_cons", 0.0),
        ("rho", 0.0),
    ],
)
def test_a_bad_constant_set_in_code_is_an_error_naming_the_field(key: str, value: float) -> None:
    with pytest.raises(ConfigError, match=f"^{key} "):
        PlacementSettings(**{key: value})  # type: ignore[arg-type]


@pytest.mark.parametrize("key", ["hot", "cool", "recompute_factor", "confirm", "rho"])
def test_the_constants_are_the_code_s_not_the_operator_s(key: str) -> None:
    env = {f"{ENV_PREFIX}_PLACEMENT__{key.upper()}": "0.5"}
    with pytest.raises(ConfigError, match=f"placement.{key} is a constant of the code"):
        load_config(RouterConfig, env_prefix=ENV_PREFIX, env=env)


def test_constants_set_in_code_reach_the_confident_rule() -> None:
    settings = PlacementSettings(
        "confident", reassign_interval_requests=4, hot=0.8, cool=0.4, recompute_factor=3.0,
        confirm=3,
    )  # fmt: skip
    assert settings.confident_reassignment() == ConfidentReassignmentConfig(
        interval_requests=4, hot=0.8, cool=0.4, recompute_factor=3.0, confirm=3
    )


# -- placement of newcomers ---------------------------------------------------------------


def test_newcomer_goes_to_an_active_instance_with_room_not_an_idle_one() -> None:
    service, ledger = _service(policy="confident")
    _ongoing(ledger, "old", "i1", 2000)  # i0 idle (lowest index), i1 active with room
    newcomer = _agent(ledger, "new", 1000)
    assert service.choose(newcomer).name == "i1"
    consolidating, ledger2 = _service(policy="consolidating")
    _ongoing(ledger2, "old", "i1", 2000)
    assert consolidating.choose(_agent(ledger2, "new", 1000)).name == "i0"  # Algorithm 2


def test_newcomer_that_does_not_fit_wakes_an_idle_instance() -> None:
    service, ledger = _service(policy="confident")
    _ongoing(ledger, "old", "i0", 4500)  # U_0 < θ·U_max, but not with the newcomer's 1000
    assert service.choose(_agent(ledger, "new", 1000)).name == "i1"


# -- reassignment -------------------------------------------------------------------------


def test_no_move_without_pressure() -> None:
    service, ledger = _service(policy="confident")
    agent = _ongoing(ledger, "a", "i0", 3000)
    _ongoing(ledger, "b", "i0", 3000)  # U_0 = 0.6·U_max < hot
    _ongoing(ledger, "c", "i1", 500)  # Algorithm 3 would move: U_0 ≥ 2·U_1
    assert _requests(service, agent, 40) == [None] * 40
    assert agent.instance == "i0" and agent.steps_since_assign == 0  # checked, reset, stayed
    algorithm3, ledger3 = _service(policy="consolidating")
    agent3 = _ongoing(ledger3, "a", "i0", 3000)
    _ongoing(ledger3, "b", "i0", 3000)
    _ongoing(ledger3, "c", "i1", 500)
    assert _requests(algorithm3, agent3, 8)[-1] == "i1"
    assert _reassigned(algorithm3, "imbalance", "i0", "i1") == 1.0


def _pressure(ledger: Ledger, turns: int = 20) -> Agent:
    """i0 at 0.8·U_max (hot), i1 active at 0.05·U_max; returns the 4000-token agent on i0."""
    agent = _ongoing(ledger, "a", "i0", 4000, turns)
    _ongoing(ledger, "b", "i0", 4000)
    _ongoing(ledger, "c", "i1", 500)
    return agent


def test_move_under_pressure_after_confirm_checks() -> None:
    service, ledger = _service(policy="confident")
    agent = _pressure(ledger)
    first = _requests(service, agent, 8)
    assert first == [None] * 8 and agent.instance == "i0"  # 1st check: not yet confirmed
    second = _requests(service, agent, 8)
    assert second == [None] * 7 + ["i1"]  # 2nd consecutive check: move
    assert agent.instance == "i1" and agent.steps_since_assign == 0
    assert ledger.usage_tokens("i0") == 4000 and ledger.usage_tokens("i1") == 4500
    assert _reassigned(service, "pressure", "i0", "i1") == 1.0


def test_confirm_and_interval_are_configurable() -> None:
    service, ledger = _service(policy="confident", confirm=3, reassign_interval_requests=2)
    agent = _pressure(ledger)
    assert _requests(service, agent, 6) == [None] * 5 + ["i1"]


def test_no_move_when_relief_does_not_pay_for_the_recompute() -> None:
    service, ledger = _service(policy="confident")
    agent = _pressure(ledger, turns=2)  # 2 · (0.8 − 0.05) < recompute_factor 2
    assert _requests(service, agent, 32) == [None] * 32
    agent.turns = 3  # 3 · 0.75 ≥ 2: a longer-lived agent is worth moving
    assert _requests(service, agent, 16)[-1] == "i1"


def test_no_move_to_an_instance_without_room_or_idle() -> None:
    service, ledger = _service(policy="confident")
    agent = _ongoing(ledger, "a", "i0", 4000)
    _ongoing(ledger, "b", "i0", 4000)
    _ongoing(ledger, "c", "i1", 1500)  # 1500 + 4000 > cool·U_max; i2 idle
    assert _requests(service, agent, 32) == [None] * 32


def test_streak_forgotten_when_the_agent_ends() -> None:
    service, ledger = _service(policy="confident")
    agent = _pressure(ledger)
    assert _requests(service, agent, 8) == [None] * 8  # streak 1 of 2
    ledger.remove("a")  # ended (AgentService.finish) or expired
    again = _ongoing(ledger, "a", "i0", 4000)  # the same id comes back (implicit start)
    assert _requests(service, again, 8) == [None] * 8  # a fresh streak: 1 of 2 again
    assert _requests(service, again, 8)[-1] == "i1"


def test_streak_forgotten_when_the_agent_is_placed_anew() -> None:
    service, ledger = _service(policy="confident")
    agent = _pressure(ledger)
    assert _requests(service, agent, 8) == [None] * 8  # streak 1 of 2
    service.choose(agent)  # e.g. failover: evidence about its old instance is void
    assert _requests(service, agent, 8) == [None] * 8


def test_streak_forgotten_when_another_service_moves_the_agent() -> None:
    """A room move (point 15), overflow relief or a held agent admitted elsewhere puts
    the agent on another instance: its streak was evidence about the old one."""
    service, ledger = _service(policy="confident")
    agent = _pressure(ledger)
    _ongoing(ledger, "d", "i2", 4000)
    assert _requests(service, agent, 8) == [None] * 8  # streak 1 of 2, on i0
    ledger.set_ongoing(agent, "i2")  # moved: i2 is now as hot as i0 was
    assert _requests(service, agent, 8) == [None] * 8  # a fresh streak: 1 of 2 on i2
    assert _requests(service, agent, 8)[-1] == "i1"


def test_reassign_off_disables_confident_moves() -> None:
    service, ledger = _service(policy="confident", reassign=False)
    agent = _pressure(ledger)
    assert _requests(service, agent, 32) == [None] * 32


# -- through the real router --------------------------------------------------------------


async def test_router_moves_an_agent_under_pressure(
    make_router: StartRouter, backend: FakeBackend, backend2: FakeBackend
) -> None:
    for b in (backend, backend2):
        b.behaviour.capacity_tokens = CAPACITY
    backend.behaviour.prompt_tokens = 3996  # C_a = 4000 on i0
    backend2.behaviour.prompt_tokens = 96  # C_a = 100 on i1
    router = await make_router(
        [backend.url, backend2.url],
        placement=PlacementSettings(policy="confident"),
    )
    await router.health.check_once()  # learns U_max from both /metrics
    tokens = []
    for _ in range(3):
        token = await start_agent(router.url)
        await one_turn(router, token)
        tokens.append(token)
    # a, b consolidate on i0 (U_0 = 0.8·U_max); c does not fit there and wakes i1
    assert [instance_of(router, t) for t in tokens] == ["i0", "i0", "i1"]
    for _ in range(15):  # 1st check (8 turns) unconfirmed, 2nd one (16 turns) moves
        await one_turn(router, tokens[0])
        assert instance_of(router, tokens[0]) == "i0"
    before = len(backend2.received)
    await one_turn(router, tokens[0])
    assert instance_of(router, tokens[0]) == "i1"
    assert len(backend2.received) == before + 1  # the request itself went to i1
    metrics = router.core.metrics.render().decode()
    assert 'kairos_router_reassignments_total{reason="pressure",source="i0",target="i1"} 1.0' in (
        metrics
    )


def test_without_balancing_moves_the_large_agent_moves() -> None:
    service, ledger = _service(reassign_interval_requests=1)
    big = _ongoing(ledger, "big", "i0", 6_000)
    _ongoing(ledger, "small", "i0", 500)
    _ongoing(ledger, "other", "i1", 2_000)
    assert service.maybe_reassign(big) == "i1"

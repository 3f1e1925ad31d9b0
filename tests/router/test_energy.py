"""The router's energy per agent: measured-energy deltas from decisions, attribution
to the agents' work, records written once attributed, sub-agents into parents."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from kairos_common.config import load_config
from kairos_common.errors import ConfigError, WireFormatError
from kairos_common.testing import ManualClock, decision
from kairos_common.wire import AdmissionDecision
from reporting.records import AgentRecord, EnergyRecord
from router.config import EnergyWeightSettings, RouterConfig
from router.core import RouterCore
from router.energy import EnergyService


def _decision(total_j: float | None, epoch: int, start: float = 1.7e9) -> AdmissionDecision:
    return decision("gpu0", epoch, daemon_id="d", start_unix_s=start, energy_total_j=total_j)


def _record(agent_id: str, parent: str | None = None) -> AgentRecord:
    return AgentRecord(
        agent_id=agent_id, start_s=0.0, end_s=1.0, turns=1, decode_tokens=10, prompt_tokens=100,
        llm_time_s=1.0, pending_s=0.0, throughput_tok_s=10.0, slo_tok_s=20.0, slo_met=False,
        parent_id=parent, instances=("gpu0",),
    )  # fmt: skip


class _Setup:
    def __init__(self, live: set[str] | None = None) -> None:
        self.clock = ManualClock(100.0)
        self.written: list[AgentRecord] = []
        self.energy: list[EnergyRecord] = []
        self.registry = CollectorRegistry()
        self.live = live if live is not None else set()
        self.parents: set[str] = set()  # agents with live sub-agents
        self.svc = EnergyService(
            self.registry,
            write=self._write,
            is_live=self.live.__contains__,
            clock=self.clock,
            wall_clock=lambda: 1.7e9,
            idle_power_w=10.0,
            has_live_children=self.parents.__contains__,
        )

    def _write(self, record: AgentRecord | EnergyRecord) -> None:
        if isinstance(record, EnergyRecord):
            self.energy.append(record)
        else:
            self.written.append(record)

    def metric(self, kind: str) -> float:
        name = f"kairos_router_instance_{kind}_energy_joules_total"
        return self.registry.get_sample_value(name, {"instance": "gpu0"}) or 0.0

    def request(self, agent_id: str, prompt: int = 1000, completion: int = 100) -> None:
        start = self.clock()
        self.clock.advance(2.0)
        self.svc.record("gpu0", agent_id, prompt, 0, completion, start, None)


def test_counter_deltas_are_attributed_and_lost_messages_lose_nothing() -> None:
    s = _Setup()
    s.svc.on_decision("gpu0", _decision(0.0, 0), in_flight_since_s=None)  # baseline
    s.request("a")
    s.request("b", prompt=3000)
    s.clock.advance(1.0)  # 5 s interval
    s.svc.on_decision("gpu0", _decision(550.0, 1), in_flight_since_s=None)
    assert s.metric("measured") == 550.0
    assert s.metric("unattributed") == pytest.approx(50.0)  # 10 W idle x 5 s
    assert s.metric("attributed") == pytest.approx(500.0)
    assert s.svc.agent_energy_j("b") > s.svc.agent_energy_j("a") > 0
    # epochs 2 and 3 lost; epoch 4 carries their joules; a repeat adds nothing
    s.request("a")
    s.clock.advance(13.0)
    s.svc.on_decision("gpu0", _decision(1700.0, 4), in_flight_since_s=None)
    s.svc.on_decision("gpu0", _decision(1700.0, 4), in_flight_since_s=None)
    assert s.metric("measured") == 1700.0
    assert s.metric("attributed") + s.metric("unattributed") == pytest.approx(1700.0)


def test_a_restarted_daemon_starts_a_new_counter_and_old_messages_are_ignored() -> None:
    s = _Setup()
    s.svc.on_decision("gpu0", _decision(5000.0, 9), in_flight_since_s=None)
    s.svc.on_decision("gpu0", _decision(30.0, 0, start=1.8e9), in_flight_since_s=None)
    assert s.metric("measured") == 5030.0
    s.svc.on_decision("gpu0", _decision(9000.0, 10), in_flight_since_s=None)  # the old daemon, late
    assert s.metric("measured") == 5030.0


def test_records_wait_for_their_energy_and_parents_get_their_sub_agents() -> None:
    s = _Setup(live={"parent"})
    s.svc.on_decision("gpu0", _decision(0.0, 0), in_flight_since_s=None)
    s.request("child")
    s.request("parent")
    s.svc.finish(_record("child", parent="parent"))
    assert s.written == []  # its work has no joules yet
    s.svc.on_decision("gpu0", _decision(400.0, 1), in_flight_since_s=None)
    (child,) = s.written
    assert child.energy_own_j is not None and child.energy_own_j > 0
    assert child.energy_j == child.energy_own_j
    s.live.clear()
    s.svc.finish(_record("parent"))
    parent = s.written[-1]
    assert parent.energy_own_j is not None and parent.energy_j is not None
    assert parent.energy_j == pytest.approx(parent.energy_own_j + child.energy_j)
    own = math.fsum(r.energy_own_j or 0.0 for r in s.written)
    assert own + s.metric("unattributed") == pytest.approx(s.metric("measured"))


def test_a_parent_that_ends_first_still_gets_its_sub_agents_joules() -> None:
    """A sub-agent's record waits for its last joules; a parent ending meanwhile (or
    while a sub-agent still runs) waits for it, so its energy_j includes it."""
    s = _Setup(live={"parent", "child"})
    s.parents.add("parent")
    s.svc.on_decision("gpu0", _decision(0.0, 0), in_flight_since_s=None)
    s.request("parent")
    s.svc.on_decision("gpu0", _decision(200.0, 1), in_flight_since_s=None)
    s.live.discard("parent")
    s.svc.finish(_record("parent"))  # its own work is attributed; its sub-agent runs on
    assert s.written == []
    s.request("child")
    s.live.discard("child")
    s.parents.clear()
    s.svc.finish(_record("child", parent="parent"))  # parked: its joules are not in yet
    assert s.written == []
    s.svc.on_decision("gpu0", _decision(500.0, 2), in_flight_since_s=None)
    child, parent = s.written
    assert (child.agent_id, parent.agent_id) == ("child", "parent")
    assert child.energy_j is not None and child.energy_j > 0
    assert parent.energy_own_j is not None and parent.energy_j is not None
    assert parent.energy_j == pytest.approx(parent.energy_own_j + child.energy_j)


def test_a_parent_waits_for_a_sub_agent_at_most_max_lag_and_shutdown_writes_children_first() -> (
    None
):
    s = _Setup(live={"child"})
    s.parents.add("parent")
    s.svc.on_decision("gpu0", _decision(0.0, 0), in_flight_since_s=None)
    s.svc.finish(_record("parent"))
    assert s.written == []
    s.clock.advance(601.0)
    s.svc.release()
    assert [r.agent_id for r in s.written] == ["parent"]  # the sub-agent ran too long
    t = _Setup(live={"parent", "child"})
    t.svc.on_decision("gpu0", _decision(0.0, 0), in_flight_since_s=None)
    t.request("child")
    t.request("parent")
    t.live.clear()
    t.svc.finish(_record("parent"))
    t.svc.finish(_record("child", parent="parent"))
    t.svc.close()  # nothing measured since: both written with what is known, child first
    assert [r.agent_id for r in t.written] == ["child", "parent"]
    child, parent = t.written
    assert parent.energy_j == pytest.approx((parent.energy_own_j or 0) + (child.energy_j or 0))


def test_without_energy_reports_records_are_written_at_once_without_energy() -> None:
    s = _Setup()
    s.svc.on_decision("gpu0", _decision(None, 0), in_flight_since_s=None)  # an old daemon
    s.request("a")
    s.svc.finish(_record("a"))
    (rec,) = s.written
    assert rec.energy_j is None and rec.energy_own_j is None


def test_an_agent_that_never_ran_a_request_used_no_energy() -> None:
    """Seen on an H200: agents stopped before their first request had no energy at
    all, so "every record carries energy" failed; they cost 0 J, which is known."""
    s = _Setup()
    s.svc.on_decision("gpu0", _decision(0.0, 0), in_flight_since_s=None)
    s.svc.finish(dataclasses.replace(_record("idle"), turns=0, instances=()))
    (rec,) = s.written
    assert rec.energy_j == 0.0 and rec.energy_own_j == 0.0


def test_shutdown_writes_parked_records() -> None:
    s = _Setup()
    s.svc.on_decision("gpu0", _decision(0.0, 0), in_flight_since_s=None)
    s.request("a")
    s.svc.finish(_record("a"))
    s.request("b")
    s.svc.on_decision("gpu0", _decision(300.0, 1), in_flight_since_s=0.0)
    s.clock.advance(5.0)
    s.svc.on_decision("gpu0", _decision(400.0, 2), in_flight_since_s=None)
    s.request("c")  # after the last measurement
    s.svc.finish(_record("c"))
    s.svc.close()
    a, c = s.written
    assert a.energy_own_j is not None and a.energy_own_j > 0
    assert c.energy_own_j == 0.0  # its interval was never measured
    (energy,) = s.energy
    assert energy.measured_j == 400.0 and energy.daemon_epoch == 2
    assert (
        energy.unrecorded_j == pytest.approx(s.svc.agent_energy_j("b")) and energy.unrecorded_j > 0
    )
    total = a.energy_own_j + energy.unrecorded_j + energy.unattributed_j
    assert total == pytest.approx(energy.measured_j)
    assert energy.attributed_j + energy.unattributed_j == pytest.approx(energy.measured_j)


@pytest.mark.parametrize("bad", [-1.0, math.nan, math.inf, 1e300, "5", True])
def test_wire_rejects_a_bad_energy_counter(bad: object) -> None:
    obj = _decision(1.0, 0).to_json()
    obj["measured"]["energy_total_j"] = bad
    with pytest.raises(WireFormatError):
        AdmissionDecision.from_json(obj)


def test_wire_round_trips_the_energy_counter() -> None:
    d = _decision(12345.5, 3)
    assert AdmissionDecision.from_json(d.to_json()).measured.energy_total_j == 12345.5
    obj = d.to_json()
    del obj["measured"]["energy_total_j"]  # a daemon that measures nothing
    assert AdmissionDecision.from_json(obj).measured.energy_total_j is None


def _split_p_over_d(config: RouterConfig) -> float:
    """Joules of a long-prompt agent over a long-answer agent's, same interval."""
    clock = ManualClock(100.0)
    svc = EnergyService(
        CollectorRegistry(), write=None, is_live=lambda _a: True, clock=clock,
        wall_clock=lambda: 1.7e9, idle_power_w=10.0,
        weights=config.energy_weights.work_weights(),
    )  # fmt: skip
    svc.on_decision("gpu0", _decision(0.0, 0), in_flight_since_s=None)
    start = clock()
    clock.advance(4.0)
    svc.record("gpu0", "p", 30_000, 0, 10, start, None)
    svc.record("gpu0", "d", 300, 0, 1_500, start, None)
    clock.advance(1.0)
    svc.on_decision("gpu0", _decision(5000.0, 1), in_flight_since_s=None)
    return svc.agent_energy_j("p") / svc.agent_energy_j("d")


def test_configured_weights_decide_the_split(tmp_path: Path) -> None:
    """Weights set in code reach the attribution: a dense model's weights (a prefill
    token ten times dearer, no per-token experts) charge the long prompt more. They
    are constants of the code, which a file or variable may not set."""
    weights = EnergyWeightSettings(
        prefill_s_per_token=1.48e-4, attn_s_per_pair=2.92e-9, step_shared_s=0.0164, token_s=0.0,
        kv_s_per_token=9.8e-8,
    )  # fmt: skip
    dense = RouterConfig(energy_weights=weights)
    ratio_default, ratio_dense = _split_p_over_d(RouterConfig()), _split_p_over_d(dense)
    assert ratio_dense > 2 * ratio_default
    core = RouterCore(dense, secret=None, store=None, records=None, clock=ManualClock())
    assert core.energy.accountant.weights == dense.energy_weights.work_weights()
    toml = tmp_path / "router.toml"
    toml.write_text("[energy_weights]\ntoken_s = 0.0\n")
    with pytest.raises(ConfigError, match="energy_weights is a constant of the code"):
        load_config(RouterConfig, path=toml, env_prefix="KAIROS_ROUTER", env={})
    env = {"KAIROS_ROUTER_ENERGY_WEIGHTS__TOKEN_S": "0.002"}
    with pytest.raises(ConfigError, match="KAIROS_ROUTER_ENERGY_WEIGHTS__TOKEN_S"):
        load_config(RouterConfig, env_prefix="KAIROS_ROUTER", env=env)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("token_s", math.nan),
        ("kv_s_per_token", -1e-9),
        ("step_shared_s", math.inf),
        ("prefill_s_per_token", 11.0),
    ],
)
def test_bad_weights_are_refused(field: str, value: float) -> None:
    with pytest.raises(ConfigError, match=f"energy_weights.{field}"):
        EnergyWeightSettings(**{field: value})


def test_weights_that_price_a_kind_of_work_at_nothing_are_refused() -> None:
    with pytest.raises(ConfigError, match="prefill and decode"):
        EnergyWeightSettings(prefill_s_per_token=0.0, attn_s_per_pair=0.0)
    with pytest.raises(ConfigError, match="prefill and decode"):
        EnergyWeightSettings(step_shared_s=0.0, token_s=0.0)

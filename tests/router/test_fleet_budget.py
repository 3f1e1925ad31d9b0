"""The router as fleet power-budget coordinator (router/fleet_budget.py), the wire
fields it uses, and its HTTP surface. Time is a manual clock: nothing sleeps."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from structlog.testing import capture_logs

from kairos_common.errors import WireFormatError
from kairos_common.testing import ManualClock
from kairos_common.testing import decision as wire_decision
from kairos_common.views import ModelReport
from kairos_common.wire import AdmissionDecision, DecisionAck
from router.config import FleetBudgetSettings
from router.fleet_budget import FleetBudgetService
from router.metrics import FleetMetrics
from router.testing import FakeBackend, start_router
from tests.router.conftest import control

LEVELS = (800, 1000, 1200, 1400, 1600)
NAMES = ("a", "b")


def decision(
    name: str,
    epoch: int,
    *,
    clock_mhz: int | None = 1600,
    measured_w: float | None = 400.0,
    measured_mhz: int | None = 1600,
    levels: tuple[int, ...] = LEVELS,
    margins: dict[int, float] | None = None,
    valid_for_s: float = 1.5,
) -> AdmissionDecision:
    return wire_decision(
        name,
        epoch,
        daemon_id="kd",
        start_unix_s=1.0,
        clock_mhz=clock_mhz,
        valid_for_s=valid_for_s,
        levels_mhz=levels,
        power_w=measured_w,
        measured_clock_mhz=measured_mhz,
        report=None if margins is None else ModelReport(margins),
    )


def service(cap_w: float = 700.0, **kw: Any) -> tuple[FleetBudgetService, ManualClock]:
    clock = ManualClock()
    settings = FleetBudgetSettings(cap_w=cap_w, **kw)
    metrics = FleetMetrics(CollectorRegistry())
    return FleetBudgetService(settings, slo_tok_s=20.0, clock=clock, metrics=metrics), clock


def one_epoch(svc: FleetBudgetService, clock: ManualClock, epoch: int, **kw: Any) -> dict[str, Any]:
    """Both instances post once (a, then b half an epoch later); their caps."""
    caps = {}
    for name in NAMES:
        caps[name] = svc.on_decision(name, decision(name, epoch, **kw), NAMES)[0]
        clock.advance(0.25)
    return caps


# ---------------------------------------------------------------- the wire


def test_decision_round_trips_the_budget_fields() -> None:
    d = decision("a", 3, margins={2: 0.4})
    d2 = AdmissionDecision.from_json(d.to_json())
    assert d2 == d
    assert d2.clock.levels_mhz == LEVELS and d2.measured.power_w == 400.0
    assert d2.clock.report is not None and d2.clock.report.slo_margin(2) == 0.4


def _bare(name: str) -> dict[str, Any]:
    """A decision with neither a clock nor a measurement part (observe mode at start)."""
    full = decision(name, 0).to_json()
    return {k: v for k, v in full.items() if k not in ("clock", "measured")}


def test_a_decision_without_clock_or_measurement_has_no_budget_fields() -> None:
    d = AdmissionDecision.from_json(_bare("a"))
    assert d.clock.levels_mhz == () and d.measured.power_w is None
    assert d.measured.clock_mhz is None
    assert d.clock.min_throughput_tok_s is None and d.clock.report is None


def test_bad_budget_fields_are_wire_errors() -> None:
    base = decision("a", 0).to_json()
    with pytest.raises(WireFormatError, match="levels_mhz"):
        AdmissionDecision.from_json({**base, "clock": {"levels_mhz": [800, "fast"]}})
    with pytest.raises(WireFormatError, match="slo_margins"):
        AdmissionDecision.from_json({**base, "clock": {"report": {"slo_margins": [[2, "hi"]]}}})


def test_a_key_the_schema_does_not_name_is_ignored() -> None:
    old = {**decision("a", 0).to_json(), "extras": {"margin_l2": 0.4}}
    assert AdmissionDecision.from_json(old) == decision("a", 0)


def test_ack_round_trips_cap_and_an_ack_without_one_means_no_cap() -> None:
    ack = DecisionAck(accepted=True, admitted=("x",), clock_cap_mhz=1200, budget_conflict=True)
    assert DecisionAck.from_json(ack.to_json()) == ack
    bare = DecisionAck.from_json({"accepted": True, "admitted": [], "reason": ""})
    assert bare.clock_cap_mhz is None and not bare.budget_conflict
    # No budget: the ack carries no budget fields at all.
    assert DecisionAck(accepted=True).to_json() == {
        "version": 2, "accepted": True, "admitted": [], "reason": "",
    }  # fmt: skip


# ------------------------------------------------------------- allocation


def test_fleet_over_cap_gets_capped_under_it() -> None:
    svc, clock = service(cap_w=700.0)
    one_epoch(svc, clock, 0)  # first round: a's view only, nothing to lower yet
    caps = one_epoch(svc, clock, 1)
    assert caps["a"] is not None and caps["a"] < 1600
    assert caps["b"] is not None and caps["b"] < 1600
    state = svc.state(NAMES)
    assert state["predicted_power_w"] <= 700.0
    assert state["cap_w"] == 700.0 and not state["conflict"] and not state["infeasible"]
    assert state["instances"]["a"]["kind"] == "capped"
    assert state["instances"]["a"]["clock_cap_mhz"] == caps["a"]


def test_most_slack_is_lowered_first() -> None:
    svc, clock = service(cap_w=760.0)
    roomy = {lv: 1.0 for lv in range(1, 6)}
    tight = {lv: 0.2 for lv in range(1, 6)}
    for epoch in range(2):
        svc.on_decision("a", decision("a", epoch, margins=tight), NAMES)
        svc.on_decision("b", decision("b", epoch, margins=roomy), NAMES)
        clock.advance(0.5)
    assert svc.cap_for("a") == (None, False)
    cap_b, conflict = svc.cap_for("b")
    assert cap_b is not None and cap_b < 1600 and not conflict


def test_an_instance_below_its_cap_is_not_capped() -> None:
    svc, clock = service(cap_w=2000.0)
    caps = [one_epoch(svc, clock, e) for e in range(3)]
    assert all(c == {"a": None, "b": None} for c in caps)
    assert svc.state(NAMES)["instances"]["a"]["kind"] == "controlled"


def test_one_round_per_epoch_not_per_post() -> None:
    svc, clock = service()
    for epoch in range(5):
        one_epoch(svc, clock, epoch)
    # a posts first and sets the pace: rounds at a's posts 0, 1, 2, 3, 4.
    assert svc.rounds == 5


def test_slo_unsafe_cap_is_a_reported_conflict_logged_once() -> None:
    svc, clock = service(cap_w=500.0)
    tight = {lv: -0.5 for lv in range(1, 6)}
    with capture_logs() as logs:
        for epoch in range(4):
            one_epoch(svc, clock, epoch, margins=tight)
        for epoch in range(4, 6):
            one_epoch(svc, clock, epoch, measured_w=100.0, margins=tight)
    started = [e for e in logs if e["event"] == "fleet_budget_conflict_started"]
    ended = [e for e in logs if e["event"] == "fleet_budget_conflict_ended"]
    assert len(started) == 1 and len(ended) == 1
    assert svc.conflict_rounds >= 2
    assert not svc.state(NAMES)["conflict"]


def test_stale_daemon_is_counted_pessimistically_at_its_top_clock() -> None:
    svc, clock = service(cap_w=700.0)
    svc.on_decision("a", decision("a", 0, measured_w=300.0, measured_mhz=1000), NAMES)
    for epoch in range(4):  # a stopped posting; b carries on past a's validity
        svc.on_decision("b", decision("b", epoch), NAMES)
        clock.advance(1.0)
    state = svc.state(NAMES)
    assert state["instances"]["a"]["kind"] == "stale"
    assert state["instances"]["a"]["clock_cap_mhz"] is None
    # 300 W at 1000 MHz scaled to 1600 MHz: more than it last drew.
    assert state["reserved_w"] > 300.0
    cap_b, _ = svc.cap_for("b")
    assert cap_b is not None and cap_b < 1600
    assert state["predicted_power_w"] <= 700.0


def test_reserve_beyond_cap_is_infeasible() -> None:
    svc, _ = service(cap_w=300.0)
    observe = decision("a", 0, levels=(), measured_w=350.0)
    svc.on_decision("a", observe, NAMES)
    svc.on_decision("b", decision("b", 0), NAMES)
    svc.on_decision("b", decision("b", 1), NAMES)
    state = svc.state(NAMES)
    assert state["instances"]["a"]["kind"] == "fixed"
    assert state["reserved_w"] == 350.0
    assert state["infeasible"] and state["conflict"]
    assert svc.cap_for("b") == (800, True)  # everything controllable at its floor


def test_an_unmeasured_daemon_and_a_missing_one_are_unknown_not_counted() -> None:
    svc, _ = service()
    old = AdmissionDecision.from_json(_bare("a"))
    names = ("a", "b", "c")
    assert svc.on_decision("a", old, names) == (None, False)
    svc.on_decision("b", decision("b", 0), names)
    svc.on_decision("b", decision("b", 1), names)
    state = svc.state(names)
    assert state["instances"]["a"]["kind"] == "unknown"
    assert state["instances"]["c"]["kind"] == "no-daemon"
    assert state["reserved_w"] == 0.0


def test_removed_instance_is_forgotten() -> None:
    svc, clock = service(cap_w=500.0)
    one_epoch(svc, clock, 0)
    svc.on_decision("b", decision("b", 1), ("b",))
    svc.on_decision("b", decision("b", 2), ("b",))
    assert set(svc.state(("b",))["instances"]) == {"b"}
    assert "a" not in svc._views


# ------------------------------------------------------------- over HTTP


async def test_decision_ack_carries_cap_and_fleet_endpoint_reports_it(
    tmp_path: Path, backend: FakeBackend, backend2: FakeBackend
) -> None:
    clock = ManualClock()
    router = await start_router(
        [f"a={backend.url}", f"b={backend2.url}"],
        tmp_path / "state",
        clock=clock,
        fleet_budget=FleetBudgetSettings(cap_w=700.0),
    )
    try:
        acks = []
        for epoch in range(3):
            for name in NAMES:
                url = f"{router.url}/kairos/v1/instances/{name}/decision"
                status, ack = await control("POST", url, decision(name, epoch).to_json())
                assert status == 200 and ack["accepted"]
                acks.append(ack)
                clock.advance(0.25)
        assert acks[-1]["clock_cap_mhz"] is not None and acks[-1]["clock_cap_mhz"] < 1600
        status, fleet = await control("GET", router.url + "/kairos/v1/fleet")
        assert status == 200 and fleet["enabled"] and fleet["cap_w"] == 700.0
        assert fleet["predicted_power_w"] <= 700.0 and fleet["measured_power_w"] == 800.0
        assert fleet["instances"]["b"]["clock_cap_mhz"] == acks[-1]["clock_cap_mhz"]
    finally:
        await router.stop()


async def test_fleet_metrics_exported(tmp_path: Path, backend: FakeBackend) -> None:
    clock = ManualClock()
    router = await start_router(
        [f"a={backend.url}"], tmp_path / "s", clock=clock, fleet_budget=FleetBudgetSettings(500.0)
    )
    fleet = router.core.fleet
    assert fleet is not None
    try:
        for epoch in range(2):
            fleet.on_decision("a", decision("a", epoch), ["a"])
        text = router.core.metrics.render().decode()
    finally:
        await router.stop()
    assert "kairos_router_fleet_cap_watts 500.0" in text
    assert 'kairos_router_fleet_clock_cap_mhz{instance="a"}' in text
    assert "kairos_router_fleet_rounds_total 2.0" in text


async def test_fleet_endpoint_without_budget_and_behind_control_auth(
    tmp_path: Path, backend: FakeBackend
) -> None:
    router = await start_router([backend.url], tmp_path / "s", control_token="s3cret")
    try:
        url = router.url + "/kairos/v1/fleet"
        status, _ = await control("GET", url)
        assert status == 401
        status, body = await control("GET", url, headers={"Authorization": "Bearer s3cret"})
        assert status == 200 and body["enabled"] is False
        assert router.core.fleet is None
    finally:
        await router.stop()

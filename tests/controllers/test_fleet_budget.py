"""The fleet power budget coordinator (docs/beyond.md §4)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controllers import Cap, ControlDecision, FrequencyLevels, ModelReport, Reason
from controllers.errors import InvalidConfigError
from controllers.fleet_budget import FleetBudget, FleetBudgetConfig, InstancePower

LEVELS = FrequencyLevels((660, 825, 975, 1140, 1305, 1470, 1620, 1785))


def _view(
    name: str, level: int, power_w: float, slack: float | None = None, measured_level: int = 8
) -> InstancePower:
    report = None if slack is None else ModelReport({lv: slack for lv in range(1, 9)})
    d = ControlDecision(
        epoch=1, level=level, clock_mhz=LEVELS.clock_of(level), reason=Reason.CONTEXT,
        report=report,
    )  # fmt: skip
    return InstancePower(name, LEVELS, d, power_w, LEVELS.clock_of(measured_level))


def test_no_change_under_the_cap() -> None:
    fb = FleetBudget(FleetBudgetConfig(cap_w=2000.0))
    views = [_view("a", 8, 380.0), _view("b", 5, 250.0)]
    out = fb.allocate(views)
    assert out.lowered_levels == 0 and not out.conflict
    assert {k: d.level for k, d in out.decisions.items()} == {"a": 8, "b": 5}


def test_lowers_the_instance_with_most_slack_first() -> None:
    fb = FleetBudget(FleetBudgetConfig(cap_w=700.0))
    views = [_view("tight", 8, 380.0, slack=0.2), _view("loose", 8, 380.0, slack=2.0)]
    out = fb.allocate(views)
    assert out.decisions["loose"].level < out.decisions["tight"].level == 8
    assert out.predicted_power_w <= 700.0
    assert not out.conflict
    loose = out.decisions["loose"]
    assert loose.cap is Cap.FLEET and loose.label == f"fleet-cap({loose.reason})"


def test_reserved_power_is_taken_out_of_the_cap() -> None:
    """Power nobody can lower (a stale or observe-only instance) shrinks what
    the controllable instances may draw: same views, same cap, lower clocks."""
    views = [_view("a", 8, 380.0, slack=2.0), _view("b", 8, 380.0, slack=2.0)]
    free = FleetBudget(FleetBudgetConfig(cap_w=900.0)).allocate(views)
    held = FleetBudget(FleetBudgetConfig(cap_w=900.0)).allocate(views, reserved_w=300.0)
    assert free.lowered_levels == 0
    assert held.lowered_levels > 0 and held.predicted_power_w <= 600.0
    assert held.effective_cap_w == pytest.approx(600.0)


def test_never_lowers_below_an_instance_efficient_floor() -> None:
    """An instance whose controller says levels under 3 are clock-bound (no
    saving) is not taken below 3; the budget reports the cap as infeasible."""
    d = ControlDecision(
        epoch=1,
        level=8,
        clock_mhz=1785,
        reason=Reason.SLO_BOOST,
        report=ModelReport({7: 1.0}, efficient_floor_level=3),
    )
    floored = InstancePower("f", LEVELS, d, 380.0, 1785)
    out = FleetBudget(FleetBudgetConfig(cap_w=100.0)).allocate([floored, _view("g", 8, 380.0)])
    assert out.decisions["f"].level == 3
    assert out.decisions["g"].level == 1
    assert out.infeasible and out.conflict


def test_a_repeated_measurement_is_learned_once() -> None:
    fb = FleetBudget(FleetBudgetConfig(cap_w=2000.0))
    slow = _view("slow", 8, 380.0)
    for level in (8, 7, 6):
        fb.allocate([slow, _view("fast", level, 300.0, measured_level=level)])
    # "slow" posted one closed epoch three times; "fast" three different ones.
    assert fb.fit_samples == 4


def test_reports_conflict_when_slack_runs_out() -> None:
    fb = FleetBudget(FleetBudgetConfig(cap_w=500.0))
    views = [_view("a", 8, 380.0, slack=-0.5), _view("b", 8, 380.0, slack=-0.5)]
    out = fb.allocate(views)
    assert out.conflict
    assert fb.conflict_epochs == 1


def test_reports_infeasible_when_floor_is_over_the_cap() -> None:
    fb = FleetBudget(FleetBudgetConfig(cap_w=50.0))
    out = fb.allocate([_view("a", 8, 380.0), _view("b", 8, 380.0)])
    assert out.infeasible and out.conflict
    assert all(d.level == 1 for d in out.decisions.values())


def test_headroom_tracks_epochs_over_the_cap() -> None:
    fb = FleetBudget(FleetBudgetConfig(cap_w=700.0, correction_gain=1.0, quantile=0.9))
    fb.allocate([_view("a", 8, 380.0, slack=1.0), _view("b", 8, 380.0, slack=1.0)])
    # Measured 760 W > 700 W: the headroom grows by q·1 % of the cap = 6.3 W.
    over = fb.allocate([_view("a", 6, 380.0, 1.0, 6), _view("b", 6, 380.0, 1.0, 6)])
    assert over.effective_cap_w == pytest.approx(700.0 - 6.3)
    # Measured 600 W < 700 W: it shrinks by (1 − q)·1 % = 0.7 W.
    under = fb.allocate([_view("a", 6, 300.0, 1.0, 6), _view("b", 6, 300.0, 1.0, 6)])
    assert under.effective_cap_w == pytest.approx(700.0 - 6.3 + 0.7)


def test_invalid_cap() -> None:
    with pytest.raises(InvalidConfigError):
        FleetBudgetConfig(cap_w=0.0)


@settings(max_examples=80, deadline=None)
@given(
    cap=st.floats(100.0, 2000.0),
    inst=st.lists(
        st.tuples(st.integers(1, 8), st.floats(60.0, 400.0), st.floats(-1.0, 3.0)),
        min_size=1,
        max_size=6,
    ),
)
def test_never_exceeds_the_cap_when_feasible(
    cap: float, inst: list[tuple[int, float, float]]
) -> None:
    fb = FleetBudget(FleetBudgetConfig(cap_w=cap))
    views = [_view(f"i{n}", lv, w, s) for n, (lv, w, s) in enumerate(inst)]
    out = fb.allocate(views)
    assert all(out.decisions[v.name].level <= v.decision.level for v in views)
    if not out.infeasible:
        assert out.predicted_power_w <= cap + 1e-6
    else:
        assert all(d.level == 1 for d in out.decisions.values())

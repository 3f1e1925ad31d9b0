"""Energy attribution: an interval's parts sum to its measured energy, shares follow work."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controllers.energy_attribution import (
    AgentWork,
    EnergyAccountant,
    IntervalSplit,
    WorkWeights,
    request_work,
    split_interval,
)

energies = st.floats(0.0, 1e6, allow_nan=False)
durations = st.floats(0.0, 3600.0, allow_nan=False)
idles = st.none() | st.floats(0.0, 2000.0, allow_nan=False)
works = st.dictionaries(
    st.text("abcdef", min_size=1, max_size=3),
    st.builds(
        AgentWork,
        st.floats(0.0, 100.0, allow_nan=False),
        st.floats(0.0, 1e5, allow_nan=False),
        st.floats(0.0, 100.0, allow_nan=False),
    ),
    max_size=6,
)


def _parts(s: IntervalSplit) -> float:
    return s.attributed_j + s.unattributed_j + s.carried_out_j - s.carried_in_j


@given(energies, durations, works, idles, st.booleans(), st.floats(0.0, 1e5, allow_nan=False))
def test_parts_sum_to_measured_and_are_non_negative(
    energy: float,
    duration: float,
    work: dict[str, AgentWork],
    idle: float | None,
    in_flight: bool,
    carried: float,
) -> None:
    split = split_interval(
        energy, duration, work, idle_power_w=idle, in_flight=in_flight, carried_in_j=carried
    )
    assert math.isclose(_parts(split), energy, rel_tol=1e-9, abs_tol=1e-6)
    assert split.unattributed_j >= 0 and split.carried_out_j >= 0
    for share in split.shares.values():
        assert share.prefill_j >= 0 and share.decode_j >= 0
    assert split.static_j <= energy + 1e-9


@given(works, st.text("xyz", min_size=1, max_size=2), st.floats(0.01, 50.0))
def test_more_work_never_means_less_energy(
    work: dict[str, AgentWork], me: str, extra: float
) -> None:
    """Monotone: adding work to one agent raises its share and lowers no one else's share."""
    mine = AgentWork(1.0, 10.0, 0.5)
    before = split_interval(500.0, 5.0, {**work, me: mine}, idle_power_w=50.0, in_flight=False)
    more = AgentWork(mine.prefill_s + extra, mine.decode_tokens, mine.context_s)
    after = split_interval(500.0, 5.0, {**work, me: more}, idle_power_w=50.0, in_flight=False)
    assert after.shares[me].energy_j >= before.shares[me].energy_j - 1e-9
    for aid, share in after.shares.items():
        if aid != me:
            assert share.energy_j <= before.shares[aid].energy_j + 1e-9


def test_idle_draw_is_unattributed_and_no_work_in_flight_is_carried() -> None:
    work = {"a": AgentWork(prefill_s=1.0), "b": AgentWork(prefill_s=3.0)}
    split = split_interval(1000.0, 10.0, work, idle_power_w=50.0, in_flight=False)
    assert split.unattributed_j == pytest.approx(500.0)
    assert split.shares["a"].energy_j == pytest.approx(125.0)
    assert split.shares["b"].energy_j == pytest.approx(375.0)
    held = split_interval(1000.0, 10.0, {}, idle_power_w=50.0, in_flight=True)
    assert (held.unattributed_j, held.carried_out_j) == (pytest.approx(500.0), pytest.approx(500.0))
    later = split_interval(600.0, 10.0, work, idle_power_w=50.0, in_flight=False, carried_in_j=500)
    assert later.attributed_j == pytest.approx(600.0)


def test_request_work_counts_uncached_prefill_and_growing_context() -> None:
    w = WorkWeights(prefill_s_per_token=1.0, attn_s_per_pair=0.0, kv_s_per_token=1.0)
    prefill, tokens, context = request_work(w, 10, 4, 3)
    assert (prefill, tokens, context) == (6.0, 3.0, 3 * 10 + 3)
    assert request_work(w, 5, 99, 0) == (0.0, 0.0, 0.0)  # cached clamped to the prompt


def test_weights_from_the_performance_model_and_validation() -> None:
    w = WorkWeights.from_decode_prefill(0.01, 0.001, 0.002, 0.015, -1.0)
    assert w.step_shared_s == 0.01 and w.kv_s_per_token == pytest.approx(2e-8)
    assert w.attn_s_per_pair == 0.0
    with pytest.raises(ValueError, match="finite"):
        WorkWeights(token_s=math.nan)


requests = st.lists(
    st.tuples(
        st.sampled_from(["a", "b", "c"]),
        st.integers(1, 5000),
        st.integers(0, 5000),
        st.integers(0, 500),
        st.floats(0.0, 100.0),
        st.floats(0.0, 30.0),
    ),
    max_size=30,
)


@settings(max_examples=60)
@given(requests, st.lists(st.floats(0.0, 5000.0, allow_nan=False), min_size=1, max_size=25))
def test_accountant_totals_sum_to_measured(
    reqs: list[tuple[str, int, int, int, float, float]], energies_j: list[float]
) -> None:
    """Whatever the requests' spans and the intervals, attributed + unattributed
    equals measured after a flush, and every agent's share is non-negative."""
    acc = EnergyAccountant(max_lag_s=20.0)
    reqs = sorted(reqs, key=lambda r: r[4] + r[5])
    t, i = 0.0, 0
    for k, energy in enumerate(energies_j):
        t = 5.0 * (k + 1)
        while i < len(reqs) and reqs[i][4] + reqs[i][5] <= t:
            aid, p, c, n, start, length = reqs[i]
            acc.record("gpu0", aid, p, c, n, start_s=start, end_s=start + length)
            i += 1
        since = min((r[4] for r in reqs[i:] if r[4] < t), default=None)
        acc.close("gpu0", energy, t, in_flight_since_s=since, start_s=0.0)
    acc.flush("gpu0")
    inst = acc.instances["gpu0"]
    assert math.isclose(inst.counted_j, sum(energies_j), rel_tol=1e-9, abs_tol=1e-6)
    assert math.isclose(
        sum(s.energy_j for s in acc.agents.values()), inst.attributed_j, rel_tol=1e-9, abs_tol=1e-6
    )
    assert all(s.prefill_j >= 0 and s.decode_j >= 0 for s in acc.agents.values())


def test_a_long_request_is_spread_over_the_intervals_it_ran_in() -> None:
    """A request finishing late gets the energy of the intervals it ran in, not its
    neighbour that happened to finish during one of them."""
    acc = EnergyAccountant(idle_power_w=0.0)
    acc.close("g", 100.0, 5.0, in_flight_since_s=0.0, start_s=0.0)  # both running
    acc.record("g", "short", 100, 0, 50, start_s=4.0, end_s=6.0)
    acc.close("g", 100.0, 10.0, in_flight_since_s=0.0)  # long still running: held
    assert acc.agents == {}
    acc.record("g", "long", 100, 0, 150, start_s=0.0, end_s=12.0)
    acc.close("g", 100.0, 15.0, in_flight_since_s=None)
    assert sum(s.energy_j for s in acc.agents.values()) == pytest.approx(300.0)
    assert acc.agents["long"].energy_j > 2 * acc.agents["short"].energy_j
    assert not acc.has_open_work("long")


def test_idle_power_is_learned_from_an_interval_without_work() -> None:
    acc = EnergyAccountant()
    acc.close("g", 400.0, 10.0, in_flight_since_s=None, start_s=0.0)  # 40 W doing nothing
    acc.record("g", "a", 1000, 0, 100, start_s=10.0, end_s=19.0)
    acc.close("g", 2400.0, 20.0, in_flight_since_s=None)
    assert acc.instances["g"].idle_power_w == pytest.approx(40.0)
    assert acc.agents["a"].energy_j == pytest.approx(2000.0)
    assert acc.pop_agent("a").energy_j == pytest.approx(2000.0)
    assert acc.pop_agent("a").energy_j == 0.0

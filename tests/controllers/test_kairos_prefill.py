"""Prefill at the top clock (docs/control-law.md, point 9): queued compute-bound
prompt work lifts the level; held requests and the paper policy do not."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controllers import (
    AgentView,
    FrequencyLevels,
    InstanceSnapshot,
    InvalidConfigError,
    KairosConfig,
    KairosController,
)
from controllers.registry import kairos_config_for

LEVELS = FrequencyLevels((600, 800, 1000, 1200, 1400))
CAP = 1_000_000


def _snap(ongoing: tuple[AgentView, ...], pending: tuple[AgentView, ...] = ()) -> InstanceSnapshot:
    return InstanceSnapshot(
        now_s=100.0, epoch=3, capacity_tokens=CAP, ongoing=ongoing, pending=pending
    )


def _agent(aid: str, prefill: int, ctx: int = 20_000) -> AgentView:
    return AgentView(aid, 0.0, context_tokens=ctx, in_flight=True, prefill_tokens=prefill)


def test_queued_prefill_at_the_threshold_runs_the_top_clock() -> None:
    ctrl = KairosController(LEVELS, KairosConfig(prefill_boost_tokens=10_000))
    quiet = ctrl.decide(_snap((_agent("a", 4_000), _agent("b", 5_999))))
    assert quiet.level == 1 and quiet.reason == "context"
    busy = ctrl.decide(_snap((_agent("a", 4_000), _agent("b", 6_000))))
    assert busy.level == LEVELS.count and busy.reason == "prefill"
    assert busy.clock_mhz == 1400 and not busy.boost


def test_held_requests_do_not_count() -> None:
    ctrl = KairosController(LEVELS, KairosConfig(prefill_boost_tokens=10_000))
    held = AgentView("h", 0.0, in_flight=True, prefill_tokens=50_000, waiting_since_s=99.0)
    assert ctrl.decide(_snap((_agent("a", 0),), (held,))).reason != "prefill"


def test_default_on_paper_and_predictive_off() -> None:
    assert KairosConfig().prefill_boost_tokens is not None
    assert kairos_config_for("predictive").prefill_boost_tokens is None
    paper = KairosController(LEVELS, kairos_config_for("kairos-paper"))
    assert paper.decide(_snap((_agent("a", 900_000),))).level == 1


@pytest.mark.parametrize("tokens", [0, -5])
def test_bad_threshold_is_rejected(tokens: int) -> None:
    with pytest.raises(InvalidConfigError):
        KairosConfig(prefill_boost_tokens=tokens)


@given(
    contexts=st.lists(st.integers(0, 400_000), min_size=1, max_size=6),
    prefills=st.lists(st.integers(0, 60_000), min_size=6, max_size=6),
)
def test_the_boost_only_ever_raises_the_level(contexts: list[int], prefills: list[int]) -> None:
    """Same admissions, a level never below the law's without the boost."""
    pairs = zip(contexts, prefills[: len(contexts)], strict=True)
    agents = tuple(_agent(f"a{i}", p, c) for i, (c, p) in enumerate(pairs))
    with_boost = KairosController(LEVELS, KairosConfig(prefill_boost_tokens=30_000))
    without = KairosController(LEVELS, KairosConfig(prefill_boost_tokens=None))
    a, b = with_boost.decide(_snap(agents)), without.decide(_snap(agents))
    assert a.level >= b.level and a.admit == b.admit
    assert a.defer_admissions == b.defer_admissions
    assert (a.level > b.level) <= (sum(prefills[: len(contexts)]) >= 30_000)

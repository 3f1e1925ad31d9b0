"""Prefill at the top clock (point 9, :class:`~controllers.stages.PrefillBoost`):
queued compute-bound prompt work lifts the level; held requests, ``kairos-alg1``
and ``predictive`` (whose model prices prefill) do not."""

from __future__ import annotations

import pytest

from controllers import KAIROS, KAIROS_ALG1, InvalidConfigError, KairosController, Reason
from controllers.kairos import PREDICTIVE_NETS
from controllers.stages import PrefillBoost
from controllers.testing import FIVE_LEVELS, active, agent, snapshot
from controllers.types import AgentView, InstanceSnapshot

LAW = KAIROS.varied(prefill_boost_tokens=10_000)


def _snap(ongoing: tuple[AgentView, ...], pending: tuple[AgentView, ...] = ()) -> InstanceSnapshot:
    return snapshot(*ongoing, pending=pending, now_s=100.0, capacity_tokens=1_000_000)


def _agent(aid: str, prefill: int, ctx: int = 20_000) -> AgentView:
    return active(aid, ctx, prefill_tokens=prefill)


def test_queued_prefill_at_the_threshold_runs_the_top_clock() -> None:
    ctrl = KairosController(FIVE_LEVELS, LAW)
    quiet = ctrl.decide(_snap((_agent("a", 4_000), _agent("b", 5_999))))
    assert quiet.level == 1 and quiet.reason is Reason.CONTEXT
    busy = ctrl.decide(_snap((_agent("a", 4_000), _agent("b", 6_000))))
    assert busy.level == FIVE_LEVELS.count and busy.reason is Reason.PREFILL
    assert busy.clock_mhz == 1400 and not busy.boost


def test_held_requests_do_not_count() -> None:
    held = agent("h", in_flight=True, prefill_tokens=50_000, waiting_since_s=99.0)
    d = KairosController(FIVE_LEVELS, LAW).decide(_snap((_agent("a", 0),), (held,)))
    assert d.reason is not Reason.PREFILL


def test_kairos_has_it_alg1_and_predictive_do_not() -> None:
    assert KAIROS.setting("prefill_boost_tokens") == 65536
    for law in (KAIROS_ALG1, PREDICTIVE_NETS):
        assert not any(isinstance(s, PrefillBoost) for s in law.stages)
    paper = KairosController(FIVE_LEVELS, KAIROS_ALG1)
    assert paper.decide(_snap((_agent("a", 900_000),))).level == 1


@pytest.mark.parametrize("tokens", [0, -5])
def test_bad_threshold_is_rejected(tokens: int) -> None:
    with pytest.raises(InvalidConfigError):
        PrefillBoost(prefill_boost_tokens=tokens)

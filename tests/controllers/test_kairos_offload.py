"""KAIROS for vLLM with a CPU KV tier (docs/control-law.md, point 13): idle
contexts are no pressure, active ones still are, and the ``kairos-offload``
policy admits at once with the long-context ceiling on."""

from __future__ import annotations

import dataclasses

from hypothesis import given
from hypothesis import strategies as st

from controllers import AgentView, InstanceSnapshot, KairosConfig, KairosController
from controllers.registry import kairos_config_for, make_controller
from tests.controllers.test_kairos_busy_ceiling import CAP, LEVELS, NOW
from tests.controllers.test_kairos_busy_ceiling import CFG as CEILING

CFG = dataclasses.replace(CEILING, idle_contexts_offloaded=True)


def _active(aid: str, ctx: int) -> AgentView:
    return AgentView(aid, 0.0, context_tokens=ctx, in_flight=True)


def _idle(aid: str, ctx: int) -> AgentView:
    return AgentView(aid, 0.0, context_tokens=ctx, in_flight=False, last_active_s=NOW - 60.0)


def _snap(*ongoing: AgentView, pending: tuple[AgentView, ...] = ()) -> InstanceSnapshot:
    return InstanceSnapshot(
        now_s=NOW, epoch=2, capacity_tokens=CAP, ongoing=ongoing, pending=pending
    )


def test_idle_contexts_past_gamma_are_no_pressure_with_a_cpu_tier() -> None:
    # U = 240K ≥ γ·U_max = 180K, but only 140K of it is active.
    snap = _snap(_active("a", 140_000), _idle("b", 100_000))
    offloaded = KairosController(LEVELS, CFG).decide(snap)
    assert offloaded.level == 3 and offloaded.reason == "busy-ceiling"
    # Without the tier the same U is pressure: every context counts (Eq. 8's top).
    plain = KairosController(LEVELS, dataclasses.replace(CFG, idle_contexts_offloaded=False))
    assert plain.decide(snap).level == 5


def test_active_contexts_past_gamma_still_press() -> None:
    # 190K active ≥ γ·U_max: the running requests' KV must drain, the paper's law stands.
    d = KairosController(LEVELS, CFG).decide(_snap(_active("a", 95_000), _active("b", 95_000)))
    assert d.level == 5 and d.reason != "busy-ceiling"


def test_held_agents_still_press() -> None:
    ctrl = KairosController(LEVELS, CFG)
    assert ctrl.under_pressure(_snap(_active("a", 10_000), pending=(_active("p", 5_000),)), 10_000)
    assert not ctrl.under_pressure(_snap(_active("a", 10_000), _idle("b", 190_000)), 200_000)


def test_kairos_offload_policy_admits_at_once_with_the_ceiling() -> None:
    cfg = kairos_config_for("kairos-offload")
    assert not cfg.thrashing_avoidance and cfg.idle_contexts_offloaded and cfg.busy_ceiling
    assert not KairosConfig().idle_contexts_offloaded  # the default policy is unchanged
    ctrl = make_controller("kairos-offload", LEVELS)
    d = ctrl.decide(_snap(_active("o", 190_000), pending=(_active("p1", 50_000),)))
    assert d.admit == ("p1",) and not d.defer_admissions


@given(
    active=st.lists(st.integers(0, 150_000), max_size=4),
    idle=st.lists(st.integers(0, 300_000), max_size=4),
)
def test_offloaded_idle_contexts_never_raise_the_level(active: list[int], idle: list[int]) -> None:
    """Adding idle sessions to an instance with a CPU tier leaves its level as is
    (they neither press nor count towards Eq. 9), whatever their size."""
    ctrl = KairosController(LEVELS, CFG)
    base = [_active(f"a{i}", c) for i, c in enumerate(active)]
    extra = [_idle(f"i{i}", c) for i, c in enumerate(idle)]
    assert ctrl.decide(_snap(*base, *extra)).level == ctrl.decide(_snap(*base)).level

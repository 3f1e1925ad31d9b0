"""Long-context work: the clock floor at the memory knee (point 11,
:class:`~controllers.stages.LongContextFloor`) and, where vLLM keeps a CPU KV tier,
the ceiling at that same level (points 12–13, :class:`~controllers.stages.TierCeiling`).

Active agents whose mean context is long keep the level at or above the knee; short
contexts, idle agents and ``kairos-alg1`` do not. With a tier, Eq. 9's higher levels
are held down to the floor's unless prefill is waiting or the instance is under
pressure; Eq. 8 and the boosts are never capped; without a tier there is no
ceiling (measured and not adopted: docs/notes/configuration.md)."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controllers import KAIROS, KAIROS_ALG1, InvalidConfigError, KairosController, Reason
from controllers.kairos import PREDICTIVE_NETS
from controllers.stages import LongContextFloor, TierCeiling
from controllers.testing import FIVE_LEVELS, active, idle, newcomer, snapshot
from controllers.types import AgentView, InstanceSnapshot
from tests.branches import Branches

NOW = 100.0
TIER = 2_000_000
LAW = KAIROS.varied(busy_floor_context_tokens=50_000, prefill_boost_tokens=None)
"""``kairos`` with a 50K-token floor threshold and no prefill boost."""
NO_FLOOR = KAIROS.varied(busy_floor_mhz=None, prefill_boost_tokens=None)


def _snap(
    *ongoing: AgentView,
    cap: int = 10_000_000,
    pending: tuple[AgentView, ...] = (),
    tier: int = 0,
) -> InstanceSnapshot:
    return snapshot(*ongoing, pending=pending, now_s=NOW, capacity_tokens=cap,
                    offload_tokens=tier)  # fmt: skip


def _idle(aid: str, ctx: int, idle_s: float = 60.0) -> AgentView:
    return idle(aid, ctx, now_s=NOW, idle_s=idle_s)


# -- the floor ---------------------------------------------------------------------------


def test_long_active_context_runs_at_the_first_level_over_the_knee() -> None:
    d = KairosController(FIVE_LEVELS, LAW).decide(_snap(active("a", 120_000)))
    assert d.level == 3 and d.clock_mhz == 1000 and d.reason is Reason.BUSY_FLOOR


def test_the_mean_over_active_agents_decides() -> None:
    ctrl = KairosController(FIVE_LEVELS, LAW)
    # 120K + 10K: mean 65K ≥ 50K → floor; 120K + 10K + 10K: mean 46.7K < 50K → none.
    assert ctrl.decide(_snap(active("a", 120_000), active("b", 10_000))).level == 3
    short = ctrl.decide(_snap(active("a", 120_000), active("b", 10_000), active("c", 10_000)))
    assert short.level == 1 and short.reason is Reason.CONTEXT


def test_idle_agents_neither_lift_nor_dilute() -> None:
    ctrl = KairosController(FIVE_LEVELS, LAW)
    assert ctrl.decide(_snap(_idle("a", 200_000, 30.0))).level == 1
    assert ctrl.decide(_snap(active("a", 120_000), _idle("b", 1_000, 30.0))).level == 3
    # Active until ``idle_after_s`` (10 s) after its last request.
    assert ctrl.decide(_snap(_idle("a", 200_000, idle_s=5.0))).level == 3


def test_never_lowers_the_context_level() -> None:
    # Eq. 9: ⌊140K / (0.75·200K) · 4⌋ + 1 = 4, above the floor's level 3: it stands.
    big = KairosController(FIVE_LEVELS, LAW).decide(_snap(active("a", 140_000), cap=200_000))
    assert big.level == 4 and big.reason is Reason.CONTEXT


def test_floor_above_every_level_is_the_top_and_below_every_level_is_off() -> None:
    top = KAIROS.varied(busy_floor_mhz=5_000, busy_floor_context_tokens=0)
    assert KairosController(FIVE_LEVELS, top).decide(_snap(active("a", 1))).level == 5
    off = KAIROS.varied(busy_floor_mhz=500, busy_floor_context_tokens=0)
    assert KairosController(FIVE_LEVELS, off).decide(_snap(active("a", 1))).level == 1


def test_kairos_has_it_alg1_and_predictive_do_not() -> None:
    assert any(isinstance(s, LongContextFloor) for s in KAIROS.stages)
    for law in (KAIROS_ALG1, PREDICTIVE_NETS):
        assert not any(isinstance(s, LongContextFloor | TierCeiling) for s in law.stages)
    paper = KairosController(FIVE_LEVELS, KAIROS_ALG1)
    assert paper.decide(_snap(active("a", 300_000))).level == 1


@pytest.mark.parametrize(
    "changes", [{"busy_floor_mhz": 0}, {"busy_floor_mhz": -1}, {"busy_floor_context_tokens": -1}]
)
def test_bad_values_are_rejected(changes: dict[str, int]) -> None:
    with pytest.raises(InvalidConfigError):
        LongContextFloor(**changes)


@given(
    contexts=st.lists(st.integers(0, 400_000), min_size=1, max_size=6),
    at_work=st.lists(st.booleans(), min_size=6, max_size=6),
)
def test_the_floor_only_ever_raises_the_level(contexts: list[int], at_work: list[bool]) -> None:
    """Same admissions; a level never below the law's without the floor, and above
    it only when the active agents' mean context reaches the threshold."""
    agents = tuple(
        active(f"a{i}", c) if on else _idle(f"a{i}", c)
        for i, (c, on) in enumerate(zip(contexts, at_work, strict=False))
    )
    snap = _snap(*agents, cap=1_000_000)
    with_floor = KairosController(FIVE_LEVELS, LAW).decide(snap)
    without = KairosController(FIVE_LEVELS, NO_FLOOR).decide(snap)
    assert with_floor.level >= without.level and with_floor.admit == without.admit
    assert with_floor.defer_admissions == without.defer_admissions
    on = [c for c, a in zip(contexts, at_work, strict=False) if a]
    lifted = with_floor.level > without.level
    assert lifted <= (bool(on) and sum(on) >= 50_000 * len(on))
    if on and sum(on) >= 50_000 * len(on):
        assert with_floor.clock_mhz >= 1000


# -- the ceiling, with a CPU KV tier -------------------------------------------------------


def test_long_context_decode_runs_at_the_floor_not_at_eq9() -> None:
    # 140K of 200K gives Eq. 9's level 4 (1200 MHz), held at the floor's level 3.
    d = KairosController(FIVE_LEVELS, LAW).decide(
        _snap(active("a", 140_000), cap=200_000, tier=TIER)
    )
    assert d.level == 3 and d.clock_mhz == 1000 and d.reason is Reason.BUSY_CEILING


def test_without_a_tier_there_is_no_ceiling() -> None:
    d = KairosController(FIVE_LEVELS, LAW).decide(_snap(active("a", 140_000), cap=200_000))
    assert d.level == 4 and d.reason is Reason.CONTEXT


def test_waiting_prefill_lifts_the_ceiling() -> None:
    snap = _snap(active("a", 140_000, prefill_tokens=2_000), cap=200_000, tier=TIER)
    d = KairosController(FIVE_LEVELS, LAW).decide(snap)
    assert d.level == 4 and d.reason is Reason.CONTEXT


def test_held_agents_or_a_full_cache_keep_the_paper_law() -> None:
    held = (newcomer("h", 30_000, now_s=NOW, waited_s=5.0),)  # within the grace
    d = KairosController(FIVE_LEVELS, LAW).decide(
        _snap(active("a", 140_000), cap=200_000, pending=held, tier=TIER)
    )
    assert d.level > 3 and d.reason in (Reason.CONTEXT, Reason.CONTEXT_HIGH)
    # α = 1 keeps Eq. 9 under the top while U ≥ γ·U_max (192K ≥ 190K): no ceiling.
    full = LAW.varied(alpha=1.0)
    d = KairosController(FIVE_LEVELS, full).decide(
        _snap(active("a", 192_000), cap=200_000, tier=TIER)
    )
    assert d.level == 4 and d.reason is Reason.CONTEXT


def test_eq8_top_clock_is_never_capped() -> None:
    d = KairosController(FIVE_LEVELS, LAW).decide(
        _snap(active("a", 160_000), cap=200_000, tier=TIER)
    )
    assert d.level == FIVE_LEVELS.count and d.reason is Reason.CONTEXT_HIGH


def test_short_contexts_have_no_ceiling() -> None:
    agents = (active("a", 40_000), active("b", 40_000), active("c", 40_000))
    d = KairosController(FIVE_LEVELS, LAW).decide(_snap(*agents, cap=200_000, tier=TIER))
    assert d.level == 4 and d.reason is Reason.CONTEXT  # mean 40K < 50K: no floor, no ceiling


BIG = 1_000_000  # U_max of the property test: Eq. 9 gives level 4 for U in [562.5K, 750K)


@st.composite
def _instance(draw: st.DrawFn) -> tuple[list[int], list[int], bool]:
    """(contexts, prefill tokens, a newcomer held): any instance, or half the time
    one whose U is in level 4's band (the mean context ≥ 112.5K is long), where
    the ceiling holds the level down unless prefill waits or someone is held."""
    n = draw(st.integers(1, 5))
    if not draw(st.booleans()):
        contexts = draw(st.lists(st.integers(0, 300_000), min_size=n, max_size=n))
        prefill = draw(st.lists(st.sampled_from([0, 1_000, 3_000]), min_size=n, max_size=n))
        return contexts, prefill, draw(st.booleans())
    total = draw(st.integers(562_500, 749_999))
    cuts = sorted(draw(st.lists(st.integers(0, total), min_size=n - 1, max_size=n - 1)))
    contexts = [b - a for a, b in itertools.pairwise([0, *cuts, total])]
    prefill = [0] * n
    noise = draw(st.sampled_from(["quiet", "prefill", "held"]))
    if noise == "prefill":
        prefill[draw(st.integers(0, n - 1))] = draw(st.integers(1, 3_000))
    return contexts, prefill, noise == "held"


def test_the_ceiling_only_lowers_to_the_floor() -> None:
    """Same admissions and boosts with a tier as without; the level is never above
    the law's without one, and below it only at the floor's level with no prefill
    waiting and nobody held. Seeds 1-20, 100 examples each: the ceiling held the
    level down in 14-49 and stood aside in level 4's band for prefill or a held
    agent in 13-37 (tests/branches.py's strategy, measured on the opt-in ceiling it
    replaced)."""
    branches = Branches()

    @given(_instance())
    def check(instance: tuple[list[int], list[int], bool]) -> None:
        contexts, prefill, held = instance
        pairs = enumerate(zip(contexts, prefill, strict=True))
        agents = tuple(active(f"a{i}", c, prefill_tokens=p) for i, (c, p) in pairs)
        pending = (newcomer("h", 10_000, now_s=NOW, waited_s=5.0),) if held else ()
        law = KairosController(FIVE_LEVELS, LAW)
        on = law.decide(_snap(*agents, cap=BIG, pending=pending, tier=TIER))
        off = KairosController(FIVE_LEVELS, LAW).decide(_snap(*agents, cap=BIG, pending=pending))
        assert on.admit == off.admit and on.defer_admissions == off.defer_admissions
        assert on.boost == off.boost and on.level <= off.level
        if on.level < off.level:
            branches.reached("held down")
            assert on.level == 3 and on.reason is Reason.BUSY_CEILING
            assert not held and not any(prefill)
        elif off.level == 4 and (held or any(prefill)):
            branches.reached("stood aside")

    check()
    branches.require(**{"held down": 5, "stood aside": 5})

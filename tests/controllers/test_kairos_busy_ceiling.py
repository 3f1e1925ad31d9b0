"""The long-context decode ceiling (docs/control-law.md, point 12, opt-in): while
the busy floor applies, Eq. 9's higher levels are held down to the floor's level
unless prefill is waiting or the instance is under pressure; Eq. 8 and the boosts
are not capped, admissions never change, and neither policy has it by default."""

from __future__ import annotations

import dataclasses
import itertools

from hypothesis import given
from hypothesis import strategies as st

from controllers import (
    AgentView,
    FrequencyLevels,
    InstanceSnapshot,
    KairosConfig,
    KairosController,
)
from controllers.registry import kairos_config_for
from tests.branches import Branches

LEVELS = FrequencyLevels((600, 800, 1000, 1200, 1400))
NOW = 100.0
CAP = 200_000
CFG = KairosConfig(
    busy_floor_mhz=900,
    busy_floor_context_tokens=50_000,
    prefill_boost_tokens=None,
    busy_ceiling=True,
)


def _active(aid: str, ctx: int, prefill: int = 0) -> AgentView:
    return AgentView(aid, 0.0, context_tokens=ctx, in_flight=True, prefill_tokens=prefill)


def _snap(*ongoing: AgentView, pending: tuple[AgentView, ...] = ()) -> InstanceSnapshot:
    return InstanceSnapshot(
        now_s=NOW, epoch=2, capacity_tokens=CAP, ongoing=ongoing, pending=pending
    )


def test_long_context_decode_runs_at_the_floor_not_at_eq9() -> None:
    # Eq. 9: ⌊100K / (0.75·200K) · 4⌋ + 1 = 3 (1000 MHz) would already be the floor;
    # 140K gives level 4 (1200 MHz), held at the floor's level 3.
    d = KairosController(LEVELS, CFG).decide(_snap(_active("a", 140_000)))
    assert d.level == 3 and d.clock_mhz == 1000 and d.reason == "busy-ceiling"


def test_waiting_prefill_lifts_the_ceiling() -> None:
    d = KairosController(LEVELS, CFG).decide(_snap(_active("a", 140_000, prefill=2_000)))
    assert d.level == 4 and d.reason == "context"


def test_held_agents_or_a_full_cache_keep_the_paper_law() -> None:
    held = AgentView("h", NOW - 5.0, estimated_context_tokens=30_000)  # within the grace
    d = KairosController(LEVELS, CFG).decide(_snap(_active("a", 140_000), pending=(held,)))
    assert d.level > 3 and d.reason.startswith("context")
    # α = 1 keeps Eq. 9 under the top while U ≥ γ·U_max (192K ≥ 190K): no ceiling.
    full = dataclasses.replace(CFG, alpha=1.0)
    d = KairosController(LEVELS, full).decide(_snap(_active("a", 192_000)))
    assert d.level == 4 and d.reason == "context"


def test_eq8_top_clock_is_never_capped() -> None:
    d = KairosController(LEVELS, CFG).decide(_snap(_active("a", 160_000)))
    assert d.level == LEVELS.count and d.reason == "context-high"


def test_short_contexts_the_default_and_the_paper_policy_have_no_ceiling() -> None:
    agents = (_active("a", 40_000), _active("b", 40_000), _active("c", 40_000))
    d = KairosController(LEVELS, CFG).decide(_snap(*agents))
    assert d.level == 4 and d.reason == "context"  # mean 40K < 50K: no floor, no ceiling
    for policy in ("kairos", "kairos-paper"):
        assert kairos_config_for(policy).busy_ceiling is False  # opt-in
        ctrl = KairosController(LEVELS, kairos_config_for(policy))
        assert ctrl.decide(_snap(_active("a", 140_000))).level == 4


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
    """Same admissions and boosts; the level is never above the law's without the
    ceiling, and below it only at the floor's level with no prefill waiting and
    nobody held. Seeds 1-20, 100 examples each: the ceiling held the level down in
    14-49 and stood aside in level 4's band for prefill or a held agent in 13-37."""
    branches = Branches()

    @given(_instance())
    def check(instance: tuple[list[int], list[int], bool]) -> None:
        contexts, prefill, held = instance
        pairs = enumerate(zip(contexts, prefill, strict=True))
        agents = tuple(_active(f"a{i}", c, prefill=p) for i, (c, p) in pairs)
        pending = (AgentView("h", NOW - 5.0, estimated_context_tokens=10_000),) if held else ()
        snap = InstanceSnapshot(
            now_s=NOW, epoch=1, capacity_tokens=BIG, ongoing=agents, pending=pending
        )
        on = KairosController(LEVELS, CFG).decide(snap)
        off = KairosController(LEVELS, dataclasses.replace(CFG, busy_ceiling=False)).decide(snap)
        assert on.admit == off.admit and on.defer_admissions == off.defer_admissions
        assert on.boost == off.boost and on.level <= off.level
        if on.level < off.level:
            branches.reached("held down")
            assert on.level == 3 and on.reason == "busy-ceiling"
            assert not held and not any(prefill)
        elif off.level == 4 and (held or any(prefill)):
            branches.reached("stood aside")

    check()
    branches.require(**{"held down": 5, "stood aside": 5})

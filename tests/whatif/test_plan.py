"""The calibration plan (whatif/plan.py): inside the engine's limits and the budget."""

from __future__ import annotations

from whatif.plan import Costs, grid, plan
from whatif.probes import DecodeProbe, EngineShape, PrefillProbe

CPU = EngineShape(
    capacity_tokens=196_608, block_size=128, max_model_len=65_536,
    max_num_batched_tokens=2048, max_num_seqs=128,
)  # fmt: skip
COSTS = Costs(token_s=3e-5, pair_s=2.5e-8, step_s=5e-3)


def test_the_grid_stays_within_the_engine() -> None:
    probes = grid(CPU)
    assert probes
    for p in probes:
        if isinstance(p, PrefillProbe):
            assert p.cached + p.uncached <= min(CPU.max_model_len - 1, CPU.capacity_tokens // 2)
            assert p.cached % CPU.block_size == 0
        else:
            assert p.batch <= CPU.max_num_seqs
            assert p.batch * (p.context + p.tokens) <= CPU.capacity_tokens // 2
    small = EngineShape(4096, 128, 2048, 2048, 4)
    assert all(
        (p.batch <= 4) if isinstance(p, DecodeProbe) else (p.cached + p.uncached <= 2047)
        for p in grid(small)
    )


def test_the_plan_fits_its_budget_dropping_the_costliest_first() -> None:
    for budget in (60.0, 240.0, 900.0):
        p = plan(CPU, COSTS, budget)
        assert p.estimate_s <= budget
        assert sum(map(COSTS.estimate_s, p.probes)) <= budget + 1e-9
        if p.dropped:
            assert min(map(COSTS.estimate_s, p.dropped)) >= max(map(COSTS.estimate_s, p.probes))
    assert len(plan(CPU, COSTS, 900.0).probes) > len(plan(CPU, COSTS, 60.0).probes)


def test_pilot_prices_come_back_from_two_prefills() -> None:
    def t(n: int) -> float:
        return 5e-3 + n * 3e-5 + n * (n + 1) / 2 * 2.5e-8

    costs = Costs.from_pilot((256, t(256)), (2048, t(2048)), 5e-3)
    assert abs(costs.token_s - 3e-5) < 1e-9
    assert abs(costs.pair_s - 2.5e-8) < 1e-12

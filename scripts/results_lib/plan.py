"""What the results script runs: seeds, windows, policies, and the paper's numbers.

Adding a policy to every comparison is a one-line change to ``COMPARE_POLICIES``
(or ``OPTIONAL_POLICIES`` for one that may not be registered yet): every item
builds its specs from these tuples.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from controllers import levels_for, make_controller
from controllers.errors import ControllerError
from simulator.presets import get_preset

TRACE_PATH = Path("/work/shared/traces/claude-code-dev.jsonl")

#: Policies compared in items 2, 3, 5, 6 and 8 (single-instance comparisons).
COMPARE_POLICIES: tuple[str, ...] = ("no-control", "fixed:810", "kairos")
#: Compared too when ``controllers.make_controller`` knows them at run time.
OPTIONAL_POLICIES: tuple[str, ...] = ("predictive",)
#: Adaptive policies (these get SLO sweeps, the multi-instance run and the oracle gap).
ADAPTIVE_POLICIES: tuple[str, ...] = ("kairos", "predictive")


def policy_available(name: str) -> bool:
    """True when the controller registry builds ``name`` (a policy another change adds)."""
    preset = get_preset()
    try:
        levels = levels_for(name, preset.gpu.supported_clocks_mhz)
        make_controller(name, levels)
    except ControllerError:
        return False
    return True


def compare_policies() -> tuple[str, ...]:
    """``COMPARE_POLICIES`` plus the optional ones that are registered."""
    return COMPARE_POLICIES + tuple(p for p in OPTIONAL_POLICIES if policy_available(p))


def adaptive(policies: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(p for p in policies if p in ADAPTIVE_POLICIES)


@dataclass(frozen=True, slots=True)
class Plan:
    """Sizes of every experiment; ``quick()`` shrinks them for the smoke test."""

    quick: bool
    duration_s: float
    seeds: tuple[int, ...]
    fig4_clocks_mhz: tuple[int, ...]
    fig7_rates: tuple[float, ...]
    fig8_slos: tuple[float, ...]
    ta_rates: tuple[float, ...]
    trace_rates: tuple[float, ...]
    trace_duration_s: float
    scales: tuple[float, ...]
    oracle_window_s: float
    oracle_scenarios: tuple[tuple[float, float], ...]  # (rate, SLO) on the paper workload
    policies: tuple[str, ...]

    @property
    def hours(self) -> float:
        return self.duration_s / 3600.0


def full_plan(policies: tuple[str, ...]) -> Plan:
    return Plan(
        quick=False,
        duration_s=3 * 3600.0,
        seeds=(1, 2, 3),
        fig4_clocks_mhz=(660, 750, 810, 900, 1020, 1185, 1410, 1680),
        fig7_rates=(0.02, 0.04, 0.06, 0.08),
        fig8_slos=(20.0, 35.0, 45.0, 55.0, 65.0),
        ta_rates=(0.05, 0.10),
        trace_rates=(0.001, 0.002, 0.004),
        trace_duration_s=6 * 3600.0,
        scales=(0.7, 1.0, 1.3),
        oracle_window_s=300.0,
        oracle_scenarios=((0.04, 20.0), (0.06, 20.0), (0.08, 20.0)),
        policies=policies,
    )


def quick_plan(policies: tuple[str, ...]) -> Plan:
    return Plan(
        quick=True,
        duration_s=900.0,
        seeds=(1,),
        fig4_clocks_mhz=(660, 1680),
        fig7_rates=(0.06,),
        fig8_slos=(20.0, 45.0),
        ta_rates=(0.10,),
        trace_rates=(0.004,),
        trace_duration_s=900.0,
        scales=(1.3,),
        oracle_window_s=450.0,
        oracle_scenarios=((0.06, 20.0),),
        policies=policies,
    )


@dataclass(frozen=True, slots=True)
class PaperValue:
    """One number from the KAIROS paper, with where it is stated."""

    value: float
    unit: str
    ref: str


PAPER: dict[str, PaperValue] = {
    "fig4_power_cut_1680_900_pct": PaperValue(30.0, "%", '§3.3, Fig. 4 ("about 30%")'),
    "fig4_knee_high_mhz": PaperValue(900.0, "MHz", "§3.3, Fig. 4 (trend reverses below 900)"),
    "fig4_knee_low_mhz": PaperValue(660.0, "MHz", "§3.4, Fig. 5 (660 MHz thrashes)"),
    "fig7_avg_saving_pct": PaperValue(27.0, "%", "§8.1, Fig. 7 (average over rates)"),
    "fig7_max_saving_pct": PaperValue(39.8, "%", "§8.1, Fig. 7 (best rate)"),
    "table1_nc_0.06_w": PaperValue(367.9, "W", "Table 1, Qwen3-Coder-30B, 0.06 jobs/s"),
    "table1_kairos_0.06_w": PaperValue(240.9, "W", "Table 1, Qwen3-Coder-30B, 0.06 jobs/s"),
    "fig8_saving_slo20_pct": PaperValue(32.9, "%", "§8.1, Fig. 8 (DABStep, 0.03 jobs/s)"),
    "fig8_saving_slo45_pct": PaperValue(6.3, "%", "§8.1, Fig. 8 (DABStep, 0.03 jobs/s)"),
    "fig10_nota_p5": PaperValue(2.3, "tok/s", "§8.1, Fig. 10 (DABStep, 0.05 jobs/s)"),
    "fig10_nota_jobs": PaperValue(0.046, "jobs/s", "§8.1, Fig. 10"),
    "fig10_ta_p5": PaperValue(20.0, "tok/s", '§8.1, Fig. 10 ("close to 20")'),
    "fig10_ta_jobs": PaperValue(0.05, "jobs/s", "§8.1, Fig. 10"),
    "fig12_nc_w": PaperValue(1279.5, "W", "§8.2, Fig. 12 (4 instances, 0.16 jobs/s)"),
    "fig12_rr_w": PaperValue(784.8, "W", "§8.2, Fig. 12"),
    "fig12_cons_w": PaperValue(686.5, "W", "§8.2, Fig. 12"),
    "fig12_saving_pct": PaperValue(46.3, "%", "§8.2, Fig. 12 / abstract"),
}

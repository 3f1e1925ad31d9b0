"""Policies as compositions of stages (controllers/kairos.py, controllers/policy.py,
controllers/registry.py): what each named policy holds, how operators' intents and
research variants change it, renamed names, and the reasons decisions carry."""

from __future__ import annotations

import pytest

from controllers import (
    KAIROS,
    KAIROS_ALG1,
    Cap,
    ControlDecision,
    Intents,
    InvalidConfigError,
    KairosController,
    Reason,
    UnknownPolicyError,
    law_for,
    make_controller,
    rule_for,
)
from controllers.kairos import KAIROS_NO_TA, PREDICTIVE_NETS
from controllers.reason import label
from controllers.registry import POLICY_NAMES
from controllers.stages import (
    Activity,
    ContextLevel,
    LongContextFloor,
    PrefillBoost,
    ReachableSloBoost,
    SloBoost,
    TierCeiling,
    WindowedContextLevel,
)
from controllers.testing import FIVE_LEVELS, snapshot
from controllers.types import ADMIT_ALL, AdmissionRule


def _kinds(law: object) -> list[type]:
    return [type(s) for s in law.stages]  # type: ignore[attr-defined]


def test_each_policy_reads_as_its_list_of_stages() -> None:
    assert _kinds(KAIROS) == [
        Activity, WindowedContextLevel, LongContextFloor, TierCeiling, PrefillBoost,
        ReachableSloBoost,
    ]  # fmt: skip
    assert _kinds(KAIROS_ALG1) == [ContextLevel, SloBoost]
    assert _kinds(KAIROS_NO_TA) == _kinds(KAIROS) and not KAIROS_NO_TA.rule.enabled
    assert _kinds(PREDICTIVE_NETS) == [Activity, ContextLevel, ReachableSloBoost]
    assert PREDICTIVE_NETS.rule == KAIROS.rule


def test_the_rules_differ_where_the_paper_does() -> None:
    assert KAIROS.rule == AdmissionRule(beta=0.98, gamma=0.95, evictable_after_s=60.0)
    assert KAIROS_ALG1.rule == AdmissionRule(
        beta=0.95, gamma=0.90, evictable_after_s=None, offload_aware=False
    )
    assert rule_for("no-control") is ADMIT_ALL and rule_for("fixed:900") is ADMIT_ALL
    assert rule_for("kairos-no-ta") == KAIROS_NO_TA.rule


def test_intents_set_tau_and_eq13_and_leave_the_rest() -> None:
    law = law_for("kairos", Intents(slo_tok_s=35.0, beta=0.9, gamma=0.85))
    assert law is not None
    assert law.setting("slo_tok_s") == 35.0
    assert (law.rule.beta, law.rule.gamma) == (0.9, 0.85)
    assert law.stages[1:] != KAIROS.stages[1:] and _kinds(law) == _kinds(KAIROS)
    assert law_for("kairos-alg1", Intents()) == KAIROS_ALG1  # unset: the policy's own
    assert law_for("no-control", Intents(beta=0.5, gamma=0.4)) is None


def test_beta_and_gamma_are_checked_together() -> None:
    with pytest.raises(InvalidConfigError, match="gamma"):
        law_for("kairos", Intents(gamma=0.99))  # above kairos's β = 0.98
    assert law_for("kairos", Intents(beta=0.9, gamma=0.8)) is not None  # both at once


def test_a_research_variant_changes_a_stage_by_field_name() -> None:
    law = KAIROS.varied(busy_floor_mhz=1020, evictable_after_s=None, pending_grace_s=5.0)
    assert law.setting("busy_floor_mhz") == 1020 and law.rule.evictable_after_s is None
    assert law.pending_grace_s == 5.0
    # None for a required constant drops its stage: kairos without the prefill boost.
    assert PrefillBoost not in _kinds(KAIROS.varied(prefill_boost_tokens=None))
    with pytest.raises(InvalidConfigError, match=r"no setting busy_ceiling; it has .*busy_floor"):
        KAIROS.varied(busy_ceiling=True)
    with pytest.raises(InvalidConfigError, match="busy_floor_mhz"):
        KAIROS.varied(busy_floor_mhz=0)


def test_predictive_variants_reach_its_own_constants_or_its_nets() -> None:
    ctrl = make_controller("predictive", FIVE_LEVELS, variant={"max_elasticity": 0.8,
                                                               "alpha": 0.6})  # fmt: skip
    assert ctrl.config.max_elasticity == 0.8 and ctrl.alpha == 0.6  # type: ignore[attr-defined]
    with pytest.raises(InvalidConfigError, match="nope"):
        make_controller("predictive", FIVE_LEVELS, variant={"perf.nope": 1})
    with pytest.raises(InvalidConfigError):
        make_controller("no-control", FIVE_LEVELS, variant={"alpha": 0.5})


def test_time_scaling_divides_every_time_constant_and_nothing_else() -> None:
    fast = KAIROS.time_scaled(20.0)
    assert fast.rule.idle_after_s == 0.5 and fast.rule.evictable_after_s == 3.0
    assert fast.setting("context_window_s") == 6.0 and fast.pending_grace_s == 0.5
    assert fast.setting("slo_tok_s") == 20.0  # a rate, not a time
    assert fast.rule.beta == KAIROS.rule.beta and KAIROS.time_scaled(1.0) is KAIROS
    assert KAIROS_ALG1.time_scaled(10.0).rule.evictable_after_s is None


def test_every_name_builds_and_the_old_name_says_what_replaced_it() -> None:
    for name in POLICY_NAMES:
        built = make_controller(name.replace("MHZ", "1000"), FIVE_LEVELS)
        assert built.rule.enabled == (name not in ("kairos-no-ta", "no-control", "fixed:MHZ"))
    with pytest.raises(UnknownPolicyError, match="renamed kairos-alg1"):
        make_controller("kairos-paper", FIVE_LEVELS)
    with pytest.raises(UnknownPolicyError, match="known: kairos"):
        make_controller("kairos-turbo", FIVE_LEVELS)


def test_reasons_keep_their_text_with_their_qualifiers() -> None:
    assert str(Reason.SLO_BOOST) == "slo-boost" and Reason("busy-ceiling") is Reason.BUSY_CEILING
    assert label(Reason.CONTEXT, warmup=True) == "warmup-context"
    assert label(Reason.SLO_BOOST, cap=Cap.FLEET) == "fleet-cap(slo-boost)"
    assert label(Reason.CONTEXT, warmup=True, cap=Cap.BUDGET) == "budget-cap(warmup-context)"
    d = ControlDecision(epoch=1, level=1, clock_mhz=600, reason=Reason.PREFILL, cap=Cap.BUDGET)
    assert d.label == "budget-cap(prefill)"


def test_the_controller_runs_its_policy_and_says_so() -> None:
    ctrl = KairosController(FIVE_LEVELS, KAIROS_ALG1)
    assert ctrl.name == "kairos-alg1" and ctrl.rule is KAIROS_ALG1.rule
    assert make_controller("kairos-alg1", FIVE_LEVELS).decide(snapshot()).rule is ctrl.rule

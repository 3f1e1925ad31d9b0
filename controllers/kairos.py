"""The KAIROS per-instance law (paper §6.2, Algorithm 1, Eq. 6–13) and its runner.

Each policy below is one :class:`~controllers.policy.Policy`: the admission rule
it weighs contexts and admits by, and the stages its level goes through, in
order (:mod:`controllers.stages`). :class:`KairosController` runs any of them:

    weigh the snapshot (Eq. 6, points 6, 13, 14) → each stage in turn → Eq. 13

``kairos-alg1`` is Algorithm 1 per instance as the paper states it (with the open
points 1–3 decided as docs/control-law.md records); ``kairos`` departs from it
where a measured departure earned its place (points 6, 7, 9, 11–14, 17, 18).
The fleet rules (fleet-wide admission, overflow relief, making room, holding
back an overflowing request: points 8, 10, 15, 16) are the router's and the
simulator's, and apply under every policy.
"""

from __future__ import annotations

import dataclasses

from controllers.admission import admit_in_order
from controllers.epoch import agent_context, weigh
from controllers.frequency import FrequencyLevels
from controllers.policy import Policy
from controllers.stages import (
    Activity,
    ContextLevel,
    LongContextFloor,
    PrefillBoost,
    Proposal,
    ReachableSloBoost,
    RunningStage,
    SloBoost,
    TierCeiling,
    WindowedContextLevel,
)
from controllers.types import ControlDecision, InstanceSnapshot
from kairos_common.views import AdmissionRule

KAIROS = Policy(
    "kairos",
    AdmissionRule(beta=0.98, gamma=0.95, evictable_after_s=60.0, offload_aware=True),
    (
        Activity(),  # point 6: the working set
        WindowedContextLevel(alpha=0.75, context_window_s=120.0),  # Eq. 8–9, point 17
        LongContextFloor(busy_floor_mhz=900, busy_floor_context_tokens=65536),  # point 11
        TierCeiling(),  # points 12–13
        PrefillBoost(prefill_boost_tokens=65536),  # point 9
        ReachableSloBoost(slo_tok_s=20.0),  # Eq. 10–12, points 2 and 7
    ),
)
"""The default law. Its rule admits to 98 % and stops at 95 % (point 18), leaves
out the contexts of sessions away past 60 s (point 14) and the idle ones a CPU KV
tier holds (point 13)."""

KAIROS_ALG1 = Policy(
    "kairos-alg1",
    AdmissionRule(beta=0.95, gamma=0.90, evictable_after_s=None, offload_aware=False),
    (ContextLevel(alpha=0.75), SloBoost(slo_tok_s=20.0)),
)
"""Algorithm 1 per instance as the paper states it: Eq. 8–9 over every ongoing
context, the SLO boost over every agent, Eq. 13 at the paper's β = 0.95 and
γ = 0.90, every context counted until its agent ends."""

KAIROS_NO_TA = dataclasses.replace(
    KAIROS, name="kairos-no-ta", rule=dataclasses.replace(KAIROS.rule, enabled=False)
)
"""``kairos`` without thrashing avoidance: every held agent admitted at once (the
paper's Fig. 10–11 ablation)."""

PREDICTIVE_NETS = Policy(
    "predictive",
    KAIROS.rule,
    (Activity(), ContextLevel(alpha=0.75), ReachableSloBoost(slo_tok_s=20.0)),
)
"""KAIROS's safety nets under ``predictive`` (docs/beyond.md §2): its own model
prices prefill and finds the efficient floor (so no prefill boost and no busy
floor), and it steps down only when confident (so Eq. 9 without the window, which
left it 0.2–0.4 point worse off); Eq. 13 is ``kairos``'s."""


class KairosController:
    """Runs one :class:`~controllers.policy.Policy` per epoch (no I/O, no clock)."""

    def __init__(self, levels: FrequencyLevels, policy: Policy = KAIROS) -> None:
        self.levels = levels
        self.policy = policy
        self.name = policy.name
        self._stages: tuple[RunningStage, ...] = tuple(s.start() for s in policy.stages)

    @property
    def rule(self) -> AdmissionRule:
        """Eq. 13 as this policy applies it, carried whole in every decision."""
        return self.policy.rule

    def decide(self, snapshot: InstanceSnapshot) -> ControlDecision:
        rule = self.policy.rule
        epoch = weigh(snapshot, self.levels, rule, self.policy.pending_grace_s)
        proposal = Proposal(level_tokens=epoch.usage_tokens)
        for stage in self._stages:
            proposal = stage.apply(epoch, proposal)
        cap = snapshot.capacity_tokens
        sizes = ((a.agent_id, agent_context(a)) for a in snapshot.pending)
        admit, usage_after = admit_in_order(sizes, epoch.resident_tokens, cap, rule)
        return ControlDecision(
            epoch=snapshot.epoch,
            level=proposal.level,
            clock_mhz=self.levels.clock_of(proposal.level),
            reason=proposal.reason,
            admit=admit,
            defer_admissions=rule.enabled and usage_after > rule.beta * cap,
            boost=proposal.boost,
            usage_tokens=epoch.usage_tokens,
            capacity_tokens=cap,
            min_throughput_tok_s=epoch.min_throughput_tok_s,
            offload_tokens=epoch.offload_tokens,
            level_tokens=proposal.level_tokens,
            rule=rule,
        )

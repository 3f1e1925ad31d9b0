"""The predictive controller (policy ``predictive``): lowest confident clock.

KAIROS maps context linearly to a clock and boosts to the maximum when an
agent falls below the SLO, so it leaves power unused whenever agents have
throughput slack. This controller instead asks an online performance model
(:mod:`controllers.perf_model`, learned from finished requests with the clock
as an input) how much slower a typical request would be at each level, and each
epoch picks the lowest level that satisfies two predicted constraints:

* **throughput**: every ongoing agent's Eq. 10 throughput divided by the
  predicted slowdown stays ≥ ``τ·(1 + margin)``;
* **context** (Little's law): the aggregate context the instance would hold —
  today's ongoing + pending contexts, and ``λ̂·Ŵ·C̄`` from the measured arrival
  rate, agent lifetime and context per agent unless no clock could hold it —
  scaled by how much longer agents live at that clock (only their LLM time
  stretches, not tool time) stays ≤ ``α·U_max``.

Stepping **up** is immediate (the lowest feasible level above the current one).
Stepping **down** follows Evolving Infra §4.3: one level at a time, only when
the mean of the recent per-epoch margins at that level exceeds twice its
standard error, and not within ``cooldown_epochs`` of the last change.
KAIROS's SLO boost and its two-threshold admission stay as safety nets: the
stages of :data:`controllers.kairos.PREDICTIVE_NETS`, run by a
:class:`KairosController` whose level is also this controller's ceiling. Until
the model has warmed up the controller follows KAIROS exactly.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field, replace

from controllers.epoch import agent_context
from controllers.errors import InvalidConfigError
from controllers.frequency import FrequencyLevels
from controllers.kairos import PREDICTIVE_NETS, KairosController
from controllers.perf_model import OnlinePerfModel, PerfModelConfig, RequestShape, typical_shape
from controllers.policy import Policy
from controllers.reason import Reason
from controllers.types import (
    AdmissionRule,
    AgentView,
    ControlDecision,
    InstanceSnapshot,
    ModelReport,
    RequestObservation,
)


@dataclass(frozen=True, slots=True)
class PredictiveConfig:
    """Constants of the predictive law (see ``docs/beyond.md``), set in code: research
    scripts vary them (``predictive[max_elasticity=0.8]``), operators do not."""

    margin: float = 0.1
    """Predicted slowest-agent throughput must stay ≥ τ·(1 + margin)."""
    history_epochs: int = 12
    """Window of per-epoch margins the 2·SE step-down test uses."""
    min_samples: int = 4
    """Fewest margins at a level before a step down to it may be confident."""
    se_factor: float = 2.0
    cooldown_epochs: int = 3
    """Epochs after any change before the next step down."""
    max_step_down: int = 8
    """Most levels one confident step down may cross (each must be confident)."""
    kairos_ceiling: bool = True
    """Outside boosts, never run above KAIROS's own context level (Eq. 9): the
    prediction only lowers the clock. Proactive steps above it (to keep the
    slowest agents over τ·(1+margin)) cost 1–6 pp of power where the SLO binds
    for < 1 % attainment; KAIROS's boost still guards τ. Off only in tests of the
    predictive choice itself."""
    lifetime_window_s: float = 1800.0
    """Window over which arrivals and finished agents' lifetimes are measured."""
    recent_requests: int = 200
    """Finished requests the 'typical request' is taken from."""
    slowest_agents: int = 3
    """How many of the slowest agents are predicted individually."""
    future_share: float = 0.5
    """Share of an agent's Eq. 3 time still ahead of it (remaining ≈ completed)."""
    min_steps: int = 2
    """Agents with fewer completed requests are left to KAIROS's boost: their
    Eq. 10 value is dominated by the first prompt's hold and prefill, which no
    clock can undo, and chasing them pins the GPU at its maximum."""
    max_elasticity: float = 0.6
    """Do not go below a level where the model predicts request time growing
    almost as fast as the clock falls (``d ln T / d ln(1/f) > max_elasticity``):
    there the GPU is clock-bound, lower clocks stretch busy time at ~static power
    and save little or nothing (below the memory knee). 0.6 rather than 0.8:
    at 0.02 jobs/s it keeps the GPU near its most efficient clock (1.5 pp more
    saved than KAIROS at a *higher* P5, where 0.8 saved 0.5 pp at a lower P5)."""
    perf: PerfModelConfig = field(default_factory=PerfModelConfig)

    def __post_init__(self) -> None:
        if self.margin < 0 or self.se_factor < 0:
            raise InvalidConfigError("margin and se_factor must be >= 0")
        if self.history_epochs < 2 or self.min_samples < 2:
            raise InvalidConfigError("history_epochs and min_samples must be >= 2")
        if self.cooldown_epochs < 0:
            raise InvalidConfigError("cooldown_epochs must be >= 0")


def confident_positive(samples: list[float], se_factor: float, min_samples: int) -> bool:
    """Evolving Infra §4.3: ``mean > se_factor · SE`` (and the mean is positive)."""
    n = len(samples)
    if n < min_samples:
        return False
    mean = sum(samples) / n
    if mean <= 0:
        return False
    var = sum((s - mean) ** 2 for s in samples) / (n - 1)
    return mean > se_factor * math.sqrt(var / n)


class PredictiveController:
    """Per-instance predictive DVFS with KAIROS's safety nets (no I/O, no clock)."""

    name = "predictive"

    def __init__(
        self,
        levels: FrequencyLevels,
        nets: Policy = PREDICTIVE_NETS,
        config: PredictiveConfig | None = None,
    ) -> None:
        self.levels = levels
        self.kairos = KairosController(levels, nets)
        self.config = config or PredictiveConfig()
        self.slo_tok_s: float = nets.setting("slo_tok_s")
        self.alpha: float = nets.setting("alpha")
        self.model = OnlinePerfModel(levels.clocks_mhz[:-1], self.config.perf)
        self._recent: deque[RequestObservation] = deque(maxlen=self.config.recent_requests)
        self._margins: dict[int, deque[float]] = {
            lv: deque(maxlen=self.config.history_epochs) for lv in range(1, levels.count + 1)
        }
        self._level = levels.count
        self._pre_boost_level: int | None = None
        self._changed_epoch = -(10**9)
        self._seen: dict[str, float] = {}
        self._arrivals: deque[float] = deque()
        self._lifetimes: deque[tuple[float, float]] = deque()

    @property
    def rule(self) -> AdmissionRule:
        """KAIROS's Eq. 13, which this policy admits by."""
        return self.kairos.rule

    # ------------------------------------------------------------ bookkeeping
    def _track_agents(self, snap: InstanceSnapshot) -> None:
        """Arrivals and lifetimes (for Little's law) from agents appearing/vanishing."""
        present = {a.agent_id: a.arrival_s for a in (*snap.ongoing, *snap.pending)}
        for agent_id, arrival in present.items():
            if agent_id not in self._seen:
                self._arrivals.append(arrival)
        for agent_id, arrival in self._seen.items():
            if agent_id not in present:
                self._lifetimes.append((snap.now_s, snap.now_s - arrival))
        self._seen = present
        horizon = snap.now_s - self.config.lifetime_window_s
        while self._arrivals and self._arrivals[0] < horizon:
            self._arrivals.popleft()
        while self._lifetimes and self._lifetimes[0][0] < horizon:
            self._lifetimes.popleft()

    def _llm_fraction(self, snap: InstanceSnapshot) -> float:
        """Share of an agent's life spent waiting on the LLM (the part a clock stretches)."""
        llm = sum(a.llm_time_s for a in snap.ongoing)
        life = sum(max(snap.now_s - a.arrival_s, 0.0) for a in snap.ongoing)
        return min(max(llm / life, 0.0), 1.0) if life > 0 else 1.0

    def _little_tokens(self, snap: InstanceSnapshot, usage: int) -> float:
        """``λ̂·Ŵ·C̄``: steady-state context at today's clock (0 without history)."""
        if not self._lifetimes or not snap.ongoing:
            return 0.0
        span = min(self.config.lifetime_window_s, max(snap.now_s, 1.0))
        rate = len(self._arrivals) / span
        life = sum(w for _, w in self._lifetimes) / len(self._lifetimes)
        return rate * life * usage / len(snap.ongoing)

    # -------------------------------------------------------------- the law
    def _margins_now(
        self, snap: InstanceSnapshot, usage: int, shape: RequestShape
    ) -> tuple[dict[int, float], dict[int, float]]:
        """Per level: ``min(throughput margin, context margin)`` predicted now,
        against ``τ·(1 + margin)`` and against bare ``τ``.

        Each of the slowest agents is predicted with its own request shape (its
        context is what its next prefill attends over), so a long-context agent,
        whose requests are more compute-bound, gets its own, larger slowdown.
        """
        f_now = snap.clock_mhz if snap.clock_mhz else self.levels.clock_of(self._level)
        agents = [
            (t, a)
            for a in (*snap.ongoing, *snap.pending)
            if a.completed_steps >= self.config.min_steps and (t := a.throughput_tok_s) is not None
        ]
        tau = self.slo_tok_s
        top = self.levels.max_mhz
        # Agents no clock can lift to τ are left to KAIROS's boost: chasing them
        # would pin the maximum clock for nothing (an SLO they cannot meet).
        helpable = [
            (t, a)
            for t, a in agents
            if t / max(self._agent_slowdown(shape, a, top, f_now), 1e-3) >= tau
        ]
        slowest = sorted(helpable, key=lambda ta: ta[0])[: self.config.slowest_agents]
        phi = self._llm_fraction(snap)
        pending = sum(agent_context(a) for a in snap.pending)
        limit = self.alpha * snap.capacity_tokens
        levels = range(1, self.levels.count + 1)
        # How much longer agents live at each level: only their LLM time stretches.
        stretch: dict[int, float | None] = {}
        for lv in levels:
            slow = self.model.slowdown(shape, self.levels.clock_of(lv), f_now)
            stretch[lv] = None if slow is None else 1.0 - phi + phi * max(slow, 1e-3)
        base = self._context_base(
            snap, float(usage + pending), usage, stretch[self.levels.count], limit
        )
        with_margin: dict[int, float] = {}
        bare: dict[int, float] = {}
        for lv in levels:
            clock = self.levels.clock_of(lv)
            lv_stretch = stretch[lv]
            if lv_stretch is None:
                with_margin[lv] = bare[lv] = -1.0
                continue
            ctx_m = 1.0 - base * lv_stretch / limit
            worst = float("inf")
            for tput, agent in slowest:
                s = self._agent_slowdown(shape, agent, clock, f_now)
                worst = min(worst, tput / max(s, 1e-3))
            if tau <= 0 or worst == float("inf"):
                with_margin[lv] = bare[lv] = ctx_m
                continue
            with_margin[lv] = min(worst / (tau * (1.0 + self.config.margin)) - 1.0, ctx_m)
            bare[lv] = min(worst / tau - 1.0, ctx_m)
        return with_margin, bare

    def _context_base(
        self, snap: InstanceSnapshot, now_tokens: float, usage: int,
        top_stretch: float | None, limit: float,
    ) -> float:  # fmt: skip
        """The context the margin projects: Little's steady state when it is larger
        than today's and some clock can keep it under ``α·U_max`` (the top clock,
        whose lifetime stretch is ``top_stretch``, is the best any can), else today's.

        A steady state no clock can hold under the limit is left to admission
        (Eq. 13 holds what does not fit; fleet admission places it elsewhere), as
        agents no clock can lift are left to the boost: chasing it pinned the clock
        at KAIROS's ceiling on the consolidation target of the Claude Code trace,
        whose arrivals and session lifetimes project 1–3× ``α·U_max`` for an
        instance that never holds that much (docs/beyond.md).
        """
        little = self._little_tokens(snap, usage)
        if little <= now_tokens:
            return now_tokens
        if top_stretch is None or little * top_stretch > limit:
            return now_tokens
        return little

    def _agent_slowdown(
        self, shape: RequestShape, agent: AgentView, clock_mhz: int, f_now: float
    ) -> float:
        """Slowdown of ``agent``'s Eq. 3 throughput over its whole life at ``clock_mhz``.

        Its next requests are predicted with its own context as the cached prefix;
        only the part of its life still ahead (``future_share``, by default as
        long as what it has done) runs at the new clock — the SLO is on the
        agent's whole-life throughput, which its past already fixes in part.
        """
        own = replace(shape, cached_tokens=float(agent_context(agent)))
        slow = self.model.slowdown(own, clock_mhz, f_now) or 1.0
        w = self.config.future_share
        return (1.0 - w) + w * slow

    def efficient_floor(self, shape: RequestShape) -> int:
        """Lowest level above which every step down still pays (elasticity rule)."""
        floor = 1
        for lv in range(1, self.levels.count):
            lo, hi = self.levels.clock_of(lv), self.levels.clock_of(lv + 1)
            t_lo = self.model.request_time_s(shape, lo)
            t_hi = self.model.request_time_s(shape, hi)
            if t_lo is None or t_hi is None or t_lo <= 0 or t_hi <= 0:
                continue
            elasticity = math.log(t_lo / t_hi) / math.log(hi / lo)
            if elasticity > self.config.max_elasticity:
                floor = lv + 1
        return floor

    def _current_level(self, snap: InstanceSnapshot) -> int:
        """The level the GPU is at (a fleet budget may have lowered it), else ours."""
        if snap.clock_mhz:
            level = self.levels.level_of(snap.clock_mhz)
            if level != self._level:
                self._level, self._changed_epoch = level, snap.epoch
        return self._level

    def _end_boost(self, epoch: int) -> None:
        """Return to the level held before an SLO boost once it is over.

        The boost is a safety net, not an operating point: holding the maximum
        until every lower level is confidently safe again (the 2·SE rule) kept
        the GPU at the top for minutes after each boost where the SLO binds. The
        level the controller had chosen is still its best estimate; if its
        margin is now negative, the usual immediate step up corrects it.
        """
        if self._pre_boost_level is None:
            return
        level, self._pre_boost_level = self._pre_boost_level, None
        if level < self._level:
            self._level, self._changed_epoch = level, epoch

    def _choose(
        self, epoch: int, margins: dict[int, float], bare: dict[int, float], floor: int
    ) -> tuple[int, Reason]:
        cur = self._level
        if cur < floor:
            return floor, Reason.EFFICIENT_FLOOR
        if margins[cur] < 0:
            top = self.levels.count
            up = [lv for lv in range(cur + 1, top + 1) if margins[lv] >= 0]
            if up:
                return up[0], Reason.PREDICTED_SLO_UP
            # No clock buys the margin: settle for the lowest that meets τ itself
            # (the maximum buys little here and KAIROS's boost still guards τ).
            enough = [lv for lv in range(cur, top + 1) if bare[lv] >= 0]
            if enough:
                return enough[0], Reason.PREDICTED_SLO_BARE if enough[0] > cur else Reason.HOLD
            return top, Reason.PREDICTED_SLO_UP
        if epoch - self._changed_epoch < self.config.cooldown_epochs or cur <= floor:
            return cur, Reason.HOLD
        # Walk down while each lower level is feasible now *and* confidently so
        # over the recent window; stop at the first that is not (or the floor).
        target = cur
        for lv in range(cur - 1, max(floor, 1) - 1, -1):
            samples = list(self._margins[lv])
            if margins[lv] < 0 or not confident_positive(
                samples, self.config.se_factor, self.config.min_samples
            ):
                break
            target = lv
            if cur - target >= self.config.max_step_down:
                break
        return (target, Reason.CONFIDENT_DOWN) if target < cur else (cur, Reason.HOLD)

    def decide(self, snapshot: InstanceSnapshot) -> ControlDecision:
        base = self.kairos.decide(snapshot)
        self.model.observe(snapshot.observations)
        last = self._recent[-1].t_s if self._recent else float("-inf")
        self._recent.extend(
            o for o in sorted(snapshot.observations, key=lambda o: o.t_s) if o.t_s > last
        )
        self._track_agents(snapshot)
        shape = typical_shape(list(self._recent))
        if not self.model.ready or shape is None:
            return self._emit(snapshot, replace(base, warmup=True), base.level, base.reason, {})
        self._current_level(snapshot)
        # The context margin guards against thrashing and, like admission (Eq. 13),
        # counts every ongoing context: idle sessions come back within a think gap.
        margins, bare = self._margins_now(snapshot, base.usage_tokens, shape)
        for lv, m in margins.items():
            self._margins[lv].append(m)
        floor = self.efficient_floor(shape)
        if base.boost:
            # KAIROS's safety net: an agent under τ takes the top clock. Eq. 8's
            # jump at U ≥ α·U_max is not one: the context margin raises the clock
            # itself, as far as it must (docs/beyond.md §2).
            if self._pre_boost_level is None:
                self._pre_boost_level = self._level
            return self._emit(snapshot, base, self.levels.count, base.reason, margins, floor)
        self._end_boost(snapshot.epoch)
        level, reason = self._choose(snapshot.epoch, margins, bare, floor)
        ceiling = max(base.level, floor)
        if self.config.kairos_ceiling and level > ceiling:
            level, reason = ceiling, Reason.KAIROS_CEILING
        return self._emit(snapshot, base, level, reason, margins, floor)

    def _emit(
        self,
        snap: InstanceSnapshot,
        base: ControlDecision,
        level: int,
        reason: Reason,
        margins: dict[int, float],
        floor: int | None = None,
    ) -> ControlDecision:
        if level != self._level:
            self._changed_epoch = snap.epoch
        self._level = level
        report = ModelReport(
            slo_margin_by_level=dict(margins),
            slo_slack=margins[level] if margins else None,
            efficient_floor_level=floor,
            model_error=self.model.error,
            model_observations=self.model.observed,
        )
        return replace(
            base,
            level=level,
            clock_mhz=self.levels.clock_of(level),
            reason=reason,
            report=report,
        )

"""The KAIROS per-instance controller (paper §6.2, Algorithm 1, Eq. 6–13).

The points the paper leaves open are named fields of :class:`KairosConfig`; see
``docs/control-law.md`` for the reasoning. The default departs from the paper in
the fields the policy ``kairos-paper`` turns off (``activity_aware``,
``boost_reachable_only``, ``prefill_boost_tokens``, ``busy_floor_mhz``,
``offload_aware``, ``evictable_after_s``, ``context_window_s``; points 6, 7, 9,
11, 13, 14 and 17, 13 only where the engine has a CPU KV tier), and
``busy_ceiling`` (point 12) is an opt-in departure; the open points themselves:

* ``new_agent_context_tokens`` (3000): size of an agent with no completed request
  (the first author's placeholder), unless the caller supplies an estimate from
  the held request's prompt, which is preferred (it is what vLLM will allocate).
* ``pending_grace_s`` (10 s): a pending agent with no completed request has no
  Eq. 10 throughput. It is left out of the min-throughput until it has waited
  this long; after that it enters with throughput 0 (its eventual Eq. 3
  throughput is falling while it waits), which forces a boost that drains
  ongoing agents faster. Pending agents *with* history use their measured value.
* ``admit_within_beta`` (True): Algorithm 1 admits while ``U < γ·U_max`` and
  updates ``U`` after each admission, which can overshoot. §6.2.4 says an agent
  whose admission would violate ``U ≤ β·U_max`` stays pending, so by default the
  head of the queue is admitted only if ``U + C_head ≤ β·U_max`` (head-of-line:
  arrival order is never skipped). An empty instance always admits its head, or an
  agent larger than ``β·U_max`` would starve.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from controllers.admission import (
    AdmissionRule,
    active_now,
    admission_tokens,
    admit_in_order,
)
from controllers.errors import InvalidConfigError, InvalidSnapshotError
from controllers.frequency import FrequencyLevels
from controllers.types import AgentView, ControlDecision, InstanceSnapshot


@dataclass(frozen=True, slots=True)
class KairosConfig:
    """Constants of Algorithm 1 with the paper's defaults (§6.2), except where noted."""

    alpha: float = 0.75
    beta: float = 0.98
    """Eq. 13's bound on admitting (the paper's 0.95, policy ``kairos-paper``). The
    paper's headroom under ``U_max`` was all that stood between admitted contexts
    growing and vLLM preempting; the hold-back of ``hold_overflow`` (point 16) now
    catches that growth per request, so admission keeps less (docs/control-law.md,
    point 18)."""
    gamma: float = 0.95
    """Eq. 13's stop (the paper's 0.90, policy ``kairos-paper``); also where context
    pressure starts (point 6). See ``beta``."""
    slo_tok_s: float = 20.0
    slo_boost: bool = True
    thrashing_avoidance: bool = True
    new_agent_context_tokens: int = 3000
    pending_grace_s: float = 10.0
    admit_within_beta: bool = True
    make_room: bool = True
    """Fleet admission moves idle agents off an instance so that a held agent fits
    there when the fleet's free room is split between instances (docs/control-law.md,
    point 15). False: held agents wait for one instance to have the room alone."""
    hold_overflow: bool = True
    """An admitted agent whose next request would overflow the KV cache beside the
    running ones, with no other instance to move to, waits in the hold queue instead
    of making vLLM preempt (docs/control-law.md, point 16). False: it runs, and the
    instance thrashes until contexts end."""
    activity_aware: bool = True
    """Eq. 9 from the context of *active* agents only (docs/control-law.md, point 6);
    False is the paper-exact law (policy ``kairos-paper``)."""
    boost_reachable_only: bool = True
    """The SLO boost ignores agents no clock can lift to τ (docs/control-law.md,
    point 7); False is the paper (any agent under τ pins the top clock)."""
    idle_after_s: float = 10.0
    """An ongoing agent with no request in flight for this long stops counting
    towards the clock level (it still counts towards admission)."""
    prefill_boost_tokens: int | None = 65536
    """Top clock while at least this many uncached prompt tokens wait for their first
    output on the instance (docs/control-law.md, point 9). None: off (the paper)."""
    busy_floor_mhz: int | None = 900
    """Lowest clock for long-context work (docs/control-law.md, point 11): while the
    active agents' mean context is at least ``busy_floor_context_tokens``, the level
    is at least the first one at or above this clock (the GPU's memory knee, under
    which decode slows ∝ 1/f). None: off (the paper)."""
    busy_floor_context_tokens: int = 65536
    """Mean context per active agent from which the floor applies: about where one
    sequence's KV read per decode step outweighs the step's share of the weights."""
    busy_ceiling: bool = False
    """Opt in to running long-context decode at the busy floor's level, not above
    it (docs/control-law.md, point 12): while the floor applies, no prefill is
    waiting and nothing presses (nobody held here, ``U < γ·U_max``), Eq. 9's higher
    levels buy a decode step almost nothing. It saves about 3 points of power on
    the Claude Code trace and costs attainment where the fleet is overloaded, so it
    is off by default: Eq. 9 as is. It applies anyway on an instance with a CPU KV
    tier (``offload_aware``), where that overload does not thrash."""
    evictable_after_s: float | None = 60.0
    """An ongoing agent with no request in flight for this long holds only evictable
    prefix cache (docs/control-law.md, point 14): vLLM freed its blocks when its
    last request ended and evicts them for whoever needs the room, so Eq. 13 and
    the pressure test stop counting its context, and it re-prefills if it comes
    back. Longer than the agents' usual tool call or think gap, so working sessions
    keep their room (30 s thrashed on the Claude Code trace, 60 s changed nothing
    there), and short enough that a session away for minutes (a person reading, a
    long build) does not hold newcomers. None: every ongoing context counts until
    its agent ends (the paper, policy ``kairos-paper``). An agent active by
    ``idle_after_s`` is never evictable."""
    offload_aware: bool = True
    """Read the engine's CPU KV tier (``InstanceSnapshot.offload_tokens``; vLLM
    ``--kv-offloading-size``; docs/control-law.md, point 13): idle contexts the tier
    holds need no room in HBM, so Eq. 13 admits and the pressure test weighs only
    the resident usage (:func:`controllers.admission.resident_tokens`), and the
    long-context ceiling of point 12 applies, whose cost was the overload the tier
    removes. Without a tier nothing changes. False: the tier is ignored (the
    paper, policy ``kairos-paper``)."""

    context_window_s: float | None = 120.0
    """Eq. 9's level from the working set averaged over the last this many seconds
    while nothing presses (docs/control-law.md, point 17). A session's context is
    active for a request and its think gap, then idle for its tool call, so the
    working set swings epoch by epoch, and the clock with it, while the work per
    minute stays put; power is convex in the clock, so a steady clock at the mean
    does that work for less energy. Under pressure (agents held here, ``U ≥
    γ·U_max``) and at Eq. 8's ``α·U_max`` the epoch's own value stands. Longer than
    a session's turn (a request, a think gap and a tool call). None: each epoch's
    own value (the paper, policy ``kairos-paper``)."""

    def __post_init__(self) -> None:
        if not 0.0 < self.alpha <= 1.0:
            raise InvalidConfigError(f"alpha must be in (0, 1], got {self.alpha}")
        if not 0.0 < self.gamma <= self.beta < 1.0 + 1e-12:
            raise InvalidConfigError(
                f"need 0 < gamma <= beta <= 1, got gamma={self.gamma} beta={self.beta}"
            )
        if self.slo_tok_s < 0.0:
            raise InvalidConfigError("slo_tok_s must be >= 0")
        if self.new_agent_context_tokens < 0:
            raise InvalidConfigError("new_agent_context_tokens must be >= 0")
        if not self.idle_after_s > 0.0:
            raise InvalidConfigError(f"idle_after_s must be > 0, got {self.idle_after_s}")
        for name in ("evictable_after_s", "context_window_s"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value > 0.0):
                raise InvalidConfigError(f"{name} must be > 0 or None, got {value}")
        if self.busy_floor_mhz is not None and self.busy_floor_mhz < 1:
            raise InvalidConfigError(
                f"busy_floor_mhz must be >= 1 or None, got {self.busy_floor_mhz}"
            )
        if self.busy_floor_context_tokens < 0:
            raise InvalidConfigError(
                f"busy_floor_context_tokens must be >= 0, got {self.busy_floor_context_tokens}"
            )
        if self.prefill_boost_tokens is not None and self.prefill_boost_tokens < 1:
            raise InvalidConfigError(
                f"prefill_boost_tokens must be >= 1 or None, got {self.prefill_boost_tokens}"
            )

    @property
    def admission_rule(self) -> AdmissionRule:
        """Eq. 13 with these thresholds (shared with fleet admission)."""
        return AdmissionRule(
            beta=self.beta,
            gamma=self.gamma,
            enabled=self.thrashing_avoidance,
            admit_within_beta=self.admit_within_beta,
            make_room=self.make_room,
            hold_overflow=self.hold_overflow,
        )


def context_level(usage_tokens: int, capacity_tokens: int, levels: int, alpha: float) -> int:
    """Eq. 8–9: ``L`` if ``U ≥ α·U_max`` else ``⌊U/(α·U_max)·(L−1)⌋ + 1``."""
    if capacity_tokens <= 0:
        raise InvalidSnapshotError(f"U_max must be positive, got {capacity_tokens}")
    if levels < 1:
        raise InvalidSnapshotError("need at least one frequency level")
    threshold = alpha * capacity_tokens
    if usage_tokens >= threshold:
        return levels
    return math.floor(max(usage_tokens, 0) / threshold * (levels - 1)) + 1


class KairosController:
    """Algorithm 1: context-aware level, SLO boost, two-threshold admission."""

    name = "kairos"

    def __init__(self, levels: FrequencyLevels, config: KairosConfig | None = None) -> None:
        self.levels = levels
        self.config = config or KairosConfig()
        self.admission_control = self.config.thrashing_avoidance
        self._calm: deque[tuple[float, int]] = deque()
        """``(now_s, working set)`` of the calm epochs within ``context_window_s``."""
        self._calm_sum = 0

    def agent_context(self, agent: AgentView) -> int:
        """``C_a``, or the documented size of an agent without a completed request."""
        if agent.context_tokens is not None:
            return agent.context_tokens
        if agent.estimated_context_tokens is not None:
            return agent.estimated_context_tokens
        return self.config.new_agent_context_tokens

    def usage(self, snapshot: InstanceSnapshot) -> int:
        """Eq. 6: ``U_k = Σ_{a ongoing} C_a`` (or the caller's measured value)."""
        if snapshot.usage_tokens is not None:
            return snapshot.usage_tokens
        return sum(self.agent_context(a) for a in snapshot.ongoing)

    def min_throughput(self, snapshot: InstanceSnapshot) -> float | None:
        """Eq. 11 over ongoing ∪ pending, with the pending-without-history rule."""
        values = [v for v, _ in self._throughputs(snapshot)]
        return min(values) if values else None

    def boost_throughput(self, snapshot: InstanceSnapshot) -> float | None:
        """The minimum the SLO boost acts on. With ``boost_reachable_only``,
        measured agents below ``τ·f(1)/f(L)`` are left out: their requests ran at
        ``f(1)`` or faster and compute time shrinks at most by ``f(L)/f(1)`` at the
        top clock (prefill queueing and held time not at all), so no clock lifts
        them to τ and boosting for them pins the top clock for nothing (huge-prompt
        sessions whose latency is prefill). Held agents past the grace period
        still count (at 0): boosting drains contexts, which is what admits them."""
        values = self._throughputs(snapshot)
        if self.config.boost_reachable_only and self.levels.count > 1:
            reach = self.levels.clock_of(self.levels.count) / self.levels.clock_of(1)
            floor = self.config.slo_tok_s / reach
            values = [(v, measured) for v, measured in values if not measured or v >= floor]
        return min(v for v, _ in values) if values else None

    def _throughputs(self, snapshot: InstanceSnapshot) -> list[tuple[float, bool]]:
        """Eq. 10 per agent, with whether it was measured (False: a held agent
        without history, entered at 0 after ``pending_grace_s``)."""
        values: list[tuple[float, bool]] = []
        for agent in snapshot.ongoing:
            tput = agent.throughput_tok_s
            if tput is not None:
                values.append((tput, True))
        for agent in snapshot.pending:
            tput = agent.throughput_tok_s
            if tput is not None:
                values.append((tput, True))
            elif self._waited(agent, snapshot.now_s) >= self.config.pending_grace_s:
                values.append((0.0, False))
        return values

    @staticmethod
    def _waited(agent: AgentView, now_s: float) -> float:
        since = agent.waiting_since_s if agent.waiting_since_s is not None else agent.arrival_s
        return max(0.0, now_s - since)

    def admissions(
        self, snapshot: InstanceSnapshot, usage_tokens: int
    ) -> tuple[tuple[str, ...], int]:
        """Eq. 13 two-threshold admission, in arrival order, head-of-line
        (:func:`controllers.admission.admit_in_order`).

        Returns the admitted agent ids and ``U`` after admitting them.
        """
        sizes = ((a.agent_id, self.agent_context(a)) for a in snapshot.pending)
        return admit_in_order(
            sizes, usage_tokens, snapshot.capacity_tokens, self.config.admission_rule
        )

    def is_active(self, agent: AgentView, now_s: float) -> bool:
        """Has ``agent`` had a request in flight within ``idle_after_s``?

        Unknown activity (an old router, no completed request) counts as active,
        which is the paper's law.
        """
        return active_now(agent.in_flight, agent.last_active_s, now_s, self.config.idle_after_s)

    def working_usage(self, snapshot: InstanceSnapshot) -> int:
        """The context Eq. 9 sets the clock from (docs/control-law.md, point 6).

        Every ongoing context (the paper) without ``activity_aware``, and also
        under context pressure: while agents are held here (with fleet admission
        that means no instance has room) or once ``U ≥ γ·U_max`` (the instance has
        stopped admitting), contexts must drain and the paper's law applies, less
        the evictable contexts (point 14), which no clock drains: their agents are
        away. Otherwise only the active agents' contexts, so a GPU whose sessions
        sit in tool calls or think gaps runs slow. A measured ``usage_tokens`` from
        vLLM carries no per-agent activity and is used as is.
        """
        usage = self.usage(snapshot)
        return self._working(snapshot, usage, self.under_pressure(snapshot, usage))

    def _working(self, snapshot: InstanceSnapshot, usage: int, pressed: bool) -> int:
        """:meth:`working_usage` from ``U`` and :meth:`under_pressure`, which
        :meth:`decide` computes once for every rule that asks."""
        if not self.config.activity_aware or snapshot.usage_tokens is not None:
            return usage
        if pressed:
            return self.resident_usage(snapshot, usage, with_tier=False)
        return self.active_usage(snapshot)

    def level_usage(self, snapshot: InstanceSnapshot, working: int, pressed: bool) -> int:
        """The context Eq. 9 reads (docs/control-law.md, point 17): ``working``
        (:meth:`working_usage`), or, while nothing presses and it is under Eq. 8's
        ``α·U_max``, its mean over the calm epochs of the last ``context_window_s``.
        ``pressed`` is :meth:`under_pressure`.

        Called once per decision: it records the epoch. Samples at or after
        ``now_s`` (the same instant decided again, or a clock that went back) are
        replaced by this one.
        """
        window = self.config.context_window_s
        if window is None or pressed:
            return working
        now = snapshot.now_s
        calm = self._calm
        while calm and now <= calm[-1][0]:
            self._calm_sum -= calm.pop()[1]
        calm.append((now, working))
        self._calm_sum += working
        while calm[0][0] <= now - window:
            self._calm_sum -= calm.popleft()[1]
        if working >= self.config.alpha * snapshot.capacity_tokens:
            return working
        return round(self._calm_sum / len(calm))

    def offload_tokens(self, snapshot: InstanceSnapshot) -> int:
        """The CPU KV tier this law counts on (0: none, or ``offload_aware`` off, or a
        measured ``usage_tokens``, which carries no per-agent activity)."""
        if not self.config.offload_aware or snapshot.usage_tokens is not None:
            return 0
        return max(0, snapshot.offload_tokens)

    def evictable_after_s(self, snapshot: InstanceSnapshot) -> float | None:
        """The eviction window this law counts on (point 14); None with a measured
        ``usage_tokens``, which carries no per-agent activity."""
        return None if snapshot.usage_tokens is not None else self.config.evictable_after_s

    def resident_usage(
        self, snapshot: InstanceSnapshot, usage: int, *, with_tier: bool = True
    ) -> int:
        """``U`` less the evictable contexts (point 14) and, ``with_tier``, the idle
        ones the CPU KV tier holds (point 13):
        :func:`controllers.admission.resident_tokens`."""
        weighed = admission_tokens(
            ((self.agent_context(a), a.in_flight, a.last_active_s) for a in snapshot.ongoing),
            snapshot.now_s,
            self.config.idle_after_s,
            self.evictable_after_s(snapshot),
            self.offload_tokens(snapshot) if with_tier else 0,
        )
        return usage if weighed is None else weighed[0]

    def active_usage(self, snapshot: InstanceSnapshot) -> int:
        """The contexts of the agents :meth:`is_active` counts as working now."""
        now = snapshot.now_s
        return sum(self.agent_context(a) for a in snapshot.ongoing if self.is_active(a, now))

    def under_pressure(self, snapshot: InstanceSnapshot, usage: int) -> bool:
        """Must contexts drain here? Agents are held here (with fleet admission that
        means no instance has room) or ``U ≥ γ·U_max`` (the instance has stopped
        admitting). Then the paper's law stands: every context counts towards
        Eq. 9 (point 6) and the long-context ceiling lifts (point 12). With a CPU KV
        tier only the resident usage presses (point 13)."""
        usage = self.resident_usage(snapshot, usage)
        return bool(snapshot.pending) or usage >= self.config.gamma * snapshot.capacity_tokens

    def long_context_work(self, snapshot: InstanceSnapshot) -> bool:
        """Do the active agents (:meth:`is_active`) average at least
        ``busy_floor_context_tokens`` of context? Then a decode step is mostly their
        own KV reads, which a larger batch does not share (point 11)."""
        now = snapshot.now_s
        active = [self.agent_context(a) for a in snapshot.ongoing if self.is_active(a, now)]
        return bool(active) and sum(active) >= self.config.busy_floor_context_tokens * len(active)

    def busy_floor(self, snapshot: InstanceSnapshot) -> int:
        """The lowest level the work running now may use (docs/control-law.md, point 11).

        Decode is memory-bound: above the GPU's memory knee its speed is nearly flat
        in the SM clock, below it a step takes ∝ 1/f. For short contexts a lower
        clock still pays there: slower steps gather larger batches that share one
        read of the weights (the paper workload saves most at 660 MHz). A long
        context's step is mostly its own KV read, which no batch shares, so below
        the knee it only slows the agent while static power keeps running, and
        sessions end later (Claude Code trace: near the window's end, after it).
        So while the active agents (:meth:`is_active`) average at least
        ``busy_floor_context_tokens`` of context, the level is at least the first
        one at or above ``busy_floor_mhz``. Level 1 when off or nobody is active.
        """
        floor_mhz = self.config.busy_floor_mhz
        if floor_mhz is None or floor_mhz <= self.levels.min_mhz:
            return 1
        if not self.long_context_work(snapshot):
            return 1
        return self.levels.level_at_least(floor_mhz)

    def busy_ceiling(self, snapshot: InstanceSnapshot, pressed: bool) -> bool:
        """May Eq. 9's level over long-context work be held down to the busy floor's?

        Above the memory knee a decode step whose time is mostly its own KV read
        barely speeds up with the clock (docs/control-law.md, point 12), so Eq. 9's
        higher levels only buy prefill, which is compute-bound: the ceiling lifts
        while any ongoing agent has prompt tokens waiting for their first output
        (``AgentView.prefill_tokens``; the prefill boost takes the long ones to the
        top). Under pressure (``pressed``, :meth:`under_pressure`) the paper's law
        stands, as in :meth:`working_usage`. Eq. 8's top
        clock and the boosts are never capped (the caller checks the level).
        """
        return (
            (self.config.busy_ceiling or self.offload_tokens(snapshot) > 0)
            and not pressed
            and not any(a.prefill_tokens > 0 for a in snapshot.ongoing)
        )

    def prefill_boost(self, snapshot: InstanceSnapshot) -> bool:
        """Is enough compute-bound prefill queued to run it at the top clock?

        Prefill is compute-bound: its energy is nearly flat in the clock (a lower
        clock saves power but stretches the work by the same factor), while its
        latency scales ∝ 1/f and is what long-context sessions wait on. So a long
        prefill runs at the top clock and the GPU returns to the context level as
        soon as the first tokens are out (docs/control-law.md, point 9).
        """
        threshold = self.config.prefill_boost_tokens
        if threshold is None:
            return False
        return sum(a.prefill_tokens for a in snapshot.ongoing) >= threshold

    def decide(self, snapshot: InstanceSnapshot) -> ControlDecision:
        cfg = self.config
        if snapshot.capacity_tokens <= 0:
            raise InvalidSnapshotError(f"U_max must be positive, got {snapshot.capacity_tokens}")
        usage = self.usage(snapshot)
        pressed = self.under_pressure(snapshot, usage)
        level_tokens = self.level_usage(snapshot, self._working(snapshot, usage, pressed), pressed)
        level = context_level(level_tokens, snapshot.capacity_tokens, self.levels.count, cfg.alpha)
        reason = "context" if level < self.levels.count else "context-high"
        floor = self.busy_floor(snapshot)
        if level < floor:
            level, reason = floor, "busy-floor"
        elif 1 < floor < level < self.levels.count and self.busy_ceiling(snapshot, pressed):
            level, reason = floor, "busy-ceiling"
        if level < self.levels.count and self.prefill_boost(snapshot):
            level, reason = self.levels.count, "prefill"
        min_tput = self.min_throughput(snapshot)
        boost_tput = self.boost_throughput(snapshot) if cfg.slo_boost else None
        boost = boost_tput is not None and boost_tput < cfg.slo_tok_s
        if boost:
            level = self.levels.count
            reason = "slo-boost"
        admit, usage_after = self.admissions(snapshot, self.resident_usage(snapshot, usage))
        defer = cfg.thrashing_avoidance and usage_after > cfg.beta * snapshot.capacity_tokens
        return ControlDecision(
            epoch=snapshot.epoch,
            level=level,
            clock_mhz=self.levels.clock_of(level),
            admit=admit,
            defer_admissions=defer,
            boost=boost,
            usage_tokens=usage,
            capacity_tokens=snapshot.capacity_tokens,
            min_throughput_tok_s=min_tput,
            reason=reason,
            offload_tokens=self.offload_tokens(snapshot),
            level_tokens=level_tokens,
        )

"""The stages a per-instance policy is built from, each one equation or departure.

A policy (:class:`controllers.policy.Policy`) is a list of these, applied in
order to a :class:`Proposal` over one weighed :class:`~controllers.epoch.Epoch`;
each stage may change the level and says why (:class:`~controllers.reason.Reason`).
``kairos`` and ``kairos-alg1`` differ by which stages they hold, not by flags:

=======================  ==========================================  ===========
stage                    what it implements                           source
=======================  ==========================================  ===========
:class:`Activity`        Eq. 9 reads the working set, not every       point 6
                         context (every context under pressure)
:class:`ContextLevel`    ``ℓ = ⌊U/(α·U_max)·(L−1)⌋ + 1``, ``L`` at    Eq. 8–9
                         ``U ≥ α·U_max``
:class:`WindowedContextLevel`  the same over the working set's mean   point 17
                         of the last two minutes while nothing presses
:class:`LongContextFloor`  at least the memory knee's level while     point 11
                         long contexts are at work
:class:`TierCeiling`     long-context decode held at that level       points 12–13
                         where vLLM keeps a CPU KV tier
:class:`PrefillBoost`    the top level while long prefill is queued   point 9
:class:`SloBoost`        the top level while an agent is under τ      Eq. 10–12
:class:`ReachableSloBoost`  the same, for agents a clock can lift     point 7
=======================  ==========================================  ===========

Every stage is a small frozen object holding its own constants, with the
documented defaults; operators set only the intents among them (τ, α), research
scripts vary the rest in code (:meth:`controllers.policy.Policy.varied`). A stage
with memory across epochs (the window) hands each controller its own running
copy (:meth:`Stage.start`).
"""

from __future__ import annotations

import dataclasses
import math
from collections import deque
from dataclasses import dataclass
from typing import Protocol

from controllers.epoch import Epoch
from controllers.errors import InvalidConfigError, InvalidSnapshotError
from controllers.reason import Reason


@dataclass(frozen=True, slots=True)
class Proposal:
    """The level the stages so far propose, what Eq. 9 read, and why."""

    level_tokens: int
    """The context Eq. 9 reads (``U`` until :class:`Activity` says otherwise)."""
    level: int = 1
    reason: Reason = Reason.CONTEXT
    floor: int = 1
    """The lowest level the work running now may use (:class:`LongContextFloor`)."""
    boost: bool = False
    """The SLO boost set the level (Eq. 12)."""


class RunningStage(Protocol):
    """A stage as one controller runs it (with its own memory, if it has any)."""

    def apply(self, epoch: Epoch, proposal: Proposal) -> Proposal: ...


class Stage(RunningStage, Protocol):
    """A frozen stage of a policy: its constants, and how a controller starts it."""

    def start(self) -> RunningStage: ...


class _Stateless:
    """A stage without memory runs as itself."""

    __slots__ = ()

    def start(self) -> RunningStage:
        return self  # type: ignore[return-value]


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


@dataclass(frozen=True, slots=True)
class Activity(_Stateless):
    """Point 6: Eq. 9 from the working set, the contexts of agents at work.

    Eq. 9 counts the contexts of agents sitting in tool calls or think gaps: a GPU
    holding four idle 100K-token sessions ran at its top clock with nothing to
    compute. So the level comes from the agents with a request in flight or one
    that ended within ``idle_after_s`` (the rule's window). Under context pressure
    (agents held here, or ``U_res ≥ γ·U_max``) contexts must drain and every
    context counts again, as in the paper, less the evictable ones (point 14),
    which no clock drains. A ``U`` measured from vLLM carries no activity and is
    read as it is.
    """

    def apply(self, epoch: Epoch, proposal: Proposal) -> Proposal:
        if epoch.measured:
            tokens = epoch.usage_tokens
        elif epoch.pressed:
            tokens = epoch.held_tokens
        else:
            tokens = sum(epoch.active_contexts)
        return dataclasses.replace(proposal, level_tokens=tokens)


@dataclass(frozen=True, slots=True)
class ContextLevel(_Stateless):
    """Eq. 8–9: the level from the context Eq. 9 reads, the top one at ``α·U_max``."""

    alpha: float = 0.75

    def __post_init__(self) -> None:
        if not 0.0 < self.alpha <= 1.0:
            raise InvalidConfigError(f"alpha must be in (0, 1], got {self.alpha}")

    def apply(self, epoch: Epoch, proposal: Proposal) -> Proposal:
        top = epoch.levels.count
        level = context_level(proposal.level_tokens, epoch.capacity_tokens, top, self.alpha)
        reason = Reason.CONTEXT if level < top else Reason.CONTEXT_HIGH
        return dataclasses.replace(proposal, level=level, reason=reason)


@dataclass(frozen=True, slots=True)
class WindowedContextLevel(ContextLevel):
    """Point 17: Eq. 9 over the mean of the last ``context_window_s`` of calm epochs.

    The working set swings epoch by epoch (a session is active for a request and
    its think gap, idle for its tool call) while the work per minute stays put;
    power is convex in the clock, so a steady clock at the mean does that work for
    less energy. Under pressure and at Eq. 8's ``α·U_max`` the epoch's own value
    acts at once; epochs under pressure are not recorded. None: each epoch's own
    value (Eq. 9 as the paper reads it).
    """

    context_window_s: float | None = 120.0

    def __post_init__(self) -> None:
        ContextLevel.__post_init__(self)
        window = self.context_window_s
        if window is not None and not (math.isfinite(window) and window > 0.0):
            raise InvalidConfigError(f"context_window_s must be > 0 or None, got {window}")

    def start(self) -> RunningStage:
        return self if self.context_window_s is None else _CalmWindow(self)


class _CalmWindow:
    """One controller's memory of :class:`WindowedContextLevel`'s calm epochs."""

    def __init__(self, stage: WindowedContextLevel) -> None:
        assert stage.context_window_s is not None
        self.stage = stage
        self.window_s = stage.context_window_s
        self._calm: deque[tuple[float, int]] = deque()
        self._sum = 0

    def apply(self, epoch: Epoch, proposal: Proposal) -> Proposal:
        if not epoch.pressed:
            tokens = self._record(epoch, proposal.level_tokens)
            proposal = dataclasses.replace(proposal, level_tokens=tokens)
        return ContextLevel.apply(self.stage, epoch, proposal)

    def _record(self, epoch: Epoch, working: int) -> int:
        """Record this epoch; the mean it leaves, or ``working`` at ``α·U_max``.
        A sample at or after ``now_s`` (the same instant decided again, or a clock
        that went back) is replaced."""
        now = epoch.snapshot.now_s
        calm = self._calm
        while calm and now <= calm[-1][0]:
            self._sum -= calm.pop()[1]
        calm.append((now, working))
        self._sum += working
        while calm[0][0] <= now - self.window_s:
            self._sum -= calm.popleft()[1]
        if working >= self.stage.alpha * epoch.capacity_tokens:
            return working
        return round(self._sum / len(calm))


@dataclass(frozen=True, slots=True)
class LongContextFloor(_Stateless):
    """Point 11: while long contexts are at work, at least the memory knee's level.

    Decode is memory-bound: above the GPU's memory knee its speed is nearly flat in
    the SM clock, below it a step takes ∝ 1/f. Short contexts still gain below the
    knee (slower steps gather larger batches that share one read of the weights); a
    long context's step is mostly its own KV read, which no batch shares. So while
    the active agents average at least ``busy_floor_context_tokens``, the level is
    at least the first one at or above ``busy_floor_mhz``. It only ever raises.
    """

    busy_floor_mhz: int = 900
    busy_floor_context_tokens: int = 65536

    def __post_init__(self) -> None:
        if self.busy_floor_mhz < 1:
            raise InvalidConfigError(f"busy_floor_mhz must be >= 1, got {self.busy_floor_mhz}")
        if self.busy_floor_context_tokens < 0:
            raise InvalidConfigError(
                f"busy_floor_context_tokens must be >= 0, got {self.busy_floor_context_tokens}"
            )

    def floor(self, epoch: Epoch) -> int:
        """Level 1, or the knee's level while the active agents' mean context is long."""
        levels = epoch.levels
        if self.busy_floor_mhz <= levels.min_mhz:
            return 1
        active = epoch.active_contexts
        if not active or sum(active) < self.busy_floor_context_tokens * len(active):
            return 1
        return levels.level_at_least(self.busy_floor_mhz)

    def apply(self, epoch: Epoch, proposal: Proposal) -> Proposal:
        floor = self.floor(epoch)
        if proposal.level < floor:
            return dataclasses.replace(proposal, level=floor, reason=Reason.BUSY_FLOOR, floor=floor)
        return dataclasses.replace(proposal, floor=floor)


@dataclass(frozen=True, slots=True)
class TierCeiling(_Stateless):
    """Points 12–13: with a CPU KV tier, long-context decode runs at the floor's level.

    Above the memory knee a long context's decode step is its own KV read, nearly
    flat in the clock, so Eq. 9's higher levels buy it almost nothing. Where vLLM
    keeps a CPU KV tier the law holds the level at :class:`LongContextFloor`'s,
    unless prefill is waiting (compute-bound: what a clock does speed up), the
    instance is under pressure, or Eq. 8's top level stands. Without a tier it
    cost attainment where the fleet is overloaded (the contexts thrash, which the
    tier removes), so it applies with a tier only (docs/notes/).
    """

    def apply(self, epoch: Epoch, proposal: Proposal) -> Proposal:
        floor, level = proposal.floor, proposal.level
        if not 1 < floor < level < epoch.levels.count:
            return proposal
        if epoch.offload_tokens <= 0 or epoch.pressed:
            return proposal
        if any(a.prefill_tokens > 0 for a in epoch.snapshot.ongoing):
            return proposal
        return dataclasses.replace(proposal, level=floor, reason=Reason.BUSY_CEILING)


@dataclass(frozen=True, slots=True)
class PrefillBoost(_Stateless):
    """Point 9: the top level while ``prefill_boost_tokens`` of prefill are queued.

    Prefill is compute-bound: its energy is nearly flat in the clock while its
    latency scales ∝ 1/f, and it is what long-context sessions wait on. So a long
    prefill runs at the top clock, and the level returns once the first tokens
    are out.
    """

    prefill_boost_tokens: int = 65536

    def __post_init__(self) -> None:
        if self.prefill_boost_tokens < 1:
            raise InvalidConfigError(
                f"prefill_boost_tokens must be >= 1, got {self.prefill_boost_tokens}"
            )

    def apply(self, epoch: Epoch, proposal: Proposal) -> Proposal:
        top = epoch.levels.count
        if proposal.level < top and epoch.prefill_tokens >= self.prefill_boost_tokens:
            return dataclasses.replace(proposal, level=top, reason=Reason.PREFILL)
        return proposal


@dataclass(frozen=True, slots=True)
class SloBoost(_Stateless):
    """Eq. 10–12: the top level while the slowest agent's throughput is under τ.

    Over ongoing and held agents; a held agent without history enters at 0 after
    the grace of point 2 (boosting drains the contexts that hold it).
    """

    slo_tok_s: float = 20.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.slo_tok_s) and self.slo_tok_s >= 0.0):
            raise InvalidConfigError(f"slo_tok_s must be >= 0, got {self.slo_tok_s}")

    def candidates(self, epoch: Epoch) -> list[float]:
        """The throughputs the boost's minimum is over."""
        return [v for v, _ in epoch.throughputs]

    def apply(self, epoch: Epoch, proposal: Proposal) -> Proposal:
        values = self.candidates(epoch)
        if values and min(values) < self.slo_tok_s:
            top = epoch.levels.count
            return dataclasses.replace(proposal, level=top, reason=Reason.SLO_BOOST, boost=True)
        return proposal


@dataclass(frozen=True, slots=True)
class ReachableSloBoost(SloBoost):
    """Point 7: the SLO boost for the agents some clock can lift to τ.

    Eq. 3 throughput includes prefill and time held: a session whose latency is a
    100K-token prefill can sit under τ at any clock. Its requests ran at ``f(1)``
    or faster and compute time shrinks at most by ``f(L)/f(1)``, so a measured
    agent below ``τ·f(1)/f(L)`` cannot be lifted and is left out of the boost's
    minimum (it still counts in the reported one). Held agents past the grace
    still count: boosting drains the contexts that hold them.
    """

    def candidates(self, epoch: Epoch) -> list[float]:
        levels = epoch.levels
        if levels.count <= 1:
            return SloBoost.candidates(self, epoch)
        reach = levels.clock_of(levels.count) / levels.clock_of(1)
        floor = self.slo_tok_s / reach
        return [v for v, measured in epoch.throughputs if not measured or v >= floor]

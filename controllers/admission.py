"""Admission across the fleet: who runs now, where, and who must wait (one rule, one place).

The per-instance rule is KAIROS's Eq. 13 (:func:`admit_in_order`): admit held
agents in arrival order while ``U < γ·U_max`` and, by default, only while the
newcomer fits under ``β·U_max``. On its own that rule strands agents: Algorithm 2
places a newcomer by the instance's *current* load, and a 100K-token session placed
on a nearly-full instance then waits there while other GPUs sit idle.

So placement and admission are decided together, for the whole fleet:

* :func:`place` — a new agent goes to the instance the placement policy prefers
  *among those that would admit it now*; only when none would does it go where the
  policy prefers overall, to be held there.
* :func:`rehome_held` — a held agent that another instance would admit now moves
  there (and is admitted); nobody waits while another instance could take them.
* :func:`overflow_target` and :func:`holds_overflow` — an admitted agent whose next
  request would not fit beside those running moves where it fits, or, when no
  instance has room, waits in the hold queue rather than make vLLM preempt.

The rule is one :class:`~kairos_common.views.AdmissionRule` per policy, defined
with the policy (:mod:`controllers.kairos`) and carried whole in each daemon's
decision; each instance admits by its own (:attr:`InstanceGate.rule`).

An instance *admits now* (:func:`admits_now`) when its policy does no admission
control (no-control, fixed clocks, ``kairos-no-ta``), its capacity is unknown,
or: its daemon does not defer admissions, nobody is queued ahead (head-of-line:
arrival order is never skipped on an instance), and the Eq. 13 rule admits the
agent on top of the instance's current usage.

The router (``router/admission.py``, ``router/placement_service.py``) and the
simulator (``simulator/fleet_admission.py``) call exactly these functions, with
the same inputs, so a simulated result describes the router's behaviour.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from controllers.placement import InstanceLoad, LeastContext, PlacementPolicy, PlacementRequest
from kairos_common.views import ADMIT_ALL as ADMIT_ALL  # the wire's; re-exported
from kairos_common.views import AdmissionRule as AdmissionRule


def admit_in_order(
    sizes: Iterable[tuple[str, int]], usage_tokens: int, capacity_tokens: int, rule: AdmissionRule
) -> tuple[tuple[str, ...], int]:
    """Eq. 13 over ``(agent_id, C_a)`` in arrival order, head-of-line.

    The head is admitted while ``U < γ·U_max`` and only if ``U + C_head ≤ β·U_max``
    (§6.2.4's text rather than the pseudo-code, which could overshoot ``β``:
    docs/control-law.md, point 3). Returns the admitted ids and ``U`` after
    admitting them. An empty instance always admits its head, or an agent larger
    than ``β·U_max`` could never run.
    """
    u = usage_tokens
    admitted: list[str] = []
    if not rule.enabled or capacity_tokens <= 0:
        for agent_id, size in sizes:
            admitted.append(agent_id)
            u += size
        return tuple(admitted), u
    for agent_id, size in sizes:
        if u >= rule.gamma * capacity_tokens:
            break
        if u > 0 and u + size > rule.beta * capacity_tokens:
            break
        admitted.append(agent_id)
        u += size
    return tuple(admitted), u


def active_now(
    in_flight: bool, last_active_s: float | None, now_s: float, idle_after_s: float
) -> bool:
    """Is an agent working now: a request in flight, or one ended within
    ``idle_after_s``? Unknown activity (no request ended yet) counts as active."""
    return activity(in_flight, last_active_s, now_s, idle_after_s, None) is Activity.ACTIVE


class Activity(enum.Enum):
    """What an ongoing agent's context asks of its instance's KV cache now."""

    ACTIVE = "active"
    """A request in flight, or one ended within ``idle_after_s``: it needs its room."""
    IDLE = "idle"
    """Between requests (a tool call, a think gap): its blocks wait in HBM, or in
    the CPU KV tier, for a return that is likely soon."""
    EVICTABLE = "evictable"
    """Idle past ``evictable_after_s``: vLLM keeps its blocks only as evictable
    prefix cache, and one re-prefill on its return is cheaper than holding
    newcomers for it (docs/control-law.md, point 14)."""


def activity(
    in_flight: bool,
    last_active_s: float | None,
    now_s: float,
    idle_after_s: float,
    evictable_after_s: float | None,
) -> Activity:
    """Active (a request in flight, one ended within ``idle_after_s``, or unknown
    activity), else evictable once idle for ``evictable_after_s`` (None: never),
    else idle."""
    if in_flight or last_active_s is None:
        return Activity.ACTIVE
    idle_s = now_s - last_active_s
    if idle_s < idle_after_s:
        return Activity.ACTIVE
    if evictable_after_s is not None and idle_s >= evictable_after_s:
        return Activity.EVICTABLE
    return Activity.IDLE


def resident_tokens(contexts: Iterable[tuple[int, Activity]], offload_tokens: int) -> int:
    """The part of ``U`` that needs room in HBM, over ``(C_a, activity)`` per agent.

    An evictable context (idle past the eviction window) needs none: vLLM frees a
    finished request's blocks at once and keeps them only as prefix cache, which it
    evicts for anyone who needs the room; the agent re-prefills when it comes back
    (docs/control-law.md, point 14).

    An engine with a CPU KV tier (vLLM ``--kv-offloading-size``) keeps a copy of
    every computed block in host memory and loads a prefix the GPU evicted back
    instead of computing it again (0.4 s for 100K tokens over PCIe, against tens
    of seconds of prefill). So the contexts of idle agents (no request in flight
    for a while) that the tier can hold press on nothing: admitting beside them
    costs a copy when they return, not a thrash. The tier also holds the active
    contexts' blocks (it copies every block), so the idle ones get what is left:
    ``active + idle − min(idle, max(0, T − active))``. Without a tier (``T`` = 0)
    and with nothing evictable this is ``U`` (point 13).
    """
    active = idle = 0
    for tokens, state in contexts:
        if state is Activity.ACTIVE:
            active += tokens
        elif state is Activity.IDLE:
            idle += tokens
    parked = min(idle, max(0, offload_tokens - active))
    return active + idle - parked


def evictable_tokens(contexts: Iterable[tuple[int, Activity]]) -> int:
    """The part of ``U`` that is only evictable prefix cache (point 14): room vLLM
    gives to whoever needs it, so overflow relief may move an agent into it."""
    return sum(tokens for tokens, state in contexts if state is Activity.EVICTABLE)


def admission_tokens(
    agents: Iterable[tuple[int, bool, float | None]],
    now_s: float,
    idle_after_s: float,
    evictable_after_s: float | None,
    offload_tokens: int,
) -> tuple[int, int] | None:
    """``(resident, evictable)`` over ``(C_a, in_flight, last_active_s)`` per agent
    (:func:`resident_tokens`, :func:`evictable_tokens`), as the controller, the
    router and the simulator all weigh an instance. None when the law counts every
    context (no CPU KV tier, no eviction window): the caller uses ``U``, and
    ``agents`` is not read."""
    if offload_tokens <= 0 and evictable_after_s is None:
        return None
    contexts = [
        (tokens, activity(in_flight, last, now_s, idle_after_s, evictable_after_s))
        for tokens, in_flight, last in agents
    ]
    return resident_tokens(contexts, offload_tokens), evictable_tokens(contexts)


def new_agent_tokens(
    estimate_tokens: int | None, placeholder_tokens: int, limit_tokens: int
) -> int:
    """Size of an agent before its first response, for placement and admission.

    Its first prompt's token estimate when known (what vLLM will allocate), else
    the placeholder. A prompt beyond ``limit_tokens`` (the model's maximum length,
    or the KV capacity) is rejected by vLLM at once and holds no cache: it is sized
    0, which admission never holds (:func:`admits_now`). Sized at the limit instead,
    it waited for a nearly empty instance only to get its error (Claude Code trace,
    0.008 sessions/s: sessions held 500–870 s for a 400 vLLM answers at once).
    """
    size = placeholder_tokens if estimate_tokens is None else estimate_tokens
    if limit_tokens > 0 and size > limit_tokens:
        return 0
    return max(0, size)


@dataclass(frozen=True, slots=True)
class InstanceGate:
    """One eligible instance as fleet admission sees it.

    ``held`` counts agents already queued there; ``defer`` is its daemon's latest
    valid "defer admissions". ``rule`` is the admission rule of the instance's own
    daemon while it is fresh (its policy's, carried whole in its decision; the
    simulator's controller's); None: the fleet's (the router's, from its
    ``policy``). A rule that is not ``enabled`` admits every agent at once (the
    router must not hold agents for such a policy). ``resident_tokens`` is the
    usage Eq. 13 admits against when the instance has a CPU KV tier or an eviction
    window (:func:`resident_tokens`); None:
    ``load.usage_tokens``. Placement still ranks instances by ``load`` (every
    context: each costs its instance a copy or a recompute when it returns).
    """

    load: InstanceLoad
    held: int = 0
    defer: bool = False
    resident_tokens: int | None = None
    evictable_tokens: int = 0
    """The contexts of agents away past the eviction window (:func:`evictable_tokens`),
    which overflow relief counts as room."""
    rule: AdmissionRule | None = None

    @property
    def admission_usage_tokens(self) -> int:
        """The ``U`` Eq. 13 admits against here."""
        return self.load.usage_tokens if self.resident_tokens is None else self.resident_tokens

    def rule_here(self, rule: AdmissionRule) -> AdmissionRule:
        """The rule Eq. 13 admits by here: the instance's own, else the fleet's ``rule``."""
        return rule if self.rule is None else self.rule


def admits_now(gate: InstanceGate, context_tokens: int, rule: AdmissionRule) -> bool:
    """Would ``gate``'s instance admit an agent of ``context_tokens`` right now?"""
    cap = gate.load.capacity_tokens
    here = gate.rule_here(rule)
    if not here.enabled or cap <= 0 or context_tokens <= 0:
        return True  # (an agent that brings no context adds nothing to U: nothing to wait for)
    if gate.defer or gate.held > 0:
        return False
    admitted, _ = admit_in_order(((".", context_tokens),), gate.admission_usage_tokens, cap, here)
    return bool(admitted)


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a new agent goes, and whether it runs at once or is held there."""

    instance: str
    admit_now: bool


def place(
    policy: PlacementPolicy,
    request: PlacementRequest,
    gates: Sequence[InstanceGate],
    rule: AdmissionRule,
) -> Placement:
    """The policy's choice among instances that admit ``request`` now, else overall.

    ``request.context_tokens`` must be what is known of the agent's size (its first
    prompt's token estimate), never a fixed placeholder when the prompt is known:
    a 3000-token guess would place a 100K-token session where it cannot run.
    """
    size = request.context_tokens
    open_now = [g.load for g in gates if admits_now(g, size, rule)]
    if open_now:
        return Placement(policy.place(request, open_now), admit_now=True)
    return Placement(policy.place(request, [g.load for g in gates]), admit_now=False)


@dataclass(frozen=True, slots=True)
class HeldAgent:
    """An agent waiting for admission on ``instance``, sized by what is known."""

    agent_id: str
    instance: str
    context_tokens: int


@dataclass(frozen=True, slots=True)
class Move:
    """Take ``agent_id`` out of ``source``'s hold queue and admit it on ``target``."""

    agent_id: str
    source: str
    target: str


def rehome_held(
    policy: PlacementPolicy,
    held: Sequence[HeldAgent],
    gates: Sequence[InstanceGate],
    rule: AdmissionRule,
    sequence: int = 0,
) -> tuple[Move, ...]:
    """Held agents (in global arrival order) that another instance admits now.

    Each move adds the agent's size to its target before the next agent is
    considered, so one pass never over-fills an instance. An agent whose own
    instance is the only one with room stays: its instance admits it through the
    per-instance rule. ``sequence`` numbers the placements (round-robin).
    """
    by_name = {g.load.name: g for g in gates}
    moves: list[Move] = []
    for agent in held:
        size = agent.context_tokens
        others = [
            g for name, g in by_name.items() if name != agent.instance and admits_now(g, size, rule)
        ]
        if not others:
            continue
        request = PlacementRequest(agent.agent_id, sequence + len(moves), size)
        target = policy.place(request, [g.load for g in others])
        moves.append(Move(agent.agent_id, agent.instance, target))
        by_name[target] = with_admitted(by_name[target], size)
    return tuple(moves)


def with_admitted(gate: InstanceGate, tokens: int) -> InstanceGate:
    """``gate`` once an agent of ``tokens`` is admitted there (a planned move)."""
    load = dataclasses.replace(gate.load, usage_tokens=gate.load.usage_tokens + tokens, active=True)
    resident = None if gate.resident_tokens is None else gate.resident_tokens + tokens
    return dataclasses.replace(gate, load=load, resident_tokens=resident)


def overflow_target(
    agent_id: str,
    current: str,
    context_tokens: int,
    running_tokens: int,
    gates: Sequence[InstanceGate],
    rule: AdmissionRule,
) -> str | None:
    """Where an admitted agent goes, at its next request, if it cannot run where it is.

    Contexts keep growing after admission, so the agents of one instance can come
    to need more than its KV cache. When the agent's context ``C_a`` and those of
    the requests already running there (``running_tokens``) exceed ``U_max``, vLLM
    must preempt and recompute to serve it. Algorithm 3 moves an agent only once
    ``U_i ≥ ρ·U_j`` (ρ = 2), which left such an instance thrashing beside instances
    with room (Claude Code trace, 0.008 sessions/s: ``U/U_max`` 1.2–1.3 for an hour
    next to 0.77, 47 preemptions). So the agent moves, at once, to the instance of
    least context that has room for it by Eq. 13 (``U_j < γ·U_max`` and
    ``U_j + C_a ≤ β·U_max``); it re-prefills there, which preemption would have made
    it do anyway, and its cache on the old instance becomes evictable.

    Idle contexts do not trigger it: vLLM evicts an idle agent's prefix cache
    without preempting anyone, and a move then only costs a re-prefill (moving
    whenever ``U_i > U_max`` cost one of 16 cells at 0.004 sessions/s two points of
    attainment). For the same reason the target's room leaves out the contexts of
    agents away past the eviction window (``gate.evictable_tokens``, point 14).
    The move admits nobody (the context is already in the fleet), so agents held
    on the target or a deferring daemon there do not stop it (requiring that cost
    most of the effect: 72 instead of 19 preemptions at 0.008 sessions/s).
    Room is judged with Eq. 13 under every policy, also where admission control is
    off. None: stay. docs/control-law.md, point 10.
    """
    here = next((g for g in gates if g.load.name == current), None)
    if here is None or not overflows(context_tokens, running_tokens, here.load.capacity_tokens):
        return None
    fits = [
        g.load
        for g in gates
        if g.load.name != current
        and g.load.capacity_tokens > 0
        and admit_in_order(
            ((agent_id, context_tokens),),
            g.load.usage_tokens - g.evictable_tokens,
            g.load.capacity_tokens,
            dataclasses.replace(g.rule_here(rule), enabled=True),
        )[0]
    ]
    if not fits:
        return None
    return LeastContext().place(PlacementRequest(agent_id, 0, context_tokens), fits)


def overflows(context_tokens: int, running_tokens: int, capacity_tokens: int) -> bool:
    """Whether a request over ``context_tokens`` would not fit in the KV cache beside
    the requests running there (``running_tokens``): vLLM would preempt to serve it."""
    return context_tokens > 0 and running_tokens + context_tokens > capacity_tokens


def holds_overflow(
    context_tokens: int, running_tokens: int, gate: InstanceGate, rule: AdmissionRule
) -> bool:
    """Whether an admitted agent's next request waits in the hold queue (point 16).

    Called when overflow relief (:func:`overflow_target`) found no instance with room:
    the request would not fit beside those running (:func:`overflows`), so serving it
    now preempts and recomputes running requests, which then preempt others as their
    agents come back. Eq. 13 holds newcomers so that admitted contexts fit, but the
    admitted contexts keep growing; when the whole fleet is past its KV cache, the
    paper's law has no answer and the instance thrashes (dev trace, half 1, 0.008
    sessions/s: 679 preemptions in 16 seeds). The answer is the one operating systems
    give to thrashing, load control: the agent stops being admitted, its context no
    longer counts, and it is admitted again by the same rule as a newcomer (Eq. 13,
    fleet admission, making room) once running contexts leave it room. It waits
    instead of the agents whose requests it would have preempted.

    Only with nothing else in flight does it run anyway (waiting frees nothing),
    and only under admission control (a policy that admits everyone also thrashes).
    """
    if not gate.rule_here(rule).enabled:
        return False
    cap = gate.load.capacity_tokens
    return cap > 0 and running_tokens > 0 and overflows(context_tokens, running_tokens, cap)

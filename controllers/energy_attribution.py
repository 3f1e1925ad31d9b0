"""Energy per agent: split one instance's measured GPU energy among the agents it served.

The GPU measures one number per interval (joules between two energy-counter
readings); what each agent caused is estimated from the work the router saw it
do in that interval. Per interval and instance:

* **static** = ``idle_power_w × duration_s`` (capped at the measured energy): what
  the GPU draws with nothing queued. It is *not* split among agents: it is drawn
  whether one agent or none is served, an agent thinking in a tool call would
  otherwise be charged for its neighbours' idle GPU, and no work measure says
  whose it is. It is reported as the instance's **unattributed** line.
* **dynamic** = measured − static, split among the agents in proportion to
  their work, each agent's work being the estimated GPU seconds of

  - prefill: ``uncached × prefill_s_per_token + attention_pairs × attn_s_per_pair``
    with ``pairs = u·c + u(u+1)/2`` for ``u`` uncached and ``c`` cached prompt tokens;
  - decode: ``tokens × (step_shared_s / B + token_s)`` (the step's fixed cost and
    weight streaming shared by the ``B`` sequences decoding together) plus
    ``context_token_steps × kv_s_per_token`` (reading its KV cache every step).

  The form is the online performance model's (:mod:`controllers.perf_model`:
  decode time ``a + b·B + c·K``, TTFT ``d + e·u + h·P``), so its fitted
  coefficients can be used as weights (:meth:`WorkWeights.from_decode_prefill`);
  the defaults are an H100 serving a mid-size MoE model (docs/energy.md).

Work is counted when a request *finishes* (that is when the router knows its
tokens), so an interval in which requests are still running but none finished
holds its dynamic energy over (``carried_j``) to the next interval that has
finished work; one with no request in flight at all gives it up as unattributed.
Every interval's parts therefore sum exactly to its measured energy:
``Σ attributed + unattributed + Δcarried = measured``.

Pure: no I/O, no clocks; the caller passes energies, durations and work.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

DEFAULT_IDLE_POWER_W: float | None = None
"""No prior: the idle power is learned from intervals with no work at all."""


@dataclass(frozen=True, slots=True)
class WorkWeights:
    """Estimated GPU seconds per unit of work (the shares only need their ratios)."""

    prefill_s_per_token: float = 15e-6
    attn_s_per_pair: float = 1.75e-9
    step_shared_s: float = 6.5e-3
    """Per decode step, shared by the batch: host overhead, fixed kernels, weights."""
    token_s: float = 1.0e-3
    """Per decoded token, not shared (expert weights a larger batch touches)."""
    kv_s_per_token: float = 3.7e-8
    """Per context token read in one decode step (KV bytes / achieved bandwidth)."""

    def __post_init__(self) -> None:
        for name in (
            "prefill_s_per_token",
            "attn_s_per_pair",
            "step_shared_s",
            "token_s",
            "kv_s_per_token",
        ):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0.0):
                raise ValueError(f"WorkWeights.{name} must be finite and ≥ 0, got {value!r}")

    @classmethod
    def from_decode_prefill(
        cls, a_s: float, b_s: float, c_s_per_100k: float, e_s_per_1k: float, h_s_per_1e7: float
    ) -> WorkWeights:
        """From the performance model's coefficients at one clock: decode time per
        token ``a + b·B + c·K/1e5``, TTFT ``d + e·u/1e3 + h·P/1e7`` (negative fits
        are clamped to 0)."""
        return cls(
            prefill_s_per_token=max(e_s_per_1k, 0.0) / 1e3,
            attn_s_per_pair=max(h_s_per_1e7, 0.0) / 1e7,
            step_shared_s=max(a_s, 0.0),
            token_s=max(b_s, 0.0),
            kv_s_per_token=max(c_s_per_100k, 0.0) / 1e5,
        )


@dataclass(slots=True)
class AgentWork:
    """One agent's work on one instance in one interval, in estimated GPU seconds
    (decode tokens kept apart: their shared per-step cost depends on the batch)."""

    prefill_s: float = 0.0
    decode_tokens: float = 0.0
    context_s: float = 0.0

    def decode_s(self, w: WorkWeights, batch: float) -> float:
        per_token = w.step_shared_s / max(batch, 1.0) + w.token_s
        return self.decode_tokens * per_token + self.context_s


def request_work(
    w: WorkWeights, prompt_tokens: int, cached_tokens: int, completion_tokens: int
) -> tuple[float, float, float]:
    """``(prefill_s, decode_tokens, context_s)`` of one finished request (cached is
    clamped to the prompt; context read per decode step grows by one token)."""
    p = max(int(prompt_tokens), 0)
    c = min(max(int(cached_tokens), 0), p)
    n = max(int(completion_tokens), 0)
    u = p - c
    pairs = u * c + u * (u + 1) // 2
    prefill_s = u * w.prefill_s_per_token + pairs * w.attn_s_per_pair
    return prefill_s, float(n), (n * p + n * (n - 1) // 2) * w.kv_s_per_token


@dataclass(frozen=True, slots=True)
class AgentShare:
    """Joules attributed to one agent in one interval, by kind of work."""

    prefill_j: float
    decode_j: float

    @property
    def energy_j(self) -> float:
        return self.prefill_j + self.decode_j


@dataclass(frozen=True, slots=True)
class IntervalSplit:
    """One interval's measured energy, in parts that sum to it exactly.

    ``measured_j == Σ shares + unattributed_j + (carried_out_j − carried_in_j)``.
    """

    measured_j: float
    static_j: float
    shares: dict[str, AgentShare]
    unattributed_j: float
    carried_in_j: float
    carried_out_j: float

    @property
    def attributed_j(self) -> float:
        return sum(s.energy_j for s in self.shares.values())


def split_interval(
    energy_j: float,
    duration_s: float,
    work: dict[str, AgentWork],
    *,
    idle_power_w: float | None,
    in_flight: bool,
    carried_in_j: float = 0.0,
    weights: WorkWeights | None = None,
    batch: float | None = None,
) -> IntervalSplit:
    """Split one interval's ``energy_j`` (see the module docstring).

    ``batch`` is the mean number of sequences decoding together (None: the number
    of agents with work, at least 1); ``in_flight`` whether a request was still
    running at the interval's end (then unattributable dynamic energy is carried).
    """
    w = weights or WorkWeights()
    measured = max(float(energy_j), 0.0) if math.isfinite(energy_j) else 0.0
    carried_in = max(float(carried_in_j), 0.0) if math.isfinite(carried_in_j) else 0.0
    idle_w = idle_power_w if idle_power_w is not None and math.isfinite(idle_power_w) else 0.0
    static = min(max(idle_w, 0.0) * max(duration_s, 0.0), measured)
    dynamic = measured - static + carried_in
    b = batch if batch is not None else float(max(len(work), 1))
    parts = {aid: (wk.prefill_s, wk.decode_s(w, b)) for aid, wk in work.items()}
    total_s = math.fsum(p + d for p, d in parts.values())
    if total_s > 0.0 and dynamic > 0.0:
        shares = {
            aid: AgentShare(dynamic * p / total_s, dynamic * d / total_s)
            for aid, (p, d) in parts.items()
            if p + d > 0.0
        }
        return IntervalSplit(measured, static, shares, static, carried_in, 0.0)
    if in_flight and dynamic > 0.0:
        return IntervalSplit(measured, static, {}, static, carried_in, dynamic)
    return IntervalSplit(measured, static, {}, static + dynamic, carried_in, 0.0)


class _Bucket:
    """Work falling in one interval of one instance; ``end_s`` None while open."""

    __slots__ = ("end_s", "energy_j", "in_flight", "request_s", "start_s", "work")

    def __init__(self, start_s: float | None) -> None:
        self.start_s = start_s
        self.end_s: float | None = None
        self.energy_j = 0.0
        self.in_flight = False
        self.request_s = 0.0
        self.work: dict[str, AgentWork] = {}

    def overlap(self, a: float, b: float) -> float:
        lo = a if self.start_s is None else max(a, self.start_s)
        hi = b if self.end_s is None else min(b, self.end_s)
        return max(hi - lo, 0.0)

    def add(self, agent_id: str, prefill_s: float, decode_tokens: float, context_s: float) -> None:
        wk = self.work.get(agent_id)
        if wk is None:
            wk = self.work[agent_id] = AgentWork()
        wk.prefill_s += prefill_s
        wk.decode_tokens += decode_tokens
        wk.context_s += context_s


@dataclass(slots=True)
class InstanceEnergy:
    """Running totals of one instance: measured = attributed + unattributed + held,
    where held is the energy of intervals not yet attributed plus ``carried_j``."""

    measured_j: float = 0.0
    attributed_j: float = 0.0
    unattributed_j: float = 0.0
    carried_j: float = 0.0
    idle_power_w: float | None = None
    intervals: int = 0

    @property
    def counted_j(self) -> float:
        return self.attributed_j + self.unattributed_j


class EnergyAccountant:
    """Per-instance work and per-agent attributed joules: the one attribution the
    router and the simulator share (pure state, owned by one event loop).

    Work is known when a request finishes, but it was done over its whole span,
    so a finished request's work is spread over the intervals it overlapped
    (prefill over its time to first token, decode over the rest). A closed
    interval is therefore attributed only once every request that ran during it
    has finished: once it ended before the oldest request still in flight began,
    or when it is older than ``max_lag_s`` (work of a request older than that
    lands in the oldest interval still open to it).

    ``idle_power_w``: the instance's idle draw (W) when known; None learns it as
    the lowest mean power of an interval in which the instance did no work.
    """

    def __init__(
        self,
        *,
        idle_power_w: float | None = None,
        weights: WorkWeights | None = None,
        max_lag_s: float = 600.0,
    ) -> None:
        self.idle_prior_w = idle_power_w
        self.weights = weights or WorkWeights()
        self.max_lag_s = max_lag_s
        self.instances: dict[str, InstanceEnergy] = {}
        self.agents: dict[str, AgentShare] = {}
        self._buckets: dict[str, list[_Bucket]] = {}
        self._held_j: dict[str, dict[str, float]] = {}  # instance → agent → J not popped

    def instance(self, name: str) -> InstanceEnergy:
        inst = self.instances.get(name)
        if inst is None:
            inst = self.instances[name] = InstanceEnergy(idle_power_w=self.idle_prior_w)
            self._buckets[name] = [_Bucket(None)]
        return inst

    def begin(self, instance: str, start_s: float) -> None:
        """Measurement of ``instance`` starts at ``start_s`` (if nothing started it before)."""
        self.instance(instance)
        bucket = self._buckets[instance][-1]
        if bucket.start_s is None:
            bucket.start_s = start_s

    def record(
        self,
        instance: str,
        agent_id: str,
        prompt_tokens: int,
        cached_tokens: int,
        completion_tokens: int,
        *,
        start_s: float,
        end_s: float,
        first_token_s: float | None = None,
    ) -> None:
        """A request of ``agent_id`` ran on ``instance`` from ``start_s`` to ``end_s``
        (seconds on the same clock as :meth:`close`'s)."""
        self.instance(instance)
        buckets = self._buckets[instance]
        prefill_s, tokens, context_s = request_work(
            self.weights, prompt_tokens, cached_tokens, completion_tokens
        )
        end = max(end_s, start_s)
        first = end if first_token_s is None else min(max(first_token_s, start_s), end)
        if first_token_s is None or first <= start_s or first >= end:
            self._spread(buckets, agent_id, start_s, end, (prefill_s, tokens, context_s))
            return
        self._spread(buckets, agent_id, start_s, first, (prefill_s, 0.0, 0.0))
        self._spread(buckets, agent_id, first, end, (0.0, tokens, context_s))

    @staticmethod
    def _spread(
        buckets: list[_Bucket],
        agent_id: str,
        a: float,
        b: float,
        amount: tuple[float, float, float],
    ) -> None:
        span = b - a
        if span <= 0.0:  # an instant: the newest interval that had begun by then
            at = next((k for k in reversed(buckets) if k.start_s is None or k.start_s <= a), None)
            (at or buckets[0]).add(agent_id, *amount)
            return
        placed = 0.0
        for bucket in reversed(buckets):
            ov = bucket.overlap(a, b)
            if ov > 0.0:
                f = ov / span
                placed += f
                bucket.request_s += ov
                bucket.add(agent_id, amount[0] * f, amount[1] * f, amount[2] * f)
            elif bucket.end_s is not None and bucket.end_s <= a:
                break
        rest = 1.0 - placed
        if rest > 1e-12:  # ran before the oldest interval still open: that one takes it
            buckets[0].add(agent_id, amount[0] * rest, amount[1] * rest, amount[2] * rest)

    def has_open_work(self, agent_id: str) -> bool:
        """Whether work of ``agent_id`` still waits for an interval's attribution."""
        return any(agent_id in b.work for bs in self._buckets.values() for b in bs)

    def close(
        self,
        instance: str,
        energy_j: float,
        end_s: float,
        *,
        in_flight_since_s: float | None,
        start_s: float | None = None,
    ) -> list[IntervalSplit]:
        """The instance measured ``energy_j`` since its last close, ending at
        ``end_s``; ``in_flight_since_s`` is when the oldest request still in flight
        on it began (None: none is). ``start_s``: where the first interval began,
        when known (else its static part is taken as 0). Returns the intervals
        attributed now, oldest first."""
        inst = self.instance(instance)
        buckets = self._buckets[instance]
        open_ = buckets[-1]
        if open_.start_s is None:
            open_.start_s = end_s if start_s is None else min(start_s, end_s)
        open_.end_s = max(end_s, open_.start_s)
        open_.energy_j = max(float(energy_j), 0.0) if math.isfinite(energy_j) else 0.0
        open_.in_flight = in_flight_since_s is not None
        inst.measured_j += open_.energy_j
        buckets.append(_Bucket(open_.end_s))
        done: list[IntervalSplit] = []
        while len(buckets) > 1:
            oldest_end = buckets[0].end_s
            if (
                in_flight_since_s is not None
                and oldest_end is not None
                and oldest_end > in_flight_since_s
                and end_s - oldest_end < self.max_lag_s
            ):
                break
            done.append(self._attribute(instance, inst, buckets.pop(0)))
        return done

    def _attribute(self, name: str, inst: InstanceEnergy, bucket: _Bucket) -> IntervalSplit:
        assert bucket.end_s is not None and bucket.start_s is not None
        duration = bucket.end_s - bucket.start_s
        if (
            self.idle_prior_w is None
            and not bucket.work
            and not bucket.in_flight
            and bucket.request_s == 0.0
            and duration > 0
        ):
            mean_w = bucket.energy_j / duration
            if inst.idle_power_w is None or mean_w < inst.idle_power_w:
                inst.idle_power_w = mean_w
        split = split_interval(
            bucket.energy_j,
            duration,
            bucket.work,
            idle_power_w=inst.idle_power_w,
            in_flight=bucket.in_flight,
            carried_in_j=inst.carried_j,
            weights=self.weights,
            batch=bucket.request_s / duration if duration > 0 else None,
        )
        inst.unattributed_j += split.unattributed_j
        inst.carried_j = split.carried_out_j
        inst.intervals += 1
        agents = self.agents
        held = self._held_j.setdefault(name, {})
        for aid, share in split.shares.items():
            inst.attributed_j += share.energy_j
            held[aid] = held.get(aid, 0.0) + share.energy_j
            old = agents.get(aid)
            agents[aid] = (
                share
                if old is None
                else AgentShare(old.prefill_j + share.prefill_j, old.decode_j + share.decode_j)
            )
        return split

    def flush(self, instance: str) -> list[IntervalSplit]:
        """End of a run: attribute every closed interval now and give up the carried
        energy as unattributed (work after the last close stays unmeasured)."""
        inst = self.instance(instance)
        buckets = self._buckets[instance]
        done = [self._attribute(instance, inst, buckets.pop(0)) for _ in range(len(buckets) - 1)]
        inst.unattributed_j += inst.carried_j
        inst.carried_j = 0.0
        return done

    def pop_agent(self, agent_id: str) -> AgentShare:
        """The agent's total so far, forgotten (its record is being written)."""
        for held in self._held_j.values():
            held.pop(agent_id, None)
        return self.agents.pop(agent_id, AgentShare(0.0, 0.0))

    def unpopped_j(self, instance: str) -> float:
        """Joules ``instance`` attributed to agents not popped yet (no record written)."""
        return math.fsum(self._held_j.get(instance, {}).values())

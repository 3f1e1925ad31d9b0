"""One simulated vLLM instance and the agents on it (:class:`~simulator.cluster.Cluster`'s unit).

The cluster owns the event loop and the router's decisions; an instance keeps
what the router and its daemon know of one GPU: which agents are admitted and
held there, their summed context ``U_i`` (kept incrementally: it is read at
every request), and what vLLM reports about each finished request.
"""

from __future__ import annotations

from controllers import (
    AdmissionRule,
    ControlDecision,
    Controller,
    InstanceLoad,
    RequestObservation,
)
from controllers.admission import admission_tokens
from controllers.energy_attribution import EnergyAccountant
from controllers.room import IdleAgent, idle_agents
from reporting.records import EpochRecord
from simulator.agents import SimAgent
from simulator.engine import Engine
from simulator.engine_types import RequestFinished
from simulator.gpu import SimulatedGpu


class SimInstance:
    """One vLLM instance as the cluster drives it: its engine, GPU and controller,
    the agents admitted to it (``ongoing``) and held for it (``pending``), and the
    marks its epoch accounting reads."""

    __slots__ = (
        "_load",
        "controller",
        "decision",
        "energy_mark_j",
        "engine",
        "epoch",
        "gen_mark",
        "gpu",
        "index",
        "name",
        "observations",
        "ongoing",
        "pending",
        "pre_mark",
        "usage",
    )

    def __init__(self, index: int, engine: Engine, gpu: SimulatedGpu, ctrl: Controller) -> None:
        self.index = index
        self.name = f"sim{index}"
        self.engine = engine
        self.gpu = gpu
        self.controller = ctrl
        self.ongoing: dict[str, SimAgent] = {}
        self.pending: list[SimAgent] = []
        self.observations: list[RequestObservation] = []
        self.decision: ControlDecision | None = None
        self.epoch = 0
        self.energy_mark_j = 0.0
        self.gen_mark = 0
        self.pre_mark = 0
        self.usage = 0
        """Σ ``C_a`` of ``ongoing``, kept up to date by :meth:`join`, :meth:`leave` and
        :meth:`completed` (summing it afresh at every request was a hot spot)."""
        self._load: InstanceLoad | None = None

    def usage_tokens(self) -> int:
        return self.usage

    @property
    def overcommitted(self) -> bool:
        """``U`` past ``U_max``: only then can a request not fit beside the running
        ones (overflow relief, point 10; holding back, point 16), as the router's
        ``AdmissionService.overcommitted``."""
        return self.usage > self.engine.capacity_tokens

    def running_tokens(self, besides: SimAgent) -> int:
        """The contexts of the agents other than ``besides`` with a request in flight:
        what a request of ``besides`` must fit beside (the router's
        ``Ledger.running_tokens``)."""
        return sum(
            a.usage_tokens() for a in self.ongoing.values() if a.in_flight and a is not besides
        )

    def load(self, capacity_tokens: int) -> InstanceLoad:
        """The router's view ``U_i``; rebuilt only after :meth:`join`, :meth:`leave`
        or :meth:`completed` changed it (it is read at every request)."""
        if self._load is None:
            self._load = InstanceLoad(
                self.name, self.index, self.usage, capacity_tokens, bool(self.ongoing)
            )
        return self._load

    def admission_tokens(self, t: float, law: AdmissionRule) -> tuple[int | None, int]:
        """``(resident, evictable)`` at ``t``, as the router computes them
        (docs/control-law.md, points 13–14): ``U`` less the evictable contexts and
        what this instance's CPU KV tier holds of the idle ones (None when the law
        counts every context), and the evictable contexts alone."""
        weighed = admission_tokens(
            ((a.usage_tokens(), a.in_flight, a.last_end_s) for a in self.ongoing.values()),
            t,
            law.idle_after_s,
            law.evictable_after_s,
            self.engine.params.kv_offload_tokens if law.offload_aware else 0,
        )
        return (None, 0) if weighed is None else weighed

    def idle_agents(self, t: float, law: AdmissionRule) -> list[IdleAgent]:
        """Its agents that making room may move (:func:`controllers.room.idle_agents`),
        as the router lists them; none on an instance whose CPU KV tier the law
        reads (its idle contexts need no room)."""
        if law.offload_aware and self.engine.params.kv_offload_tokens > 0:
            return []
        return idle_agents(
            self.name,
            (
                (a.agent_id, a.usage_tokens(), a.in_flight, a.last_end_s)
                for a in self.ongoing.values()
            ),
            t,
            law.idle_after_s,
            law.evictable_after_s,
        )

    def join(self, agent: SimAgent) -> None:
        self.ongoing[agent.agent_id] = agent
        self.usage += agent.usage_tokens()
        self._load = None

    def leave(self, agent_id: str) -> None:
        agent = self.ongoing.pop(agent_id, None)
        if agent is not None:
            self.usage -= agent.usage_tokens()
            self._load = None

    def completed(self, agent: SimAgent, t: float, prompt_tokens: int, output_tokens: int) -> None:
        """``agent`` (ongoing here) finished a request: its ``C_a`` changes."""
        before = agent.usage_tokens()
        agent.complete(t, prompt_tokens, output_tokens)
        if agent.agent_id in self.ongoing:
            self.usage += agent.usage_tokens() - before
            self._load = None

    def observation(self, ev: RequestFinished) -> RequestObservation:
        """What the router and vLLM expose about a finished request (no coefficients)."""
        decode_s = ev.t_s - ev.first_token_s
        per_token = decode_s / (ev.output_tokens - 1) if ev.output_tokens > 1 else 0.0
        return RequestObservation(
            t_s=ev.t_s,
            prompt_tokens=ev.prompt_tokens,
            cached_tokens=ev.cached_tokens,
            completion_tokens=ev.output_tokens,
            ttft_s=max(ev.first_token_s - ev.arrival_s, 0.0),
            decode_s_per_token=per_token,
            running=len(self.engine.running) + 1,
            active_context_tokens=self.usage_tokens(),
            clock_mhz=self.gpu.clock_at(ev.t_s),
        )

    def unfinished_agents(self) -> list[SimAgent]:
        """Agents admitted here or held for here: sessions not finished (yet)."""
        return [*self.ongoing.values(), *self.pending]

    def close_epoch(
        self, t: float, epoch_s: float, policy: str, run: str, energy: EnergyAccountant
    ) -> EpochRecord:
        """End this instance's epoch at ``t``: its record (what a daemon would write),
        with the energy measured since the last one handed to the attribution."""
        d = self.decision
        assert d is not None
        energy_j = self.engine.energy_j_at(t)
        c = self.engine.counters
        record = EpochRecord(
            t_s=t,
            instance=self.name,
            epoch=self.epoch,
            epoch_s=epoch_s,
            policy=policy,
            target_clock_mhz=d.clock_mhz,
            actual_clock_mhz=self.gpu.clock_at(t),
            energy_j=energy_j - self.energy_mark_j,
            avg_power_w=(energy_j - self.energy_mark_j) / epoch_s,
            usage_tokens=d.usage_tokens,
            capacity_tokens=d.capacity_tokens,
            ongoing=len(self.ongoing),
            pending=len(self.pending),
            min_throughput_tok_s=d.min_throughput_tok_s,
            boost=d.boost,
            deferred=d.defer_admissions,
            admitted=len(d.admit),
            reason=d.label,
            run=run,
            output_tokens=c.generation_tokens - self.gen_mark,
            preemptions=c.preemptions - self.pre_mark,
        )
        eng = self.engine
        since = min((s.req.arrival_s for s in (*eng.running, *eng.waiting)), default=None)
        energy.close(
            self.name,
            energy_j - self.energy_mark_j,
            t,
            in_flight_since_s=since,
            start_s=t - epoch_s,
        )
        self.energy_mark_j = energy_j
        self.gen_mark = c.generation_tokens
        self.pre_mark = c.preemptions
        return record

"""Closed-loop simulation of agents on N vLLM instances under one policy.

The router side (placement, hold queue, reassignment) and the per-instance
controllers are the real objects from :mod:`controllers`, called exactly where
the router and the daemon call them:

* a new agent is placed by the placement policy on the router's loads ``U_i``;
  it is *pending* on that instance (its first request held in a FIFO) until a
  controller decision admits it — or at once through the router's fast path,
  when nobody is pending there, the last decision did not defer, and the
  controller's own admission rule would admit it now;
* every ``epoch_s`` each instance's controller decides from an
  :class:`~controllers.InstanceSnapshot`; the clock is locked on the simulated
  GPU (effective after its latency) and the admitted agents' held requests go out;
* when an ongoing agent issues a request its step counter advances and the
  :class:`~controllers.ReassignmentRule` may move it to another instance.

Which instance admits whom across the fleet (placement, the hold queues' moves,
overflow relief and holds, client patience) is :mod:`simulator.fleet_admission`.

Agents run closed-loop: turn ``i+1`` is released ``think_s`` after turn ``i``
completed, so a slower GPU makes agents live longer and hold more context.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from controllers import (
    ConfidentReassignment,
    ControlDecision,
    FleetBudget,
    FleetBudgetConfig,
    InstancePower,
    InstanceSnapshot,
    Intents,
    ReassignmentConfig,
    ReassignmentRule,
    make_controller,
    make_placement_policy,
    rule_for,
)
from controllers.admission import new_agent_tokens
from controllers.energy_attribution import EnergyAccountant
from controllers.placement import ReassignmentDecision
from reporting.energy import with_energy
from reporting.records import GAVE_UP, AgentRecord, EpochRecord
from simulator.agents import SimAgent
from simulator.engine import Engine
from simulator.engine_types import EngineEvent, EngineRequest, RequestFinished, RequestRejected
from simulator.fleet_admission import FleetAdmission
from simulator.gpu import SimulatedGpu
from simulator.instance import SimInstance
from simulator.power import PowerModel
from simulator.presets import Preset, control_levels
from simulator.timing import TimingModel
from simulator.workload import AgentProgram, Workload

_ARRIVAL, _RELEASE, _EPOCH, _ENGINE = 0, 1, 2, 3

DEFAULT_CLIENT_PATIENCE_S = (1 + 2) * 600.0
"""What a held session gets from the router's defaults and the OpenAI SDK's: the
router answers a held request 503 after ``admission.max_wait_s`` (600 s) and keeps
the agent's place when it retries within ``admission.requeue_grace_s``; the SDK
retries twice (``max_retries=2``), then the agent's call fails. A test pins it to
the router's default (docs/simulator.md, "Client patience")."""


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    """One simulated deployment and policy (``kairos sim`` flags map onto this)."""

    policy: str = "kairos"
    instances: int = 1
    duration_s: float = 3 * 3600.0
    placement: str = "consolidating"
    theta_cons: float = 0.5
    reassignment: ReassignmentConfig = field(default_factory=ReassignmentConfig)
    slo_tok_s: float = 20.0
    """τ: the SLO agents are judged by and the law's boost defends."""
    variant: tuple[tuple[str, Any], ...] = ()
    """Constants of the policy changed in code, by field name (research only:
    :func:`controllers.registry.make_controller`)."""
    epoch_s: float | None = None
    run: str = ""
    fast_forward: bool = True
    fleet_budget: FleetBudgetConfig | None = None
    """Optional cap on the instances' total power (docs/beyond.md)."""
    client_patience_s: float | None = DEFAULT_CLIENT_PATIENCE_S
    """How long a held session's client keeps asking before the session fails
    (``FleetAdmission.drop_impatient``, :mod:`simulator.fleet_admission`); None:
    clients wait for as long as it takes."""


class Cluster:
    """Runs one policy over one arrival sequence; collect results with :meth:`run`."""

    def __init__(
        self,
        preset: Preset,
        config: ClusterConfig,
        workload: Workload,
        arrivals_s: list[float],
        *,
        progress: Callable[[float], None] | None = None,
        on_request: Callable[[str, int, float, RequestFinished], None] | None = None,
    ) -> None:
        self.preset = preset
        self.config = config
        self.workload = workload
        self.arrivals_s = arrivals_s
        self.progress = progress
        self.on_request = on_request
        """Told of every finished request: agent id, turn index, when the agent released
        it (held time included from there) and the engine's event (``kairos whatif
        --compare`` sets simulated calls beside recorded ones)."""
        self.epoch_s = config.epoch_s or preset.control.epoch_s
        timing, power = TimingModel(preset.timing), PowerModel(preset.power)
        self.instances: list[SimInstance] = []
        intents = Intents(slo_tok_s=config.slo_tok_s)
        variant = dict(config.variant)
        for i in range(config.instances):
            gpu = SimulatedGpu(preset.gpu, index=i)
            ctrl = make_controller(
                config.policy, control_levels(preset, config.policy), intents, variant
            )
            engine = Engine(preset.engine, timing, power, gpu, fast_forward=config.fast_forward)
            self.instances.append(SimInstance(i, engine, gpu, ctrl))
        self.policy_name = self.instances[0].controller.name if self.instances else config.policy
        self.names = [inst.name for inst in self.instances]
        # Fleet admission, the router's (placement, hold queues, moves between instances).
        self.admission = FleetAdmission(
            self.instances,
            make_placement_policy(config.placement, config.theta_cons),
            rule_for(config.policy, intents, variant),
            config.reassignment,
            config.client_patience_s,
            self._admit,
        )
        self.reassign = ReassignmentRule(config.reassignment)
        self.confident = (
            ConfidentReassignment()
            if config.placement == "confident" and config.reassignment.enabled
            else None
        )
        if self.confident is not None:  # as the router's Ledger.on_move
            self.admission.on_move = self.confident.forget
        self.fleet = FleetBudget(config.fleet_budget) if config.fleet_budget else None
        self.epochs: list[EpochRecord] = []
        self.agents_done: list[AgentRecord] = []
        self.started_agents = 0
        self.reassignments = 0
        self.overflow_moves = 0
        self._heap: list[tuple[float, int, int, Any]] = []
        self._seq = itertools.count()
        self._by_request: dict[str, SimAgent] = {}
        # Per-agent energy, attributed from each epoch's measured energy by the
        # router's code (docs/energy.md), weighed as configured for the preset's
        # model; agent records get it at the end of the run.
        self.energy = EnergyAccountant(weights=preset.energy_weights or timing.work_weights())
        self._req_ids = itertools.count()

    @property
    def held_moves(self) -> int:
        return self.admission.held_moves

    @property
    def room_moves(self) -> int:
        return self.admission.room_moves

    @property
    def overflow_holds(self) -> int:
        return self.admission.overflow_holds

    # ------------------------------------------------------------ main loop
    def run(self) -> None:
        end = self.config.duration_s
        for i, t in enumerate(self.arrivals_s):
            if t < end:
                self._push(t, _ARRIVAL, (self.workload.program(i), None))
        self._push(0.0, _EPOCH, 0)
        engines = [(inst, inst.engine) for inst in self.instances]
        heap = self._heap
        inf = float("inf")
        while True:
            t_heap = heap[0][0] if heap else inf
            t_eng = inf
            which: tuple[SimInstance, Engine] | None = None
            for pair in engines:
                t_next = pair[1].next_event_time()
                if t_next is not None and t_next < t_eng:
                    t_eng, which = t_next, pair
            if which is not None and t_eng <= t_heap and t_eng <= end:
                self._deliver(which[0], which[1].advance_to(t_eng))
                continue
            if t_heap > end:
                self._fill_energy()
                break
            t, _, kind, payload = heapq.heappop(heap)
            if kind == _ENGINE:
                self._on_engine_event(t, payload)
            elif kind == _RELEASE:
                self._on_release(t, payload)
            elif kind == _EPOCH:
                self._on_epoch(t, payload)
            else:
                self._on_arrival(t, payload[0], payload[1])

    def unfinished(self, end_s: float) -> tuple[int, float]:
        """Sessions still running or held at ``end_s``, and the seconds they were held.

        Agent records exist only for finished sessions, so their mean pending time
        says nothing of a session held until the run ended (or admitted so late it
        could not finish): this is that missing part (docs/results.md item 10).
        """
        agents = self._unfinished_agents()
        held_s = 0.0
        for agent in agents:
            held_s += agent.pending_s
            if not agent.admitted:  # still held: its wait runs to the end
                held_s += max(0.0, end_s - agent.waiting_since_s)
        return len(agents), held_s

    def _unfinished_agents(self) -> list[SimAgent]:
        """Every instance's :meth:`SimInstance.unfinished_agents`: admitted or held."""
        return [a for inst in self.instances for a in inst.unfinished_agents()]

    def nearly_done(self) -> int:
        """Unfinished sessions in their last tenth of turns (:attr:`SimAgent.nearly_done`).

        The long-context bar's "sessions done" (docs/results.md item 10) is
        counted inside a fixed window, so a policy that runs a little slower loses
        the sessions no control finishes just before the end: at 0.004 sessions/s,
        with 30–45 sessions a run, one such session fails the 0.98× bar. This count
        tells that window edge apart from sessions lost to holding or thrashing
        (docs/notes/law-dropped-how-much-one-cell-says.md).
        """
        return sum(a.nearly_done for a in self._unfinished_agents())

    def unfinished_throughputs(self, end_s: float) -> list[float]:
        """Eq. 3 so far of every session still running or held at ``end_s``
        (:meth:`SimAgent.throughput_so_far`), for an attainment over every
        session that arrived, not only those that finished."""
        agents = self._unfinished_agents()
        return [t for a in agents if (t := a.throughput_so_far(end_s)) is not None]

    def _fill_energy(self) -> None:
        for inst in self.instances:
            self.energy.flush(inst.name)
        own = {aid: (s.prefill_j, s.decode_j) for aid, s in self.energy.agents.items()}
        self.agents_done = with_energy(self.agents_done, own)

    def _push(self, t: float, kind: int, payload: Any) -> None:
        heapq.heappush(self._heap, (t, next(self._seq), kind, payload))

    def _deliver(self, inst: SimInstance, events: list[EngineEvent]) -> None:
        for ev in events:
            if type(ev) is RequestFinished or type(ev) is RequestRejected:
                heapq.heappush(self._heap, (ev.t_s, next(self._seq), _ENGINE, (inst.index, ev)))

    # -------------------------------------------------------------- arrivals
    def _on_arrival(self, t: float, program: AgentProgram, parent: str | None) -> None:
        self.started_agents += 1
        for child in program.children:
            self._push(t + child.offset_s, _ARRIVAL, (child, program.agent_id))
        size = self._size_of(program)
        choice = self.admission.place(program.agent_id, size, t)
        inst = self.admission.instance(choice.instance)
        agent = SimAgent(program, t, inst.index, size)
        agent.held = True
        if choice.admit_now:
            self._admit(inst, agent, t)
        else:
            inst.pending.append(agent)

    def _size_of(self, program: AgentProgram) -> int:
        """A newcomer sized as the router sizes it: its first prompt, bounded."""
        params = self.preset.engine
        limit = min(params.max_model_len, params.kv_capacity_tokens)
        return new_agent_tokens(program.turns[0].prompt_tokens, 0, limit)

    def _admit(self, inst: SimInstance, agent: SimAgent, t: float) -> None:
        agent.admitted = True
        agent.pending_s += t - agent.waiting_since_s
        inst.join(agent)
        if agent.held:
            agent.held = False
            self._submit(inst, agent, t)

    # ----------------------------------------------------------------- turns
    def _submit(self, inst: SimInstance, agent: SimAgent, t: float) -> None:
        turn = agent.turn
        rid = f"{agent.agent_id}/{agent.next_turn}/{next(self._req_ids)}"
        agent.in_flight = True
        agent.prefill_tokens = max(0, turn.prompt_tokens - (agent.context_tokens or 0))
        self._by_request[rid] = agent
        inst.engine.submit(
            EngineRequest(
                rid,
                turn.prompt_tokens,
                turn.output_tokens,
                t,
                cache_key=agent.agent_id,
                shared_prefix_tokens=turn.shared_prefix_tokens,
            )
        )
        self._deliver(inst, inst.engine.poll_events())

    def _on_release(self, t: float, agent: SimAgent) -> None:
        agent.release_s = t
        inst = self.instances[agent.instance]
        agent.steps_since_assignment += 1
        relief = self.admission.overflow_target(inst, agent, t)
        if relief is not None:
            decision = ReassignmentDecision(target=relief, reset_counter=True)
            self.overflow_moves += 1
        elif self.confident is not None:
            decision = self.confident.decide_agent(
                inst.name,
                agent.steps_since_assignment,
                self.admission.loads(),
                agent_id=agent.agent_id,
                context_tokens=agent.usage_tokens(),
                completed_steps=agent.steps,
            )
        else:
            decision = self.reassign.decide(
                inst.name,
                agent.steps_since_assignment,
                self.admission.loads(),
                context_tokens=agent.usage_tokens(),
            )
        if decision.reset_counter:
            agent.steps_since_assignment = 0
        if decision.target is not None:
            inst = self.admission.move_admitted(agent, inst, decision.target)
            self.reassignments += 1
        if self.admission.hold_overflow(inst, agent, t):
            return
        self._submit(inst, agent, t)

    def _on_engine_event(self, t: float, payload: tuple[int, EngineEvent]) -> None:
        _, ev = payload
        agent = self._by_request.pop(ev.request_id, None)
        if agent is None:
            return
        inst = self.instances[agent.instance]
        if isinstance(ev, RequestRejected):
            inst.leave(agent.agent_id)
            self.agents_done.append(self._record(agent, t, "rejected"))
            self.admission.rehome_held(t)
            return
        assert isinstance(ev, RequestFinished)
        if self.on_request is not None:
            self.on_request(agent.agent_id, agent.next_turn, agent.release_s, ev)
        inst.observations.append(inst.observation(ev))
        inst.completed(agent, t, ev.prompt_tokens, ev.output_tokens)
        self.energy.record(
            inst.name, agent.agent_id, ev.prompt_tokens, ev.cached_tokens, ev.output_tokens,
            start_s=ev.arrival_s, end_s=ev.t_s, first_token_s=ev.first_token_s,
        )  # fmt: skip
        if agent.done:
            inst.leave(agent.agent_id)
            if self.confident is not None:
                self.confident.forget(agent.agent_id)
            self.agents_done.append(self._record(agent, t, "end"))
        else:
            self._push(t + agent.turn.think_s, _RELEASE, agent)
        self.admission.rehome_held(t)  # usage changed: as the router does after every completion

    def _record(self, agent: SimAgent, t: float, reason: str) -> AgentRecord:
        return agent.record(t, self.config.slo_tok_s, self.config.run, self.names, reason)

    # ---------------------------------------------------------------- epochs
    def _snapshot(
        self, inst: SimInstance, t: float, pending: tuple[SimAgent, ...] | None = None
    ) -> InstanceSnapshot:
        held = tuple(inst.pending) if pending is None else pending
        first = inst.engine.awaiting_first_token()
        return InstanceSnapshot(
            now_s=t,
            epoch=inst.epoch,
            capacity_tokens=inst.engine.capacity_tokens,
            ongoing=tuple(a.view(a.agent_id in first) for a in inst.ongoing.values()),
            pending=tuple(a.view() for a in held),
            clock_mhz=inst.gpu.clock_at(t),
            power_w=inst.gpu.power_w,
            observations=tuple(inst.observations) if pending is None else (),
            offload_tokens=inst.engine.params.kv_offload_tokens,
        )

    def _on_epoch(self, t: float, k: int) -> None:
        decisions: list[ControlDecision] = []
        for inst in self.instances:
            self._deliver(inst, inst.engine.advance_to(t))
            if k > 0:
                self._close_epoch(inst, t)
            inst.epoch = k
            decisions.append(inst.controller.decide(self._snapshot(inst, t)))
            inst.observations.clear()
        if self.fleet is not None:
            decisions = self._apply_budget(self.fleet, decisions, k)
        for inst, decision in zip(self.instances, decisions, strict=True):
            if inst.gpu.locked_max_mhz != decision.clock_mhz:
                inst.engine.set_clock(decision.clock_mhz, t)
                self._deliver(inst, inst.engine.poll_events())
            inst.decision = decision
            if decision.admit:
                admit = set(decision.admit)
                for agent in [a for a in inst.pending if a.agent_id in admit]:
                    inst.pending.remove(agent)
                    self._admit(inst, agent, t)
        self.admission.rehome_held(t)
        for agent in self.admission.drop_impatient(t):
            self.agents_done.append(self._record(agent, t, GAVE_UP))
        if self.progress is not None:
            self.progress(t)
        if t + self.epoch_s <= self.config.duration_s + 1e-9:
            self._push(t + self.epoch_s, _EPOCH, k + 1)

    def _apply_budget(
        self, fleet: FleetBudget, decisions: list[ControlDecision], k: int
    ) -> list[ControlDecision]:
        """Cluster-level coordinator: every instance's decision, then the cap."""
        last = {e.instance: e for e in self.epochs[-len(self.instances) :]} if k > 0 else {}
        views = []
        for inst, d in zip(self.instances, decisions, strict=True):
            rec = last.get(inst.name)
            views.append(
                InstancePower(
                    inst.name,
                    inst.controller.levels,
                    d,
                    rec.avg_power_w if rec else None,
                    rec.actual_clock_mhz if rec else None,
                )
            )
        outcome = fleet.allocate(views)
        return [outcome.decisions[inst.name] for inst in self.instances]

    def _close_epoch(self, inst: SimInstance, t: float) -> None:
        self.epochs.append(
            inst.close_epoch(t, self.epoch_s, self.policy_name, self.config.run, self.energy)
        )

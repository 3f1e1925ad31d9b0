"""Agent lifecycle: start (id-tracker), implicit start on first request, end, idle
expiry, status, and the per-agent completion record written at the end.

An agent that ends frees its context on its instance (``U_i`` drops by ``C_a``),
which can admit held agents, so every end pumps its instance's admission.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Callable
from typing import Any

import structlog

from kairos_common.identity import end_key, issue_token, new_agent_id
from kairos_common.wire import AgentEnd, AgentStart, AgentStarted, AgentSummary
from reporting.records import GAVE_UP, AgentRecord, JsonlWriter
from router.admission import AdmissionService
from router.energy import EnergyService
from router.errors import NotFoundError
from router.instances import InstancePool
from router.ledger import Agent, Ledger
from router.metrics import RouterMetrics
from router.state_sync import RecordJournal

log = structlog.get_logger("kairos.router.agents")


def ended_reason(agent: Agent, reason: str) -> str:
    """``gave-up`` for a session that ends without ever having run because its held
    requests gave up (the 503 after ``admission.max_wait_s``, or its client gone),
    whatever its end signal said: reports then count it as a missed SLO and not as
    a finished session, as the simulator counts one whose client ran out of
    patience (docs/simulator.md, "Client patience"). The exit code stays in the
    record."""
    if agent.turns == 0 and not agent.admitted and agent.gave_up_s is not None:
        return GAVE_UP
    return reason


def summary_of(record: AgentRecord, *, final: bool) -> AgentSummary:
    """The launcher's view of an agent record: every :class:`AgentSummary` field but
    ``final`` is the record's field of the same name."""
    shared = (f.name for f in dataclasses.fields(AgentSummary) if f.name != "final")
    return AgentSummary(final=final, **{name: getattr(record, name) for name in shared})


class AgentService:
    def __init__(
        self,
        ledger: Ledger,
        pool: InstancePool,
        admission: AdmissionService,
        metrics: RouterMetrics,
        *,
        secret: bytes | None,
        idle_expiry_s: float,
        default_slo_tok_s: float,
        records: JsonlWriter | None,
        clock: Callable[[], float],
        wall_clock: Callable[[], float] = time.time,
        run: str = "",
        energy: EnergyService | None = None,
        cell: str | None = None,
        journal: RecordJournal | None = None,
    ) -> None:
        self.cell = cell
        """Agent ids minted here carry it (kairos_common.identity.new_agent_id)."""
        self.ledger = ledger
        self.pool = pool
        self.admission = admission
        self.metrics = metrics
        self.secret = secret
        self.idle_expiry_s = idle_expiry_s
        self.default_slo_tok_s = default_slo_tok_s
        self.records = records
        self.clock = clock
        self.wall_clock = wall_clock
        self.run = run
        # One-turn agents are named from a per-process prefix and a counter: unique
        # within the ledger without an os.urandom call per anonymous request.
        self._one_turn_prefix = f"req-{uuid.uuid4().hex[:12]}-"
        self._one_turn_seq = 0
        self.energy = energy
        """Fills records with attributed energy before they are written (None: no energy)."""
        self.journal = journal
        """With a shared store: keeps each record in the store until it is written."""

    def _new(self, agent_id: str, *, ephemeral: bool = False, **kw: Any) -> Agent:
        now = self.clock()
        agent = Agent(
            agent_id=agent_id,
            arrival_s=now,
            start_unix_s=self.wall_clock(),
            ephemeral=ephemeral,
            last_seen_s=now,
            **kw,
        )
        return self.ledger.add(agent)

    def start(self, msg: AgentStart) -> AgentStarted:
        """``POST /kairos/v1/agents``: a fresh identity and its signed token."""
        agent_id = new_agent_id(self.cell)
        self._new(agent_id, parent_id=msg.parent_id, name=msg.name, slo_tok_s=msg.slo_tok_s)
        self.metrics.agents_started.labels("api").inc()
        log.info("agent_started", agent=agent_id, parent=msg.parent_id, agent_name=msg.name)
        return AgentStarted(
            agent_id=agent_id,
            token=issue_token(agent_id, self.secret),
            idle_expiry_s=self.idle_expiry_s,
            end_key=end_key(agent_id, self.secret),
        )

    def for_request(self, agent_id: str | None) -> Agent:
        """The agent a request belongs to; unknown signed ids start implicitly,
        anonymous requests become one-turn agents."""
        metrics = self.metrics
        if agent_id is None:
            metrics.agents_started.labels("one-turn").inc()
            self._one_turn_seq += 1
            return self._new(f"{self._one_turn_prefix}{self._one_turn_seq}", ephemeral=True)
        agent = self.ledger.get(agent_id)
        if agent is None:
            agent = self._new(agent_id)
            metrics.agents_started.labels("implicit").inc()
        return agent

    def end(self, agent_id: str, msg: AgentEnd) -> None:
        agent = self.ledger.get(agent_id)
        if agent is None:
            raise NotFoundError(f"no live agent {agent_id!r}")
        if agent.in_flight > 0 and agent.admitted:
            # A stream's last bytes reach the client before the router accounts the
            # request, so the agent can exit first: end it once that request is counted.
            agent.ending = (msg.reason, msg.exit_code)
            return
        self.finish(agent, reason=msg.reason, exit_code=msg.exit_code)

    def request_done(self, agent: Agent) -> None:
        """After every proxied request: finish a one-turn agent, or an agent whose
        end arrived while this request was in flight."""
        if agent.ephemeral:
            self.finish(agent, reason="one-turn")
        elif agent.ending is not None and agent.in_flight == 0:
            reason, exit_code = agent.ending
            self.finish(agent, reason=reason, exit_code=exit_code)

    def finish(self, agent: Agent, *, reason: str, exit_code: int | None = None) -> None:
        """Remove ``agent``, free its context, write its record, pump admission."""
        reason = ended_reason(agent, reason)
        self.admission.remove_pending(agent)
        instance = agent.instance
        self.ledger.remove(agent.agent_id)
        if not agent.ephemeral:
            self.metrics.agents_ended.labels(reason).inc()
            self._write_record(agent, reason, exit_code)
            log.info("agent_ended", agent=agent.agent_id, reason=reason, turns=agent.turns)
        inst = self.pool.get(instance)
        if inst is not None:
            self.admission.pump(inst)

    def _write_record(self, agent: Agent, reason: str, exit_code: int | None) -> None:
        tput = agent.throughput_tok_s
        if tput is not None:
            self.metrics.agent_throughput.observe(tput)
        if self.records is None and self.energy is None:
            return
        record = self._record(agent, reason, exit_code)
        if self.journal is not None:
            self.journal.ended(record)
        if self.energy is not None:
            self.energy.finish(record)  # written once its last joules are attributed
        elif self.records is not None:
            self.records.write(record)

    def _record(self, agent: Agent, reason: str, exit_code: int | None) -> AgentRecord:
        """``agent``'s completion record as of now (energy filled in when written)."""
        tput = agent.throughput_tok_s
        slo = agent.slo_tok_s if agent.slo_tok_s is not None else self.default_slo_tok_s
        return AgentRecord(
            agent_id=agent.agent_id,
            start_s=agent.start_unix_s,
            end_s=self.wall_clock(),
            turns=agent.turns,
            decode_tokens=agent.decode_tokens,
            prompt_tokens=agent.prompt_tokens,
            llm_time_s=agent.llm_time_s,
            pending_s=agent.pending_s,
            throughput_tok_s=tput,
            slo_tok_s=slo,
            slo_met=None if tput is None else tput >= slo,
            parent_id=agent.parent_id,
            name=agent.name,
            instances=tuple(agent.instances),
            exit_code=exit_code,
            end_reason=reason,
            max_context_tokens=agent.max_context_tokens,
            run=self.run,
        )

    def summary(self, agent_id: str, record: AgentRecord | None) -> AgentSummary | None:
        """What an ended agent cost: its final ``record``, else what is known so far.

        Without the record (the end call stopped waiting), the agent is either
        still ending (a request of it in flight) or its record waits for its last
        joules; either way the summary says ``final: false``, with the energy
        attributed so far. None: unknown agent.
        """
        if record is not None:
            return summary_of(record, final=True)
        energy = self.energy
        so_far = energy.parked(agent_id) if energy is not None else None
        if so_far is None:
            agent = self.ledger.get(agent_id)
            if agent is None:
                return None
            so_far = self._record(agent, agent.ending[0] if agent.ending else "end", None)
        joules = energy.energy_so_far_j(agent_id, so_far.instances) if energy else None
        return dataclasses.replace(summary_of(so_far, final=False), energy_j=joules)

    def _ended_status(self, agent_id: str) -> dict[str, Any]:
        energy = self.energy
        record = energy.parked(agent_id) if energy is not None else None
        if energy is None or record is None:
            raise NotFoundError(f"no live agent {agent_id!r}")
        return {
            "agent_id": record.agent_id,
            "parent_id": record.parent_id,
            "name": record.name,
            "instance": None,
            "state": "ended",
            "end_reason": record.end_reason,
            "queue_position": None,
            "turns": record.turns,
            "in_flight": 0,
            "prompt_tokens": record.prompt_tokens,
            "decode_tokens": record.decode_tokens,
            "llm_time_s": record.llm_time_s,
            "pending_s": record.pending_s,
            "throughput_tok_s": record.throughput_tok_s,
            "instances": list(record.instances),
            "energy_j": energy.agent_energy_j(agent_id),  # own requests, as while live
        }

    def expire_idle(self) -> list[str]:
        """End agents idle (no request in flight) longer than ``idle_expiry_s``."""
        now = self.clock()
        expired = [
            a
            for a in self.ledger
            if a.in_flight == 0 and now - a.last_seen_s > self.idle_expiry_s and not a.ephemeral
        ]
        for agent in expired:
            self.finish(agent, reason="expired")
        return [a.agent_id for a in expired]

    def status(self, agent_id: str) -> dict[str, Any]:
        """``GET /kairos/v1/agents/{id}``: instance, state, context, throughput, queue position.

        An agent that has ended but whose record still waits for its last joules
        (or its sub-agents' records) is ``ended``: what its record will say, with
        the energy attributed so far. 404 once the record is written.
        """
        agent = self.ledger.get(agent_id)
        if agent is None:
            return self._ended_status(agent_id)
        position = None
        if agent.instance is not None and not agent.admitted:
            position = self.admission.queue(agent.instance).position(agent_id)
        state = "ongoing" if agent.admitted else ("pending" if position is not None else "new")
        return {
            "agent_id": agent.agent_id,
            "parent_id": agent.parent_id,
            "name": agent.name,
            "instance": agent.instance,
            "state": state,
            "queue_position": position,
            "context_tokens": agent.context_tokens,
            "context_estimated": agent.context_estimated,
            # Conversations counted in context_tokens now (router/conversations.py).
            "conversations": agent.conversations.live(
                self.ledger.clock(), self.ledger.conversation_window_s
            ),
            "turns": agent.turns,
            "in_flight": agent.in_flight,
            "prefill_tokens": agent.prefill_tokens,
            "decode_tokens": agent.decode_tokens,
            "llm_time_s": agent.llm_time_s,
            "pending_s": agent.pending_s,
            "throughput_tok_s": agent.throughput_tok_s,
            "steps_since_assignment": agent.steps_since_assign,
            "instances": list(agent.instances),
            # Estimate, own requests, intervals attributed so far (docs/energy.md).
            "energy_j": self.energy.agent_energy_j(agent_id) if self.energy else None,
        }

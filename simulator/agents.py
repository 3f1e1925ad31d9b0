"""Router-side bookkeeping of one simulated agent (the per-agent ledger).

Mirrors what the router knows: the agent's instance, whether it is pending
(held) or ongoing, ``C_a`` (prompt + completion of its latest completed
request), Eq. 3 sums, pending time, and the reassignment step counter. It builds
the :class:`~controllers.AgentView` the controllers see and the
:class:`~reporting.records.AgentRecord` written when the agent finishes.
"""

from __future__ import annotations

from controllers import AgentView
from controllers.types import agent_throughput_tok_s
from reporting.records import AgentRecord
from simulator.workload import AgentProgram, Turn


class SimAgent:
    __slots__ = (
        "_view",
        "_view_key",
        "admitted",
        "agent_id",
        "arrival_s",
        "context_tokens",
        "decode_tokens",
        "estimated_context_tokens",
        "held",
        "in_flight",
        "instance",
        "instances",
        "last_end_s",
        "llm_time_s",
        "max_context_tokens",
        "next_turn",
        "pending_s",
        "prefill_tokens",
        "program",
        "prompt_tokens",
        "release_s",
        "steps",
        "steps_since_assignment",
        "waiting_since_s",
    )

    def __init__(
        self,
        program: AgentProgram,
        arrival_s: float,
        instance: int,
        estimated_context_tokens: int | None = None,
    ) -> None:
        self.program = program
        self.agent_id = program.agent_id
        """The program's id, copied: it is read several times per request."""
        self.estimated_context_tokens = (
            program.turns[0].prompt_tokens
            if estimated_context_tokens is None
            else estimated_context_tokens
        )
        """What the router can size a new agent by: its first (held) prompt, bounded
        by the model's length (:func:`controllers.admission.new_agent_tokens`)."""
        self.arrival_s = arrival_s
        self.instance = instance
        self.instances: list[int] = [instance]
        self.admitted = False
        self._view: AgentView | None = None
        self._view_key: tuple[int, bool, bool, int] = (-1, False, False, 0)
        self.held = False
        self.in_flight = False
        # Uncached prompt tokens of the request in flight (prompt − C_a), as the
        # router estimates them; shown in view() until its first token.
        self.prefill_tokens = 0
        self.last_end_s: float | None = None
        self.context_tokens: int | None = None
        self.decode_tokens = 0
        self.prompt_tokens = 0
        self.llm_time_s = 0.0
        self.steps = 0
        self.steps_since_assignment = 0
        self.pending_s = 0.0
        self.waiting_since_s = arrival_s
        self.release_s = arrival_s
        self.next_turn = 0
        self.max_context_tokens = 0

    @property
    def turn(self) -> Turn:
        return self.program.turns[self.next_turn]

    def usage_tokens(self) -> int:
        """``C_a`` or, before its first completion, the held prompt's size."""
        if self.context_tokens is not None:
            return self.context_tokens
        return self.estimated_context_tokens

    def view(self, prefilling: bool = False) -> AgentView:
        """The controllers' view, rebuilt only when it changed: every field it
        shows changes only with ``steps`` (:meth:`complete`), ``in_flight``,
        ``admitted`` or whether its request still awaits its first token
        (``prefilling``; a snapshot asks every agent every epoch)."""
        prefill = self.prefill_tokens if prefilling else 0
        key = (self.steps, self.in_flight, self.admitted, prefill)
        if self._view is not None and key == self._view_key:
            return self._view
        self._view_key = key
        self._view = AgentView(
            agent_id=self.agent_id,
            arrival_s=self.arrival_s,
            context_tokens=self.context_tokens,
            estimated_context_tokens=self.estimated_context_tokens,
            decode_tokens=self.decode_tokens,
            llm_time_s=self.llm_time_s,
            completed_steps=self.steps,
            waiting_since_s=None if self.admitted else self.waiting_since_s,
            in_flight=self.in_flight,
            last_active_s=self.last_end_s,
            prefill_tokens=prefill,
        )
        return self._view

    def complete(self, t_s: float, prompt_tokens: int, output_tokens: int) -> None:
        """A request finished: update ``C_a`` and the Eq. 3 sums."""
        self.decode_tokens += output_tokens
        self.prompt_tokens += prompt_tokens
        self.llm_time_s += t_s - self.release_s
        self.steps += 1
        self.in_flight = False
        self.last_end_s = t_s
        self.context_tokens = prompt_tokens + output_tokens
        self.max_context_tokens = max(self.max_context_tokens, self.context_tokens)
        self.next_turn += 1

    def throughput_so_far(self, end_s: float) -> float | None:
        """Eq. 3 of a session the run ended before it finished: its output over
        its LLM time so far, the request it is waiting on (held or in flight)
        counted up to ``end_s``. A session held since it arrived scores 0, as one
        that gave up does; None when no time has passed (nothing to judge).
        """
        time_s = self.llm_time_s
        if self.in_flight or self.held:
            time_s += max(0.0, end_s - self.release_s)
        return self.decode_tokens / time_s if time_s > 0.0 else None

    @property
    def done(self) -> bool:
        return self.next_turn >= len(self.program.turns)

    @property
    def nearly_done(self) -> bool:
        """In its last tenth of turns (at least its last turn): a session a run that
        ended a little later would have counted as done."""
        turns = len(self.program.turns)
        return self.admitted and turns - self.steps <= max(1, turns // 10)

    def record(
        self, end_s: float, slo_tok_s: float, run: str, names: list[str], reason: str = "end"
    ) -> AgentRecord:
        tput = agent_throughput_tok_s(self.decode_tokens, self.llm_time_s, self.steps)
        return AgentRecord(
            agent_id=self.agent_id,
            start_s=self.arrival_s,
            end_s=end_s,
            turns=self.steps,
            decode_tokens=self.decode_tokens,
            prompt_tokens=self.prompt_tokens,
            llm_time_s=self.llm_time_s,
            pending_s=self.pending_s,
            throughput_tok_s=tput,
            slo_tok_s=slo_tok_s,
            slo_met=None if tput is None else tput >= slo_tok_s,
            parent_id=self.program.parent_id,
            name=self.program.agent_id,
            instances=tuple(dict.fromkeys(names[i] for i in self.instances)),
            end_reason=reason,
            max_context_tokens=self.max_context_tokens,
            run=run,
        )

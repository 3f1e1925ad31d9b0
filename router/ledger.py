"""The per-agent ledger: what the router knows about every live agent.

``C_a`` (``context_tokens``) is prompt + completion tokens of the agent's latest
completed request (paper Eq. 6), over the conversations one identity may carry
(:mod:`router.conversations`: a harness's in-process sub-agents and side requests);
``decode_tokens`` and ``llm_time_s`` are the Eq. 3
sums (latency from arrival at the router to the last byte, including time held
pending). ``U_i = Σ_{a ongoing on i} C_a`` is kept as a running sum, updated when
an agent joins or leaves an instance or its size changes, so reading it (twice
per request: admission and placement) costs the same with 5 agents or 5000.

The ledger is plain in-memory state owned by the event loop: no locks, no I/O.
Persistence (:mod:`router.store`) copies dirty agents off the loop.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from controllers.placement import InstanceLoad
from controllers.types import AgentView, agent_throughput_tok_s
from router.conversations import DEFAULT_KEY, Conversations


@dataclass(slots=True)
class Agent:
    """One agent. Times ending in ``_s`` are on the router's monotonic clock,
    ``_unix_s`` on the wall clock (persisted)."""

    agent_id: str
    arrival_s: float
    start_unix_s: float
    parent_id: str | None = None
    name: str | None = None
    slo_tok_s: float | None = None
    ephemeral: bool = False
    instance: str | None = None
    admitted: bool = False
    waiting_since_s: float | None = None
    context_tokens: int | None = None
    context_estimated: bool = False
    estimated_context_tokens: int | None = None
    max_context_tokens: int = 0
    prompt_tokens: int = 0
    decode_tokens: int = 0
    llm_time_s: float = 0.0
    pending_s: float = 0.0
    turns: int = 0
    estimated_turns: int = 0
    steps_since_assign: int = 0
    in_flight: int = 0
    prefill_tokens: int = 0
    """Uncached prompt tokens of its forwarded requests with no response byte yet
    (prompt estimate − ``C_a``): the clock's prefill signal (control-law point 9)."""
    last_seen_s: float = 0.0
    instances: list[str] = field(default_factory=list)
    ending: tuple[str, int | None] | None = None
    """(reason, exit code) of an end that arrived while a request was still in flight."""
    queue_since_s: float | None = None
    """Its place in line: when its first held request arrived. Kept after its last
    waiting request gave up, so a retry within ``admission.requeue_grace_s``
    (``gave_up_s``) takes its old place, not the back of the queue."""
    gave_up_s: float | None = None
    conversations: Conversations = field(default_factory=Conversations)
    """Its conversations (:mod:`router.conversations`): ``context_tokens`` is their
    ``C_a``. Not persisted: after a restart the next completed request starts them."""

    @property
    def last_active_s(self) -> float | None:
        """When its latest request started or ended (None: no request completed
        yet, which the controllers count as active)."""
        return self.last_seen_s if self.turns else None

    @property
    def throughput_tok_s(self) -> float | None:
        """Eq. 3: Σ decode tokens / Σ request latency (None without history)."""
        return agent_throughput_tok_s(self.decode_tokens, self.llm_time_s, self.turns)

    def to_row(self, now_s: float, now_unix_s: float) -> dict[str, Any]:
        """JSON-able persistent form (monotonic times become ages)."""
        row = {name: getattr(self, name) for name in _PERSISTED}
        row["instances"] = list(self.instances)
        row["idle_for_s"] = max(0.0, now_s - self.last_seen_s)
        row["conversations"] = self.conversations.sizes(now_s)
        return row

    @classmethod
    def from_row(cls, row: dict[str, Any], now_s: float, now_unix_s: float) -> Agent:
        """Rebuild from :meth:`to_row` output after a restart."""
        data = dict(row)
        idle = float(data.pop("idle_for_s", 0.0))
        sizes = data.pop("conversations", None)
        known = set(_PERSISTED)
        data = {k: v for k, v in data.items() if k in known}
        agent = cls(arrival_s=now_s - max(0.0, now_unix_s - data["start_unix_s"]), **data)
        agent.instances = list(agent.instances)
        agent.last_seen_s = now_s - idle
        agent.conversations = Conversations.from_sizes(sizes, now_s)
        return agent


class PrefillClaim:
    """One request's share of ``Agent.prefill_tokens``: added once it is forwarded
    (:meth:`start`), taken back exactly once at its first response byte or its end
    (:meth:`done`, idempotent), so a retry, an error or a cancelled client never
    leaves tokens behind."""

    __slots__ = ("_agent", "_tokens")

    def __init__(self, agent: Agent) -> None:
        self._agent = agent
        self._tokens = 0

    def start(self, tokens: int) -> None:
        self._tokens = max(0, tokens)
        self._agent.prefill_tokens += self._tokens

    def done(self) -> None:
        if self._tokens:
            self._agent.prefill_tokens -= self._tokens
            self._tokens = 0


_TRANSIENT = frozenset(
    {
        "arrival_s",
        "last_seen_s",
        "in_flight",
        "prefill_tokens",
        "waiting_since_s",
        "ending",
        "queue_since_s",
        "gave_up_s",
        "conversations",
    }
)
_PERSISTED = tuple(f for f in Agent.__dataclass_fields__ if f not in _TRANSIENT)


class Ledger:
    """All live agents plus, per instance, the ids of its ongoing (admitted) agents."""

    def __init__(
        self,
        new_agent_context_tokens: int,
        clock: Callable[[], float],
        conversation_window_s: float = 300.0,
    ) -> None:
        self.placeholder_tokens = new_agent_context_tokens
        self.clock = clock
        self.conversation_window_s = conversation_window_s
        """How long an idle conversation of an agent still counts in its ``C_a``."""
        self.agents: dict[str, Agent] = {}
        self._ongoing: dict[str, set[str]] = {}
        # U_i, and what each ongoing agent adds to it (subtracted as counted, so the
        # sum stays exact even if an agent's fields changed behind the ledger's back).
        self._usage: dict[str, int] = {}
        self._counted: dict[str, tuple[str, int]] = {}
        self.dirty: set[str] = set()
        self.deleted: set[str] = set()
        self._children: dict[str, set[str]] = {}  # parent id -> its live sub-agents' ids
        # Called with the id of every agent that leaves (ended or expired), so services
        # keeping per-agent state (confident placement's streaks) can drop it.
        self.on_remove: list[Callable[[str], None]] = []
        # Called with the id of every admitted agent that runs on another instance
        # from now (any reassignment, a room move, a held agent admitted elsewhere):
        # evidence gathered about its old instance is void.
        self.on_move: list[Callable[[str], None]] = []
        # Called when a (non one-turn) agent is assigned an instance (admitted, moved,
        # held there): a shared store writes assignments at once, not at its next flush.
        self.on_assign: list[Callable[[], None]] = []

    def __len__(self) -> int:
        return len(self.agents)

    def __iter__(self) -> Iterator[Agent]:
        return iter(list(self.agents.values()))

    def get(self, agent_id: str) -> Agent | None:
        return self.agents.get(agent_id)

    def add(self, agent: Agent) -> Agent:
        replaced = self.agents.get(agent.agent_id)
        if replaced is not None and replaced.instance is not None:
            self._ongoing.get(replaced.instance, set()).discard(agent.agent_id)
        self._uncount(agent.agent_id)
        if replaced is not None:
            self._unlink(replaced)
        self.agents[agent.agent_id] = agent
        if agent.parent_id is not None:
            self._children.setdefault(agent.parent_id, set()).add(agent.agent_id)
        self.deleted.discard(agent.agent_id)
        if agent.instance is not None and agent.admitted:
            self._ongoing.setdefault(agent.instance, set()).add(agent.agent_id)
            self._count(agent, agent.instance)
        self.touch(agent)
        return agent

    def remove(self, agent_id: str) -> Agent | None:
        agent = self.agents.pop(agent_id, None)
        if agent is not None and agent.instance is not None:
            self._ongoing.get(agent.instance, set()).discard(agent_id)
        self._uncount(agent_id)
        self.dirty.discard(agent_id)
        if agent is not None:
            self._unlink(agent)
        if agent is not None and not agent.ephemeral:
            self.deleted.add(agent_id)
        if agent is not None:
            for listener in self.on_remove:
                listener(agent_id)
        return agent

    def clear(self) -> list[str]:
        """Forget every agent without deleting any from the store (a leader that lost
        its lease: the store now belongs to the router that took over); the ids."""
        ids = list(self.agents)
        self.agents.clear()
        self._ongoing.clear()
        self._usage.clear()
        self._counted.clear()
        self._children.clear()
        self.dirty.clear()
        self.deleted.clear()
        for agent_id in ids:
            for listener in self.on_remove:
                listener(agent_id)
        return ids

    def has_children(self, agent_id: str) -> bool:
        """Does ``agent_id`` have live sub-agents (agents naming it their parent)?"""
        return bool(self._children.get(agent_id))

    def _unlink(self, agent: Agent) -> None:
        if agent.parent_id is None:
            return
        siblings = self._children.get(agent.parent_id)
        if siblings is not None:
            siblings.discard(agent.agent_id)
            if not siblings:
                del self._children[agent.parent_id]

    def touch(self, agent: Agent) -> None:
        """Mark for persistence (ephemeral one-turn agents are never persisted)."""
        if not agent.ephemeral:
            self.dirty.add(agent.agent_id)

    def context_of(self, agent: Agent) -> int:
        """``C_a``, else the held prompt's estimate, else the placeholder (point 1)."""
        if agent.context_tokens is not None:
            return agent.context_tokens
        if agent.estimated_context_tokens is not None:
            return agent.estimated_context_tokens
        return self.placeholder_tokens

    def ongoing_ids(self, instance: str) -> set[str]:
        return self._ongoing.get(instance, set())

    def ongoing(self, instance: str) -> Iterator[Agent]:
        """The agents ongoing on ``instance`` (in no particular order)."""
        agents = self.agents
        for agent_id in self.ongoing_ids(instance):
            agent = agents.get(agent_id)
            if agent is not None:
                yield agent

    def running_tokens(self, instance: str, besides: Agent) -> int:
        """The contexts of the agents other than ``besides`` with a request in flight
        on ``instance``: what a request of ``besides`` must fit beside (points 10, 16)."""
        return sum(
            self.context_of(other)
            for other in self.ongoing(instance)
            if other is not besides and other.in_flight > 0
        )

    def in_flight_since(self, instance: str) -> float | None:
        """When the oldest request in flight on ``instance`` began (None: none is),
        called once per daemon epoch for energy attribution. An agent's
        ``last_seen_s`` is its latest request's start while one is in flight (later
        than the oldest when it runs several)."""
        return min(
            (a.last_seen_s for a in self.ongoing(instance) if a.in_flight > 0 and a.admitted),
            default=None,
        )

    def usage_tokens(self, instance: str) -> int:
        """``U_i``: Σ C_a over the instance's ongoing agents (a running sum)."""
        return self._usage.get(instance, 0)

    def _count(self, agent: Agent, instance: str) -> None:
        """(Re)count ``agent``'s ``C_a`` in ``U_instance``."""
        self._uncount(agent.agent_id)
        tokens = self.context_of(agent)
        self._counted[agent.agent_id] = (instance, tokens)
        self._usage[instance] = self._usage.get(instance, 0) + tokens

    def _uncount(self, agent_id: str) -> None:
        counted = self._counted.pop(agent_id, None)
        if counted is not None:
            instance, tokens = counted
            self._usage[instance] -= tokens

    def _recount(self, agent: Agent) -> None:
        """``agent``'s size changed: update the sum it is counted in, if any."""
        counted = self._counted.get(agent.agent_id)
        if counted is not None:
            self._count(agent, counted[0])

    def set_estimate(self, agent: Agent, tokens: int) -> None:
        """Size a newcomer (no ``C_a`` yet) from its first request."""
        agent.estimated_context_tokens = tokens
        self._recount(agent)

    def set_ongoing(self, agent: Agent, instance: str) -> None:
        """Agent becomes ongoing on ``instance`` (admission or reassignment)."""
        previous = agent.instance
        if previous is not None:
            self._ongoing.get(previous, set()).discard(agent.agent_id)
        agent.instance = instance
        agent.admitted = True
        agent.waiting_since_s = None
        self._ongoing.setdefault(instance, set()).add(agent.agent_id)
        self._count(agent, instance)
        if not agent.instances or agent.instances[-1] != instance:
            agent.instances.append(instance)
        self.touch(agent)
        if not agent.ephemeral:
            for assigned in self.on_assign:
                assigned()
        if previous is not None and previous != instance:
            for listener in self.on_move:
                listener(agent.agent_id)

    def place(self, agent: Agent, instance: str) -> None:
        """Agent is placed on ``instance`` but not admitted there (yet)."""
        if agent.instance is not None:
            self._ongoing.get(agent.instance, set()).discard(agent.agent_id)
        self._uncount(agent.agent_id)
        agent.instance = instance
        agent.admitted = False

    def set_pending(self, agent: Agent, instance: str, now_s: float) -> None:
        """Agent is placed on ``instance`` but waits in its hold queue."""
        if agent.instance is not None:
            self._ongoing.get(agent.instance, set()).discard(agent.agent_id)
        self._uncount(agent.agent_id)
        agent.instance = instance
        agent.admitted = False
        if agent.waiting_since_s is None:
            agent.waiting_since_s = now_s
        self.touch(agent)
        if not agent.ephemeral:
            for assigned in self.on_assign:
                assigned()

    def forget_instance(self, instance: str) -> list[Agent]:
        """Detach every agent from a removed/dead instance; returns them."""
        self._ongoing.pop(instance, None)
        moved = [a for a in self.agents.values() if a.instance == instance]
        for agent in moved:
            self._uncount(agent.agent_id)
            agent.instance = None
            agent.admitted = False
            self.touch(agent)
        return moved

    def view(self, agent: Agent) -> AgentView:
        """The controllers' view of an agent (wire format for kairosd)."""
        return AgentView(
            agent_id=agent.agent_id,
            arrival_s=agent.arrival_s,
            context_tokens=agent.context_tokens,
            estimated_context_tokens=agent.estimated_context_tokens,
            decode_tokens=agent.decode_tokens,
            llm_time_s=agent.llm_time_s,
            completed_steps=agent.turns,
            waiting_since_s=agent.waiting_since_s,
            in_flight=agent.in_flight > 0,
            last_active_s=agent.last_active_s,
            prefill_tokens=agent.prefill_tokens if agent.admitted else 0,
        )

    def load_of(self, name: str, index: int, capacity_tokens: int | None) -> InstanceLoad:
        """What placement sees of an instance: ``U_i``, ``U_max`` (0: unknown), busy."""
        return InstanceLoad(
            name=name,
            index=index,
            usage_tokens=self.usage_tokens(name),
            capacity_tokens=capacity_tokens or 0,
            active=bool(self._ongoing.get(name)),
        )

    def request_started(self, agent: Agent, conversation: int = DEFAULT_KEY) -> None:
        """A request of ``agent``'s ``conversation`` is forwarded: it runs beside the
        agent's other conversations, so ``C_a`` may grow."""
        agent.conversations.start(conversation)
        self._refresh(agent)

    def request_ended(self, agent: Agent, conversation: int = DEFAULT_KEY) -> None:
        """That request ended without completing (an error answer, a client gone);
        a completed one ends in :meth:`record_completion`."""
        agent.conversations.done(conversation)
        self._refresh(agent)

    def cached_tokens(self, agent: Agent, conversation: int = DEFAULT_KEY) -> int:
        """What vLLM's prefix cache holds for a request of ``conversation``: its own
        context, else (a conversation not seen yet, or a client whose root changes
        at every request) the latest request's, as the paper's ``C_a`` would say."""
        known = agent.conversations.context_of(conversation)
        if known is not None:
            return known
        latest = agent.conversations.latest_tokens()
        return latest if latest is not None else agent.context_tokens or 0

    def _refresh(self, agent: Agent) -> None:
        tokens = agent.conversations.context_tokens(self.clock(), self.conversation_window_s)
        if tokens is not None and tokens != agent.context_tokens:
            agent.context_tokens = tokens
            self._recount(agent)

    def record_completion(
        self,
        agent: Agent,
        *,
        prompt_tokens: int,
        completion_tokens: int,
        latency_s: float,
        estimated: bool,
        conversation: int = DEFAULT_KEY,
    ) -> None:
        """One request finished: update ``C_a`` and the Eq. 3 sums."""
        context = prompt_tokens + completion_tokens
        now_s = self.clock()
        agent.conversations.complete(conversation, context, now_s)
        # Never None once a request of it completed.
        agent.context_tokens = agent.conversations.context_tokens(now_s, self.conversation_window_s)
        agent.context_estimated = estimated
        agent.estimated_context_tokens = None
        agent.max_context_tokens = max(agent.max_context_tokens, context)
        agent.prompt_tokens += prompt_tokens
        agent.decode_tokens += completion_tokens
        agent.llm_time_s += latency_s
        agent.turns += 1
        if estimated:
            agent.estimated_turns += 1
        self._recount(agent)
        self.touch(agent)

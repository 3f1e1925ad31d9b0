"""Per-instance FIFO of pending (held) agents, in arrival order.

The queue holds *agents*, not requests: all held requests of one agent wait on
the same future, and the agent's place in line is the arrival of its first held
request. When the last waiting request of an agent gives up (timeout, client
gone) the agent leaves the queue, so the queue only reflects live demand; if it
comes back within the grace period (a client retrying a 503) it takes its old
place again (``AdmissionService.wait_admitted``).
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from dataclasses import dataclass

from router.errors import HoldQueueFullError


@dataclass(slots=True)
class Held:
    future: asyncio.Future[None]
    waiters: int = 0
    since_s: float = 0.0
    """The agent's place in line (``Agent.queue_since_s``)."""


class HoldQueue:
    """Bounded FIFO for one instance."""

    def __init__(self, max_agents: int, retry_after_s: float) -> None:
        self.max_agents = max_agents
        self.retry_after_s = retry_after_s
        self._items: OrderedDict[str, Held] = OrderedDict()

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, agent_id: str) -> bool:
        return agent_id in self._items

    def order(self) -> list[str]:
        """Agent ids in arrival order (head first)."""
        return list(self._items)

    def places(self) -> list[tuple[str, float]]:
        """``(agent_id, since_s)`` head first: each agent with its place in line."""
        return [(agent_id, held.since_s) for agent_id, held in self._items.items()]

    def position(self, agent_id: str) -> int | None:
        for pos, key in enumerate(self._items):
            if key == agent_id:
                return pos
        return None

    def join(self, agent_id: str, since_s: float) -> asyncio.Future[None]:
        """Add a waiting request of ``agent_id``; the future resolves on admission.

        A new agent takes its place by ``since_s`` (its first held request's
        arrival): at the back, unless it is an agent coming back to an older place
        (a retry after a timeout), which goes ahead of everyone who came later."""
        held = self._items.get(agent_id)
        if held is None:
            if len(self._items) >= self.max_agents:
                raise HoldQueueFullError(
                    "admission queue of the instance is full; retry later",
                    retry_after_s=self.retry_after_s,
                )
            held = Held(future=asyncio.get_running_loop().create_future(), since_s=since_s)
            self._insert(agent_id, held)
        held.waiters += 1
        return held.future

    def _insert(self, agent_id: str, held: Held) -> None:
        """Place ``held`` after every agent that is not later than it (stable)."""
        later = [k for k, h in self._items.items() if h.since_s > held.since_s]
        self._items[agent_id] = held
        for key in later:  # behind the newcomer, in their own order
            self._items.move_to_end(key)

    def leave(self, agent_id: str) -> bool:
        """One waiting request gave up; returns True if the agent left the queue."""
        held = self._items.get(agent_id)
        if held is None:
            return False
        held.waiters -= 1
        if held.waiters <= 0 and not held.future.done():
            del self._items[agent_id]
            return True
        return False

    def release(self, agent_id: str) -> bool:
        """Admit: wake every waiting request of the agent."""
        held = self._items.pop(agent_id, None)
        if held is None:
            return False
        if not held.future.done():
            held.future.set_result(None)
        return True

    def take_all(self) -> list[tuple[str, Held]]:
        """Empty the queue (instance removed/dead) keeping order, for re-queueing."""
        items = list(self._items.items())
        self._items.clear()
        return items

    def adopt(self, agent_id: str, held: Held) -> None:
        """Take an agent moved from another queue, keeping its waiting requests and
        its place in line."""
        self._insert(agent_id, held)

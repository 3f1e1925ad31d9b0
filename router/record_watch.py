"""Wake the callers waiting for an ended agent's final record.

An agent's record is written once its last joules are attributed, an epoch or
two after its last request (docs/energy.md), or at once where no daemon
measures energy. An end call that asks for the agent's summary
(``AgentEnd.summary_wait_s``) waits here for that write, bounded, instead of
polling the status endpoint.
"""

from __future__ import annotations

import asyncio

from reporting.records import AgentRecord, Record


class RecordWatch:
    """Futures keyed by agent id, resolved by the record sink; one event loop."""

    def __init__(self) -> None:
        self._waiters: dict[str, list[asyncio.Future[AgentRecord]]] = {}

    def expect(self, agent_id: str) -> asyncio.Future[AgentRecord]:
        """Register before ending the agent: its record may be written at once."""
        fut: asyncio.Future[AgentRecord] = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(agent_id, []).append(fut)
        return fut

    def written(self, record: Record) -> None:
        """The record sink wrote ``record``: resolve whoever waits for it."""
        if not isinstance(record, AgentRecord):
            return
        for fut in self._waiters.pop(record.agent_id, ()):
            if not fut.done():
                fut.set_result(record)

    async def wait(
        self, agent_id: str, fut: asyncio.Future[AgentRecord], timeout_s: float
    ) -> AgentRecord | None:
        """The record, or None if it was not written within ``timeout_s``."""
        try:
            return await asyncio.wait_for(asyncio.shield(fut), timeout_s)
        except TimeoutError:
            return None
        finally:
            self.forget(agent_id, fut)

    def forget(self, agent_id: str, fut: asyncio.Future[AgentRecord]) -> None:
        """Drop one waiter (timed out, or the end call failed)."""
        waiters = self._waiters.get(agent_id)
        if waiters is None:
            return
        if fut in waiters:
            waiters.remove(fut)
        if not waiters:
            del self._waiters[agent_id]

    def __len__(self) -> int:
        return sum(len(w) for w in self._waiters.values())

"""Is this router the leader now? The one question every request path asks.

Routers that share a Redis store elect a leader by a lease (:mod:`router.lease`);
only the leader serves. A router on the embedded SQLite store is alone and always
the leader. :class:`LeaderGate` holds the answer where the hot path can read it
for the price of a clock call, and builds the ``not_leader`` refusal
(:mod:`kairos_common.wire`): 503, ``Retry-After``, and the leader's URL when known.

Why the gate compares a deadline and does not trust a flag: a leader paused past
its lease (SIGSTOP, a long stall) wakes up with requests already read from its
sockets, and asyncio runs those callbacks before its overdue renewal timer. The
deadline (the last confirmed renewal's send time plus the lease, less a margin)
has passed by then, so it refuses them until the store confirms the lease again,
and the router that took over is the only one placing agents.

The one exception is an unreachable store: the leader keeps routing from memory
(``store_down``) rather than fail every request, since no other router can take
the lease while nobody reaches the store either (docs/scale-out.md, "Redis
trouble", says what a network partition does to that).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from kairos_common.wire import LIVENESS_PATH, READY_PATH, ROLE_LEADER, ROLE_STANDBY
from router.errors import NotLeaderError


class LeaderGate:
    """The leader/standby state the request paths read (one event loop, no locks)."""

    __slots__ = ("_clock", "deadline_s", "leader", "leader_url", "reason", "store_down")

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self.leader = True
        """Holds (or held, and may still serve within ``deadline_s``) the lease."""
        self.deadline_s = math.inf
        """Monotonic time until which the lease is surely still this router's."""
        self.store_down = False
        """The store is unreachable: a leader keeps serving past ``deadline_s``."""
        self.leader_url: str | None = None
        """The leader's advertised URL, as the lease says (None: unknown)."""
        self.reason = ""
        """Why this router does not serve, for ``/health/ready`` and the refusal."""

    @classmethod
    def standby(cls, reason: str, clock: Callable[[], float] = time.monotonic) -> LeaderGate:
        gate = cls(clock)
        gate.step_down(reason)
        return gate

    def serving(self) -> bool:
        """May this router place and forward requests now?"""
        return self.leader and (self.store_down or self._clock() < self.deadline_s)

    def check(self) -> None:
        """Raise the ``not_leader`` refusal unless :meth:`serving`."""
        if not self.serving():
            raise self.refusal()

    def refusal(self) -> NotLeaderError:
        why = self.reason or "lease not confirmed"
        return NotLeaderError(f"this router is not the leader ({why})", leader_url=self.leader_url)

    @property
    def role(self) -> str:
        return ROLE_LEADER if self.serving() else ROLE_STANDBY

    def lead(self, deadline_s: float) -> None:
        """The store confirmed the lease until ``deadline_s`` (monotonic)."""
        self.leader = True
        self.deadline_s = deadline_s
        self.reason = ""

    def step_down(self, reason: str) -> None:
        """Stop serving at once (fenced, lease lost, or never held)."""
        self.leader = False
        self.deadline_s = -math.inf
        self.reason = reason


UNGATED_PATHS = frozenset({LIVENESS_PATH, READY_PATH, "/metrics"})
"""Answered by a standby too: liveness, readiness and its metrics."""


def ready_body(gate: LeaderGate, store: dict[str, object], **detail: object) -> dict[str, object]:
    """The ``/health/ready`` body (:data:`kairos_common.wire.READY_PATH`)."""
    serving = gate.serving()
    body: dict[str, object] = {"ready": serving, "role": gate.role}
    if not serving:
        body["reason"] = gate.reason or "lease not confirmed"
    if gate.leader_url:
        body["leader_url"] = gate.leader_url
    body["store"] = store
    body.update(detail)
    return body

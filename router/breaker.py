"""A per-instance circuit breaker for timeouts and 5xx answers.

Health checks only see ``/health``; a backend that answers it but hangs or fails
on inference would keep receiving agents. The proxy reports every upstream
outcome here: ``failures`` consecutive timeouts / 5xx *open* the instance's
breaker, which makes it ineligible (placement skips it, its agents move, as for an
unhealthy instance) for ``open_s``. Then it is *half-open*: eligible again, and
the next outcome decides — a success closes it, a failure reopens it at once.
The last eligible instance is never cut off: with nowhere else to go, trying
beats answering 503.
"""

from __future__ import annotations

from collections.abc import Callable

import structlog

from router.config import TimeoutSettings
from router.instances import Instance, InstancePool
from router.ports import Evacuator, Pump

log = structlog.get_logger("kairos.router.breaker")


class CircuitBreakers:
    """Breaker state of every instance (pure bookkeeping plus the core's evacuation).

    Handed only what it touches: the pool (is another instance eligible? which
    breakers to half-open), the evacuation to run when one opens, and the hold
    queue pump to run when one half-opens.
    """

    def __init__(
        self,
        pool: InstancePool,
        evacuator: Evacuator,
        pump: Pump,
        clock: Callable[[], float],
        timeouts: TimeoutSettings,
    ) -> None:
        self._pool = pool
        self._evacuator = evacuator
        self._pump = pump
        self.clock = clock
        self.failures = timeouts.breaker_failures
        self.open_s = timeouts.breaker_open_s
        self._streak: dict[str, int] = {}
        self._open_until: dict[str, float] = {}

    def success(self, inst: Instance) -> None:
        inst.last_answered_s = self.clock()
        if self._streak.pop(inst.name, 0) >= self.failures:
            log.info("breaker_closed", instance=inst.name)

    def failure(self, inst: Instance, reason: str) -> None:
        streak = self._streak.get(inst.name, 0) + 1
        self._streak[inst.name] = streak
        if streak >= self.failures and not inst.breaker_open:
            if not any(i.eligible for i in self._pool if i is not inst):
                return  # the last instance left: failing fast would only turn errors into 503s
            inst.breaker_open = True
            self._open_until[inst.name] = self.clock() + self.open_s
            log.warning("breaker_opened", instance=inst.name, reason=reason, failures=streak,
                        open_s=self.open_s)  # fmt: skip
            self._evacuator.evacuate(inst.name, ongoing_too=True, reason="breaker")

    def tick(self) -> None:
        """Half-open every breaker whose time is up (called each maintenance second)."""
        now = self.clock()
        for name, until in list(self._open_until.items()):
            if now < until:
                continue
            del self._open_until[name]
            inst = self._pool.get(name)
            if inst is not None and inst.breaker_open:
                inst.breaker_open = False
                log.info("breaker_half_open", instance=name)
                self._pump(inst)

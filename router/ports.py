"""The few core operations components need, as narrow interfaces.

The router's components (proxy, health checker, circuit breakers, control and
admin APIs) are built once in the composition root (:func:`router.app.create_app`
over :class:`router.core.RouterCore`) and handed exactly the services they use.
Operations that span several services — health transitions, evacuation,
membership changes, the instance listing — stay on the core, and a component
that needs one or two of them receives the core typed as one of these
Protocols: it can call only what it declares, mypy enforces that, and a test
can pass a small fake instead of a whole core. Single operations with no
keywords (``pump``, ``persist``, a clock) are passed as plain callables.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol

from router.instances import Instance

Pump = Callable[[Instance], object]
"""Admit what an instance's hold queue can take now (``AdmissionService.pump``; what it
returns, the admitted ids, is not used)."""

Persist = Callable[[], Awaitable[None]]
"""Write the ledger's pending changes (``RouterCore.persist``)."""


class HealthSink(Protocol):
    """Where health observations go (active checks, refused upstream connections)."""

    def mark_health(self, inst: Instance, ok: bool) -> None: ...


class Evacuator(Protocol):
    """Moves agents off an instance that must stop serving (breaker opened)."""

    def evacuate(self, name: str, *, ongoing_too: bool, reason: str) -> None: ...


class InstanceAdmin(Protocol):
    """Runtime membership changes (the admin API)."""

    def add_instance(self, name: str, url: str) -> Instance: ...

    def remove_instance(self, name: str) -> None: ...

    def set_draining(self, name: str, draining: bool) -> Instance: ...


class InstanceListing(Protocol):
    """Every instance's state as JSON (``/health`` and ``/kairos/v1/instances``)."""

    def instances_json(self) -> list[dict[str, object]]: ...

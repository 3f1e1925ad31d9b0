"""The ``/kairos/v1`` control API (contract: :mod:`kairos_common.wire`).

* agents: start / end / status — used by ``id-tracker``;
* instances: list, per-instance state snapshot and admission decisions — used by
  each instance's ``kairosd``;
* fleet: the fleet power budget's state (``GET /kairos/v1/fleet``); with a budget
  configured, each decision's ack carries the instance's clock cap
  (:mod:`router.fleet_budget`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from aiohttp import web

from kairos_common.errors import WireFormatError, WireVersionError
from kairos_common.identity import end_key_matches
from kairos_common.wire import (
    API_PREFIX,
    AdmissionDecision,
    AgentEnd,
    AgentEndReply,
    AgentStart,
)
from router.admission import AdmissionService
from router.agents import AgentService
from router.auth import ControlAuth, Role
from router.cells import CellGuard, CellRoom
from router.energy import EnergyService
from router.errors import (
    BadRequestError,
    FencedError,
    ForbiddenError,
    NotLeaderError,
    StateStoreError,
    UnsupportedWireVersionError,
)
from router.fleet_budget import FleetBudgetService
from router.instances import InstancePool
from router.json_body import parse_json, read_body
from router.ledger import Ledger
from router.ports import InstanceListing, Persist
from router.record_watch import RecordWatch

CONTROL_BODY_LIMIT = 1 << 20
"""Control messages are small; a decision with thousands of admits is ~100 KB."""
_CONTROL_DEPTH = 16
FUTURE_SKEW_S = 3600.0
"""How far ahead of the router's clock a daemon's start time may be (clock skew)."""


async def read_json_object(request: web.Request, read_timeout_s: float = 10.0) -> dict[str, Any]:
    """A small JSON object body (empty body → ``{}``); 400/408/413 on anything else."""
    body = await read_body(request, CONTROL_BODY_LIMIT, read_timeout_s)
    if not body.strip():
        return {}
    obj = await parse_json(body, _CONTROL_DEPTH)
    if not isinstance(obj, dict):
        raise BadRequestError("body must be a JSON object")
    return obj


def _bad_message(exc: WireFormatError) -> BadRequestError:
    """HTTP 400 for a malformed message; one of another wire version says which
    version this router speaks (code ``unsupported_wire_version``)."""
    if isinstance(exc, WireVersionError):
        return UnsupportedWireVersionError(str(exc))
    return BadRequestError(str(exc))


class ControlApi:
    """Handlers; every write checks its role first, before reading the body.

    Handed the services behind its routes (agents, pool, admission, energy, the
    optional fleet budget, the ledger for in-flight ages), the instance listing,
    the persist operation (durable acknowledgements), the wall clock (skew check)
    and the record watch (an end call that waits for the agent's summary).
    """

    def __init__(
        self,
        auth: ControlAuth,
        *,
        agents: AgentService,
        pool: InstancePool,
        ledger: Ledger,
        admission: AdmissionService,
        energy: EnergyService,
        fleet: FleetBudgetService | None,
        listing: InstanceListing,
        persist: Persist,
        wall_clock: Callable[[], float],
        watch: RecordWatch,
        cell_room: CellRoom | None = None,
        cell_guard: CellGuard | None = None,
    ) -> None:
        self.auth = auth
        self._cell_room = cell_room
        self._cell_guard = cell_guard or CellGuard(None)
        self._agents = agents
        self._pool = pool
        self._ledger = ledger
        self._admission = admission
        self._energy = energy
        self._fleet = fleet
        self._listing = listing
        self._persist = persist
        self._wall_clock = wall_clock
        self._watch = watch

    def routes(self) -> list[web.RouteDef]:
        p = API_PREFIX
        return [
            web.post(f"{p}/agents", self.start_agent),
            web.post(f"{p}/agents/{{agent_id}}/end", self.end_agent),
            web.get(f"{p}/agents/{{agent_id}}", self.agent_status),
            web.get(f"{p}/instances", self.list_instances),
            web.get(f"{p}/instances/{{name}}/state", self.instance_state),
            web.post(f"{p}/instances/{{name}}/decision", self.decision),
            web.get(f"{p}/fleet", self.fleet),
        ]

    def _read(self, request: web.Request) -> None:
        self.auth.require_read(request)

    def _lifecycle(self, request: web.Request) -> None:
        self.auth.require(request, Role.LIFECYCLE, Role.ADMIN)

    async def start_agent(self, request: web.Request) -> web.Response:
        self._lifecycle(request)
        self._cell_guard.check_start(request)
        if self._cell_room is not None:
            self._cell_room.require_room(request)  # 503 cell_full: the balancer tries another
        try:
            msg = AgentStart.from_json(await read_json_object(request))
        except WireFormatError as exc:
            raise _bad_message(exc) from None
        started = self._agents.start(msg)
        await self._durable()
        return web.json_response(started.to_json())

    async def end_agent(self, request: web.Request) -> web.Response:
        who = self.auth.require(request, Role.LIFECYCLE, Role.ADMIN)
        try:
            obj = await read_json_object(request)
            msg = AgentEnd.from_json(obj or {"exit_code": 0})
        except WireFormatError as exc:
            raise _bad_message(exc) from None
        agent_id = request.match_info["agent_id"]
        self._cell_guard.check(agent_id)  # 421, not a 404 a misrouted end would take as done
        # Every id-tracker holds the lifecycle credential; only the one that started
        # this agent holds its end key. The admin may end any agent.
        if who.role is Role.LIFECYCLE and not end_key_matches(
            agent_id, msg.end_key, self._agents.secret
        ):
            raise ForbiddenError("ending an agent needs the end key its start returned")
        # Registered before the end: with nothing left to attribute, the record is
        # written inside it.
        fut = self._watch.expect(agent_id) if msg.summary_wait_s > 0 else None
        try:
            self._agents.end(agent_id, msg)
        except BaseException:
            if fut is not None:
                self._watch.forget(agent_id, fut)
            raise
        await self._durable()
        if fut is None:
            return web.json_response(AgentEndReply().to_json())
        record = await self._watch.wait(agent_id, fut, msg.summary_wait_s)
        summary = self._agents.summary(agent_id, record)
        return web.json_response(AgentEndReply(summary).to_json())

    async def _durable(self) -> None:
        """Persist before acknowledging a start/end, so a router killed right after
        (SIGKILL, power loss) neither forgets a started agent nor revives an ended
        one. A failing disk does not fail the call: the change stays queued and
        the maintenance loop retries (and logs) it."""
        try:
            await self._persist()
        except FencedError:
            # Another router leads now and never saw this change: the caller must
            # repeat it there (its client follows the leader on a not_leader answer).
            raise NotLeaderError(
                "this router lost its lease before the change was stored"
            ) from None
        except StateStoreError:
            return

    async def agent_status(self, request: web.Request) -> web.Response:
        self._read(request)
        agent_id = request.match_info["agent_id"]
        self._cell_guard.check(agent_id)
        return web.json_response(self._agents.status(agent_id))

    async def list_instances(self, request: web.Request) -> web.Response:
        self._read(request)
        return web.json_response({"instances": self._listing.instances_json()})

    async def instance_state(self, request: web.Request) -> web.Response:
        self._read(request)
        inst = self._pool.resolve(request.match_info["name"])
        return web.json_response(self._admission.state(inst).to_json())

    async def decision(self, request: web.Request) -> web.Response:
        # Only this instance's daemon: neither admin nor another instance's daemon.
        who = self.auth.require(request, Role.DAEMON)
        inst = self._pool.resolve(request.match_info["name"])
        if who.instance != inst.name:
            raise ForbiddenError("a daemon credential is valid for its own instance only")
        try:
            decision = AdmissionDecision.from_json(await read_json_object(request))
        except WireFormatError as exc:
            raise _bad_message(exc) from None
        if decision.daemon_start_unix_s > self._wall_clock() + FUTURE_SKEW_S:
            # Decisions apply in (start, epoch) order: a start in the future would
            # make every later decision of the real daemon look stale.
            raise BadRequestError("decision's daemon_start_unix_s is in the future")
        if self._pool.resolve(decision.instance) is not inst:
            raise BadRequestError("decision names a different instance than the URL")
        ack = self._admission.apply_decision(decision)
        if ack.accepted:
            since = self._ledger.in_flight_since(inst.name)
            self._energy.on_decision(inst.name, decision, since)
        fleet = self._fleet
        if fleet is not None:
            names = [i.name for i in self._pool]
            if ack.accepted:
                cap, conflict = fleet.on_decision(inst.name, decision, names)
            else:  # a repeat: the cap in force still holds
                cap, conflict = fleet.cap_for(inst.name)
            ack = dataclasses.replace(ack, clock_cap_mhz=cap, budget_conflict=conflict)
        return web.json_response(ack.to_json())

    async def fleet(self, request: web.Request) -> web.Response:
        """The fleet power budget: cap, predicted and measured W, per-instance caps."""
        self._read(request)
        if self._fleet is None:
            return web.json_response({"enabled": False, "cap_w": None, "instances": {}})
        return web.json_response(self._fleet.state([i.name for i in self._pool]))

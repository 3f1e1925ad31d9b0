"""This router's cell (docs/cells.md): the room it reports, and the identities it refuses.

A fleet split into cells has one router (pair) per cell and a front balancer
(deploy/haproxy/cells.cfg) that sends each agent's requests to the cell named in
its identity, and each agent start to a cell with room. The router's part:

* ``GET /health/room`` — 200 ``{"room": true}`` while this cell would admit a new
  agent now (:func:`controllers.cell_room.cell_has_room`: the fleet-wide
  admission rule over this cell's instances, with the agents started here that
  have not sent a request yet counted as placed), else 503. Unauthenticated, as
  a balancer's health check is, so it says nothing about any agent: one boolean
  and the cell's name.
* an agent start sent with ``X-Kairos-Require-Room`` (the balancer adds it on
  the starts it steers by room) is declined with 503 ``cell_full`` when there is
  no room, so the balancer retries it on another cell at once instead of waiting
  for its next health check.
* an identity minted by another cell is refused with 421 ``wrong_cell``
  (:meth:`CellGuard.check`): serving it here would count the agent in two cells.
"""

from __future__ import annotations

from collections.abc import Callable

import structlog
from aiohttp import web

from controllers.cell_room import cell_has_room
from kairos_common.identity import cell_of
from kairos_common.wire import CELL_HEADER, REQUIRE_ROOM_HEADER
from router.admission import AdmissionService
from router.errors import CellFullError, MisdirectedError
from router.ledger import Ledger

log = structlog.get_logger("kairos.router.cells")

ROOM_PATH = "/health/room"
DECLINE_RETRY_AFTER_S = 1.0


class CellGuard:
    """Refuses agent ids (and starts) addressed to another cell; a no-op without a cell."""

    def __init__(self, cell: str | None) -> None:
        self.cell = cell

    def check(self, agent_id: str | None) -> None:
        """Raise 421 when ``agent_id`` was minted by another cell."""
        if self.cell is None:
            return
        theirs = cell_of(agent_id)
        if theirs is not None and theirs != self.cell:
            raise MisdirectedError(
                f"this agent belongs to cell {theirs!r}, this router serves cell "
                f"{self.cell!r}: send its requests through the front balancer"
            )

    def check_start(self, request: web.Request) -> None:
        """Raise 421 for a start whose ``X-Kairos-Cell`` names another cell."""
        wanted = request.headers.get(CELL_HEADER, "").strip()
        if self.cell is not None and wanted and wanted != self.cell:
            raise MisdirectedError(
                f"start asked for cell {wanted[:40]!r}, this router serves cell {self.cell!r}"
            )


class CellRoom:
    """Whether this cell can admit a new agent now, from the live admission state."""

    def __init__(
        self,
        cell: str | None,
        admission: AdmissionService,
        ledger: Ledger,
        clock: Callable[[], float],
        start_reserve_s: float,
    ) -> None:
        self.cell = cell
        self._admission = admission
        self._ledger = ledger
        self._clock = clock
        self._reserve_s = start_reserve_s

    def unplaced_tokens(self) -> list[int]:
        """Sizes of agents started within the reserve window that have no instance yet."""
        now = self._clock()
        ledger = self._ledger
        return [
            ledger.context_of(a)
            for a in ledger
            if a.instance is None and not a.ephemeral and now - a.arrival_s <= self._reserve_s
        ]

    def has_room(self) -> bool:
        admission = self._admission
        return cell_has_room(
            admission.gates(), self.unplaced_tokens(), self._ledger.placeholder_tokens,
            admission.rule,
        )  # fmt: skip

    def require_room(self, request: web.Request) -> None:
        """Decline a start that asked for room (503 ``cell_full``) when there is none."""
        if REQUIRE_ROOM_HEADER not in request.headers or self.has_room():
            return
        log.info("start_declined_no_room", cell=self.cell)
        raise CellFullError(
            f"cell {self.cell or '(none)'} cannot admit a new agent now",
            retry_after_s=DECLINE_RETRY_AFTER_S,
        )

    def routes(self) -> list[web.RouteDef]:
        return [web.get(ROOM_PATH, self.room)]

    async def room(self, _request: web.Request) -> web.Response:
        """``GET /health/room``: one boolean and the cell name, nothing about agents."""
        room = self.has_room()
        return web.json_response({"room": room, "cell": self.cell}, status=200 if room else 503)

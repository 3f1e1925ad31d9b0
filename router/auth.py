"""Authentication of the control and admin APIs by credential role (docs/design.md §9).

=========  ============================================  ==============================
role       credential                                    may call
=========  ============================================  ==============================
admin      ``--control-token-file`` or ``admin.token``   everything except decisions
lifecycle  ``lifecycle.token`` (id-tracker)              start / end agents, reads
daemon     ``daemon-<instance>.token`` (kairosd)         its instance's decisions, reads
=========  ============================================  ==============================

Every write needs a credential, loopback peers included: an agent is a local
process too. Reads (agent status, instance list and state, fleet) stay open to
loopback peers without one, as ``/metrics`` is. Credentials are compared as
bytes with :func:`hmac.compare_digest` against every candidate, so timing says
nothing about which role or prefix matched; anything that is not a short,
printable ASCII bearer value is a 401 before any comparison. An agent identity
key is never a credential here: identity keys are checked only on inference
routes.
"""

from __future__ import annotations

import enum
import hmac
import ipaddress
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from aiohttp import web

from kairos_common.credentials import MAX_CREDENTIAL_CHARS
from router.errors import AuthenticationError, ForbiddenError
from router.secrets_store import RouterCredentials, digest


class Role(enum.Enum):
    ADMIN = "admin"
    LIFECYCLE = "lifecycle"
    DAEMON = "daemon"


@dataclass(frozen=True, slots=True)
class Principal:
    """Who a valid credential belongs to (``instance`` only for daemons)."""

    role: Role
    instance: str | None = None


def _is_loopback(peer: str | None) -> bool:
    if not peer:
        return False
    try:
        return ipaddress.ip_address(peer.split("%", 1)[0]).is_loopback
    except ValueError:
        return False


def bearer_bytes(request: web.Request) -> bytes | None:
    """The bearer value as bytes; None without the header; 401 when malformed."""
    header = request.headers.get("Authorization")
    if header is None:
        return None
    scheme, _, given = header.partition(" ")
    given = given.strip()
    if (
        scheme.lower() != "bearer"
        or not given
        or len(given) > MAX_CREDENTIAL_CHARS
        or not given.isascii()
        or not given.isprintable()
    ):
        raise AuthenticationError("malformed control credential (expected Authorization: Bearer)")
    return given.encode("ascii")


class ControlAuth:
    """Checks control/admin requests against the router's :class:`RouterCredentials`."""

    def __init__(
        self,
        credentials: RouterCredentials,
        instances: Callable[[], Iterable[str]],
        *,
        loopback_reads: bool = True,
    ) -> None:
        self.credentials = credentials
        self._instances = instances
        self.loopback_reads = loopback_reads
        self.shared_digests: dict[str, str] = {}
        """With a shared store: every router's credential digests by role
        (``admin``, ``lifecycle``, ``daemon:<instance>``), accepted beside this
        router's own, so a client keeps its credential across a takeover."""

    def identify(self, given: bytes, instance: str | None = None) -> Principal | None:
        """The principal ``given`` authenticates, or None (every candidate compared)."""
        creds = self.credentials
        found: Principal | None = None
        if hmac.compare_digest(given, creds.admin):
            found = Principal(Role.ADMIN)
        if hmac.compare_digest(given, creds.lifecycle):
            found = Principal(Role.LIFECYCLE)
        names = [instance] if instance is not None else list(self._instances())
        for name in names:
            if hmac.compare_digest(given, creds.daemon_token(name)):
                found = Principal(Role.DAEMON, name)
        if found is None and self.shared_digests:
            found = self._identify_shared(digest(given).encode(), names)
        return found

    def _identify_shared(self, given: bytes, names: list[str]) -> Principal | None:
        shared = self.shared_digests
        found: Principal | None = None
        if hmac.compare_digest(given, shared.get("admin", "").encode()):
            found = Principal(Role.ADMIN)
        if hmac.compare_digest(given, shared.get("lifecycle", "").encode()):
            found = Principal(Role.LIFECYCLE)
        for name in names:
            if hmac.compare_digest(given, shared.get(f"daemon:{name}", "").encode()):
                found = Principal(Role.DAEMON, name)
        return found

    def require(self, request: web.Request, *roles: Role, instance: str | None = None) -> Principal:
        """A principal of one of ``roles`` (daemons: of ``instance``), else 401/403."""
        given = bearer_bytes(request)
        if given is None:
            raise AuthenticationError("this endpoint requires a control credential")
        who = self.identify(given, instance)
        if who is None:
            raise AuthenticationError("invalid control credential")
        if who.role not in roles:
            raise ForbiddenError(f"the {who.role.value} credential may not call this endpoint")
        return who

    def require_read(self, request: web.Request) -> None:
        """Reads: any valid credential, or a loopback peer without one (unless the
        operator configured an admin token: then every control call needs one)."""
        given = bearer_bytes(request)
        if given is None:
            if self.loopback_reads and _is_loopback(request.remote):
                return
            if self.loopback_reads:
                raise ForbiddenError("control reads from non-loopback peers need a credential")
            raise AuthenticationError("this endpoint requires a control credential")
        if self.identify(given) is None:
            raise AuthenticationError("invalid control credential")

"""Authentication of the control and admin APIs.

With a control token configured, callers must send ``Authorization: Bearer
<token>`` (compared in constant time). Without one, only loopback peers are
accepted, so a router bound to a public interface never exposes its control
plane unauthenticated.
"""

from __future__ import annotations

import hmac
import ipaddress

from aiohttp import web

from router.errors import AuthenticationError, ForbiddenError


def _is_loopback(peer: str | None) -> bool:
    if not peer:
        return False
    try:
        return ipaddress.ip_address(peer.split("%", 1)[0]).is_loopback
    except ValueError:
        return False


def check_control_auth(request: web.Request, token: str | None) -> None:
    """Raise 401/403 unless the caller may use the control plane."""
    if token:
        scheme, _, given = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip(), token):
            raise AuthenticationError("control API requires the router's control token")
        return
    if not _is_loopback(request.remote):
        raise ForbiddenError("control API accepts only loopback peers without a control token")

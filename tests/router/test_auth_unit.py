"""Control-plane authentication: token when configured, else loopback peers only."""

from __future__ import annotations

from unittest.mock import Mock

import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from router.auth import check_control_auth
from router.errors import AuthenticationError, ForbiddenError


def _request(peer: str, headers: dict[str, str] | None = None) -> web.Request:
    transport = Mock()
    transport.get_extra_info.side_effect = lambda name, default=None: (
        (peer, 12345) if name == "peername" else default
    )
    return make_mocked_request("POST", "/kairos/v1/agents", headers=headers, transport=transport)


@pytest.mark.parametrize("peer", ["127.0.0.1", "::1", "127.8.9.10"])
def test_loopback_allowed_without_token(peer: str) -> None:
    check_control_auth(_request(peer), None)


@pytest.mark.parametrize("peer", ["10.0.0.7", "192.168.1.2", "2001:db8::1"])
def test_remote_peer_refused_without_token(peer: str) -> None:
    with pytest.raises(ForbiddenError):
        check_control_auth(_request(peer), None)


def test_token_required_even_from_loopback_when_configured() -> None:
    with pytest.raises(AuthenticationError):
        check_control_auth(_request("127.0.0.1"), "tok")
    with pytest.raises(AuthenticationError):
        check_control_auth(
            _request("127.0.0.1", {"Authorization": "Bearer wrong"}),
            "tok",
        )
    check_control_auth(
        _request("10.0.0.7", {"Authorization": "Bearer tok"}),
        "tok",
    )

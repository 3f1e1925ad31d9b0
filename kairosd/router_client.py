"""The daemon's side of the ``/kairos/v1`` contract (kairos_common.wire).

Each epoch the daemon pulls its instance's agent state and pushes one
admission decision. Both calls are bounded by a timeout and raise
:class:`RouterInputError` on any failure, so the loop can count stale
epochs instead of blocking.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import quote

import aiohttp

from kairos_common.errors import WireFormatError, WireVersionError
from kairos_common.wire import API_PREFIX, AdmissionDecision, DecisionAck, InstanceState
from kairosd.errors import RouterInputError, RouterVersionError


class RouterClient:
    """Client for one instance's state/decision endpoints on the router."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        base_url: str,
        instance: str,
        timeout_s: float,
        token: str | None = None,
        token_source: Callable[[], str | None] | None = None,
    ) -> None:
        base = f"{base_url.rstrip('/')}{API_PREFIX}/instances/{quote(instance, safe='')}"
        self.state_url = f"{base}/state"
        self.decision_url = f"{base}/decision"
        self._session = session
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._token_source = token_source
        self._headers: dict[str, str] = {}
        self._set_token(token)

    def _set_token(self, token: str | None) -> None:
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}

    def _refresh_token(self) -> None:
        """Look for the credential again: a router started after the daemon (or
        restarted with new credentials) publishes it only once it listens."""
        if self._token_source is not None:
            try:
                self._set_token(self._token_source())
            except ValueError:
                return

    async def _json(self, method: str, url: str, body: dict[str, Any] | None = None) -> Any:
        if not self._headers:
            self._refresh_token()
        try:
            async with self._session.request(
                method, url, json=body, headers=self._headers, timeout=self._timeout
            ) as resp:
                if resp.status in (401, 403):
                    why = "refused the control token" if self._headers else "wants a token"
                    self._refresh_token()  # the next call may find a newer one
                    raise RouterInputError(
                        f"{method} {url} answered HTTP {resp.status}: the router {why}; "
                        "set KAIROSD_ROUTER_TOKEN or router_token_file to this instance's "
                        "daemon credential (credentials/daemon-NAME.token in the router's "
                        "state directory)"
                    )
                if resp.status == 400:
                    why = await _error_message(resp)
                    kind = RouterVersionError if "wire version" in why else RouterInputError
                    raise kind(f"{method} {url} answered HTTP 400: {why}")
                if resp.status != 200:
                    raise RouterInputError(f"{method} {url} answered HTTP {resp.status}")
                return await resp.json(content_type=None)
        except TimeoutError as exc:
            raise RouterInputError(f"{method} {url} timed out") from exc
        except (aiohttp.ClientError, ValueError) as exc:
            raise RouterInputError(f"{method} {url}: {exc}") from exc

    async def state(self) -> InstanceState:
        obj = await self._json("GET", self.state_url)
        try:
            return InstanceState.from_json(obj)
        except WireVersionError as exc:
            raise RouterVersionError(f"instance state: {exc}") from exc
        except WireFormatError as exc:
            raise RouterInputError(f"malformed instance state: {exc}") from exc

    async def post_decision(self, decision: AdmissionDecision) -> DecisionAck:
        obj = await self._json("POST", self.decision_url, decision.to_json())
        try:
            return DecisionAck.from_json(obj)
        except WireVersionError as exc:
            raise RouterVersionError(f"decision ack: {exc}") from exc
        except WireFormatError as exc:
            raise RouterInputError(f"malformed decision ack: {exc}") from exc


async def _error_message(resp: aiohttp.ClientResponse) -> str:
    """The message of the router's error body (OpenAI style), else its status text."""
    try:
        body = await resp.json(content_type=None)
        return str(body["error"]["message"])[:500]
    except (aiohttp.ClientError, ValueError, KeyError, TypeError):
        return resp.reason or "bad request"

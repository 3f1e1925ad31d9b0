"""The daemon's side of the ``/kairos/v1`` contract (kairos_common.wire).

Each epoch the daemon pulls its instance's agent state and pushes one
admission decision. Both calls are bounded by a timeout and raise
:class:`RouterInputError` on any failure, so the loop can count stale
epochs instead of blocking.

With several router URLs (a router pair; docs/kairosd.md, "Several routers")
each call goes to the one believed to lead
(:class:`kairos_common.leader.RouterUrls`). A connection error, a timeout, a
5xx (a standby's ``not_leader`` among them) moves it on within the same call's
time budget: to the leader a standby names when that is a configured URL, else
to the next one, each URL at most once per call. The move is logged when the
daemon's router changes, not on every epoch. The epochs pace the retries: a
call that found no leader makes that epoch's input stale, and the next epoch
starts again at the URL tried last.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import quote

import aiohttp
import structlog

from kairos_common.errors import WireFormatError, WireVersionError
from kairos_common.leader import RouterUrls, not_leader_hint
from kairos_common.wire import API_PREFIX, AdmissionDecision, DecisionAck, InstanceState
from kairosd.errors import RouterInputError, RouterVersionError

log = structlog.get_logger()


class _MoveOn(Exception):
    """This router cannot answer now (down, slow, 5xx, not the leader): try the next."""

    def __init__(self, message: str, leader_hint: str | None = None) -> None:
        super().__init__(message)
        self.leader_hint = leader_hint


class RouterClient:
    """Client for one instance's state/decision endpoints on the router (pair)."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        base_url: str | Sequence[str],
        instance: str,
        timeout_s: float,
        token: str | None = None,
        token_source: Callable[[], str | None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        urls = [base_url] if isinstance(base_url, str) else list(base_url)
        self.routers = RouterUrls([u.rstrip("/") for u in urls])
        self._path = f"{API_PREFIX}/instances/{quote(instance, safe='')}"
        self._session = session
        self._timeout_s = timeout_s
        self._clock = clock
        self._token_source = token_source
        self._headers: dict[str, str] = {}
        self._set_token(token)
        self._answered: str | None = None

    @property
    def state_url(self) -> str:
        return f"{self.routers.current}{self._path}/state"

    @property
    def decision_url(self) -> str:
        return f"{self.routers.current}{self._path}/decision"

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

    async def _json(self, method: str, suffix: str, body: dict[str, Any] | None = None) -> Any:
        """One call, moving through the router URLs within ``timeout_s`` (each once)."""
        if not self._headers:
            self._refresh_token()
        routers = self.routers
        deadline = self._clock() + self._timeout_s
        errors: list[str] = []
        for _ in range(len(routers)):
            url = routers.current
            remaining = deadline - self._clock()
            if remaining <= 0:
                break
            try:
                result = await self._call(method, f"{url}{self._path}{suffix}", body, remaining)
            except _MoveOn as exc:
                errors.append(f"{url}: {exc}")
                following = routers.failed(url, exc.leader_hint)
                log.info("router_unavailable_trying_next", router=url, error=str(exc),
                         next_router=following)  # fmt: skip
                continue
            routers.succeeded(url)
            if url != self._answered:
                if self._answered is not None:
                    log.warning("router_failover", previous=self._answered, router=url)
                self._answered = url
            return result
        raise RouterInputError(f"{method} …{self._path}{suffix}: " + "; ".join(errors or
                               ["no time left"]))  # fmt: skip

    async def _call(
        self, method: str, url: str, body: dict[str, Any] | None, timeout_s: float
    ) -> Any:
        try:
            async with self._session.request(
                method,
                url,
                json=body,
                headers=self._headers,
                timeout=aiohttp.ClientTimeout(total=timeout_s),
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
                if resp.status >= 500:
                    raw = await resp.read()
                    hint = not_leader_hint(resp.status, resp.headers, raw)
                    raise _MoveOn(
                        "not the leader" if hint is not None else f"HTTP {resp.status}", hint
                    )
                if resp.status != 200:
                    raise RouterInputError(f"{method} {url} answered HTTP {resp.status}")
                return await resp.json(content_type=None)
        except TimeoutError:
            raise _MoveOn("timed out") from None
        except aiohttp.ClientConnectionError as exc:
            raise _MoveOn(str(exc) or type(exc).__name__) from None
        except (aiohttp.ClientError, ValueError) as exc:
            raise RouterInputError(f"{method} {url}: {exc}") from exc

    async def state(self) -> InstanceState:
        obj = await self._json("GET", "/state")
        try:
            return InstanceState.from_json(obj)
        except WireVersionError as exc:
            raise RouterVersionError(f"instance state: {exc}") from exc
        except WireFormatError as exc:
            raise RouterInputError(f"malformed instance state: {exc}") from exc

    async def post_decision(self, decision: AdmissionDecision) -> DecisionAck:
        obj = await self._json("POST", "/decision", decision.to_json())
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

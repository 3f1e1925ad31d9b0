"""Client of the router's agent lifecycle API (``POST /kairos/v1/agents`` and ``…/end``).

Two small blocking calls made with the standard library's ``http.client``:
id-tracker makes exactly one call before the agent starts and one after it
ends, so an event loop or a connection pool would only add start-up time to
every agent launch. Retries are bounded by a deadline on an injected clock, and
the wait between attempts is injected too: id-tracker passes one that returns
early when a signal arrives, so Ctrl-C is never stuck behind a retry.

With several router URLs (a router pair, or a front balancer and the routers
behind it) each call goes to the one believed to lead
(:class:`kairos_common.leader.RouterUrls`); a connection error, a 5xx (a
standby's ``not_leader`` among them), a 429 or a 421 (a cell that is not the
agent's) moves it on at once — to the leader a standby names, when that is a
configured URL, else to the next URL — and only after a whole round of failures
does it wait the backoff. So the end report reaches the leader even when the
router that handled the start has died since.
"""

from __future__ import annotations

import dataclasses
import http.client
import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlsplit

import structlog

from idtracker.errors import (
    InterruptedBySignalError,
    RegistrationRejectedError,
    RouterProtocolError,
    RouterUnavailableError,
)
from kairos_common.errors import WireFormatError
from kairos_common.leader import RouterUrls, not_leader_hint
from kairos_common.wire import (
    API_PREFIX,
    AgentEnd,
    AgentEndReply,
    AgentStart,
    AgentStarted,
    AgentSummary,
)

log = structlog.get_logger()

Clock = Callable[[], float]
# wait(delay_s) sleeps up to delay_s; returns a signal number if one cut it short.
Waiter = Callable[[float], int | None]


def plain_wait(delay_s: float) -> int | None:
    """A waiter that cannot be interrupted (tests and library use)."""
    time.sleep(delay_s)
    return None


@dataclass(frozen=True, slots=True)
class Backoff:
    """Exponential backoff: ``first_s``, doubling, capped at ``max_s``."""

    first_s: float = 0.1
    max_s: float = 2.0

    def delay_s(self, attempt: int) -> float:
        return float(min(self.max_s, self.first_s * (2 ** max(0, attempt - 1))))


@dataclass(frozen=True, slots=True)
class _Reply:
    status: int
    body: bytes
    headers: Mapping[str, str] = dataclasses.field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class EndReceipt:
    """The router has the agent's end; ``summary`` when one was asked for and sent."""

    summary: AgentSummary | None = None


class _Transient(Exception):
    """A failure worth retrying elsewhere (connection error, timeout, 5xx, 429, 421)."""

    def __init__(self, message: str, leader_hint: str | None = None) -> None:
        super().__init__(message)
        self.leader_hint = leader_hint


class LifecycleClient:
    """Registers an agent and reports its end; one instance per id-tracker run."""

    def __init__(
        self,
        router_urls: str | Sequence[str],
        *,
        control_token: str | None,
        request_timeout_s: float = 2.0,
        clock: Clock = time.monotonic,
        wait: Waiter = plain_wait,
        backoff: Backoff | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        """``headers`` go with every call (a nested id-tracker's ``X-Kairos-Cell``)."""
        urls = [router_urls] if isinstance(router_urls, str) else list(router_urls)
        self.routers = RouterUrls(urls)
        self._token = control_token
        self._extra_headers = dict(headers or {})
        self._timeout_s = request_timeout_s
        self._clock = clock
        self._wait = wait
        self._backoff = backoff or Backoff()

    # -- public API -----------------------------------------------------------------

    def register(self, start: AgentStart, *, deadline_s: float) -> AgentStarted:
        """``POST /kairos/v1/agents``; retries transient failures for ``deadline_s``."""
        reply = self._with_retries(f"{API_PREFIX}/agents", start.to_json(), deadline_s, "start")
        if reply.status in (401, 403):
            raise RegistrationRejectedError(
                f"router at {self.routers.current} refused the control token "
                f"(HTTP {reply.status}); set KAIROS_CONTROL_TOKEN or --control-token-file"
            )
        if reply.status not in (200, 201):
            raise RouterProtocolError(
                f"router at {self.routers.current} answered agent start with HTTP {reply.status}: "
                f"{_snippet(reply.body)}"
            )
        try:
            return AgentStarted.from_json(_json_object(reply.body))
        except WireFormatError as exc:
            raise RouterProtocolError(
                f"router at {self.routers.current} sent a malformed agent-start reply: {exc}"
            ) from None

    def report_end(self, agent_id: str, end: AgentEnd, *, deadline_s: float) -> EndReceipt | None:
        """``POST /kairos/v1/agents/{id}/end``; a receipt once the router has it, else None.

        Never raises: the agent has already finished and its exit status must
        still reach the caller. A 404 counts as delivered (the router already
        forgot the agent, e.g. after its idle expiry). With ``end.summary_wait_s``
        the router may hold the reply that long, so the call's timeout grows by it.
        """
        path = f"{API_PREFIX}/agents/{quote(agent_id, safe='')}/end"
        timeout_s = self._timeout_s + end.summary_wait_s
        try:
            reply = self._with_retries(path, end.to_json(), deadline_s, "end", timeout_s)
        except RouterUnavailableError as exc:
            log.warning("agent end not reported", agent_id=agent_id, error=str(exc))
            return None
        except InterruptedBySignalError as exc:
            log.warning("agent end not reported: interrupted", agent_id=agent_id, signal=exc.signum)
            return None
        if reply.status in (200, 201, 202, 204, 404):
            return EndReceipt(_summary(reply) if end.summary_wait_s > 0 else None)
        log.warning(
            "agent end refused by router",
            agent_id=agent_id,
            status=reply.status,
            body=_snippet(reply.body),
        )
        return None

    # -- transport ------------------------------------------------------------------

    def _with_retries(
        self,
        path: str,
        body: dict[str, Any],
        deadline_s: float,
        what: str,
        timeout_s: float | None = None,
    ) -> _Reply:
        """POST until a non-transient reply or the deadline, moving through the
        router URLs; waits (after each full round of failures) are interruptible."""
        give_up_at = self._clock() + deadline_s
        attempt = 0
        failed_in_round = 0
        rounds = 0
        routers = self.routers
        while True:
            attempt += 1
            url = routers.current
            try:
                reply = self._post(url, path, body, timeout_s or self._timeout_s)
            except _Transient as exc:
                last_error = f"{url}: {exc}"
                following = routers.failed(url, exc.leader_hint)
            else:
                routers.succeeded(url)
                return reply
            remaining = give_up_at - self._clock()
            log.info("router call failed", call=what, attempt=attempt, error=last_error,
                     next_router=following)  # fmt: skip
            if remaining <= 0:
                raise RouterUnavailableError(
                    f"router unreachable for agent {what}: {last_error} "
                    f"({attempt} attempt{'s' if attempt > 1 else ''} in {deadline_s:g} s)"
                )
            failed_in_round += 1
            if failed_in_round < len(routers):
                continue  # the next router at once: a round is one try of each
            failed_in_round, rounds = 0, rounds + 1
            signum = self._wait(min(self._backoff.delay_s(rounds), remaining))
            if signum is not None:
                raise InterruptedBySignalError(signum)

    def _post(self, url: str, path: str, body: dict[str, Any], timeout_s: float) -> _Reply:
        parts = urlsplit(url)
        https = parts.scheme == "https"
        conn_cls = http.client.HTTPSConnection if https else http.client.HTTPConnection
        conn = conn_cls(parts.hostname or "127.0.0.1", parts.port, timeout=timeout_s)
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        headers.update(self._extra_headers)
        try:
            conn.request("POST", parts.path.rstrip("/") + path, json.dumps(body).encode(), headers)
            resp = conn.getresponse()
            reply = _Reply(resp.status, resp.read(64 * 1024), dict(resp.getheaders()))
        except (OSError, http.client.HTTPException) as exc:
            raise _Transient(_describe(exc)) from None
        finally:
            conn.close()
        if reply.status >= 500 or reply.status in (421, 429):
            hint = not_leader_hint(reply.status, reply.headers, reply.body)
            what = "not the leader" if hint is not None else f"HTTP {reply.status}"
            raise _Transient(what, leader_hint=hint)
        return reply


def _summary(reply: _Reply) -> AgentSummary | None:
    """The end reply's summary; None from a router too old to send one, or a 404."""
    if reply.status == 404:
        return None
    try:
        return AgentEndReply.from_json(_json_object(reply.body)).summary
    except WireFormatError as exc:
        log.warning("malformed agent summary from router", error=str(exc))
        return None


def _describe(exc: BaseException) -> str:
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, TimeoutError):
        return "timed out"
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _snippet(body: bytes) -> str:
    return body[:200].decode("utf-8", "replace")


def _json_object(body: bytes) -> dict[str, Any]:
    try:
        obj = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise WireFormatError("reply is not JSON") from None
    if not isinstance(obj, dict):
        raise WireFormatError("expected a JSON object")
    return obj

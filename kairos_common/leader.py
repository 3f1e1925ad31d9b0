"""Following the leader of a router pair: which of the configured router URLs to call.

A router pair (docs/scale-out.md) has one leader; the standby answers every
control and inference route with HTTP 503, ``error.code == "not_leader"``, a
``Retry-After`` header and, when it knows it, ``X-Kairos-Leader: <the leader's
advertised URL>``. ``kairosd`` and ``id-tracker`` take several router URLs (or
one front address, a balancer that follows the leader itself) and call the one
they believe leads; on a connection error or a ``not_leader`` answer they move
on: to the URL the leader header names when it is one of the configured URLs,
else to the next configured URL.

A leader header naming any other URL is ignored: the calls carry control
credentials, and a header is only as trustworthy as whoever answered (a
misconfigured or hostile router must not be able to send a daemon's or
id-tracker's credential elsewhere). Only the operator chooses where they go.

Standard library only: id-tracker imports this before it blocks signals
(tests/common/test_import_cost.py).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from urllib.parse import urlsplit

from kairos_common.wire import LEADER_HEADER, NOT_LEADER_CODE, NOT_LEADER_STATUS

__all__ = [
    "LEADER_HEADER",
    "NOT_LEADER_CODE",
    "RouterUrls",
    "not_leader_hint",
    "not_leader_reply",
    "url_key",
]


def url_key(url: str) -> str:
    """A URL compared as the router sees it: scheme and host lower-case, default
    port explicit, no trailing ``/`` or ``/v1``."""
    url = url.strip().rstrip("/").removesuffix("/v1").rstrip("/")
    try:
        parts = urlsplit(url)
        port = parts.port or (443 if parts.scheme.lower() == "https" else 80)
    except ValueError:
        return url
    host = (parts.hostname or "").lower()
    return f"{parts.scheme.lower()}://{host}:{port}{parts.path}"


def not_leader_hint(status: int, headers: Mapping[str, str], body: bytes) -> str | None:
    """The leader header of a ``not_leader`` 503 (``""`` when it names none), or
    None when the answer is not a ``not_leader`` 503."""
    if status != NOT_LEADER_STATUS:
        return None
    try:
        error = json.loads(body).get("error")
    except (ValueError, UnicodeDecodeError, AttributeError):
        return None
    if not isinstance(error, dict) or error.get("code") != NOT_LEADER_CODE:
        return None
    return next((v.strip() for k, v in headers.items() if k.lower() == LEADER_HEADER.lower()), "")


def not_leader_reply(leader_url: str | None) -> tuple[int, dict[str, str], dict[str, object]]:
    """Status, headers and JSON body of a standby's answer, as the routers send it
    (router/leadership.py): for the stand-in routers tests run clients against."""
    body: dict[str, object] = {
        "error": {"message": "not the leader", "type": "server_error", "param": None,
                  "code": NOT_LEADER_CODE}
    }  # fmt: skip
    headers = {"Retry-After": "1"}
    if leader_url:
        headers[LEADER_HEADER] = leader_url
    return NOT_LEADER_STATUS, headers, body


class RouterUrls:
    """The operator's router URLs, in order, and the one believed to lead.

    Starts with the first; :meth:`succeeded` remembers the URL that answered,
    :meth:`failed` chooses the next to try. Pure bookkeeping: callers do the I/O,
    the retries and their bounds.
    """

    def __init__(self, urls: Sequence[str]) -> None:
        unique: dict[str, str] = {}
        for url in urls:
            unique.setdefault(url_key(url), url)
        if not unique:
            raise ValueError("at least one router URL is needed")
        self.urls: tuple[str, ...] = tuple(unique.values())
        self._keys = tuple(unique)
        self._current = 0

    @property
    def current(self) -> str:
        """The URL to call now: the last that answered as leader, else the first."""
        return self.urls[self._current]

    @property
    def first(self) -> str:
        return self.urls[0]

    def __len__(self) -> int:
        return len(self.urls)

    def configured(self, url: str | None) -> str | None:
        """The configured URL ``url`` names (compared with :func:`url_key`), else None."""
        if not url:
            return None
        key = url_key(url)
        return next((u for u, k in zip(self.urls, self._keys, strict=True) if k == key), None)

    def succeeded(self, url: str) -> None:
        """``url`` answered (as leader): call it first from now on."""
        found = self.configured(url)
        if found is not None:
            self._current = self.urls.index(found)

    def failed(self, url: str, leader_hint: str | None = None) -> str:
        """``url`` failed (connection error, timeout, 5xx, ``not_leader``); the URL to
        try next: the hinted leader when it is a configured URL other than ``url``,
        else the one after ``url`` in the operator's order. Becomes :attr:`current`."""
        hinted = self.configured(leader_hint)
        failed_at = self.configured(url)
        if hinted is not None and hinted != failed_at:
            self._current = self.urls.index(hinted)
        else:
            at = self.urls.index(failed_at) if failed_at is not None else self._current
            self._current = (at + 1) % len(self.urls)
        return self.current

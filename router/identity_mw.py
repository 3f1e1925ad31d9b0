"""Agent identity of an inference request, and the headers forwarded upstream.

Identity comes from (highest priority first) the explicit identity header
(``X-Kairos-Agent: kairos1.<id>.<sig>``), ``Authorization: Bearer <key>``, or
``x-api-key: <key>`` in the :mod:`kairos_common.identity` key format. The user's
real key is recovered from the key and is the only credential forwarded; the
identity part and the identity header never reach a backend.

Requests without an identity: with ``anonymous = "one-turn"`` (default) each
request is its own one-turn agent; with ``anonymous = "api-key"`` requests are
grouped into one agent per API key (id ``key-<sha256 prefix>``).
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import aiohttp

from kairos_common.errors import IdentityError
from kairos_common.identity import ParsedKey, parse_key, parse_token, verify
from router.cells import CellGuard
from router.errors import AuthenticationError

_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
        "accept-encoding",
        "authorization",
        "x-api-key",
        "x-request-id",
    }
)


@dataclass(frozen=True, slots=True)
class Identity:
    """``agent_id`` None means anonymous (a one-turn agent is made for it)."""

    agent_id: str | None
    bearer_key: str | None
    x_api_key: str | None
    source: str


_VERIFIED_MAX = 65_536


class IdentityResolver:
    """Extracts identities under one signing secret, memoising verified keys: an agent
    sends the same key on every turn, so the HMAC runs once per key, not per request."""

    def __init__(
        self,
        secret: bytes | None,
        identity_header: str,
        anonymous: str,
        cell: CellGuard | None = None,
    ) -> None:
        self.secret = secret
        self.identity_header = identity_header
        self.anonymous = anonymous
        self.cell = cell or CellGuard(None)
        self._verified: dict[str, ParsedKey] = {}

    def _parse_verified(self, key: str) -> ParsedKey:
        parsed = self._verified.get(key)
        if parsed is not None:
            return parsed
        try:
            parsed = parse_key(key)
            verify(parsed, self.secret)
        except IdentityError as exc:
            raise AuthenticationError(f"invalid Kairos agent identity: {exc}") from None
        self.cell.check(parsed.agent_id)  # 421: another cell's agent
        if parsed.agent_id is not None:
            if len(self._verified) >= _VERIFIED_MAX:
                self._verified.clear()
            self._verified[key] = parsed
        return parsed

    def _explicit(self, value: str) -> str:
        """The agent id from the explicit header (a token; a bare id only when unsigned)."""
        if self.secret is None and "." not in value:
            value = f"kairos1.{value}.-"
        try:
            parse_token(value)
        except IdentityError as exc:
            raise AuthenticationError(f"invalid Kairos agent identity header: {exc}") from None
        agent_id = self._parse_verified(value).agent_id
        assert agent_id is not None
        return agent_id

    def resolve(self, headers: Mapping[str, str]) -> Identity:
        """Extract identity and real keys; raises 401 on a forged or malformed identity."""
        agent_id: str | None = None
        source = "anonymous"
        bearer: str | None = None
        auth = headers.get("Authorization")
        if auth is not None:
            scheme, _, key = auth.partition(" ")
            if scheme.lower() == "bearer" and key:
                parsed = self._parse_verified(key.strip())
                bearer = parsed.real_key
                if parsed.agent_id:
                    agent_id, source = parsed.agent_id, "authorization"
        x_key: str | None = None
        raw_x = headers.get("x-api-key")
        if raw_x:
            parsed = self._parse_verified(raw_x.strip())
            x_key = parsed.real_key
            if parsed.agent_id and agent_id is None:
                agent_id, source = parsed.agent_id, "x-api-key"
        explicit = headers.get(self.identity_header)
        if explicit:
            agent_id, source = self._explicit(explicit.strip()), "header"
        if agent_id is None and self.anonymous == "api-key" and (bearer or x_key):
            digest = hashlib.sha256((bearer or x_key or "").encode()).hexdigest()[:24]
            agent_id, source = f"key-{digest}", "api-key"
        return Identity(agent_id=agent_id, bearer_key=bearer, x_api_key=x_key, source=source)


def upstream_headers(
    headers: Mapping[str, str], identity: Identity, identity_header: str, request_id: str
) -> dict[str, str]:
    """Request headers for the backend: hop-by-hop and identity removed, real key set."""
    drop = identity_header.lower()
    out = {k: v for k, v in headers.items() if (lk := k.lower()) not in _HOP_BY_HOP and lk != drop}
    if identity.bearer_key:
        out["Authorization"] = f"Bearer {identity.bearer_key}"
    if identity.x_api_key:
        out["x-api-key"] = identity.x_api_key
    out["X-Request-Id"] = request_id
    out["Accept-Encoding"] = "identity"
    return out


class KeyChecker:
    """Whether a backend accepts a request's real API key, asked when it must wait.

    vLLM checks keys only when the request reaches it; a request with a bogus key
    that must first wait for admission would hold a queue slot (and a seat in
    Algorithm 1's order) for nothing. So before waiting, the router asks one
    backend once — ``GET /v1/models`` with the same credentials, which vLLM's
    ``--api-key`` guards — and remembers the answer per key (hashed): accepted
    for ``ok_ttl_s``, refused for ``bad_ttl_s``. Concurrent checks of one key
    share one probe. A probe that fails for any other reason (timeout, 5xx)
    admits the request: availability is not this check's job.
    """

    def __init__(
        self,
        clock: Callable[[], float],
        ok_ttl_s: float = 300.0,
        bad_ttl_s: float = 30.0,
        timeout_s: float = 2.0,
    ) -> None:
        self.clock = clock
        self.ok_ttl_s = ok_ttl_s
        self.bad_ttl_s = bad_ttl_s
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._known: dict[str, tuple[bool, float]] = {}
        self._probing: dict[str, asyncio.Future[bool]] = {}

    @staticmethod
    def _cache_key(base_url: str, headers: Mapping[str, str]) -> str:
        material = "\0".join(
            (base_url, headers.get("Authorization", ""), headers.get("x-api-key", ""))
        )
        return hashlib.sha256(material.encode("utf-8", "surrogateescape")).hexdigest()

    def known(self, base_url: str, headers: Mapping[str, str]) -> bool | None:
        """The remembered answer for these credentials, or None (ask with :meth:`accepted`)."""
        known = self._known.get(self._cache_key(base_url, headers))
        if known is not None and self.clock() < known[1]:
            return known[0]
        return None

    async def accepted(
        self, session: aiohttp.ClientSession, base_url: str, headers: Mapping[str, str]
    ) -> bool:
        key = self._cache_key(base_url, headers)
        now = self.clock()
        known = self._known.get(key)
        if known is not None and now < known[1]:
            return known[0]
        pending = self._probing.get(key)
        if pending is not None:
            return await asyncio.shield(pending)
        fut: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._probing[key] = fut
        try:
            ok = await self._probe(session, base_url, headers)
            if len(self._known) >= _VERIFIED_MAX:
                self._known.clear()
            self._known[key] = (ok, now + (self.ok_ttl_s if ok else self.bad_ttl_s))
            fut.set_result(ok)
            return ok
        finally:
            if not fut.done():
                fut.set_result(True)
            del self._probing[key]

    async def _probe(
        self, session: aiohttp.ClientSession, base_url: str, headers: Mapping[str, str]
    ) -> bool:
        auth = {k: v for k, v in headers.items() if k.lower() in ("authorization", "x-api-key")}
        try:
            async with session.get(
                base_url + "/v1/models", headers=auth, timeout=self._timeout
            ) as resp:
                return resp.status not in (401, 403)
        except (aiohttp.ClientError, TimeoutError):
            return True

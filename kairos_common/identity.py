"""Agent identity carried inside the API key.

``id-tracker`` hands its child an API key of the form::

    kairos1.<agent_id>.<sig>.<real_key_b64>

* ``kairos1.<agent_id>.<sig>`` is the *identity token* the router issued at agent
  start; ``sig`` is a truncated HMAC-SHA256 of ``kairos1.<agent_id>`` under the
  router's signing secret (or ``-`` when the router runs without one).
* ``real_key_b64`` is the user's real API key, base64url without padding (empty
  when there is none), so any key survives and the split is unambiguous.

The router recovers the real key and forwards only that to vLLM; the identity
part never reaches a backend. Keys that do not start with ``kairos1.`` are plain
keys. Agent ids are ``[A-Za-z0-9_-]{1,64}``.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass

from kairos_common.errors import IdentityError

PREFIX = "kairos1"
UNSIGNED = "-"
_AGENT_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_SIG_BYTES = 16


@dataclass(frozen=True, slots=True)
class ParsedKey:
    """An API key split into identity and the user's real key."""

    agent_id: str | None
    token: str | None
    real_key: str | None
    signature: str | None = None


def new_agent_id() -> str:
    """A fresh random agent id (128 bits, URL-safe)."""
    return secrets.token_hex(16)


def new_secret() -> bytes:
    """A fresh signing secret."""
    return secrets.token_bytes(32)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    pad = "=" * (-len(text) % 4)
    try:
        return base64.urlsafe_b64decode(text + pad)
    except (ValueError, TypeError) as exc:
        raise IdentityError("real-key part of the API key is not base64url") from exc


def sign(agent_id: str, secret: bytes | None) -> str:
    """Signature field for ``agent_id`` (``-`` without a secret)."""
    if secret is None:
        return UNSIGNED
    mac = hmac.new(secret, f"{PREFIX}.{agent_id}".encode(), hashlib.sha256).digest()
    return _b64(mac[:_SIG_BYTES])


def end_key(agent_id: str, secret: bytes | None) -> str:
    """The key that ends ``agent_id``: handed once, at start, to whoever started it.

    The lifecycle credential is shared by every id-tracker of a host and a
    same-user agent can read its file; the end key stays in the memory of the
    id-tracker that started the agent, so one agent cannot end another. Derived
    (HMAC), not stored: it survives a router restart with the signing secret.
    Empty without a secret (unsigned identities: any lifecycle caller may end).
    """
    if secret is None:
        return ""
    mac = hmac.new(secret, f"{PREFIX}.end.{agent_id}".encode(), hashlib.sha256).digest()
    return _b64(mac)


def end_key_matches(agent_id: str, given: str | None, secret: bytes | None) -> bool:
    """Constant-time check of an end key (always true without a secret)."""
    if secret is None:
        return True
    if not given or not given.isascii():
        return False
    return hmac.compare_digest(given.encode("ascii"), end_key(agent_id, secret).encode("ascii"))


def issue_token(agent_id: str, secret: bytes | None) -> str:
    """The identity token the router returns from agent start."""
    if not _AGENT_ID.match(agent_id):
        raise IdentityError("agent id must match [A-Za-z0-9_-]{1,64}")
    return f"{PREFIX}.{agent_id}.{sign(agent_id, secret)}"


def compose_key(token: str, real_key: str | None) -> str:
    """The API key id-tracker gives its child: token plus the user's real key."""
    parse_token(token)
    return f"{token}.{_b64((real_key or '').encode())}"


def parse_token(token: str) -> tuple[str, str]:
    """Split an identity token into ``(agent_id, signature)`` (no verification)."""
    parts = token.split(".")
    if len(parts) != 3 or parts[0] != PREFIX or not _AGENT_ID.match(parts[1]) or not parts[2]:
        raise IdentityError("malformed Kairos identity token")
    return parts[1], parts[2]


def parse_key(key: str | None) -> ParsedKey:
    """Split an API key; plain keys come back with ``agent_id=None``."""
    if not key:
        return ParsedKey(agent_id=None, token=None, real_key=None)
    if not key.startswith(PREFIX + "."):
        return ParsedKey(agent_id=None, token=None, real_key=key)
    parts = key.split(".")
    if len(parts) == 3:
        agent_id, sig = parse_token(key)
        return ParsedKey(agent_id=agent_id, token=key, real_key=None, signature=sig)
    if len(parts) != 4:
        raise IdentityError("malformed Kairos API key")
    token = ".".join(parts[:3])
    agent_id, sig = parse_token(token)
    try:
        real = _unb64(parts[3]).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise IdentityError("real-key part of the API key is not UTF-8") from exc
    return ParsedKey(agent_id=agent_id, token=token, real_key=real or None, signature=sig)


def verify(parsed: ParsedKey, secret: bytes | None) -> None:
    """Raise :class:`IdentityError` unless the identity is validly signed.

    Without a secret every well-formed identity is accepted.
    """
    if parsed.agent_id is None or secret is None:
        return
    expected = sign(parsed.agent_id, secret)
    if parsed.signature is None or not hmac.compare_digest(expected, parsed.signature):
        raise IdentityError("agent identity signature does not match (forged or altered key)")


def real_key_of(key: str | None) -> str | None:
    """The user's real key inside ``key`` (used by nested id-trackers)."""
    return parse_key(key).real_key

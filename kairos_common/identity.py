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

**Cells.** A router that serves one cell of a larger fleet (``cell = "NAME"``)
mints agent ids ``<cell>_<32 hex>`` (:func:`new_agent_id`); a router without a
cell mints the bare 32 hex digits, as before. The key format is unchanged (the
cell lives inside the agent id, so older clients and routers parse it as an
ordinary id), and since the signature covers ``kairos1.<agent_id>``, it covers
the cell: a client that edits the cell in its key breaks the signature, so it
cannot move itself to another cell. A front balancer reads the cell from the
key's second dot-separated field, up to the ``_`` (:func:`cell_of`;
deploy/haproxy/cells.cfg).
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
CELL_SEPARATOR = "_"
MAX_CELL_CHARS = 31
"""31 + ``_`` + 32 hex digits = 64, the longest agent id."""
_CELL = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,29}[a-z0-9])?$")
_CELL_AGENT_ID = re.compile(r"^([a-z0-9](?:[a-z0-9-]{0,29}[a-z0-9])?)_[0-9a-f]{32}$")


@dataclass(frozen=True, slots=True)
class ParsedKey:
    """An API key split into identity and the user's real key."""

    agent_id: str | None
    token: str | None
    real_key: str | None
    signature: str | None = None


def check_cell(name: str) -> str:
    """``name`` if it can name a cell: lower-case letters, digits and inner hyphens,
    at most 31 characters (a DNS label, so it is also a Kubernetes name and an
    HAProxy map key); raises :class:`IdentityError` otherwise."""
    if not _CELL.match(name):
        raise IdentityError(
            f"cell name {name!r}: expected 1-{MAX_CELL_CHARS} lower-case letters, digits "
            "and inner hyphens (e.g. a, cell-2)"
        )
    return name


def new_agent_id(cell: str | None = None) -> str:
    """A fresh random agent id (128 bits, URL-safe), ``<cell>_<hex>`` in a cell."""
    random_part = secrets.token_hex(16)
    return f"{check_cell(cell)}{CELL_SEPARATOR}{random_part}" if cell else random_part


def cell_of(agent_id: str | None) -> str | None:
    """The cell an agent id was minted in (None: no cell, or not an id a router minted)."""
    if not agent_id:
        return None
    found = _CELL_AGENT_ID.match(agent_id)
    return found.group(1) if found else None


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

"""The child's environment: the parent's, pointed at the router, keys carrying the identity.

Which variables and why (sources in docs/idtracker.md):

* base URLs — ``OPENAI_BASE_URL`` (openai SDK ≥ 1, LiteLLM), ``OPENAI_API_BASE``
  (openai SDK < 1, LiteLLM, LangChain), ``HOSTED_VLLM_API_BASE`` (LiteLLM's
  ``hosted_vllm/`` provider, which Harbor's agents use) all get ``<router>/v1``;
  ``ANTHROPIC_BASE_URL`` gets the bare router URL (the Anthropic SDK and Claude
  Code append ``/v1/messages`` themselves).
* keys — ``OPENAI_API_KEY``, ``HOSTED_VLLM_API_KEY``, ``ANTHROPIC_API_KEY`` are
  always set, except that ``ANTHROPIC_API_KEY`` is not added next to an inherited
  ``ANTHROPIC_AUTH_TOKEN`` (Claude Code warns when both are set);
  ``ANTHROPIC_AUTH_TOKEN`` is rewritten only when the parent had it. Each becomes
  ``compose_key(token, real)`` where ``real`` is the user's key *from that same
  variable* (unwrapped with ``real_key_of`` if a parent id-tracker already
  composed it, so keys never nest); an unset variable borrows the first real key
  found, so the backend sees the user's key whichever variable the client reads.
* ``KAIROS_AGENT_ID`` / ``KAIROS_ROUTER_URL`` — this agent's identity and router,
  read by a nested id-tracker to register with ``parent_id``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import PurePath

from idtracker.errors import ConfigurationError
from kairos_common.errors import IdentityError
from kairos_common.identity import compose_key, real_key_of

AGENT_ID_ENV = "KAIROS_AGENT_ID"
ROUTER_URL_ENV = "KAIROS_ROUTER_URL"
CONTROL_TOKEN_FILE_ENV = "KAIROS_CONTROL_TOKEN_FILE"  # noqa: S105 (a variable name)

OPENAI_STYLE_BASE_URLS = ("OPENAI_BASE_URL", "OPENAI_API_BASE", "HOSTED_VLLM_API_BASE")
ROUTER_ROOT_BASE_URLS = ("ANTHROPIC_BASE_URL",)
ALWAYS_SET_KEYS = ("OPENAI_API_KEY", "HOSTED_VLLM_API_KEY", "ANTHROPIC_API_KEY")
REWRITE_IF_SET_KEYS = ("ANTHROPIC_AUTH_TOKEN",)
KEY_VARS = ALWAYS_SET_KEYS + REWRITE_IF_SET_KEYS

_AGENT_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_INTERPRETERS = re.compile(r"^(python[0-9.]*|pypy[0-9.]*|node|bash|sh|zsh|uv|uvx|npx|ruby|perl)$")


def real_keys(parent: Mapping[str, str]) -> dict[str, str | None]:
    """The user's real key per key variable (None where unset or empty).

    Raises :class:`ConfigurationError` for a value that looks like a Kairos key
    but is malformed — forwarding it would only fail later, at the router.
    """
    out: dict[str, str | None] = {}
    for var in KEY_VARS:
        value = parent.get(var)
        if value is None:
            continue
        try:
            out[var] = real_key_of(value)
        except IdentityError as exc:
            raise ConfigurationError(f"${var} is a malformed Kairos identity key: {exc}") from None
    return out


def parent_agent_id(parent: Mapping[str, str]) -> str | None:
    """The enclosing id-tracker's agent id, if this one is nested (and it is valid)."""
    value = parent.get(AGENT_ID_ENV, "").strip()
    return value if _AGENT_ID.match(value) else None


def default_agent_name(cmd: list[str]) -> str:
    """A readable name: the program, plus the script for interpreters (``python x.py`` → x.py)."""
    name = PurePath(cmd[0]).name or cmd[0]
    if _INTERPRETERS.match(name):
        args = iter(cmd[1:])
        for arg in args:
            if arg in ("-m", "-c"):
                module = next(args, "") if arg == "-m" else ""
                name = f"{name} {arg} {module}".rstrip()
                break
            if not arg.startswith("-"):
                name = f"{name} {PurePath(arg).name or arg}"
                break
    return name[:128]


def _always_set(var: str, parent: Mapping[str, str]) -> bool:
    """Set ``var`` even if the parent lacks it? (Not ANTHROPIC_API_KEY next to an auth token.)"""
    if var == "ANTHROPIC_API_KEY":
        return "ANTHROPIC_AUTH_TOKEN" not in parent
    return var in ALWAYS_SET_KEYS


def child_env(
    parent: Mapping[str, str],
    *,
    router_url: str,
    agent_id: str,
    token: str,
    keys: Mapping[str, str | None],
    control_token_file: str | None = None,
) -> dict[str, str]:
    """``parent`` plus the router base URLs, identity-carrying keys and Kairos variables."""
    env = dict(parent)
    for var in OPENAI_STYLE_BASE_URLS:
        env[var] = f"{router_url}/v1"
    for var in ROUTER_ROOT_BASE_URLS:
        env[var] = router_url
    fallback = next((keys[v] for v in KEY_VARS if keys.get(v)), None)
    for var in KEY_VARS:
        if var in parent or _always_set(var, parent):
            env[var] = compose_key(token, keys.get(var) or fallback)
    env[AGENT_ID_ENV] = agent_id
    env[ROUTER_URL_ENV] = router_url
    if control_token_file is not None:
        env[CONTROL_TOKEN_FILE_ENV] = control_token_file
    return env

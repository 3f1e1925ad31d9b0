"""The child's environment: the parent's, pointed at the router, keys carrying the identity.

Which variables and why (sources in docs/idtracker.md):

* base URLs — ``OPENAI_BASE_URL`` (openai SDK ≥ 1, LiteLLM), ``OPENAI_API_BASE``
  (openai SDK < 1, LiteLLM, LangChain), ``HOSTED_VLLM_API_BASE`` (LiteLLM's
  ``hosted_vllm/`` provider, which Harbor's agents use) all get ``<router>/v1``;
  ``ANTHROPIC_BASE_URL`` is left alone unless it already names the router (the
  Anthropic SDK and Claude Code append ``/v1/messages`` themselves).
* keys — ``OPENAI_API_KEY``, ``HOSTED_VLLM_API_KEY`` (and, when Anthropic
  points here, ``ANTHROPIC_API_KEY``) are always set, except that
  ``ANTHROPIC_API_KEY`` is not added next to an inherited ``ANTHROPIC_AUTH_TOKEN``
  (Claude Code warns when both are set);
  ``ANTHROPIC_AUTH_TOKEN`` is rewritten only when the parent had it. Each becomes
  ``compose_key(token, real)`` where ``real`` is the user's key *from that same
  variable* (unwrapped with ``real_key_of`` if a parent id-tracker already
  composed it, so keys never nest). Only providers that point at this router
  get a key: the OpenAI-compatible ones (which id-tracker redirects; their two
  key variables name the same endpoint, so an unset one takes the other's key)
  and Anthropic only when ``ANTHROPIC_BASE_URL`` already points here. An
  Anthropic key is never put in an OpenAI variable or the reverse, so a user's
  cloud key cannot reach the vLLM backends.
* ``KAIROS_AGENT_ID`` / ``KAIROS_ROUTER_URL`` — this agent's identity and router,
  read by a nested id-tracker to register with ``parent_id``.
* control credentials — never: ``KAIROS_CONTROL_TOKEN`` and
  ``KAIROS_CONTROL_TOKEN_FILE`` are removed from the child's environment (SPEC §9).
  A nested id-tracker finds the lifecycle credential the way the outer one did
  (its config file or the router's published credentials,
  :mod:`kairos_common.credentials`).
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
CONTROL_TOKEN_ENV = "KAIROS_CONTROL_TOKEN"  # noqa: S105 (a variable name)
CONTROL_TOKEN_FILE_ENV = "KAIROS_CONTROL_TOKEN_FILE"  # noqa: S105 (a variable name)
CREDENTIAL_VARS = (CONTROL_TOKEN_ENV, CONTROL_TOKEN_FILE_ENV)

OPENAI_STYLE_BASE_URLS = ("OPENAI_BASE_URL", "OPENAI_API_BASE", "HOSTED_VLLM_API_BASE")
ROUTER_ROOT_BASE_URLS = ("ANTHROPIC_BASE_URL",)
ALWAYS_SET_KEYS = ("OPENAI_API_KEY", "HOSTED_VLLM_API_KEY", "ANTHROPIC_API_KEY")
REWRITE_IF_SET_KEYS = ("ANTHROPIC_AUTH_TOKEN",)
KEY_VARS = ALWAYS_SET_KEYS + REWRITE_IF_SET_KEYS
OPENAI_KEYS = ("OPENAI_API_KEY", "HOSTED_VLLM_API_KEY")
ANTHROPIC_KEYS = ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN")

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


def _points_at(value: str | None, router_url: str) -> bool:
    return value is not None and value.strip().rstrip("/").removesuffix("/v1") == router_url


def anthropic_points_here(parent: Mapping[str, str], router_url: str) -> bool:
    """Whether the parent already sends Anthropic traffic to this router.

    Otherwise ``ANTHROPIC_*`` stays as it was: an Anthropic key is a cloud key
    unless the user pointed Anthropic clients at the router themselves (or an
    enclosing id-tracker did).
    """
    return any(_points_at(parent.get(v), router_url) for v in ROUTER_ROOT_BASE_URLS)


def child_env(
    parent: Mapping[str, str],
    *,
    router_url: str,
    agent_id: str,
    token: str,
    keys: Mapping[str, str | None],
) -> dict[str, str]:
    """``parent`` plus the router base URLs, identity-carrying keys and Kairos variables.

    The OpenAI-compatible variables always point at the router (what id-tracker is
    for); their two key variables name that same endpoint, so an unset one takes
    the other's key. Anthropic's are rewritten only when Anthropic already points
    here, and never take an OpenAI key (nor the reverse). No control credential
    is passed on.
    """
    env = {k: v for k, v in parent.items() if k not in CREDENTIAL_VARS}
    for var in OPENAI_STYLE_BASE_URLS:
        env[var] = f"{router_url}/v1"
    families = [OPENAI_KEYS]
    if anthropic_points_here(parent, router_url):
        families.append(ANTHROPIC_KEYS)
        for var in ROUTER_ROOT_BASE_URLS:
            env[var] = router_url
    for family in families:
        shared = next((keys[v] for v in family if keys.get(v)), None)
        for var in family:
            if var in parent or _always_set(var, parent):
                env[var] = compose_key(token, keys.get(var) or shared)
    env[AGENT_ID_ENV] = agent_id
    env[ROUTER_URL_ENV] = router_url
    return env

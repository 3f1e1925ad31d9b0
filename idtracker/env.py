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
* control credentials — never, on any path (tagged, or untagged under
  ``--fail-open``): every variable of
  :data:`kairos_common.credentials.CREDENTIAL_ENV_VARS` (id-tracker's
  ``KAIROS_CONTROL_TOKEN`` and ``KAIROS_CONTROL_TOKEN_FILE``, the router's and the
  daemons' token, secret and credential-file variables) is removed, and so is any
  other variable whose value holds the lifecycle credential id-tracker uses
  (:func:`without_credentials`; docs/design.md §9). A nested id-tracker finds the lifecycle
  credential the way the outer one did (its config file or the router's
  published credentials, :mod:`kairos_common.credentials`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import PurePath

import structlog

from idtracker.errors import ConfigurationError
from kairos_common.credentials import CREDENTIAL_ENV_VARS
from kairos_common.errors import IdentityError
from kairos_common.identity import cell_of, compose_key, real_key_of
from kairos_common.wire import CELL_HEADER

log = structlog.get_logger()

AGENT_ID_ENV = "KAIROS_AGENT_ID"
ROUTER_URL_ENV = "KAIROS_ROUTER_URL"
CONTROL_TOKEN_ENV = "KAIROS_CONTROL_TOKEN"  # noqa: S105 (a variable name)
CONTROL_TOKEN_FILE_ENV = "KAIROS_CONTROL_TOKEN_FILE"  # noqa: S105 (a variable name)
CREDENTIAL_VARS = CREDENTIAL_ENV_VARS
MIN_SCRUB_CHARS = 8
"""A credential this long or longer is also looked for inside other variables'
values (a shorter one only as a whole value: it would match by accident)."""

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


def start_headers(parent_id: str | None) -> dict[str, str]:
    """Headers of a nested agent's start: ``X-Kairos-Cell`` with its parent's cell,
    so that a front balancer starts a sub-agent in its parent's cell (docs/cells.md)."""
    cell = cell_of(parent_id)
    return {CELL_HEADER: cell} if cell else {}


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


def without_credentials(
    parent: Mapping[str, str], credentials: Iterable[str | None] = ()
) -> dict[str, str]:
    """``parent`` less every control credential: the variables Kairos reads them
    from (:data:`CREDENTIAL_VARS`), and any variable whose value holds one of
    ``credentials`` (the lifecycle credential this id-tracker resolved, however
    the user put it there: ``MY_TOKEN=$(cat lifecycle.token)``). Each variable
    dropped by value is logged by name, never with its value.

    The one place the agent's environment loses credentials: the tagged child
    (:func:`child_env`) and the untagged one of ``--fail-open`` are both built
    from what this returns.
    """
    secrets = [c.strip() for c in credentials if c and c.strip()]
    out: dict[str, str] = {}
    for name, value in parent.items():
        if name in CREDENTIAL_VARS:
            continue
        if any(_holds(value, secret) for secret in secrets):
            log.warning("variable holds a control credential: not passed to the agent", name=name)
            continue
        out[name] = value
    return out


def _holds(value: str, secret: str) -> bool:
    value = value.strip()
    return value == secret or (len(secret) >= MIN_SCRUB_CHARS and secret in value)


def child_env(
    parent: Mapping[str, str],
    *,
    router_url: str,
    agent_id: str,
    token: str,
    keys: Mapping[str, str | None],
    router_urls: Sequence[str] = (),
    credentials: Iterable[str | None] = (),
) -> dict[str, str]:
    """``parent`` plus the router base URLs, identity-carrying keys and Kairos variables.

    The OpenAI-compatible variables always point at the router (what id-tracker is
    for); their two key variables name that same endpoint, so an unset one takes
    the other's key. Anthropic's are rewritten only when Anthropic already points
    here, and never take an OpenAI key (nor the reverse). No control credential
    is passed on (:func:`without_credentials`, with ``credentials``).

    ``router_url`` is the one base URL the agent gets (an SDK takes one: the front
    balancer, or the first router URL); ``router_urls``, all of id-tracker's, go
    to a nested id-tracker in ``KAIROS_ROUTER_URL`` so that it follows the leader
    too.
    """
    env = without_credentials(parent, credentials)
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
    env[ROUTER_URL_ENV] = ",".join(router_urls) if router_urls else router_url
    return env

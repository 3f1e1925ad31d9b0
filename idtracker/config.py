"""id-tracker configuration: flags > ``KAIROS_*`` environment > TOML file > defaults.

The environment prefix is the bare ``KAIROS`` on purpose: ``KAIROS_ROUTER_URL`` is
also what id-tracker *exports* to its child, so a nested id-tracker (a sub-agent)
finds the same router without any set-up.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from idtracker.errors import ConfigurationError
from kairos_common.cli import check_log_level
from kairos_common.config import load_config
from kairos_common.credentials import LIFECYCLE_FILE, discover_credential, read_credential
from kairos_common.errors import ConfigError
from kairos_common.wire_fields import MAX_SUMMARY_WAIT_S

ENV_PREFIX = "KAIROS"
CONFIG_ENV = "KAIROS_IDTRACKER_CONFIG"
DEFAULT_ROUTER_URL = "http://127.0.0.1:24157"  # the router's default listen address


@dataclass(frozen=True)
class IdTrackerConfig:
    """Everything id-tracker reads besides CMD; see the table in docs/idtracker.md."""

    router_url: tuple[str, ...] = (DEFAULT_ROUTER_URL,)
    """One router URL, or several (a router pair, or a front balancer first and the
    routers behind it): a list in TOML, comma-separated in ``KAIROS_ROUTER_URL``,
    ``--router-url`` repeated. The agent gets the first; the lifecycle calls
    follow the leader over all of them (docs/idtracker.md, "Several routers")."""
    control_token: str | None = None
    control_token_file: Path | None = None
    fail_open: bool = False
    start_timeout_s: float = 5.0
    end_timeout_s: float = 15.0
    request_timeout_s: float = 2.0
    kill_grace_s: float = 10.0
    log_level: str = "warning"
    summary: bool = False
    summary_wait_s: float = 15.0

    def __post_init__(self) -> None:
        for name in ("start_timeout_s", "end_timeout_s", "request_timeout_s", "kill_grace_s"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must not be negative")
        if not 0 <= self.summary_wait_s <= MAX_SUMMARY_WAIT_S:
            raise ConfigError(f"summary_wait_s must be within [0, {MAX_SUMMARY_WAIT_S:g}]")
        if self.request_timeout_s == 0:
            raise ConfigError("request_timeout_s must be positive")
        check_log_level(self.log_level, "log_level")
        if not self.router_url:
            raise ConfigError("router_url: at least one router URL is needed")


def normalise_router_urls(urls: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """Every URL normalised (:func:`normalise_router_url`), duplicates dropped, order kept."""
    out: list[str] = []
    for url in urls:
        normal = normalise_router_url(url)
        if normal not in out:
            out.append(normal)
    if not out:
        raise ConfigurationError("no router URL given")
    return tuple(out)


def normalise_router_url(url: str) -> str:
    """``http(s)://host[:port][/prefix]`` without a trailing ``/`` or ``/v1``.

    Accepting the OpenAI-style ``…/v1`` form too means users can paste the same
    URL they would give ``OPENAI_BASE_URL``.
    """
    url = url.strip().rstrip("/")
    if url.endswith("/v1"):
        url = url[: -len("/v1")]
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigurationError(f"router URL {url!r}: expected http(s)://host:port")
    try:
        _ = parts.port
    except ValueError as exc:
        raise ConfigurationError(f"router URL {url!r}: {exc}") from None
    if parts.query or parts.fragment:
        raise ConfigurationError(f"router URL {url!r}: must not have a query or fragment")
    return url


def default_config_path(env: Mapping[str, str]) -> Path | None:
    """``$KAIROS_IDTRACKER_CONFIG``, else the first existing standard location."""
    explicit = env.get(CONFIG_ENV)
    if explicit:
        return Path(explicit)
    xdg = env.get("XDG_CONFIG_HOME") or str(Path(env.get("HOME", "/nonexistent")) / ".config")
    for candidate in (
        Path(xdg) / "kairos" / "id-tracker.toml",
        Path("/etc/kairos/id-tracker.toml"),
    ):
        if candidate.is_file():
            return candidate
    return None


def load(
    *,
    path: Path | None,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> IdTrackerConfig:
    """Build the config, translating shared config errors into id-tracker's."""
    env = os.environ if env is None else env
    try:
        cfg = load_config(
            IdTrackerConfig,
            path=path if path is not None else default_config_path(env),
            env_prefix=ENV_PREFIX,
            env=env,
            overrides=overrides,
        )
    except ConfigError as exc:
        raise ConfigurationError(str(exc)) from None
    return cfg


def resolve_control_token(cfg: IdTrackerConfig, env: Mapping[str, str] | None = None) -> str | None:
    """The lifecycle credential: the literal value, else the file, else the one a
    local router published (:mod:`kairos_common.credentials`; the first of the
    router URLs that has one); None if none."""
    if cfg.control_token:
        return cfg.control_token.strip() or None
    if cfg.control_token_file is None:
        found = (discover_credential(url, LIFECYCLE_FILE, env) for url in cfg.router_url)
        return next((token for token in found if token), None)
    try:
        return read_credential(cfg.control_token_file)
    except ConfigError as exc:
        raise ConfigurationError(str(exc)) from None

"""Router configuration schema (TOML ``[sections]`` + env ``KAIROS_ROUTER_*`` + flags).

Loaded with :func:`kairos_common.config.load_config`; every constant of the
paper's Algorithms 1–3 the router uses is a field here with the paper's default.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from kairos_common.errors import ConfigError

ENV_PREFIX = "KAIROS_ROUTER"
MIB = 1024 * 1024


@dataclass(frozen=True)
class PlacementSettings:
    """Algorithm 2/3 constants."""

    policy: str = "consolidating"
    theta_cons: float = 0.5
    reassign: bool = True
    reassign_interval_requests: int = 8
    rho: float = 2.0


@dataclass(frozen=True)
class AdmissionSettings:
    """Hold queue bounds and the local fallback's thresholds (Eq. 13)."""

    enabled: bool = True
    beta: float = 0.95
    gamma: float = 0.90
    new_agent_context_tokens: int = 3000
    admit_within_beta: bool = True
    max_pending_agents: int = 1024
    max_wait_s: float = 600.0
    retry_after_s: float = 5.0
    capacity_tokens: int | None = None
    stale_after_s: float | None = None


@dataclass(frozen=True)
class TimeoutSettings:
    connect_s: float = 5.0
    first_byte_s: float = 900.0
    idle_stream_s: float = 300.0
    health_interval_s: float = 5.0
    health_timeout_s: float = 2.0
    unhealthy_after_failures: int = 2
    metrics_interval_s: float = 30.0


@dataclass(frozen=True)
class RouterConfig:
    """Everything ``kairos-router run`` needs; see ``docs/router.md``."""

    backends: tuple[str, ...] = ()
    host: str = "127.0.0.1"
    port: int = 24157
    state_dir: Path | None = None
    signing: bool = True
    signing_secret_file: Path | None = None
    control_token: str | None = None
    control_token_file: Path | None = None
    records: Path | None = None
    anonymous: str = "one-turn"
    identity_header: str = "X-Kairos-Agent"
    idle_expiry_s: float = 1800.0
    slo_tok_s: float = 20.0
    max_body_bytes: int = 256 * MIB
    max_attempts: int = 3
    log_level: str = "info"
    log_json: bool | None = None
    placement: PlacementSettings = field(default_factory=PlacementSettings)
    admission: AdmissionSettings = field(default_factory=AdmissionSettings)
    timeouts: TimeoutSettings = field(default_factory=TimeoutSettings)

    def __post_init__(self) -> None:
        if self.anonymous not in ("one-turn", "api-key"):
            raise ConfigError("anonymous must be 'one-turn' or 'api-key'")
        if self.max_attempts < 1:
            raise ConfigError("max_attempts must be >= 1")
        if self.max_body_bytes < 1024:
            raise ConfigError("max_body_bytes must be at least 1024")
        if self.idle_expiry_s <= 0:
            raise ConfigError("idle_expiry_s must be positive")

    def resolved_state_dir(self) -> Path:
        """``state_dir``, else ``$XDG_STATE_HOME/kairos/router`` (``~/.local/state``)."""
        if self.state_dir is not None:
            return self.state_dir.expanduser()
        base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
        return Path(base) / "kairos" / "router"


def parse_backend(spec: str, index: int) -> tuple[str, str]:
    """``URL`` or ``NAME=URL`` → ``(name, base_url)``; unnamed backends are ``i<index>``."""
    name, sep, url = spec.partition("=")
    if not sep:
        name, url = f"i{index}", spec
    url = url.strip().rstrip("/")
    if url.endswith("/v1"):
        url = url[: -len("/v1")]
    if not url.startswith(("http://", "https://")):
        raise ConfigError(f"backend {spec!r}: expected http(s)://host:port")
    if not name or "/" in name:
        raise ConfigError(f"backend {spec!r}: bad instance name")
    return name.strip(), url

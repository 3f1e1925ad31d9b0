"""Router configuration schema (TOML ``[sections]`` + env ``KAIROS_ROUTER_*`` + flags).

Loaded with :func:`kairos_common.config.load_config`; every constant of the
paper's Algorithms 1–3 the router uses is a field here with the paper's default.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from controllers.confident_placement import ConfidentReassignmentConfig
from controllers.energy_attribution import WorkWeights
from controllers.registry import PLACEMENT_NAMES
from kairos_common.cli import check_http_url, check_log_level, check_port, check_slo
from kairos_common.errors import ConfigError
from router.trace_recorder import TraceSettings

ENV_PREFIX = "KAIROS_ROUTER"
MIB = 1024 * 1024
_CONFIDENT = ConfidentReassignmentConfig()
_WEIGHTS = WorkWeights()


@dataclass(frozen=True)
class PlacementSettings:
    """Algorithm 2/3 constants, and the ``confident`` policy's reassignment knobs.

    ``hot``, ``cool``, ``recompute_factor`` and ``confirm`` only matter with
    ``policy = "confident"`` (``controllers.confident_placement``); they default to
    the simulator's values so a policy tuned there behaves the same here. Its
    reassignment interval is ``reassign_interval_requests``.
    """

    policy: str = "consolidating"
    theta_cons: float = 0.5
    reassign: bool = True
    reassign_interval_requests: int = 8
    rho: float = 2.0
    relieve_overflow: bool = True
    balancing_moves_only: bool = False
    hot: float = _CONFIDENT.hot
    cool: float = _CONFIDENT.cool
    recompute_factor: float = _CONFIDENT.recompute_factor
    confirm: int = _CONFIDENT.confirm

    def __post_init__(self) -> None:
        if self.policy not in PLACEMENT_NAMES:
            raise ConfigError(
                f"policy: unknown placement policy {self.policy!r}; "
                f"choose one of {', '.join(PLACEMENT_NAMES)}"
            )
        if not 0.0 < self.theta_cons <= 1.0:
            raise ConfigError(f"theta_cons must be in (0, 1], got {self.theta_cons}")
        if self.reassign_interval_requests < 1:
            raise ConfigError(
                f"reassign_interval_requests must be >= 1, got {self.reassign_interval_requests}"
            )
        if self.rho <= 0.0:
            raise ConfigError(f"rho must be positive, got {self.rho}")
        if not 0.0 < self.hot <= 1.0:
            raise ConfigError(f"hot must be in (0, 1] (a fraction of U_max), got {self.hot}")
        if not 0.0 < self.cool <= self.hot:
            raise ConfigError(f"cool must be in (0, hot={self.hot}], got {self.cool}")
        if self.recompute_factor < 0.0:
            raise ConfigError(f"recompute_factor must be >= 0, got {self.recompute_factor}")
        if self.confirm < 1:
            raise ConfigError(f"confirm must be >= 1, got {self.confirm}")

    def confident_reassignment(self) -> ConfidentReassignmentConfig:
        """The ``confident`` policy's reassignment constants from these settings."""
        return ConfidentReassignmentConfig(
            interval_requests=self.reassign_interval_requests,
            hot=self.hot,
            cool=self.cool,
            recompute_factor=self.recompute_factor,
            confirm=self.confirm,
        )


@dataclass(frozen=True)
class AdmissionSettings:
    """Hold queue bounds and the local fallback's thresholds (Eq. 13)."""

    enabled: bool = True
    beta: float = 0.98
    gamma: float = 0.95
    """Eq. 13's thresholds where no fresh daemon decision carries its own (no daemon,
    a stale or an old one): the default ``kairos``'s (docs/control-law.md, point
    18). A fresh decision's ``beta`` / ``gamma`` (a ``kairos-paper`` daemon sends the
    paper's 0.95 and 0.90) override them on its instance."""
    new_agent_context_tokens: int = 3000
    admit_within_beta: bool = True
    make_room: bool = True
    """Move idle agents off an instance so that a held agent fits there when the
    fleet's free room is split between instances (docs/control-law.md, point 15)."""
    hold_overflow: bool = True
    """Hold an admitted agent's request that would overflow its instance's KV cache
    beside the running requests, when no other instance has room for it, instead of
    letting vLLM preempt (docs/control-law.md, point 16)."""
    max_pending_agents: int = 1024
    max_wait_s: float = 600.0
    retry_after_s: float = 5.0
    requeue_grace_s: float = 60.0
    """An agent whose last held request gave up (timeout, client gone) keeps its
    place in line if it comes back within this many seconds."""
    capacity_tokens: int | None = None
    stale_after_s: float | None = None
    max_model_len_tokens: int | None = None
    """Bound on a newcomer's size estimate (its first body's bytes over the bytes
    a token learned from earlier agents, router/token_ratio.py); unset: the
    largest known KV capacity."""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.requeue_grace_s) and self.requeue_grace_s >= 0.0):
            raise ConfigError(
                f"admission.requeue_grace_s must be finite and >= 0, got {self.requeue_grace_s}"
            )


@dataclass(frozen=True)
class FleetBudgetSettings:
    """``[fleet_budget]``: a cap on the summed power of every instance's GPUs.

    The router coordinates it (``router/fleet_budget.py``); off while ``cap_w``
    is unset. The SLO is the router's ``slo_tok_s``; see docs/kairosd.md.
    """

    cap_w: float | None = None
    margin: float = 0.1
    """Lowering an instance is SLO-safe while its predicted slack stays ≥ this."""
    quantile: float = 0.95
    """Fraction of rounds whose measured fleet power should stay under the cap."""
    correction_gain: float = 1.0
    """Headroom step per round, in % of the cap."""

    def __post_init__(self) -> None:
        if self.cap_w is not None and self.cap_w <= 0:
            raise ConfigError("fleet_budget.cap_w must be positive (unset = no budget)")
        if not 0.0 < self.quantile < 1.0:
            raise ConfigError("fleet_budget.quantile must be in (0, 1)")
        if self.correction_gain < 0:
            raise ConfigError("fleet_budget.correction_gain must be >= 0")


@dataclass(frozen=True)
class EnergyWeightSettings:
    """``[energy_weights]``: estimated GPU seconds per unit of work, by which each
    instance's measured energy is split among its agents (docs/energy.md,
    "Weights for your model"). The defaults are an H100 serving a mid-size MoE
    model (Qwen3-30B-A3B in FP8); only their ratios matter, and those depend on
    the model: a dense model shares far more of each decode step and pays more
    per prefill token."""

    prefill_s_per_token: float = _WEIGHTS.prefill_s_per_token
    """Prefill GEMMs per uncached prompt token (2 × active parameters / FLOP/s)."""
    attn_s_per_pair: float = _WEIGHTS.attn_s_per_pair
    """Prefill attention per (query, key) pair (4 × layers × query heads × head dim / FLOP/s)."""
    step_shared_s: float = _WEIGHTS.step_shared_s
    """Per decode step, shared by the batch: host overhead, fixed kernels, and the
    weights every token reads (bytes / achieved bandwidth)."""
    token_s: float = _WEIGHTS.token_s
    """Per decoded token, not shared: the experts it routes to (0 for a dense model)."""
    kv_s_per_token: float = _WEIGHTS.kv_s_per_token
    """Per context token read in one decode step (KV bytes per token / bandwidth)."""

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if not (math.isfinite(value) and 0.0 <= value <= 10.0):
                raise ConfigError(f"energy_weights.{f.name} must be in 0..10 s, got {value!r}")
        if self.prefill_s_per_token + self.attn_s_per_pair == 0.0 or (
            self.step_shared_s + self.token_s == 0.0
        ):
            raise ConfigError("energy_weights: prefill and decode each need a positive weight")

    def work_weights(self) -> WorkWeights:
        return WorkWeights(**{f.name: getattr(self, f.name) for f in dataclasses.fields(self)})


@dataclass(frozen=True)
class TimeoutSettings:
    connect_s: float = 5.0
    first_byte_s: float = 900.0
    idle_stream_s: float = 300.0
    health_interval_s: float = 5.0
    health_timeout_s: float = 2.0
    unhealthy_after_failures: int = 2
    metrics_interval_s: float = 30.0
    header_read_s: float = 30.0
    """A connection must send its request headers within this (also the keep-alive idle)."""
    body_read_s: float = 60.0
    """A request body must arrive within this (a trickling client gets 408)."""
    breaker_failures: int = 3
    """Consecutive timeouts/5xx that open an instance's circuit breaker."""
    breaker_open_s: float = 30.0
    """How long an open breaker keeps new requests away before one trial request."""


EVENT_LOOPS = ("auto", "uvloop", "asyncio")


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
    credentials_dir: Path | None = None
    """Admin/lifecycle/daemon credential files (default ``<state_dir>/credentials``)."""
    records: Path | None = None
    run: str = ""
    """Label written into every agent record (``run``), like ``kairosd --run``, so
    ``kairos report`` groups a deployment's router and daemon records together."""
    anonymous: str = "one-turn"
    identity_header: str = "X-Kairos-Agent"
    idle_expiry_s: float = 1800.0
    conversation_window_s: float = 300.0
    """How long a conversation of an agent that has gone quiet still counts in its
    ``C_a`` beside the others (router/conversations.py): a harness's sub-agents
    and side requests share the agent's identity, and the parent's conversation
    waits minutes for its sub-agents. 0: only conversations with a request in
    flight count beside the latest."""
    slo_tok_s: float = 20.0
    max_body_bytes: int = 32 * MIB
    max_attempts: int = 3
    max_connections: int = 10_000
    """Inbound connections beyond this are answered 503 and closed at once."""
    max_waiting_per_agent: int = 8
    """Requests one agent may have waiting for admission; more get 429."""
    log_level: str = "info"
    log_json: bool | None = None
    event_loop: str = "auto"
    """``auto`` (uvloop when installed: ``pip install 'kairos-sidecar[fast]'``),
    ``uvloop`` (required) or ``asyncio`` (the standard library's loop)."""
    fast_http: bool = True
    """Serve the inference routes on the router's own HTTP/1.1 protocol
    (``router/fast_http.py``); false: aiohttp's server takes every request."""
    placement: PlacementSettings = field(default_factory=PlacementSettings)
    admission: AdmissionSettings = field(default_factory=AdmissionSettings)
    timeouts: TimeoutSettings = field(default_factory=TimeoutSettings)
    fleet_budget: FleetBudgetSettings = field(default_factory=FleetBudgetSettings)
    energy_idle_power_w: float | None = None
    """Idle draw of one instance's GPUs (W), left unattributed by energy per agent
    (docs/energy.md); unset: learned from intervals in which an instance did nothing."""
    energy_weights: EnergyWeightSettings = field(default_factory=EnergyWeightSettings)
    trace: TraceSettings = field(default_factory=TraceSettings)
    """Recording agent traces for ``kairos whatif`` (off unless ``trace.path`` is set;
    router/trace_recorder.py)."""

    def __post_init__(self) -> None:
        if self.event_loop not in EVENT_LOOPS:
            raise ConfigError(f"event_loop must be one of {', '.join(EVENT_LOOPS)}")
        if self.anonymous not in ("one-turn", "api-key"):
            raise ConfigError("anonymous must be 'one-turn' or 'api-key'")
        if self.max_attempts < 1:
            raise ConfigError("max_attempts must be >= 1")
        if self.max_body_bytes < 1024:
            raise ConfigError("max_body_bytes must be at least 1024")
        if self.max_connections < 1 or self.max_waiting_per_agent < 1:
            raise ConfigError("max_connections and max_waiting_per_agent must be >= 1")
        if self.idle_expiry_s <= 0:
            raise ConfigError("idle_expiry_s must be positive")
        window = self.conversation_window_s
        if not (math.isfinite(window) and 0.0 <= window <= 86_400.0):
            raise ConfigError(f"conversation_window_s must be 0..86400 s, got {window}")
        check_port(self.port, "port")
        check_slo(self.slo_tok_s, "slo_tok_s")
        check_log_level(self.log_level, "log_level")
        idle = self.energy_idle_power_w
        if idle is not None and not (math.isfinite(idle) and 0 <= idle <= 1e6):
            raise ConfigError("energy_idle_power_w must be a power in W (0..1e6) or unset")

    def resolved_state_dir(self) -> Path:
        """``state_dir``, else ``$XDG_STATE_HOME/kairos/router`` (``~/.local/state``)."""
        if self.state_dir is not None:
            return self.state_dir.expanduser()
        base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
        return Path(base) / "kairos" / "router"

    def resolved_credentials_dir(self) -> Path:
        """``credentials_dir``, else ``<state dir>/credentials``."""
        if self.credentials_dir is not None:
            return self.credentials_dir.expanduser()
        return self.resolved_state_dir() / "credentials"


def parse_backend(spec: str, index: int) -> tuple[str, str]:
    """``URL`` or ``NAME=URL`` → ``(name, base_url)``; unnamed backends are ``i<index>``."""
    name, sep, url = spec.partition("=")
    if not sep:
        name, url = f"i{index}", spec
    url = url.strip().rstrip("/")
    if url.endswith("/v1"):
        url = url[: -len("/v1")]
    check_http_url(url, "backend")
    if not name or "/" in name:
        raise ConfigError(f"backend {spec!r}: bad instance name")
    return name.strip(), url

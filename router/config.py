"""Router configuration schema (TOML ``[sections]`` + env ``KAIROS_ROUTER_*`` + flags).

Loaded with :func:`kairos_common.config.load_config`. The operator states intents
(the policy its daemons run, the placement policy, τ, the power budget),
addresses, credentials, limits and the timeouts a deployment may need to change.
The constants of Algorithms 2–3, of the fleet budget, of energy attribution and
of the router's own robustness are fields marked :data:`~kairos_common.config.CODE_ONLY`:
tests and research set them in code, a file or variable that sets one is an
error. Removed keys are errors naming what replaced them (:data:`RETIRED`).
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from controllers.confident_placement import ConfidentReassignmentConfig
from controllers.energy_attribution import WorkWeights
from controllers.errors import ControllerError, UnknownPolicyError
from controllers.policy import Intents
from controllers.registry import PLACEMENT_NAMES, policy_spec, rule_for
from controllers.types import AdmissionRule
from kairos_common.cli import check_http_url, check_log_level, check_port, check_slo
from kairos_common.config import CODE_ONLY, NOTES
from kairos_common.errors import ConfigError, IdentityError
from kairos_common.identity import check_cell
from router.trace_recorder import TraceSettings

ENV_PREFIX = "KAIROS_ROUTER"
MIB = 1024 * 1024
_CONFIDENT = ConfidentReassignmentConfig()
_WEIGHTS = WorkWeights()
_NOW_LAW = "a departure measured and kept: it is the law now, with no switch"
RETIRED: dict[str, str] = {
    "placement.relieve_overflow": f"{_NOW_LAW} (docs/control-law.md point 10)",
    "placement.balancing_moves_only": f"measured and not adopted ({NOTES})",
    "admission.enabled": 'choose policy = "kairos-no-ta" (or a baseline) to admit everyone',
    "admission.new_agent_context_tokens": "a constant of the law (point 1: 3000 tokens)",
    "admission.admit_within_beta": f"{_NOW_LAW} (point 3)",
    "admission.make_room": f"{_NOW_LAW} (point 15)",
    "admission.hold_overflow": f"{_NOW_LAW} (point 16)",
}
"""Keys operators could set before the law became a list of stages, and what
replaced each (docs/notes/configuration.md); a file or variable that sets one is
an error saying so."""


def _code(default: Any) -> Any:
    """A field that is a constant of the code (``CODE_ONLY``), with its default."""
    return field(default=default, metadata=CODE_ONLY)


@dataclass(frozen=True)
class PlacementSettings:
    """The placement policy by name and Algorithm 2's θ_cons; Algorithm 3's
    constants and the ``confident`` policy's are constants of the code, with the
    simulator's values, so a policy measured there behaves the same here (``hot``,
    ``cool``, ``recompute_factor`` and ``confirm`` only matter with
    ``policy = "confident"``, whose reassignment interval is
    ``reassign_interval_requests``).
    """

    policy: str = "consolidating"
    theta_cons: float = 0.5
    """Algorithm 2's θ_cons: how full (of ``U_max``) the lowest instances get before
    the next one takes new agents."""
    reassign: bool = _code(True)
    reassign_interval_requests: int = _code(8)
    rho: float = _code(2.0)
    hot: float = _code(_CONFIDENT.hot)
    cool: float = _code(_CONFIDENT.cool)
    recompute_factor: float = _code(_CONFIDENT.recompute_factor)
    confirm: int = _code(_CONFIDENT.confirm)

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
    """Hold queue bounds, the fallback capacity and the model's length, and Eq. 13's
    thresholds as the operator states them for the router's own rule.

    The rule itself is the daemons' policy's (``RouterConfig.policy``), carried
    whole in every fresh decision; where a daemon is stale or absent the router
    applies that policy's rule with ``beta`` / ``gamma`` if set (the same intents as
    ``kairosd``'s ``[kairos] beta`` / ``gamma``; unset: the policy's own)."""

    beta: float | None = None
    gamma: float | None = None
    max_pending_agents: int = _code(1024)
    max_wait_s: float = 600.0
    retry_after_s: float = _code(5.0)
    requeue_grace_s: float = _code(60.0)
    """An agent whose last held request gave up (timeout, client gone) keeps its
    place in line if it comes back within this many seconds."""
    capacity_tokens: int | None = None
    stale_after_s: float | None = _code(None)
    """Overrides each decision's own validity (tests)."""
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
    margin: float = _code(0.1)
    """Lowering an instance is SLO-safe while its predicted slack stays ≥ this."""
    quantile: float = _code(0.95)
    """Fraction of rounds whose measured fleet power should stay under the cap."""
    correction_gain: float = _code(1.0)
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
    """How long the router waits on a backend's first byte and between streamed
    chunks (operator settings: a deployment with very long prompts may need a later
    first byte), and the constants of its connections, health checks, circuit
    breaker and slow-client limits (code)."""

    connect_s: float = _code(5.0)
    first_byte_s: float = 900.0
    idle_stream_s: float = 300.0
    health_interval_s: float = _code(5.0)
    health_timeout_s: float = _code(2.0)
    unhealthy_after_failures: int = _code(2)
    metrics_interval_s: float = _code(30.0)
    header_read_s: float = _code(30.0)
    """A connection must send its request headers within this (also the keep-alive idle)."""
    body_read_s: float = _code(60.0)
    """A request body must arrive within this (a trickling client gets 408)."""
    breaker_failures: int = _code(3)
    """Consecutive timeouts/5xx that open an instance's circuit breaker."""
    breaker_open_s: float = _code(30.0)
    """How long an open breaker keeps new requests away before one trial request."""


EVENT_LOOPS = ("auto", "uvloop", "asyncio")


@dataclass(frozen=True)
class RouterConfig:
    """Everything ``kairos-router run`` needs; see ``docs/router.md``."""

    backends: tuple[str, ...] = ()
    policy: str = "kairos"
    """The per-instance policy the daemons run (``kairosd`` ``policy``): the router
    admits by its rule on an instance whose daemon is stale or absent. A fresh
    decision carries its daemon's own rule, which the router applies there."""
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
    identity_header: str = _code("X-Kairos-Agent")
    idle_expiry_s: float = 1800.0
    conversation_window_s: float = _code(300.0)
    """How long a conversation of an agent that has gone quiet still counts in its
    ``C_a`` beside the others (router/conversations.py): a harness's sub-agents
    and side requests share the agent's identity, and the parent's conversation
    waits minutes for its sub-agents. 0: only conversations with a request in
    flight count beside the latest."""
    slo_tok_s: float = 20.0
    max_body_bytes: int = _code(32 * MIB)
    max_attempts: int = _code(3)
    max_connections: int = _code(10_000)
    """Inbound connections beyond this are answered 503 and closed at once."""
    max_waiting_per_agent: int = _code(8)
    """Requests one agent may have waiting for admission; more get 429."""
    log_level: str = "info"
    log_json: bool | None = None
    event_loop: str = _code("auto")
    """``auto`` (uvloop when installed: ``pip install 'kairos-sidecar[fast]'``),
    ``uvloop`` (required) or ``asyncio`` (the standard library's loop)."""
    fast_http: bool = _code(True)
    """Serve the inference routes on the router's own HTTP/1.1 protocol
    (``router/fast_http.py``); false: aiohttp's server takes every request."""
    placement: PlacementSettings = field(default_factory=PlacementSettings)
    admission: AdmissionSettings = field(default_factory=AdmissionSettings)
    timeouts: TimeoutSettings = field(default_factory=TimeoutSettings)
    fleet_budget: FleetBudgetSettings = field(default_factory=FleetBudgetSettings)
    energy_idle_power_w: float | None = _code(None)
    """Idle draw of one instance's GPUs (W), left unattributed by energy per agent
    (docs/energy.md); unset: learned from intervals in which an instance did nothing."""
    energy_weights: EnergyWeightSettings = field(
        default_factory=EnergyWeightSettings, metadata=CODE_ONLY
    )
    """The built-in weights are a MoE model's (Qwen3-30B-A3B); a deployment serving
    another model sets them in code (docs/energy.md, "Weights for your model")."""
    cell: str | None = None
    """The cell this router serves in a fleet split into cells (docs/cells.md): its
    agent ids carry it (``<cell>_<hex>``), a front balancer routes each agent's
    requests by it, and an identity of another cell is refused (421). Unset: no
    cell, ids as before."""
    cell_start_reserve_s: float = _code(60.0)
    """How long an agent started here counts towards the cell's room
    (``GET /health/room``) before its first request places it: the time an agent
    program may take to start up. Agents started longer ago and still silent no
    longer reserve room. A constant of the code, like the hold queue's
    ``requeue_grace_s`` (docs/notes/configuration.md)."""
    store: str = "sqlite"
    """Where the state lives: ``sqlite`` (a file in ``state_dir``, one router) or
    ``redis://HOST:PORT/DB`` (shared by routers that elect a leader; docs/scale-out.md)."""
    store_prefix: str = "kairos:router"
    """Key prefix in Redis: routers with the same store URL and prefix are one pair."""
    advertise_url: str | None = None
    """This router's URL as others should reach it; stored with the lease, and sent
    by standbys in ``X-Kairos-Leader`` (unset: not advertised)."""
    leader_lease_s: float = 2.0
    """Redis store: the leader's lease. A standby takes over at most this long after
    the leader stops renewing (plus a poll of an eighth of it)."""
    store_flush_interval_s: float = _code(0.1)
    """Redis store: how often the leader writes what changed (the hot path never
    waits on Redis; a takeover loses at most this much of the latest changes).
    A constant of the code (docs/notes/configuration.md)."""
    store_timeout_s: float = _code(0.5)
    """Redis store: a command that takes longer counts as Redis unreachable.
    A constant of the code (docs/notes/configuration.md)."""
    trace: TraceSettings = field(default_factory=TraceSettings)
    """Recording agent traces for ``kairos whatif`` (off unless ``trace.path`` is set;
    router/trace_recorder.py)."""

    def __post_init__(self) -> None:
        if self.cell is not None:
            try:
                check_cell(self.cell)
            except IdentityError as exc:
                raise ConfigError(f"cell: {exc}") from None
        reserve = self.cell_start_reserve_s
        if not (math.isfinite(reserve) and 0.0 <= reserve <= 3600.0):
            raise ConfigError(f"cell_start_reserve_s must be 0..3600 s, got {reserve}")
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
        try:
            policy_spec(self.policy)
        except UnknownPolicyError as exc:
            raise ConfigError(f"policy: {exc}") from None
        try:
            self.rule()
        except ControllerError as exc:
            raise ConfigError(f"admission: {exc}") from None
        check_log_level(self.log_level, "log_level")
        self._check_store()
        idle = self.energy_idle_power_w
        if idle is not None and not (math.isfinite(idle) and 0 <= idle <= 1e6):
            raise ConfigError("energy_idle_power_w must be a power in W (0..1e6) or unset")

    def rule(self) -> AdmissionRule:
        """The router's own admission rule: its ``policy``'s, with the operator's
        β / γ (applied where a daemon's decision is stale or absent)."""
        adm = self.admission
        return rule_for(self.policy, Intents(beta=adm.beta, gamma=adm.gamma))

    @property
    def shared_store(self) -> bool:
        return self.store != "sqlite"

    def _check_store(self) -> None:
        if self.store != "sqlite":
            parts = urlsplit(self.store)
            if parts.scheme not in ("redis", "rediss") or not parts.hostname:
                raise ConfigError(
                    f"store must be 'sqlite' or redis://HOST:PORT/DB, got {self.store!r}"
                )
            try:
                db = int(parts.path.strip("/") or 0)
                parts.port  # noqa: B018 (raises ValueError on a bad port)
            except ValueError:
                raise ConfigError(f"store {self.store!r}: bad port or database number") from None
            if db < 0:
                raise ConfigError(f"store {self.store!r}: bad database number")
        if not self.store_prefix or any(c.isspace() for c in self.store_prefix):
            raise ConfigError("store_prefix must be a non-empty key prefix without spaces")
        if self.advertise_url is not None:
            url = self.advertise_url
            if not url.isascii() or any(c.isspace() or not c.isprintable() for c in url):
                raise ConfigError("advertise_url must be a plain http(s) URL")
            check_http_url(url, "advertise_url")
        for name, value, lo, hi in (
            ("leader_lease_s", self.leader_lease_s, 0.2, 60.0),
            ("store_flush_interval_s", self.store_flush_interval_s, 0.005, 5.0),
            ("store_timeout_s", self.store_timeout_s, 0.05, 30.0),
        ):
            if not (math.isfinite(value) and lo <= value <= hi):
                raise ConfigError(f"{name} must be {lo}..{hi} s, got {value}")

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

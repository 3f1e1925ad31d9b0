"""``kairosd`` configuration: one TOML file per instance, ``KAIROSD_*`` env, flags.

Loaded with :func:`kairos_common.config.load_config` (precedence: defaults <
TOML < env ``KAIROSD_<FIELD>`` / ``KAIROSD_KAIROS__<FIELD>`` < CLI flags). The
operator states the policy by name and its intents in the nested ``[kairos]``
table (:class:`~controllers.policy.Intents`: τ, β, γ); every other constant of
the law is its stages' (:mod:`controllers.kairos`). Keys that were removed are
errors that name what replaced them (:data:`RETIRED`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from controllers.errors import ControllerError
from controllers.frequency import DEFAULT_FLOOR_MHZ, DEFAULT_NUM_LEVELS
from controllers.policy import Intents
from controllers.registry import POLICY_NAMES, RENAMED, law_for
from kairos_common.cli import check_http_url, check_log_level, check_port
from kairos_common.config import NOTES, load_config
from kairos_common.credentials import daemon_file, discover_credential, read_credential
from kairosd.gpu.opening import BACKENDS

ENV_PREFIX = "KAIROSD"
# Input timeouts when not set: 1 s, or a fifth of a shorter epoch, so that
# `--epoch-s 1` works without also having to pass two timeouts.
DEFAULT_TIMEOUT_S = 1.0
TIMEOUT_EPOCH_SHARE = 0.2
DEFAULT_KV_BYTES_PER_TOKEN = 2 * 48 * 4 * 128 * 2  # Qwen3-Coder-30B-A3B, bf16
MAX_KV_BYTES_PER_TOKEN = 2**24  # 16 MiB: far above any served model's
MAX_KV_OFFLOADING_GIB = 2.0**20  # 1 PiB of host memory


def derived_timeout_s(epoch_s: float) -> float:
    """The default HTTP/GPU timeout for an epoch of ``epoch_s`` seconds."""
    return min(DEFAULT_TIMEOUT_S, TIMEOUT_EPOCH_SHARE * epoch_s)


_LAW = "a constant of the law in code (controllers/kairos.py)"
_NOW_LAW = "a departure measured and kept: it is the law now, with no switch"
RETIRED: dict[str, str] = {
    "decision_valid_epochs": "a constant of the daemon (a decision is valid for 3 epochs)",
    "kairos.alpha": f"{_LAW}: Eq. 8–9's 0.75",
    "kairos.slo_boost": f"{_NOW_LAW} (Eq. 10–12)",
    "kairos.thrashing_avoidance": "choose policy kairos-no-ta to admit every agent at once",
    "kairos.new_agent_context_tokens": f"{_LAW} (point 1: 3000 tokens)",
    "kairos.pending_grace_s": f"{_LAW} (point 2: 10 s)",
    "kairos.admit_within_beta": f"{_NOW_LAW} (point 3)",
    "kairos.make_room": f"{_NOW_LAW} (point 15)",
    "kairos.hold_overflow": f"{_NOW_LAW} (point 16)",
    "kairos.activity_aware": f"{_NOW_LAW} in kairos (point 6); kairos-alg1 has no such stage",
    "kairos.boost_reachable_only": f"{_NOW_LAW} in kairos (point 7)",
    "kairos.idle_after_s": f"{_LAW} (point 6: 10 s)",
    "kairos.prefill_boost_tokens": f"{_LAW} (point 9: 65536 tokens)",
    "kairos.busy_floor_mhz": f"{_LAW} (point 11: 900 MHz)",
    "kairos.busy_floor_context_tokens": f"{_LAW} (point 11: 65536 tokens)",
    "kairos.busy_ceiling": "not adopted without a CPU KV tier, and the law with one "
    f"(points 12–13; {NOTES})",
    "kairos.evictable_after_s": f"{_LAW} (point 14: 60 s)",
    "kairos.offload_aware": f"{_NOW_LAW} in kairos (point 13)",
    "kairos.context_window_s": f"{_LAW} (point 17: 120 s)",
    "predictive": f"the predictive policy's constants are set in code ({NOTES})",
}
"""Keys operators could set before the law became a list of stages, and what
replaced each (docs/notes/configuration.md); a file or variable that sets one is
an error saying so."""


def check_policy(name: str) -> str:
    """``name`` if it is a policy the controllers know, checked before any GPU is opened."""
    key = name.partition(":")[0]
    if key in RENAMED:
        raise ValueError(f"policy {name!r} was renamed {RENAMED[key]}")
    if name.startswith("fixed:"):
        raw = name.removeprefix("fixed:")
        if not raw.isdigit() or int(raw) <= 0:
            raise ValueError(f"policy {name!r}: expected fixed:MHZ with a positive clock in MHz")
        return name
    if name not in POLICY_NAMES:
        raise ValueError(f"policy {name!r}: expected one of {', '.join(POLICY_NAMES)}")
    return name


def check_kv_sizes(kv_bytes_per_token: int, kv_offloading_gib: float | None) -> None:
    """The KV sizes that turn the CPU tier into tokens; ValueError if out of range."""
    if not 0 < kv_bytes_per_token <= MAX_KV_BYTES_PER_TOKEN:
        raise ValueError(
            f"kv_bytes_per_token {kv_bytes_per_token}: expected bytes per token in "
            f"1..{MAX_KV_BYTES_PER_TOKEN} (2 × layers × KV heads × head dim × dtype bytes)"
        )
    if kv_offloading_gib is None:
        return
    if not (math.isfinite(kv_offloading_gib) and 0 <= kv_offloading_gib <= MAX_KV_OFFLOADING_GIB):
        raise ValueError(
            f"kv_offloading_gib {kv_offloading_gib:g}: expected GiB in "
            f"0..{MAX_KV_OFFLOADING_GIB:g} (0 = no tier), or unset to use vLLM's"
        )


@dataclass(frozen=True, slots=True)
class KairosdConfig:
    """Everything one daemon needs; see ``docs/kairosd.md`` for each default's reason."""

    instance: str = ""
    vllm_url: str = ""
    sim_gpu_url: str | None = None
    """Base URL hosting the simulated GPU (``gpu_backend = "sim"``); default ``vllm_url``.
    Set it to run the sim backend beside a real vLLM, which has no ``/kairos-sim``."""
    router_url: tuple[str, ...] = ()
    """The router's URL, or several (a router pair, or a front balancer and the
    routers behind it): a list in TOML, comma-separated in ``KAIROSD_ROUTER_URL``,
    ``--router-url`` repeated. The daemon calls the one that leads and follows a
    failover (docs/kairosd.md, "Several routers"). Empty: standalone mode."""
    router_token: str | None = None
    router_token_file: Path | None = None
    gpu_backend: str = "zeus"
    gpus: tuple[int, ...] = (0,)
    policy: str = "kairos"
    require_control: bool = False
    epoch_s: float = 5.0
    stale_epochs: int = 3
    http_timeout_s: float = 0.0
    """Router and vLLM request timeout; 0 = derived, min(1 s, epoch_s / 5)."""
    gpu_timeout_s: float = 0.0
    """GPU reading timeout; 0 = derived, min(1 s, epoch_s / 5)."""
    floor_mhz: int | None = DEFAULT_FLOOR_MHZ
    ceiling_mhz: int | None = None
    num_levels: int | None = DEFAULT_NUM_LEVELS
    capacity_tokens: int | None = None
    kv_bytes_per_token: int = DEFAULT_KV_BYTES_PER_TOKEN
    """Bytes of KV cache one token takes in the served model: 2 (K and V) × layers
    × KV heads × head dim × dtype bytes. vLLM does not export it, and the daemon
    needs it to turn the CPU KV tier's GiB (``--kv-offloading-size``) into the
    tokens the control law counts. The default is Qwen3-Coder-30B-A3B in bf16
    (2 × 48 × 4 × 128 × 2 = 98304), the paper's model and the simulator preset's."""
    kv_offloading_gib: float | None = None
    """The CPU KV tier in GiB, for a vLLM too old to report it (the
    ``kv_offloading_size`` label of ``vllm:cache_config_info``); 0 = no tier.
    None: use what vLLM reports."""
    listen_host: str = "127.0.0.1"
    listen_port: int | None = 9470
    report_path: Path | None = None
    run: str = ""
    log_level: str = "info"
    sim_speedup: float = 1.0
    """The accelerated CPU stack only (``make demo``, the end-to-end tests): its
    simulated time runs this many times faster than the daemon's clock, so the
    law's time constants (activity, eviction and Eq. 9 windows, the held agents'
    grace) are divided by it. 1 everywhere else."""
    kairos: Intents = field(default_factory=Intents)
    """What the operator states about the law: τ, and Eq. 13's β and γ (unset: the
    policy's own)."""

    def __post_init__(self) -> None:
        if isinstance(self.router_url, str) or self.router_url is None:  # one URL, or none
            urls = (self.router_url,) if self.router_url else ()
            object.__setattr__(self, "router_url", urls)
        if self.gpu_backend not in BACKENDS:
            raise ValueError(f"gpu_backend must be one of {', '.join(BACKENDS)}")
        if self.require_control and self.gpu_backend == "observe":
            raise ValueError("require_control contradicts gpu_backend = 'observe'")
        if not self.epoch_s > 0:
            raise ValueError(f"epoch_s {self.epoch_s:g}: expected a positive number of seconds")
        for name in ("http_timeout_s", "gpu_timeout_s"):
            if getattr(self, name) == 0:  # frozen: the one place a field is filled in
                object.__setattr__(self, name, derived_timeout_s(self.epoch_s))
        if not 0 < self.http_timeout_s < self.epoch_s:
            raise ValueError("http_timeout_s must be > 0 and below epoch_s")
        if not 0 < self.gpu_timeout_s < self.epoch_s:
            raise ValueError("gpu_timeout_s must be > 0 and below epoch_s")
        if self.stale_epochs < 1:
            raise ValueError("stale_epochs must be >= 1")
        if not self.gpus or any(g < 0 for g in self.gpus):
            raise ValueError("gpus must list at least one non-negative index")
        check_port(self.listen_port, "listen_port")
        if self.vllm_url:
            check_http_url(self.vllm_url, "vllm_url")
        for url in self.router_url:
            check_http_url(url, "router_url")
        check_policy(self.policy)
        check_log_level(self.log_level, "log_level")
        if not (math.isfinite(self.sim_speedup) and 0.0 < self.sim_speedup <= 1000.0):
            raise ValueError(f"sim_speedup {self.sim_speedup:g}: expected a factor in (0, 1000]")
        try:
            law_for(self.policy, self.kairos)
        except ControllerError as exc:
            raise ValueError(f"[kairos] {exc}") from None
        if self.capacity_tokens is not None and self.capacity_tokens <= 0:
            raise ValueError("capacity_tokens must be positive")
        check_kv_sizes(self.kv_bytes_per_token, self.kv_offloading_gib)

    def resolved_router_token(self, env: Mapping[str, str] | None = None) -> str | None:
        """This instance's daemon credential: ``router_token``, else the file's
        (:func:`~kairos_common.credentials.read_credential`: an unreadable or empty
        file is a :class:`ConfigError`), else the ``daemon-<instance>.token`` a
        local router published."""
        if self.router_token:
            return self.router_token
        if self.router_token_file is not None:
            return read_credential(self.router_token_file)
        if self.instance:
            name = daemon_file(self.instance)
            found = (discover_credential(url, name, env) for url in self.router_url)
            return next((token for token in found if token), None)
        return None

    @property
    def standalone(self) -> bool:
        """No router: U comes from vLLM's KV usage and there is no SLO boost."""
        return not self.router_url


def load_daemon_config(
    path: Path | None = None,
    *,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> KairosdConfig:
    """Build the config from ``path``, the environment and CLI ``overrides``."""
    return load_config(
        KairosdConfig,
        path=path,
        env_prefix=ENV_PREFIX,
        env=env,
        overrides=overrides,
        strict_env=True,
        retired=RETIRED,
    )

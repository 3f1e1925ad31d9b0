"""Tell the operator which CPU KV tier the control law counts on, once per change.

With a tier (vLLM ``--kv-offloading-size``) the default ``kairos`` policy stops
counting idle contexts the tier holds towards admission (docs/control-law.md,
point 13): a context vLLM evicts comes back as a copy from host memory, not a
recompute, so holding its agent back buys nothing. That changes what the daemon
admits, so the log says when the daemon starts or stops counting on a tier, and
whether this policy uses it (``kairos-alg1``, the baselines and standalone mode
do not). Nothing is said while neither vLLM nor the configuration says.
"""

from __future__ import annotations

import structlog

from controllers.kairos import KairosController
from controllers.predictive import PredictiveController
from controllers.types import Controller
from kairos_common.vllm_metrics import VllmMetrics
from kairos_common.wire_fields import MAX_TOKENS
from kairosd.config import DEFAULT_KV_BYTES_PER_TOKEN

log = structlog.get_logger("kairosd.offload_check")


def tier_unused_reason(controller: Controller, standalone: bool) -> str | None:
    """Why ``controller`` ignores a CPU KV tier, or None when it counts on one."""
    law = controller.kairos if isinstance(controller, PredictiveController) else controller
    if not isinstance(law, KairosController):
        return "this policy has no KAIROS admission: the tier is not used"
    if not law.rule.offload_aware:
        return "this policy ignores the tier (as the paper's law does); policy kairos reads it"
    if standalone:
        return "standalone mode measures usage from vLLM: the tier is not used"
    return None


def tier_hint(offload_tokens: int, unused_reason: str | None) -> str:
    """One line on what the tier now changes."""
    if offload_tokens == 0:
        return "no CPU KV tier: every context counts towards admission"
    if unused_reason is not None:
        return unused_reason
    return (
        "idle contexts the tier holds do not count towards admission "
        "(docs/control-law.md, point 13)"
    )


def offload_gib(override_gib: float | None, vllm: VllmMetrics | None) -> float | None:
    """The CPU KV tier in GiB: the operator's override, else what vLLM last said
    (None: neither says; 0.0: no tier)."""
    if override_gib is not None:
        return override_gib
    return vllm.kv_offloading_gib if vllm is not None else None


def offload_tokens_of(tier_gib: float | None, kv_bytes_per_token: int) -> int:
    """Tokens a tier of ``tier_gib`` GiB holds (0 when there is none or nobody says)."""
    if tier_gib is None or tier_gib <= 0:
        return 0
    return min(int(tier_gib * 2**30 // kv_bytes_per_token), MAX_TOKENS)


class OffloadCheck:
    """The tier in tokens each epoch; logs ``kv_offloading_tier`` when its size
    changes (from none at start, so a tier vLLM never reports, or reports as
    absent, is silent)."""

    def __init__(
        self,
        policy: str,
        unused_reason: str | None,
        override_gib: float | None = None,
        kv_bytes_per_token: int = DEFAULT_KV_BYTES_PER_TOKEN,
    ) -> None:
        self.policy = policy
        self.unused_reason = unused_reason
        self.override_gib = override_gib
        self.kv_bytes_per_token = kv_bytes_per_token
        self._said_tokens = 0

    def tokens(self, vllm: VllmMetrics | None) -> int:
        """This epoch's tier in tokens, from the override or the last good scrape
        (held like every vLLM input while a scrape fails); logged when it changes."""
        tier_gib = offload_gib(self.override_gib, vllm)
        tokens = offload_tokens_of(tier_gib, self.kv_bytes_per_token)
        self.observe(tier_gib, tokens)
        return tokens

    def observe(self, tier_gib: float | None, offload_tokens: int) -> None:
        """Log one epoch's tier if it changed since the last one said."""
        if offload_tokens == self._said_tokens:
            return
        self._said_tokens = offload_tokens
        log.info(
            "kv_offloading_tier",
            policy=self.policy,
            kv_offloading_gib=tier_gib,
            offload_tokens=offload_tokens,
            used=offload_tokens > 0 and self.unused_reason is None,
            hint=tier_hint(offload_tokens, self.unused_reason),
        )

"""Does the policy match vLLM's CPU KV tier? Said once in the log, not enforced.

``kairos-offload`` (docs/control-law.md, point 13) admits every agent at once
because vLLM copies an evicted context back from host memory instead of
computing it again. Without that tier it thrashes as no control does (Claude
Code trace, 0.008 sessions/s: 1170 preemptions against ``kairos``'s 31). The
other way round, a tier left to ``kairos`` holds agents for nothing. vLLM says
which it runs with in ``vllm:cache_config_info`` (label ``kv_offloading_size``,
``None`` when unset), so the daemon can tell the operator; it does not switch
policy itself, a choice that is the operator's and is made in its configuration.
"""

from __future__ import annotations

import structlog

log = structlog.get_logger("kairosd.offload_check")


def offload_mismatch(expects_tier: bool, tier_gib: float | None) -> str | None:
    """The log event for a policy/tier mismatch, or None when they agree or vLLM
    does not say (``tier_gib`` None: an older vLLM without the label)."""
    if tier_gib is None:
        return None
    if expects_tier and tier_gib <= 0:
        return "kv_offloading_missing"
    if not expects_tier and tier_gib > 0:
        return "kv_offloading_unused"
    return None


class OffloadCheck:
    """Logs a mismatch when it appears and again only after it has changed."""

    def __init__(self, policy: str, expects_tier: bool) -> None:
        self.policy = policy
        self.expects_tier = expects_tier
        self._said: str | None = None

    def observe(self, tier_gib: float | None) -> str | None:
        """Check one scrape; returns the mismatch seen (None: none)."""
        event = offload_mismatch(self.expects_tier, tier_gib)
        if event is not None and event != self._said:
            if event == "kv_offloading_missing":
                log.warning(
                    event,
                    policy=self.policy,
                    hint="vLLM has no CPU KV tier (--kv-offloading-size): this policy "
                    "does not hold agents and will thrash; use policy kairos",
                )
            else:
                log.info(
                    event,
                    policy=self.policy,
                    kv_offloading_gib=tier_gib,
                    hint="vLLM has a CPU KV tier: policy kairos-offload stops holding "
                    "agents it does not need to hold (docs/control-law.md, point 13)",
                )
        self._said = event
        return event

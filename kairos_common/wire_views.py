"""The JSON forms of the views the wire's messages carry (:mod:`kairos_common.views`).

Split from :mod:`kairos_common.wire` so the contract module holds the messages
and this one how the agent, request-observation and model-report views inside
them are encoded and decoded, each field read with the wire's bounds
(:mod:`kairos_common.wire_fields`).
"""

from __future__ import annotations

import math
from dataclasses import asdict
from typing import Any

from kairos_common.errors import WireFormatError
from kairos_common.views import AdmissionRule, AgentView, ModelReport, RequestObservation
from kairos_common.wire_fields import (
    MAX_DURATION_S,
    MAX_LEVELS,
    MAX_MARGIN,
    MAX_MHZ,
    MAX_TOKENS,
    MAX_VALID_FOR_S,
    finite,
    finite_or_none,
    get_field,
)


def agent_to_json(agent: AgentView) -> dict[str, Any]:
    return asdict(agent)


def agent_from_json(obj: dict[str, Any]) -> AgentView:
    return AgentView(
        agent_id=get_field(obj, "agent_id", str),
        arrival_s=get_field(obj, "arrival_s", float),
        context_tokens=get_field(obj, "context_tokens", int, None, lo=0, hi=MAX_TOKENS),
        estimated_context_tokens=get_field(
            obj, "estimated_context_tokens", int, None, lo=0, hi=MAX_TOKENS
        ),
        decode_tokens=get_field(obj, "decode_tokens", int, 0, lo=0, hi=MAX_TOKENS),
        llm_time_s=get_field(obj, "llm_time_s", float, 0.0, lo=0, hi=MAX_DURATION_S),
        completed_steps=get_field(obj, "completed_steps", int, 0, lo=0),
        waiting_since_s=get_field(obj, "waiting_since_s", float, None),
        in_flight=get_field(obj, "in_flight", bool, False),
        last_active_s=get_field(obj, "last_active_s", float, None),
        prefill_tokens=get_field(obj, "prefill_tokens", int, 0, lo=0, hi=MAX_TOKENS),
    )


def observation_to_json(ob: RequestObservation) -> dict[str, Any]:
    return asdict(ob)


def observation_from_json(obj: dict[str, Any]) -> RequestObservation:
    """``clock_mhz`` 0 means the router did not know it (the daemon fills it in)."""
    return RequestObservation(
        t_s=get_field(obj, "t_s", float),
        prompt_tokens=get_field(obj, "prompt_tokens", int, 0, lo=0, hi=MAX_TOKENS),
        cached_tokens=get_field(obj, "cached_tokens", int, 0, lo=0, hi=MAX_TOKENS),
        completion_tokens=get_field(obj, "completion_tokens", int, 0, lo=0, hi=MAX_TOKENS),
        ttft_s=get_field(obj, "ttft_s", float, 0.0, lo=0, hi=MAX_DURATION_S),
        decode_s_per_token=get_field(
            obj, "decode_s_per_token", float, 0.0, lo=0, hi=MAX_DURATION_S
        ),
        running=get_field(obj, "running", int, 0, lo=0, hi=MAX_TOKENS),
        active_context_tokens=get_field(obj, "active_context_tokens", int, 0, lo=0, hi=MAX_TOKENS),
        clock_mhz=get_field(obj, "clock_mhz", int, 0, lo=0, hi=MAX_MHZ),
    )


def report_to_json(report: ModelReport) -> dict[str, Any]:
    """Margins as ``[[level, margin], ...]`` (JSON keys are strings; levels are not)."""
    return {
        "slo_margins": [
            [lv, m] for lv, m in sorted(report.slo_margin_by_level.items()) if math.isfinite(m)
        ],
        "slo_slack": finite_or_none(report.slo_slack),
        "efficient_floor_level": report.efficient_floor_level,
        "model_error": finite_or_none(report.model_error),
        "model_observations": report.model_observations,
    }


def report_from_json(obj: dict[str, Any]) -> ModelReport:
    margins = get_field(obj, "slo_margins", list, [])
    if len(margins) > MAX_LEVELS or not all(
        isinstance(p, list)
        and len(p) == 2
        and isinstance(p[0], int)
        and not isinstance(p[0], bool)
        and 1 <= p[0] <= MAX_LEVELS
        and finite(p[1], MAX_MARGIN)
        for p in margins
    ):
        raise WireFormatError("field 'slo_margins' must list [level, finite margin] pairs")
    return ModelReport(
        slo_margin_by_level={int(lv): float(m) for lv, m in margins},
        slo_slack=get_field(obj, "slo_slack", float, None, lo=-MAX_MARGIN, hi=MAX_MARGIN),
        efficient_floor_level=get_field(
            obj, "efficient_floor_level", int, None, lo=1, hi=MAX_LEVELS
        ),
        model_error=get_field(obj, "model_error", float, None, lo=0, hi=MAX_MARGIN),
        model_observations=get_field(obj, "model_observations", int, 0, lo=0),
    )


def rule_to_json(rule: AdmissionRule) -> dict[str, Any]:
    return asdict(rule)


def rule_from_json(obj: dict[str, Any]) -> AdmissionRule:
    """Eq. 13 as the daemon's policy applies it: ``0 < γ ≤ β ≤ 1``, windows in seconds."""
    try:
        return AdmissionRule(
            beta=get_field(obj, "beta", float, lo=1e-3, hi=1.0),
            gamma=get_field(obj, "gamma", float, lo=1e-3, hi=1.0),
            enabled=get_field(obj, "enabled", bool),
            idle_after_s=get_field(obj, "idle_after_s", float, lo=1e-3, hi=MAX_VALID_FOR_S),
            evictable_after_s=get_field(
                obj, "evictable_after_s", float, None, lo=1e-3, hi=MAX_VALID_FOR_S
            ),
            offload_aware=get_field(obj, "offload_aware", bool),
        )
    except ValueError as exc:
        if isinstance(exc, WireFormatError):
            raise
        raise WireFormatError(f"field 'rule': {exc}") from None

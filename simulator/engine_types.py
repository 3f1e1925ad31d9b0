"""Requests, events and counters of the engine model (:mod:`simulator.engine`).

These are the engine's public vocabulary, shared by the cluster simulation and
the fake vLLM server, so they carry only plain values.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class EngineRequest:
    """One LLM call as the engine sees it.

    ``cache_key`` names whose cached context this prompt extends (the agent; ""
    disables reuse); ``shared_prefix_tokens`` leading prompt tokens are identical
    to that context, so they can be served from the prefix cache if resident.
    """

    request_id: str
    prompt_tokens: int
    output_tokens: int
    arrival_s: float
    cache_key: str = ""
    shared_prefix_tokens: int = 0


@dataclass(frozen=True, slots=True)
class FirstToken:
    request_id: str
    t_s: float


@dataclass(frozen=True, slots=True)
class TokenProgress:
    """``generated_tokens`` of ``request_id`` exist at ``t_s`` (streaming)."""

    request_id: str
    t_s: float
    generated_tokens: int


@dataclass(frozen=True, slots=True)
class Preempted:
    request_id: str
    t_s: float


@dataclass(frozen=True, slots=True)
class RequestFinished:
    """The last token of ``request_id`` was produced at ``t_s``."""

    request_id: str
    t_s: float
    arrival_s: float
    first_token_s: float
    prompt_tokens: int
    output_tokens: int
    cached_tokens: int
    preemptions: int


@dataclass(frozen=True, slots=True)
class RequestRejected:
    """The request can never run here (longer than the model or the KV cache)."""

    request_id: str
    t_s: float
    reason: str


EngineEvent = FirstToken | TokenProgress | Preempted | RequestFinished | RequestRejected


@dataclass(slots=True)
class EngineCounters:
    """Cumulative counters (vLLM names in brackets where vLLM has one)."""

    steps: int = 0
    busy_s: float = 0.0
    prompt_tokens: int = 0  # [vllm:prompt_tokens]
    generation_tokens: int = 0  # [vllm:generation_tokens]
    prefill_computed_tokens: int = 0
    prefill_reused_tokens: int = 0  # [vllm:prefix_cache_hits]
    loaded_tokens: int = 0
    """Prefix tokens loaded from the CPU tier instead of computed (KV offloading)."""
    prefix_queried_tokens: int = 0  # [vllm:prefix_cache_queries]
    recomputed_tokens: int = 0
    preemptions: int = 0  # [vllm:num_preemptions]
    evicted_tokens: int = 0
    finished_requests: int = 0
    rejected_requests: int = 0
    truncated_requests: int = 0
    """Replies cut at the model's length (``finish_reason`` "length" in vLLM)."""

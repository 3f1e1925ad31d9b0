"""Turn one epoch's inputs into the controller's :class:`InstanceSnapshot`.

Pure functions (no I/O, no clock), so the benchmark and the unit tests drive
them directly. Two modes:

* **router mode**: agents (ongoing/pending, contexts, throughput terms) come
  from the router's ledger; ``U = Σ C_a``; times are on the router's clock, so
  ``now_s`` is the router's ``now_s``.
* **standalone mode** (no router): no agents are known, so ``U`` is vLLM's
  measured KV usage × capacity, there is no SLO boost (no per-agent
  throughput) and nothing to admit. The law is otherwise unchanged.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from controllers.types import InstanceSnapshot, RequestObservation
from kairos_common.vllm_metrics import VllmMetrics
from kairos_common.wire import InstanceState


@dataclass(frozen=True, slots=True)
class EpochInputs:
    """What the loop managed to read this epoch (``None`` = unavailable)."""

    now_s: float
    router: InstanceState | None
    vllm: VllmMetrics | None


def resolve_capacity(
    override_tokens: int | None,
    vllm: VllmMetrics | None,
    router: InstanceState | None,
    last_known_tokens: int | None,
) -> int | None:
    """``U_max``: operator override, else vLLM, else the router, else last known."""
    for value in (
        override_tokens,
        vllm.capacity_tokens if vllm is not None else None,
        router.capacity_tokens if router is not None else None,
        last_known_tokens,
    ):
        if value is not None and value > 0:
            return value
    return None


def with_clock(
    observations: tuple[RequestObservation, ...], clock_mhz: int | None
) -> tuple[RequestObservation, ...]:
    """Fill the clock the router cannot know with the one this daemon applied.

    Observations are at most an epoch old, and the clock was locked for that
    whole epoch, so the applied clock is the one they ran at. Without a known
    clock they are dropped (an online model must not learn from a wrong input).
    """
    out = []
    for ob in observations:
        if ob.clock_mhz > 0:
            out.append(ob)
        elif clock_mhz:
            out.append(dataclasses.replace(ob, clock_mhz=clock_mhz))
    return tuple(out)


def build_snapshot(
    epoch: int,
    inputs: EpochInputs,
    capacity_tokens: int,
    standalone: bool,
    clock_mhz: int | None = None,
    offload_tokens: int = 0,
) -> InstanceSnapshot | None:
    """The controller's view, or ``None`` when the mode's source is missing.

    ``clock_mhz`` is the clock applied during the last epoch (None if unknown);
    ``offload_tokens`` the CPU KV tier (:meth:`~kairosd.offload_check.OffloadCheck.tokens`;
    0: none).
    """
    if standalone:
        usage = inputs.vllm.usage_tokens if inputs.vllm is not None else None
        if usage is None:
            return None
        return InstanceSnapshot(
            now_s=inputs.now_s,
            epoch=epoch,
            capacity_tokens=capacity_tokens,
            usage_tokens=usage,
            offload_tokens=offload_tokens,
        )
    state = inputs.router
    if state is None:
        return None
    return InstanceSnapshot(
        now_s=state.now_s,
        epoch=epoch,
        capacity_tokens=capacity_tokens,
        ongoing=state.ongoing,
        pending=state.pending,
        clock_mhz=clock_mhz,
        observations=with_clock(state.observations, clock_mhz),
        offload_tokens=offload_tokens,
    )


def agent_counts(inputs: EpochInputs, standalone: bool) -> tuple[int, int]:
    """(ongoing, pending) for the report: agents in router mode, requests standalone."""
    if not standalone and inputs.router is not None:
        return len(inputs.router.ongoing), len(inputs.router.pending)
    if inputs.vllm is not None:
        return inputs.vllm.num_running or 0, inputs.vllm.num_waiting or 0
    return 0, 0

"""The epoch loop's inputs: router state, vLLM ``/metrics``, GPU reading.

Split from :mod:`kairosd.loop` so the loop holds decide → act → record, and this
module how each input is read without ever killing the loop: any failure is a
missed input, logged once per streak and counted in the metrics, and the last good
value is *held* so the loop can tell how stale each input is
(:meth:`Inputs.stale`; the fail-safe is the loop's).
"""

from __future__ import annotations

from typing import Any, Generic, Protocol, TypeVar

import structlog

from kairos_common.vllm_metrics import VllmMetrics
from kairos_common.wire import AdmissionDecision, DecisionAck, InstanceState
from kairosd.errors import GpuError, InputError, RouterVersionError
from kairosd.gpu.base import GpuBackend, GpuStatus
from kairosd.metrics import DaemonMetrics

log = structlog.get_logger()
T = TypeVar("T")


class VllmSource(Protocol):
    async def fetch(self) -> VllmMetrics: ...


class RouterLink(Protocol):
    async def state(self) -> InstanceState: ...
    async def post_decision(self, decision: AdmissionDecision) -> DecisionAck: ...


class Held(Generic[T]):
    """Last good value of one input and how many epochs in a row it failed."""

    def __init__(self) -> None:
        self.value: T | None = None
        self.failures = 0

    def ok(self, value: T) -> None:
        self.value, self.failures = value, 0

    def failed(self) -> None:
        self.failures += 1


class Inputs:
    """The router and vLLM inputs of one daemon, each held at its last good value."""

    def __init__(self, vllm: VllmSource, router: RouterLink | None, metrics: DaemonMetrics) -> None:
        self.vllm = vllm
        self.router = router
        self.metrics = metrics
        self.router_in: Held[InstanceState] = Held()
        self.vllm_in: Held[VllmMetrics] = Held()

    async def read_router(self) -> InstanceState | None:
        if self.router is None:
            return None
        try:
            state = await self.router.state()
        except RouterVersionError as exc:  # a router of another release: say it plainly
            self._failed(self.router_in, "router", "router_speaks_another_wire_version", exc)
            return None
        except Exception as exc:  # any failure is a missed input, never a dead loop
            self._failed(self.router_in, "router", "router_unavailable", exc)
            return None
        self._ok(self.router_in, "router", state)
        return state

    def _failed(self, held: Held[Any], name: str, event: str, exc: Exception) -> None:
        """Count a failed read; log it once per streak (the count is in the metrics)."""
        held.failed()
        self.metrics.input_error(name)
        if held.failures == 1:
            text = str(exc) if isinstance(exc, InputError) else repr(exc)
            say = log.error if isinstance(exc, RouterVersionError) else log.warning
            say(event, error=text[:300], hint="logged once until it recovers")

    def _ok(self, held: Held[T], name: str, value: T) -> None:
        if held.failures:
            log.info("input_recovered", input=name, after_epochs=held.failures)
        held.ok(value)

    async def read_vllm(self) -> VllmMetrics | None:
        try:
            scraped = await self.vllm.fetch()
        except Exception as exc:  # NaN in /metrics, refused, timeout: stale, not fatal
            self._failed(self.vllm_in, "vllm", "vllm_unavailable", exc)
            return None
        if not scraped.metrics_enabled:
            self.vllm_in.failed()
            self.metrics.input_error("vllm")
            log.warning(
                "vllm_metrics_disabled",
                hint="vLLM exports no vllm:* metrics; it runs with --disable-log-stats",
                epochs=self.vllm_in.failures,
            )
            return None
        self._ok(self.vllm_in, "vllm", scraped)
        return scraped

    def stale(self, stale_epochs: int) -> str | None:
        """Which input has been unavailable for more than ``stale_epochs`` epochs."""
        n = stale_epochs
        if self.router is not None and (
            self.router_in.failures > n or self.router_in.value is None
        ):
            return "router"
        if self.vllm_in.failures > n or (self.router is None and self.vllm_in.value is None):
            return "vllm"
        return None


async def read_gpus(backend: GpuBackend, metrics: DaemonMetrics) -> list[GpuStatus] | None:
    """The GPU reading, or None (counted and logged) when it fails.

    Not held like the others: a missing reading extends the open epoch instead
    (:meth:`kairosd.loop.Daemon.run_epoch`), so no energy is lost.
    """
    try:
        return await backend.status()
    except (GpuError, OSError, ValueError) as exc:
        metrics.input_error("gpu")
        log.warning("gpu_read_failed", error=str(exc))
        return None

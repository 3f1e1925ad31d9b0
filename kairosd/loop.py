"""The epoch loop: read inputs, decide, act, record — one instance, one clock.

Each epoch gathers three inputs concurrently, every one bounded by a timeout
(router state, vLLM ``/metrics``, GPU reading), so a slow or dead input costs at
most its timeout and never blocks the loop. Then the controller decides (pure)
and only then the daemon acts: admission decision to the router, clock to the
GPU (written only when it changes). The epoch that just ended is closed with
this epoch's GPU reading and written as one power-report line.

Fail safe: an input that fails is *held* (last good value; :mod:`kairosd.inputs`)
for up to ``stale_epochs`` epochs; past that the daemon runs at the maximum clock
(it can no longer see thrashing or SLO misses) while admissions keep following the
last known capacity — or admit everyone if capacity was never known — so agents
are never starved by a broken monitor. Clocks are reset on every way out
(:meth:`Daemon.shutdown`), and reconciled at start-up by the caller
(:func:`kairosd.startup.prepare_backend`).

Fleet power budget: a router that coordinates one may answer each decision
with a clock cap, held and applied by :class:`kairosd.clock_cap.ClockCap`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

import structlog

from controllers.errors import ControllerError
from controllers.reason import Reason
from controllers.types import ControlDecision, Controller
from kairos_common.wire import (
    AdmissionDecision,
    DecisionAck,
    DecisionAdmission,
    DecisionClock,
    Measurement,
)
from kairosd.clock_cap import ClockCap
from kairosd.config import KairosdConfig
from kairosd.errors import GpuError, GpuPermissionError, InputError, RouterVersionError
from kairosd.gpu.base import GpuBackend, GpuStatus
from kairosd.gpu.observe import ObserveBackend
from kairosd.gpu_reset import reset_clocks, wait_gpu_idle
from kairosd.inputs import Inputs, RouterLink, VllmSource, read_gpus
from kairosd.metrics import DaemonMetrics
from kairosd.offload_check import OffloadCheck, tier_unused_reason
from kairosd.power_report import GpuTotals, OpenEpoch, close_epoch
from kairosd.sdnotify import Notifier
from kairosd.snapshot import EpochInputs, agent_counts, build_snapshot, resolve_capacity
from reporting.records import EpochRecord

log = structlog.get_logger()
_RECENT_RECORDS = 64  # kept in memory for status/tests; the report file has them all
DECISION_VALID_EPOCHS = 3.0
"""A decision is valid for this many epochs: the router falls back to its own rule
only once three in a row are missing (one late post is not a stale daemon)."""


class RecordSink(Protocol):
    def write(self, record: EpochRecord) -> None: ...


class Daemon:
    """One instance's control loop; every collaborator is passed in."""

    def __init__(
        self,
        config: KairosdConfig,
        *,
        backend: GpuBackend,
        controller: Controller,
        vllm: VllmSource,
        router: RouterLink | None,
        sink: RecordSink | None,
        metrics: DaemonMetrics,
        notifier: Notifier | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        daemon_id: str = "kairosd",
    ) -> None:
        self.config = config
        self.backend = backend
        self.controller = controller
        self.vllm = vllm
        self.router = router
        self.sink = sink
        self.metrics = metrics
        self.notifier = notifier or Notifier(None)
        self.clock = clock
        self.wall_clock = wall_clock
        self.daemon_id = daemon_id
        self.start_unix_s = wall_clock()
        self.epoch = 0
        self.records: deque[EpochRecord] = deque(maxlen=_RECENT_RECORDS)
        self.applied_clock_mhz: int | None = None
        self.applied_under_cap_mhz: int | None = None
        """The fleet budget's cap when ``applied_clock_mhz`` was last decided."""
        self.last_decision: ControlDecision | None = None
        self.last_ack: DecisionAck | None = None
        self.mode = "standalone" if config.standalone else "router"
        self.failsafe_reason: str | None = None
        self._inputs = Inputs(vllm, router, metrics)
        self._capacity_tokens: int | None = config.capacity_tokens
        self._open: OpenEpoch | None = None
        self._last_epoch_end_s: float | None = None
        self._started_s = clock()
        self._instant_power_w: float | None = None
        self._epoch_done = asyncio.Event()
        self.cap = ClockCap()
        self.energy_total_j = 0.0
        """Measured energy of every closed epoch since start (sent to the router)."""
        self.offload_check = OffloadCheck(
            config.policy,
            tier_unused_reason(controller, config.standalone),
            config.kv_offloading_gib,
            config.kv_bytes_per_token,
        )
        self._version_refused = False

    # ---- one epoch ----------------------------------------------------------------

    def _decide(self, inputs: EpochInputs) -> tuple[ControlDecision, str]:
        """Run the controller on held inputs, then apply the fail-safe override."""
        levels = self.controller.levels
        capacity = resolve_capacity(
            self.config.capacity_tokens, inputs.vllm, inputs.router, self._capacity_tokens
        )
        self._capacity_tokens = capacity
        stale = self._inputs.stale(self.config.stale_epochs)
        offload_tokens = self.offload_check.tokens(inputs.vllm)
        self.metrics.observe_offload(offload_tokens)
        snap = None
        if capacity is not None:
            snap = build_snapshot(
                self.epoch,
                inputs,
                capacity,
                self.config.standalone,
                self.applied_clock_mhz,
                offload_tokens,
            )
        decision = None
        if snap is not None:
            try:
                decision = self.controller.decide(snap)
                self.metrics.observe_decision(decision)
            except ControllerError as exc:  # e.g. a router bug sent an invalid agent
                log.error("controller_rejected_snapshot", error=str(exc), epoch=self.epoch)
        if decision is None:
            pending = inputs.router.pending if inputs.router is not None else ()
            why = Reason.NO_CAPACITY if capacity is None else Reason.NO_INPUT
            decision = ControlDecision(
                epoch=self.epoch,
                level=levels.count,
                clock_mhz=levels.max_mhz,
                reason=Reason.CONTROLLER_ERROR if snap is not None else why,
                admit=tuple(a.agent_id for a in pending),
                capacity_tokens=capacity or 0,
                rule=self.controller.rule,
            )
        self.failsafe_reason = stale
        if stale is not None and decision.clock_mhz != levels.max_mhz:
            decision = _with_clock(decision, levels.count, levels.max_mhz)
        reason = decision.label if stale is None else f"failsafe-{stale}:{decision.label}"
        return decision, reason

    async def _post(self, decision: ControlDecision, fresh: bool) -> int:
        """Send the admission decision; returns how many agents the router admitted."""
        if self.router is None or not fresh:
            return 0
        measured_w, measured_mhz = self._last_measured()
        msg = AdmissionDecision(
            instance=self.config.instance,
            daemon_id=self.daemon_id,
            daemon_start_unix_s=self.start_unix_s,
            epoch=decision.epoch,
            policy=self.controller.name,
            valid_for_s=self.config.epoch_s * DECISION_VALID_EPOCHS,
            admission=DecisionAdmission(
                admit=decision.admit,
                defer=decision.defer_admissions,
                rule=decision.rule,
                capacity_tokens=decision.capacity_tokens or None,
                offload_tokens=decision.offload_tokens,
            ),
            clock=DecisionClock(
                clock_mhz=decision.clock_mhz,
                boost=decision.boost,
                # Observe mode cannot follow a cap: the router counts its power as fixed.
                levels_mhz=self.controller.levels.clocks_mhz if self.backend.controls else (),
                min_throughput_tok_s=decision.min_throughput_tok_s,
                report=decision.report,
            ),
            measured=Measurement(measured_w, measured_mhz, self.energy_total_j),
        )
        try:
            ack = await self.router.post_decision(msg)
        except RouterVersionError as exc:
            self.metrics.input_error("router_decision")
            if not self._version_refused:  # once, not every epoch
                log.error("router_speaks_another_wire_version", error=str(exc))
            self._version_refused = True
            return 0
        except InputError as exc:
            self.metrics.input_error("router_decision")
            log.warning("decision_not_delivered", error=str(exc), epoch=decision.epoch)
            return 0
        self._version_refused = False
        self.last_ack = ack
        self.cap.take(ack, self.clock(), msg.valid_for_s, self.epoch)
        if not ack.accepted:
            log.info("decision_rejected", epoch=decision.epoch, reason=ack.reason)
        return len(ack.admitted) if ack.accepted else 0

    def _last_measured(self) -> tuple[float | None, int | None]:
        """``(W, MHz)`` of the last closed epoch with a duration (the fleet budget's input)."""
        for rec in reversed(self.records):
            if rec.epoch_s > 0:
                return rec.avg_power_w, rec.actual_clock_mhz or rec.target_clock_mhz
        return None, None

    def _capped(self, decision: ControlDecision, reason: str) -> tuple[ControlDecision, str]:
        """Apply the fleet budget's cap while it is valid (``ClockCap``)."""
        self.cap.expire(self.clock(), self.failsafe_reason == "router", self.epoch)
        self.metrics.observe_cap(self.cap.cap_mhz, self.cap.conflict)
        capped = self.cap.apply(decision, reason, self.controller.levels)
        if capped is None:
            return decision, reason
        self.metrics.capped_epochs.labels(self.config.instance).inc()
        return capped

    async def _apply_clock(self, clock_mhz: int) -> None:
        """Lock the clock if it changed; permission loss degrades to observe mode."""
        if clock_mhz == self.applied_clock_mhz or not self.backend.controls:
            return
        try:
            await self.backend.set_locked_clock(clock_mhz)
        except GpuPermissionError as exc:
            if self.config.require_control:
                raise
            log.error("gpu_control_denied_switching_to_observe", error=str(exc))
            self.backend = ObserveBackend(self.backend, reason=str(exc))
            self.notifier.status(self.status_line())
            return
        except GpuError as exc:
            log.warning("gpu_set_clock_failed", error=str(exc), clock_mhz=clock_mhz)
            self.applied_clock_mhz = None  # unknown now: write again next epoch
            return
        log.info("clock_set", clock_mhz=clock_mhz, epoch=self.epoch)
        self.applied_clock_mhz = clock_mhz

    def _close(self, end_s: float, gpus: list[GpuStatus] | None) -> EpochRecord | None:
        if self._open is None:
            return None
        held = self._inputs.vllm_in.value
        record = close_epoch(
            self._open,
            end_s=end_s,
            t_s=self.wall_clock(),
            end=GpuTotals.of(gpus),
            generation_tokens_total=held.generation_tokens_total if held else None,
            preemptions_total=held.preemptions_total if held else None,
            instance=self.config.instance,
            policy=self.controller.name,
            gpus=self.config.gpus,
            run=self.config.run,
        )
        self._open = None
        self.energy_total_j += record.energy_j
        self.records.append(record)
        if self.sink is not None:
            self.sink.write(record)
        self.metrics.observe_record(record, self._instant_power_w)
        return record

    async def run_epoch(self) -> ControlDecision:
        """One full epoch: gather → close previous → decide → act → open this one."""
        t0 = self.clock()
        router_state, scraped, gpus = await asyncio.gather(
            self._inputs.read_router(),
            self._inputs.read_vllm(),
            read_gpus(self.backend, self.metrics),
        )
        now = self.clock()
        totals = GpuTotals.of(gpus)
        self._instant_power_w = totals.power_w
        carry = None
        if gpus is None and self._open is not None:
            # No reading, no energy boundary: let the open epoch run on so its
            # energy is merged into the next record instead of being lost.
            carry, self._open = self._open, None
            log.warning("epoch_extended_gpu_unreadable", epoch=carry.epoch)
        else:
            self._close(now, gpus)
        inputs = self._inputs
        held = EpochInputs(now_s=now, router=inputs.router_in.value, vllm=inputs.vllm_in.value)
        decision, reason = self._decide(held)
        if not self.backend.controls:
            reason += " (observe)"
        admitted = await self._post(decision, fresh=router_state is not None)
        decision, reason = self._capped(decision, reason)
        cap_mhz = self.cap.cap_mhz
        await self._apply_clock(decision.clock_mhz)
        # Set with the clock, not with the cap: a cap the router lowered is in force
        # while the GPU write is still under way, and /healthz is read meanwhile.
        self.applied_under_cap_mhz = cap_mhz
        ongoing, pending = agent_counts(held, self.config.standalone)
        vl = inputs.vllm_in.value
        self._open = OpenEpoch(
            epoch=self.epoch,
            start_s=carry.start_s if carry else now,
            decision=decision,
            target_clock_mhz=decision.clock_mhz,
            reason=reason,
            ongoing=ongoing,
            pending=pending,
            admitted=admitted + (carry.admitted if carry else 0),
            start=carry.start if carry else totals,
            generation_tokens_total=(
                carry.generation_tokens_total
                if carry
                else (vl.generation_tokens_total if vl and scraped else None)
            ),
            preemptions_total=(
                carry.preemptions_total
                if carry
                else (vl.preemptions_total if vl and scraped else None)
            ),
        )
        self.last_decision = decision
        self.metrics.failsafe.labels(self.config.instance).set(1 if self.failsafe_reason else 0)
        self.metrics.epoch_duration.labels(self.config.instance).observe(self.clock() - t0)
        self.epoch += 1
        self._epoch_done.set()
        self._epoch_done = asyncio.Event()
        self._last_epoch_end_s = self.clock()
        self.notifier.watchdog()
        if self.epoch == 1 or self.epoch % 12 == 0 or self.failsafe_reason:
            self.notifier.status(self.status_line())
        return decision

    async def wait_epochs(self, count: int) -> None:
        """Wait until ``count`` epochs have completed (callers bound it in time)."""
        while self.epoch < count:
            await self._epoch_done.wait()

    # ---- lifecycle ----------------------------------------------------------------

    async def run_forever(self, stop: asyncio.Event) -> None:
        """Run epochs every ``epoch_s`` until ``stop``; an epoch in flight when
        ``stop`` fires is cancelled (its inputs are bounded, but exit should not
        wait for them). Missed deadlines are logged and counted, then skipped."""
        period = self.config.epoch_s
        deadline = self.clock()
        while not stop.is_set():
            work = asyncio.create_task(self.run_epoch())
            stopper = asyncio.create_task(stop.wait())
            done, _ = await asyncio.wait({work, stopper}, return_when=asyncio.FIRST_COMPLETED)
            if work not in done:
                work.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await work
                log.info("epoch_cancelled_by_stop", epoch=self.epoch)
                return
            stopper.cancel()
            work.result()
            deadline += period
            now = self.clock()
            if now > deadline:
                missed = int((now - deadline) // period) + 1
                deadline += missed * period
                self.metrics.missed.labels(self.config.instance).inc(missed)
                log.warning("missed_epochs", missed=missed, epoch=self.epoch, period_s=period)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=max(deadline - now, 0.0))

    async def shutdown(self) -> bool:
        """Reset the clocks, then write the last epoch's record; True if the reset worked.

        The reset comes first so nothing after it (a full disk under the report, a
        hung GPU read) can skip it; before it, GPU calls still in flight (a
        ``set_locked_clock`` whose epoch was cancelled) are waited for, bounded, so
        a late one cannot land on top of the reset.
        """
        self.notifier.stopping()
        await wait_gpu_idle(self.backend, 2 * self.config.gpu_timeout_s)
        reset_ok = await reset_clocks(self.backend)
        try:
            self._close(self.clock(), await read_gpus(self.backend, self.metrics))
        except Exception as exc:  # the report is best effort; the clocks are not
            log.error("final_epoch_record_failed", error=repr(exc)[:300])
        return reset_ok

    def status_line(self) -> str:
        parts = [f"{self.config.instance}: epoch {self.epoch}"]
        if self.last_decision is not None:
            d = self.last_decision
            parts.append(f"clock {d.clock_mhz} MHz, U {d.usage_tokens}/{d.capacity_tokens}")
        if self.mode == "standalone":
            parts.append("standalone (no router): U from vLLM KV usage, no SLO boost")
        if not self.backend.controls:
            parts.append("observe mode: clocks are not changed")
        if self.failsafe_reason:
            parts.append(f"FAILSAFE max clock ({self.failsafe_reason} stale)")
        if self.cap.cap_mhz is not None:
            parts.append(f"fleet budget cap {self.cap.cap_mhz} MHz")
        return "; ".join(parts)

    def health(self) -> tuple[bool, dict[str, Any]]:
        """Healthy while epochs keep completing (within three periods)."""
        now = self.clock()
        since = self._last_epoch_end_s if self._last_epoch_end_s is not None else self._started_s
        age = now - since
        ok = age <= 3 * self.config.epoch_s + self.config.http_timeout_s
        return ok, {
            "ok": ok,
            "instance": self.config.instance,
            "mode": self.mode,
            "failsafe": self.failsafe_reason,
            "epoch": self.epoch,
            "seconds_since_epoch": round(age, 3),
            "backend": self.backend.name,
            "controls_clocks": self.backend.controls,
            "policy": self.controller.name,
            "applied_clock_mhz": self.applied_clock_mhz,
            "clock_cap_mhz": self.cap.cap_mhz,
            "applied_under_cap_mhz": self.applied_under_cap_mhz,
            "budget_conflict": self.cap.conflict,
            "status": self.status_line(),
        }


def _with_clock(decision: ControlDecision, level: int, clock_mhz: int) -> ControlDecision:
    return dataclasses.replace(decision, level=level, clock_mhz=clock_mhz)

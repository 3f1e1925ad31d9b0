"""The daemon's Prometheus metrics, on a registry it owns (never the global one),
so several daemons or tests in one process never collide."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from controllers.types import ControlDecision
from kairos_common.views import ModelReport
from reporting.records import EpochRecord


class DaemonMetrics:
    """Gauges and counters updated once per epoch by the loop."""

    def __init__(self, instance: str, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r, lbl = self.registry, ["instance"]

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, lbl, registry=r)

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, lbl, registry=r)

        self.power_w = gauge("kairosd_power_watts", "Average GPU power over the last epoch")
        self.instant_power_w = gauge("kairosd_instant_power_watts", "Instant GPU power (sum)")
        self.energy_j = counter("kairosd_energy_joules", "GPU energy measured since start")
        self.target_clock = gauge("kairosd_target_clock_mhz", "Clock the controller chose")
        self.actual_clock = gauge("kairosd_actual_clock_mhz", "Clock the GPU reported")
        self.usage = gauge("kairosd_usage_tokens", "U: context tokens of ongoing agents")
        self.capacity = gauge("kairosd_capacity_tokens", "U_max: KV token capacity")
        self.level_tokens = gauge(
            "kairosd_level_tokens",
            "Context Eq. 9 set the clock from: the working set, or its recent mean while calm",
        )
        self.offload = gauge(
            "kairosd_offload_tokens",
            "vLLM's CPU KV tier in tokens, as the law counts it (0 = none)",
        )
        self.ongoing = gauge("kairosd_ongoing_agents", "Admitted agents on this instance")
        self.pending = gauge("kairosd_pending_agents", "Agents held at the router")
        self.boost = gauge("kairosd_boost", "1 while an SLO boost is active")
        self.boosts = counter("kairosd_boost_epochs", "Epochs with an SLO boost")
        self.prefill_epochs = counter(
            "kairosd_prefill_epochs", "Epochs at the top clock for queued prefill work"
        )
        self.busy_floor_epochs = counter(
            "kairosd_busy_floor_epochs", "Epochs lifted to the memory knee for long-context work"
        )
        self.busy_ceiling_epochs = counter(
            "kairosd_busy_ceiling_epochs",
            "Epochs held at the memory knee for long-context decode (Eq. 9 asked for more)",
        )
        self.admissions = counter("kairosd_admissions", "Agents admitted by the router on our word")
        self.deferred = gauge("kairosd_deferred", "1 while new admissions are deferred")
        self.failsafe = gauge("kairosd_failsafe", "1 while inputs are stale (max clock)")
        self.epochs = counter("kairosd_epochs", "Completed control epochs")
        self.missed = counter("kairosd_missed_epochs", "Epoch deadlines missed")
        self.input_errors = Counter(
            "kairosd_input_errors", "Failed epoch inputs", ["instance", "input"], registry=r
        )
        self.model_error = gauge(
            "kairosd_model_error_ratio",
            "Online performance model's mean absolute percentage error (predictive policy)",
        )
        self.model_observations = gauge(
            "kairosd_model_observations", "Requests the online performance model has learned from"
        )
        self.slo_slack = gauge(
            "kairosd_predicted_slo_slack", "Predicted SLO margin at the chosen clock (predictive)"
        )
        self.clock_cap = gauge(
            "kairosd_clock_cap_mhz", "Fleet power budget's clock cap from the router (0 = none)"
        )
        self.budget_conflict = gauge(
            "kairosd_budget_conflict", "1 while the router reports the fleet cap and SLO conflict"
        )
        self.capped_epochs = counter(
            "kairosd_budget_capped_epochs", "Epochs whose clock the fleet budget lowered"
        )
        self.epoch_duration = Histogram(
            "kairosd_epoch_duration_seconds",
            "Wall time of one epoch's work (inputs, decision, actuation)",
            lbl,
            buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
            registry=r,
        )
        self.instance = instance

    def observe_record(self, rec: EpochRecord, instant_power_w: float | None) -> None:
        i = self.instance
        self.power_w.labels(i).set(rec.avg_power_w)
        if instant_power_w is not None:
            self.instant_power_w.labels(i).set(instant_power_w)
        if rec.energy_j > 0:
            self.energy_j.labels(i).inc(rec.energy_j)
        self.target_clock.labels(i).set(rec.target_clock_mhz)
        if rec.actual_clock_mhz is not None:
            self.actual_clock.labels(i).set(rec.actual_clock_mhz)
        self.usage.labels(i).set(rec.usage_tokens)
        self.capacity.labels(i).set(rec.capacity_tokens)
        self.ongoing.labels(i).set(rec.ongoing)
        self.pending.labels(i).set(rec.pending)
        self.boost.labels(i).set(1 if rec.boost else 0)
        self.deferred.labels(i).set(1 if rec.deferred else 0)
        if rec.boost:
            self.boosts.labels(i).inc()
        if "prefill" in rec.reason:  # also under a fail-safe or budget-cap prefix
            self.prefill_epochs.labels(i).inc()
        if "busy-floor" in rec.reason:
            self.busy_floor_epochs.labels(i).inc()
        if "busy-ceiling" in rec.reason:
            self.busy_ceiling_epochs.labels(i).inc()
        self.admissions.labels(i).inc(rec.admitted)
        self.epochs.labels(i).inc()

    def observe_report(self, report: ModelReport | None) -> None:
        """Export what a learning controller reports about itself (docs/beyond.md §5)."""
        if report is None:
            return
        i = self.instance
        if report.model_error is not None:
            self.model_error.labels(i).set(report.model_error)
        self.model_observations.labels(i).set(report.model_observations)
        if report.slo_slack is not None:
            self.slo_slack.labels(i).set(report.slo_slack)

    def observe_decision(self, decision: ControlDecision) -> None:
        """Export what the controller says about its own decision: a learning
        controller's report (docs/beyond.md §5) and the context Eq. 9 read (point 17)."""
        self.observe_report(decision.report)
        if decision.level_tokens is not None:
            self.level_tokens.labels(self.instance).set(decision.level_tokens)

    def observe_offload(self, offload_tokens: int) -> None:
        self.offload.labels(self.instance).set(offload_tokens)

    def observe_cap(self, cap_mhz: int | None, conflict: bool) -> None:
        self.clock_cap.labels(self.instance).set(cap_mhz or 0)
        self.budget_conflict.labels(self.instance).set(1 if conflict else 0)

    def input_error(self, which: str) -> None:
        self.input_errors.labels(self.instance, which).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)

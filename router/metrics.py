"""Prometheus metrics of the router, on their own ``CollectorRegistry``.

Names are documented in ``docs/router.md`` (the Grafana dashboard is built from
them). Per-instance gauges (U, U_max, ongoing, pending, health) are produced at
scrape time from the live state by :class:`StateCollector`, so the request hot
path pays nothing for them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from router.hot_metrics import HotCounter, HotHistogram

LATENCY_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
OVERHEAD_BUCKETS_S = (
    0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1,
)  # fmt: skip
HOLD_BUCKETS_S = (0.01, 0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
THROUGHPUT_BUCKETS = (1, 5, 10, 15, 20, 25, 30, 40, 50, 75, 100, 150, 200, 500)


@dataclass(frozen=True, slots=True)
class InstanceGauges:
    """One instance's state at scrape time."""

    name: str
    usage_tokens: int
    capacity_tokens: int | None
    ongoing: int
    pending: int
    healthy: bool
    draining: bool
    daemon_fresh: bool


class StateCollector(Collector):
    """Yields the per-instance gauges from a snapshot callback."""

    def __init__(self, snapshot: Callable[[], Iterable[InstanceGauges]]) -> None:
        self._snapshot = snapshot

    def collect(self) -> Iterable[Metric]:
        def family(name: str, doc: str) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, doc, labels=["instance"])

        usage = family("kairos_router_instance_usage_tokens", "U_i: sum of ongoing contexts")
        cap = family("kairos_router_instance_capacity_tokens", "U_max: KV token capacity")
        ongoing = family("kairos_router_ongoing_agents", "Admitted agents per instance")
        pending = family("kairos_router_pending_agents", "Held agents per instance")
        healthy = family("kairos_router_instance_healthy", "1 when the health check passes")
        draining = family("kairos_router_instance_draining", "1 when draining")
        daemon = family("kairos_router_daemon_fresh", "1 while a kairosd decision is valid")
        for g in self._snapshot():
            labels = [g.name]
            usage.add_metric(labels, g.usage_tokens)
            if g.capacity_tokens is not None:
                cap.add_metric(labels, g.capacity_tokens)
            ongoing.add_metric(labels, g.ongoing)
            pending.add_metric(labels, g.pending)
            healthy.add_metric(labels, 1.0 if g.healthy else 0.0)
            draining.add_metric(labels, 1.0 if g.draining else 0.0)
            daemon.add_metric(labels, 1.0 if g.daemon_fresh else 0.0)
        yield from (usage, cap, ongoing, pending, healthy, draining, daemon)


class RouterMetrics:
    """All router metrics; one instance per router app (no global registry)."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry(auto_describe=True)
        self.requests = HotCounter(
            "kairos_router_requests",
            "Proxied requests by route and final HTTP status",
            ["route", "code"],
            registry=r,
        )
        self.errors = Counter(
            "kairos_router_errors",
            "Requests that failed, by route and reason",
            ["route", "reason"],
            registry=r,
        )
        self.latency = HotHistogram(
            "kairos_router_request_duration_seconds",
            "Arrival at the router to last byte (includes hold time)",
            ["route", "stream"],
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )
        self.overhead = HotHistogram(
            "kairos_router_overhead_seconds",
            "Router time before the upstream request is sent, excluding hold time",
            ["route"],
            buckets=OVERHEAD_BUCKETS_S,
            registry=r,
        )
        self.ttfb = HotHistogram(
            "kairos_router_upstream_first_byte_seconds",
            "Upstream request sent to response headers received",
            ["instance"],
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )
        self.hold_wait = Histogram(
            "kairos_router_hold_wait_seconds",
            "Time an agent's request waited in the admission hold queue",
            ["instance"],
            buckets=HOLD_BUCKETS_S,
            registry=r,
        )
        self.hold_rejections = Counter(
            "kairos_router_hold_rejections",
            "Held requests rejected (queue_full → 429, timeout → 503)",
            ["instance", "reason"],
            registry=r,
        )
        self.admissions = HotCounter(
            "kairos_router_admissions",
            "Agents admitted, by source (fast_path, daemon, local)",
            ["instance", "source"],
            registry=r,
        )
        self.decisions = Counter(
            "kairos_router_daemon_decisions",
            "Admission decisions received from kairosd, by result",
            ["instance", "result"],
            registry=r,
        )
        self.overflow_holds = Counter(
            "kairos_router_overflow_holds",
            "Admitted agents whose request would overflow their instance's KV cache "
            "and that went back to its hold queue (docs/control-law.md, point 16)",
            ["instance"],
            registry=r,
        )
        self.reassignments = Counter(
            "kairos_router_reassignments",
            "Agents moved between instances (Algorithm 3, overflow, confident, room, failure)",
            ["source", "target", "reason"],
            registry=r,
        )
        self.retries = Counter(
            "kairos_router_upstream_retries",
            "Attempts retried on another instance before the first byte",
            ["instance", "reason"],
            registry=r,
        )
        self.tokens = HotCounter(
            "kairos_router_tokens",
            "Tokens accounted from usage, by instance and kind (prompt, completion)",
            ["instance", "kind"],
            registry=r,
        )
        self.usage_estimated = HotCounter(
            "kairos_router_usage_estimated",
            "Responses without usage whose tokens were estimated",
            ["instance"],
            registry=r,
        )
        self.agents_started = HotCounter(
            "kairos_router_agents_started", "Agents started", ["source"], registry=r
        )
        self.agents_ended = Counter(
            "kairos_router_agents_ended", "Agents ended, by reason", ["reason"], registry=r
        )
        self.agent_throughput = Histogram(
            "kairos_router_agent_throughput_tokens_per_second",
            "Per-agent Eq. 3 throughput at agent end",
            buckets=THROUGHPUT_BUCKETS,
            registry=r,
        )
        self.body_bytes_per_token = Gauge(
            "kairos_router_body_bytes_per_token",
            "Request body bytes per prompt token the router sizes requests by, "
            "learned from agents' first requests (router/token_ratio.py)",
            registry=r,
        )

    def attach_state(self, snapshot: Callable[[], Iterable[InstanceGauges]]) -> None:
        self.registry.register(StateCollector(snapshot))

    def render(self) -> bytes:
        return generate_latest(self.registry)


class FleetMetrics:
    """The fleet power budget's state (``router/fleet_budget.py``), set once per round.

    Registered on the router's registry only when a budget is configured, so a
    router without one exports no misleading zero cap."""

    def __init__(self, r: CollectorRegistry) -> None:
        self.cap_w = Gauge(
            "kairos_router_fleet_cap_watts", "Configured fleet power cap", registry=r
        )
        self.predicted_w = Gauge(
            "kairos_router_fleet_predicted_power_watts",
            "Predicted fleet power at the allocated clocks (incl. reserved)",
            registry=r,
        )
        self.measured_w = Gauge(
            "kairos_router_fleet_measured_power_watts",
            "Sum of every instance's last reported epoch power",
            registry=r,
        )
        self.reserved_w = Gauge(
            "kairos_router_fleet_reserved_power_watts",
            "Power counted but not controllable (stale daemons, observe mode)",
            registry=r,
        )
        self.conflict = Gauge(
            "kairos_router_fleet_conflict", "1 while the cap and the SLO conflict", registry=r
        )
        self.rounds = Counter(
            "kairos_router_fleet_rounds", "Fleet budget allocations run", registry=r
        )
        self.conflict_rounds = Counter(
            "kairos_router_fleet_conflict_rounds",
            "Allocations where meeting the cap needed an SLO-unsafe step or was impossible",
            registry=r,
        )
        self.clock_cap = Gauge(
            "kairos_router_fleet_clock_cap_mhz",
            "Clock cap sent to the instance's daemon (0 = no cap)",
            ["instance"],
            registry=r,
        )

"""The Grafana dashboard and Prometheus scrape example use real names and ports.

Metric names come from the components' own registries, built in-process exactly
as the programs build them (kairosd's ``DaemonMetrics``, the router's
``RouterMetrics`` with its per-instance state collector, and the fake vLLM that
mirrors vLLM's exporter), so a renamed metric fails here instead of leaving an
empty panel.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from kairos_common.config import load_config
from kairosd.config import ENV_PREFIX as KAIROSD_ENV
from kairosd.config import KairosdConfig
from kairosd.metrics import DaemonMetrics
from router.config import ENV_PREFIX as ROUTER_ENV
from router.config import RouterConfig, parse_backend
from router.metrics import THROUGHPUT_BUCKETS, FleetMetrics, RouterMetrics
from simulator.fakevllm import FakeVllm, FakeVllmConfig
from tests.deploy.units import ETC, ROOT, read_env_file

MONITORING = ROOT / "docs" / "monitoring"
DASHBOARD = MONITORING / "grafana-dashboard.json"
PROMETHEUS = MONITORING / "prometheus.yml"
METRIC_RE = re.compile(r"(?<![\w:])(kairosd_\w+|kairos_router_\w+|vllm:[\w:]+)")

SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "summary": ("", "_sum", "_count", "_created"),
    "gauge": ("",),
    "info": ("_info",),
}


def sample_names(registry: CollectorRegistry) -> set[str]:
    """Every series name the registry can export (families may have no children yet)."""
    names: set[str] = set()
    for family in registry.collect():
        names.update(family.name + s for s in SUFFIXES.get(family.type, ("",)))
    return names


@pytest.fixture(scope="module")
def exported() -> set[str]:
    daemon = DaemonMetrics("gpu0")
    router = RouterMetrics()
    router.attach_state(list)  # the per-instance gauges, produced at scrape time
    FleetMetrics(router.registry)  # registered when [fleet_budget] cap_w is set
    vllm = FakeVllm(FakeVllmConfig())
    return (
        sample_names(daemon.registry) | sample_names(router.registry) | sample_names(vllm.registry)
    )


def dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return data


def panels(data: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in data["panels"]:
        yield panel
        yield from panel.get("panels", [])


def expressions(data: dict[str, Any]) -> list[tuple[str, str]]:
    return [
        (panel["title"], target["expr"])
        for panel in panels(data)
        for target in panel.get("targets", [])
    ]


def test_the_registries_expose_the_documented_families(exported: set[str]) -> None:
    """Guards the name source itself: empty registries would make the next test vacuous."""
    assert {"kairosd_power_watts", "kairos_router_pending_agents"} <= exported
    assert "kairos_router_agent_throughput_tokens_per_second_bucket" in exported
    assert "vllm:kv_cache_usage_perc" in exported


def test_every_metric_in_the_dashboard_is_exported(exported: set[str]) -> None:
    used: dict[str, str] = {}
    for title, expr in expressions(dashboard()):
        for name in METRIC_RE.findall(expr):
            used.setdefault(name, title)
    unknown = {name: title for name, title in used.items() if name not in exported}
    assert not unknown, f"dashboard queries metrics nobody exports: {unknown}"
    prefixes = {name.split("_")[0].split(":")[0] for name in used}
    assert prefixes == {"kairosd", "kairos", "vllm"}, prefixes


def test_the_dashboard_covers_what_an_operator_watches() -> None:
    data = dashboard()
    exprs = " ".join(e for _, e in expressions(data))
    for needed in (
        "kairosd_power_watts",  # power
        "kairosd_actual_clock_mhz",  # clock
        "kairosd_usage_tokens",  # context ...
        "kairosd_capacity_tokens",  # ... vs capacity
        "kairosd_pending_agents",  # pending agents
        "kairos_router_agent_throughput_tokens_per_second_bucket",  # throughput vs SLO
        "kairosd_boost",  # boosts
        "kairos_router_admissions_total",  # admissions
    ):
        assert needed in exprs, needed
    titles = [p["title"] for p in panels(data)]
    assert len(titles) == len(set(titles)), "duplicate panel titles"
    assert all(p.get("datasource") for p in panels(data) if p["type"] != "row")


def throughput_bounds() -> set[str]:
    """The ``le`` strings the router exports for agent throughput, as scraped."""
    metrics = RouterMetrics()
    metrics.agent_throughput.observe(1.0)
    exposition = metrics.render().decode()
    return set(re.findall(r'agent_throughput_tokens_per_second_bucket\{le="([^"]+)"\}', exposition))


def test_slo_choices_are_exported_bucket_bounds() -> None:
    """``le="$slo"`` matches only the exact string Prometheus scrapes (``20.0``)."""
    bounds = throughput_bounds()
    assert len(bounds) == len(THROUGHPUT_BUCKETS) + 1  # + "+Inf"
    slo = next(v for v in dashboard()["templating"]["list"] if v["name"] == "slo")
    offered = {o["value"] for o in slo["options"]}
    assert offered <= bounds, offered - bounds
    assert float(slo["current"]["value"]) == RouterConfig().slo_tok_s


def test_label_values_in_selectors_are_ones_the_router_exports() -> None:
    """``kind="completion"`` etc.: a misspelt value silently selects nothing."""
    known = {"kind": {"prompt", "completion"}}
    checked = 0
    for title, expr in expressions(dashboard()):
        for label, value in re.findall(r'(\w+)="([^"$]*)"', expr):
            if label in known:
                assert value in known[label], (title, label, value)
                checked += 1
    assert checked, "no kind= selector was checked"


def scrape_targets() -> dict[str, list[str]]:
    """``job_name`` → targets, read line by line (the file is plain block YAML)."""
    jobs: dict[str, list[str]] = {}
    job = ""
    for line in PROMETHEUS.read_text(encoding="utf-8").splitlines():
        code = line.split("#", 1)[0]
        if m := re.search(r"job_name:\s*(\S+)", code):
            job = m.group(1)
            jobs[job] = []
        jobs.setdefault(job, []).extend(re.findall(r'"([\w.\-]+:\d+)"', code))
    return jobs


def test_scrape_config_matches_the_example_configs() -> None:
    jobs = scrape_targets()
    text = PROMETHEUS.read_text(encoding="utf-8")
    daemons = [
        load_config(KairosdConfig, path=p, env_prefix=KAIROSD_ENV, env={})
        for p in sorted(ETC.glob("kairosd-*.toml"))
    ]
    assert sorted(jobs["kairosd"]) == sorted(f"{d.listen_host}:{d.listen_port}" for d in daemons)
    router = load_config(
        RouterConfig, path=ETC / "kairos-router.toml", env_prefix=ROUTER_ENV, env={}
    )
    assert jobs["kairos-router"] == [f"{router.host}:{router.port}"]
    backends = [parse_backend(b, i)[1] for i, b in enumerate(router.backends)]
    assert sorted(jobs["vllm"]) == sorted(b.removeprefix("http://") for b in backends)
    ports = sorted(read_env_file(p)["VLLM_PORT"] for p in ETC.glob("vllm-*.env"))
    assert ports == sorted(t.rsplit(":", 1)[1] for t in jobs["vllm"])
    # Our series carry their own `instance` label; Prometheus must keep it.
    assert text.count("honor_labels: true") == 2


def test_the_dashboard_is_importable_json() -> None:
    data = dashboard()
    assert data["uid"] and data["title"] and data["schemaVersion"] >= 30
    names = {v["name"] for v in data["templating"]["list"]}
    used = set(re.findall(r"\$(\w+)", json.dumps(data["panels"])))
    assert used - {"__range", "__interval", "__rate_interval"} <= names


ALERTS = MONITORING / "alerts.yml"


def alert_rules() -> list[dict[str, str]]:
    """Each rule's fields, read line by line (plain block YAML, one-line values)."""
    rules: list[dict[str, str]] = []
    for line in ALERTS.read_text(encoding="utf-8").splitlines():
        if line.lstrip().startswith("#"):
            continue
        if m := re.match(r"\s*- alert: (\w+)$", line):
            rules.append({"alert": m.group(1)})
        elif rules and (m := re.match(r"\s+(expr|for|severity|summary|description): (.+)$", line)):
            rules[-1][m.group(1)] = m.group(2).strip().strip('"')
    return rules


def test_every_alert_is_complete_and_queries_exported_metrics(exported: set[str]) -> None:
    rules = alert_rules()
    assert len(rules) >= 8
    assert len({r["alert"] for r in rules}) == len(rules), "duplicate alert names"
    jobs = scrape_targets()
    for rule in rules:
        name = rule["alert"]
        assert {"expr", "for", "severity", "summary", "description"} <= rule.keys(), name
        assert rule["severity"] in {"page", "warning"}, name
        assert re.fullmatch(r"\d+[smh]", rule["for"]), name
        expr = rule["expr"]
        assert expr.count("(") == expr.count(")") and expr.count("[") == expr.count("]"), name
        unknown = [m for m in METRIC_RE.findall(expr) if m not in exported]
        assert not unknown, f"{name} queries metrics nobody exports: {unknown}"
        for job in re.findall(r'up\{job="([^"]+)"\}', expr):
            assert job in jobs, f"{name}: no scrape job {job!r}"
        assert METRIC_RE.search(expr) or "up{" in expr, name
    assert "rule_files:\n  - alerts.yml" in PROMETHEUS.read_text(encoding="utf-8")


def test_alert_label_values_are_ones_the_components_export() -> None:
    """A misspelt ``reason`` or a bucket bound that is never exported selects
    nothing, and the alert can never fire."""
    bounds = throughput_bounds()
    reasons = {"queue_full", "timeout"}  # kairos_router_hold_rejections_total (docs/router.md)
    checked: set[str] = set()
    for rule in alert_rules():
        for label, value in re.findall(r'(\w+)="([^"]*)"', rule["expr"]):
            if label == "le":
                assert value in bounds, (rule["alert"], value)
            elif label == "reason":
                assert value in reasons, (rule["alert"], value)
            checked.add(label)
    assert {"le", "reason"} <= checked, checked  # both kinds of selector were read

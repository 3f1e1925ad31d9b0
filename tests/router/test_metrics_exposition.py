"""The hot path's counters and histograms expose what prometheus_client would."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from router.hot_metrics import HotCounter, HotHistogram

BUCKETS = (0.005, 0.01, 0.5, 1, 300)


def _without_created(text: bytes) -> list[str]:
    return [line for line in text.decode().splitlines() if "_created" not in line]


def test_same_exposition_as_prometheus_client() -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    hc = HotCounter("x_requests", "doc", ["route", "code"], registry=ours)
    pc = Counter("x_requests", "doc", ["route", "code"], registry=theirs)
    hh = HotHistogram("x_seconds", "doc", ["route"], registry=ours, buckets=BUCKETS)
    ph = Histogram("x_seconds", "doc", ["route"], registry=theirs, buckets=BUCKETS)
    for route, code, amount in (("chat", "200", 1), ("chat", "200", 2.5), ("resp", "502", 1)):
        hc.labels(route, code).inc(amount)
        pc.labels(route, code).inc(amount)
    # On a bound, just above and below it, far above the last one, and zero.
    for route, value in (("chat", 0.01), ("chat", 0.0100001), ("chat", 0.004), ("resp", 1e4),
                         ("resp", 0.0)):  # fmt: skip
        hh.labels(route).observe(value)
        ph.labels(route).observe(value)
    assert _without_created(generate_latest(ours)) == _without_created(generate_latest(theirs))
    assert sum("_created" in line for line in generate_latest(ours).decode().splitlines()) == sum(
        "_created" in line for line in generate_latest(theirs).decode().splitlines()
    )


def test_wrong_label_count_is_refused() -> None:
    hc = HotCounter("y", "doc", ["a"], registry=CollectorRegistry())
    with pytest.raises(ValueError, match="takes labels"):
        hc.labels("1", "2")

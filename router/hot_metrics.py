"""Counters and histograms for the request hot path, exposed at scrape time.

``prometheus_client``'s ``Counter.inc`` and ``Histogram.observe`` take a lock and
validate on every call (0.7 and 1.3 µs here); the router updates about eight of
them per request, on one event loop thread where the lock guards nothing. These
keep plain numbers per label tuple (a histogram's bucket is found with
``bisect``, in C) and build the same exposition as ``prometheus_client`` would
(``_total``/``_created``; ``_bucket``/``_count``/``_sum``/``_created``) only when
``/metrics`` is scraped. Not thread-safe by design: every update runs on the
router's event loop.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable, Iterable, Sequence
from typing import cast

from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

# ``le`` label values written as prometheus_client writes them (untyped upstream).
_go_float = cast(Callable[[float], str], floatToGoString)


class CounterChild:
    """One label combination of a :class:`HotCounter`."""

    __slots__ = ("created_s", "value")

    def __init__(self) -> None:
        self.value = 0.0
        self.created_s = time.time()

    def inc(self, amount: float = 1.0) -> None:
        self.value += amount


class HistogramChild:
    """One label combination of a :class:`HotHistogram`."""

    __slots__ = ("_bounds", "counts", "created_s", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        self._bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last one is +Inf
        self.sum = 0.0
        self.created_s = time.time()

    def observe(self, amount: float) -> None:
        # bisect_left: a value equal to a bound falls in that bucket (le = "≤").
        self.counts[bisect.bisect_left(self._bounds, amount)] += 1
        self.sum += amount


class _Family(Collector):
    def __init__(self, name: str, doc: str, labelnames: Sequence[str]) -> None:
        self.name = name
        self.doc = doc
        self.labelnames = tuple(labelnames)

    def _check(self, values: tuple[str, ...]) -> None:
        if len(values) != len(self.labelnames):
            raise ValueError(f"{self.name} takes labels {self.labelnames}, got {values}")


class HotCounter(_Family):
    """A labelled counter: ``labels(*values).inc(amount)``."""

    def __init__(
        self, name: str, doc: str, labelnames: Sequence[str], registry: CollectorRegistry
    ) -> None:
        super().__init__(name, doc, labelnames)
        self._children: dict[tuple[str, ...], CounterChild] = {}
        registry.register(self)  # last: registering collects once (auto_describe)

    def labels(self, *values: str) -> CounterChild:
        child = self._children.get(values)
        if child is None:
            self._check(values)
            child = self._children[values] = CounterChild()
        return child

    def collect(self) -> Iterable[Metric]:
        family = Metric(self.name, self.doc, "counter")
        for values, child in list(self._children.items()):
            labels = dict(zip(self.labelnames, values, strict=True))
            family.add_sample(self.name + "_total", labels, child.value)
            family.add_sample(self.name + "_created", labels, child.created_s)
        yield family


class HotHistogram(_Family):
    """A labelled histogram: ``labels(*values).observe(amount)``."""

    def __init__(
        self,
        name: str,
        doc: str,
        labelnames: Sequence[str],
        registry: CollectorRegistry,
        buckets: Sequence[float],
    ) -> None:
        super().__init__(name, doc, labelnames)
        self.bounds = tuple(sorted(float(b) for b in buckets))
        self._le = [_go_float(b) for b in self.bounds] + ["+Inf"]
        self._children: dict[tuple[str, ...], HistogramChild] = {}
        registry.register(self)

    def labels(self, *values: str) -> HistogramChild:
        child = self._children.get(values)
        if child is None:
            self._check(values)
            child = self._children[values] = HistogramChild(self.bounds)
        return child

    def collect(self) -> Iterable[Metric]:
        family = Metric(self.name, self.doc, "histogram")
        for values, child in list(self._children.items()):
            labels = dict(zip(self.labelnames, values, strict=True))
            total = 0
            for le, count in zip(self._le, child.counts, strict=True):
                total += count
                family.add_sample(self.name + "_bucket", {**labels, "le": le}, total)
            family.add_sample(self.name + "_count", labels, total)
            family.add_sample(self.name + "_sum", labels, child.sum)
            family.add_sample(self.name + "_created", labels, child.created_s)
        yield family

"""Parse a vLLM ``/metrics`` page into a typed snapshot (text in, dataclass out).

Used by the daemon (KV capacity and usage for the control law) and the router
(capacity per instance), so it is pure: no HTTP, no clock, no logging. Parsing is
done by ``prometheus_client``'s own exposition-format parser rather than regexes,
so label escaping, ``_total`` suffixes and histogram series are handled correctly.

Facts it relies on (vLLM 0.33, V1 engine; docs/design.md §6):

* capacity: ``vllm:cache_config_info`` labels ``kv_cache_size_tokens`` (newer
  servers) or ``num_gpu_blocks × block_size`` (fallback). One sample per engine;
  capacities of distinct engines are summed.
* usage fraction: ``vllm:kv_cache_usage_perc`` (0–1), older servers
  ``vllm:gpu_cache_usage_perc``; averaged over engines.
* ``vllm:num_requests_running`` / ``vllm:num_requests_waiting`` gauges and the
  ``vllm:num_preemptions`` / ``vllm:prompt_tokens`` / ``vllm:generation_tokens``
  counters are summed over engines.
* ``--disable-log-stats`` removes every ``vllm:`` series; the page then only holds
  process metrics, which is reported as ``metrics_enabled = False``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from kairos_common.errors import KairosCommonError

_PREFIX = "vllm:"
_CACHE_INFO = "vllm:cache_config_info"
_USAGE_NAMES = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
_READ = frozenset(
    {
        *_USAGE_NAMES,
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:num_preemptions_total",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "vllm:prefix_cache_hits_total",
        "vllm:prefix_cache_queries_total",
    }
)
_MAX_LABEL = 1e15


class MetricsParseError(KairosCommonError, ValueError):
    """The text is not valid Prometheus exposition format, or a value the
    controllers read is not a finite number (NaN/±Inf: bad input)."""


@dataclass(frozen=True, slots=True)
class VllmMetrics:
    """What one scrape of a vLLM server says, in the units the controllers use.

    Every field is ``None`` when the server did not export it; counters are the
    server's cumulative totals (differencing is the caller's job).
    """

    metrics_enabled: bool
    capacity_tokens: int | None = None
    capacity_source: str | None = None
    kv_usage_frac: float | None = None
    num_running: int | None = None
    num_waiting: int | None = None
    preemptions_total: int | None = None
    prompt_tokens_total: int | None = None
    generation_tokens_total: int | None = None
    engines: tuple[str, ...] = ()
    model_names: tuple[str, ...] = ()
    """The served model names its series carry (vLLM's ``model_name`` label)."""
    kv_offloading_gib: float | None = None
    """GiB of CPU KV tier (``--kv-offloading-size``, the ``kv_offloading_size`` label
    of ``cache_config_info``): 0.0 when vLLM says it has none, None when it does
    not say (older vLLM)."""
    prefix_cache_hits_total: int | None = None
    """Prompt tokens served from the prefix cache (``vllm:prefix_cache_hits``)."""
    prefix_cache_queries_total: int | None = None
    """Prompt tokens looked up in the prefix cache (``vllm:prefix_cache_queries``)."""
    block_size: int | None = None
    """Tokens per KV block (``cache_config_info``'s ``block_size``; the first engine's)."""

    @property
    def usage_tokens(self) -> int | None:
        """KV tokens in use, ``kv_usage_frac × capacity_tokens`` (standalone ``U``)."""
        if self.capacity_tokens is None or self.kv_usage_frac is None:
            return None
        return round(min(max(self.kv_usage_frac, 0.0), 1.0) * self.capacity_tokens)


def _samples(text: str) -> list[Sample]:
    try:
        return [s for fam in text_string_to_metric_families(text) for s in fam.samples]
    except (ValueError, TypeError, IndexError, ArithmeticError) as exc:
        raise MetricsParseError(f"malformed Prometheus text: {exc}") from exc


def _check_finite(samples: Iterable[Sample]) -> None:
    """NaN/±Inf in a series the controllers read is bad input, not a number to use.

    (Histogram ``+Inf`` *bucket labels* are fine; only sample values are checked.)
    """
    for s in samples:
        if s.name in _READ and not math.isfinite(s.value):
            raise MetricsParseError(f"non-finite value {s.value} for {s.name}")


def _engine_key(sample: Sample) -> str:
    return sample.labels.get("engine", "") + "|" + sample.labels.get("model_name", "")


def _capacity_of(sample: Sample) -> tuple[int, str] | None:
    """One engine's capacity from a ``cache_config_info`` sample's labels."""
    labels = sample.labels
    raw = labels.get("kv_cache_size_tokens")
    if raw not in (None, "", "None"):
        try:
            return _label_int(raw), "kv_cache_size_tokens"
        except ValueError:
            pass
    try:
        blocks = _label_int(labels["num_gpu_blocks"])
        block_size = _label_int(labels["block_size"])
    except (KeyError, ValueError):
        return None
    return blocks * block_size, "num_gpu_blocks*block_size"


def _offloading_gib(samples: Iterable[Sample]) -> float | None:
    """Total ``kv_offloading_size`` over the engines' ``cache_config_info`` (vLLM
    writes ``None`` when it has no tier); None when no engine carries the label."""
    sizes = [s.labels["kv_offloading_size"] for s in samples if "kv_offloading_size" in s.labels]
    if not sizes:
        return None
    total = 0.0
    for raw in sizes:
        if raw in ("", "None"):
            continue
        try:
            total += _label_number(raw)
        except ValueError:
            return None  # unreadable: unknown, not "no tier"
    return total


def _label_number(raw: str) -> float:
    """A non-negative number label (``"192.0"``); ValueError otherwise, including
    for ``nan``/``inf`` and absurd sizes."""
    value = float(raw)
    if not math.isfinite(value) or not 0 <= value <= _MAX_LABEL:
        raise ValueError(f"label value {raw!r} out of range")
    return value


def _label_int(raw: str) -> int:
    """A non-negative integer label (``"4096"`` or ``"4096.0"``), as :func:`_label_number`."""
    return int(_label_number(raw))


def _sum(samples: Iterable[Sample], name: str) -> int | None:
    values = [s.value for s in samples if s.name == name]
    return round(sum(values)) if values else None


def parse_vllm_metrics(text: str) -> VllmMetrics:
    """Parse ``text`` (a ``/metrics`` body); raises :class:`MetricsParseError`."""
    samples = [s for s in _samples(text) if s.name.startswith(_PREFIX)]
    if not samples:
        return VllmMetrics(metrics_enabled=False)
    _check_finite(samples)

    capacities: dict[str, tuple[int, str]] = {}
    for s in samples:
        if s.name == _CACHE_INFO:
            cap = _capacity_of(s)
            if cap is not None:
                capacities[_engine_key(s)] = cap
    capacity = sum(c for c, _ in capacities.values()) if capacities else None
    sources = sorted({src for _, src in capacities.values()})

    usage: float | None = None
    for name in _USAGE_NAMES:
        values = [s.value for s in samples if s.name == name]
        if values:
            usage = sum(values) / len(values)
            break

    engines = sorted({s.labels["engine"] for s in samples if "engine" in s.labels})
    models = sorted({s.labels["model_name"] for s in samples if s.labels.get("model_name")})
    return VllmMetrics(
        metrics_enabled=True,
        capacity_tokens=capacity if capacity and capacity > 0 else None,
        capacity_source=",".join(sources) if sources else None,
        kv_usage_frac=usage,
        num_running=_sum(samples, "vllm:num_requests_running"),
        num_waiting=_sum(samples, "vllm:num_requests_waiting"),
        preemptions_total=_sum(samples, "vllm:num_preemptions_total"),
        prompt_tokens_total=_sum(samples, "vllm:prompt_tokens_total"),
        generation_tokens_total=_sum(samples, "vllm:generation_tokens_total"),
        engines=tuple(engines),
        model_names=tuple(models),
        kv_offloading_gib=_offloading_gib(s for s in samples if s.name == _CACHE_INFO),
        prefix_cache_hits_total=_sum(samples, "vllm:prefix_cache_hits_total"),
        prefix_cache_queries_total=_sum(samples, "vllm:prefix_cache_queries_total"),
        block_size=_block_size(s for s in samples if s.name == _CACHE_INFO),
    )


def _block_size(samples: Iterable[Sample]) -> int | None:
    for s in samples:
        try:
            return _label_int(s.labels["block_size"]) or None
        except (KeyError, ValueError):
            continue
    return None

from __future__ import annotations

import pytest

from kairos_common.vllm_metrics import MetricsParseError, parse_vllm_metrics
from kairosd.testing import VllmState, vllm_metrics_text


def test_parses_capacity_usage_queue_and_counters() -> None:
    state = VllmState(
        capacity_tokens=160_000,
        kv_usage_frac=0.25,
        running=7,
        waiting=2,
        preemptions_total=3,
        generation_tokens_total=1234,
        prompt_tokens_total=99,
    )
    m = parse_vllm_metrics(vllm_metrics_text(state))
    assert m.metrics_enabled
    assert m.capacity_tokens == 160_000
    assert m.capacity_source == "kv_cache_size_tokens"
    assert m.kv_usage_frac == pytest.approx(0.25)
    assert m.usage_tokens == 40_000
    assert (m.num_running, m.num_waiting) == (7, 2)
    assert (m.preemptions_total, m.generation_tokens_total, m.prompt_tokens_total) == (3, 1234, 99)
    assert m.engines == ("0",)
    assert m.model_names == ("fake",)


def test_legacy_names_fall_back_to_blocks_times_block_size() -> None:
    m = parse_vllm_metrics(
        vllm_metrics_text(VllmState(capacity_tokens=32_000, kv_usage_frac=0.5, legacy_names=True))
    )
    assert m.capacity_tokens == 32_000
    assert m.capacity_source == "num_gpu_blocks*block_size"
    assert m.kv_usage_frac == pytest.approx(0.5)


def test_data_parallel_engines_sum_capacity_and_average_usage() -> None:
    text = "\n".join(
        [
            "# TYPE vllm:cache_config_info gauge",
            'vllm:cache_config_info{engine="0",kv_cache_size_tokens="1000",block_size="16"} 1',
            'vllm:cache_config_info{engine="1",kv_cache_size_tokens="3000",block_size="16"} 1',
            "# TYPE vllm:kv_cache_usage_perc gauge",
            'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.2',
            'vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.4',
            "# TYPE vllm:num_requests_running gauge",
            'vllm:num_requests_running{engine="0",model_name="m"} 2',
            'vllm:num_requests_running{engine="1",model_name="m"} 3',
            "",
        ]
    )
    m = parse_vllm_metrics(text)
    assert m.capacity_tokens == 4000
    assert m.kv_usage_frac == pytest.approx(0.3)
    assert m.num_running == 5
    assert m.engines == ("0", "1")


def test_disabled_log_stats_is_detected() -> None:
    m = parse_vllm_metrics(
        "# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 1\n"
    )
    assert not m.metrics_enabled
    assert m.capacity_tokens is None and m.usage_tokens is None


def test_malformed_text_raises_parse_error() -> None:
    with pytest.raises(MetricsParseError):
        parse_vllm_metrics('vllm:kv_cache_usage_perc{engine="0" 0.5 oops\n')


@pytest.mark.parametrize(
    ("label", "gib"),
    [
        (None, None),
        ("None", 0.0),
        ("192.0", 192.0),
        ("0.5", 0.5),
        ("nan", None),
        ("-5", None),
        ("lots", None),
    ],
)
def test_cpu_kv_tier_from_cache_config_info(label: str | None, gib: float | None) -> None:
    """vLLM's ``kv_offloading_size`` label: absent (older vLLM) is unknown, ``None``
    is no tier, a size is GiB; an unreadable one is unknown, never "no tier"."""
    state = VllmState(capacity_tokens=16_000, kv_offloading_size=label)
    assert parse_vllm_metrics(vllm_metrics_text(state)).kv_offloading_gib == gib

"""kairosd reads vLLM's CPU KV tier (``kv_offloading_size``, GiB), turns it into
tokens for the control law and the router, and says once per change what it counts on."""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any

import aiohttp
import pytest
from structlog.testing import capture_logs

from controllers.frequency import FrequencyLevels
from controllers.kairos import KairosConfig
from controllers.registry import make_controller
from controllers.types import ControlDecision, Controller, InstanceSnapshot
from kairos_common.testing import ManualClock
from kairos_common.wire_fields import MAX_TOKENS
from kairosd.config import DEFAULT_KV_BYTES_PER_TOKEN
from kairosd.loop import Daemon
from kairosd.offload_check import OffloadCheck, offload_tokens_of, tier_unused_reason
from kairosd.testing import FakeRouter, ScriptedVllm
from tests.kairosd.conftest import CLOCKS, make_daemon

TIER_192_GIB_TOKENS = 192 * 2**30 // DEFAULT_KV_BYTES_PER_TOKEN  # 2_097_152


class RecordingController:
    """Passes every snapshot on to the daemon's own controller and keeps it."""

    def __init__(self, inner: Controller) -> None:
        self.inner = inner
        self.name = inner.name
        self.levels = inner.levels
        self.admission_control = inner.admission_control
        self.snapshots: list[InstanceSnapshot] = []

    def decide(self, snapshot: InstanceSnapshot) -> ControlDecision:
        self.snapshots.append(snapshot)
        return self.inner.decide(snapshot)


def recording(daemon: Daemon) -> RecordingController:
    rec = RecordingController(daemon.controller)
    daemon.controller = rec
    return rec


def tier_events(logs: list[MutableMapping[str, Any]]) -> list[MutableMapping[str, Any]]:
    return [e for e in logs if e["event"] == "kv_offloading_tier"]


def test_gib_to_tokens() -> None:
    assert offload_tokens_of(192.0, DEFAULT_KV_BYTES_PER_TOKEN) == TIER_192_GIB_TOKENS
    assert offload_tokens_of(1.5, 1024) == 1_572_864
    assert offload_tokens_of(0.0, DEFAULT_KV_BYTES_PER_TOKEN) == 0
    assert offload_tokens_of(None, DEFAULT_KV_BYTES_PER_TOKEN) == 0
    assert offload_tokens_of(1e15, 1) == MAX_TOKENS  # what the wire carries at most


def test_said_once_per_change_and_silent_when_nobody_says() -> None:
    check = OffloadCheck("kairos", unused_reason=None)
    with capture_logs() as logs:
        for gib in (None, None, 0.0, 192.0, 192.0, 0.0, 0.0, 192.0):
            check.observe(gib, offload_tokens_of(gib, DEFAULT_KV_BYTES_PER_TOKEN))
    said = tier_events(logs)
    assert [(e["kv_offloading_gib"], e["used"]) for e in said] == [
        (192.0, True),
        (0.0, False),
        (192.0, True),
    ]
    assert said[0]["log_level"] == "info" and said[0]["policy"] == "kairos"
    assert said[0]["offload_tokens"] == TIER_192_GIB_TOKENS and "point 13" in said[0]["hint"]


def test_a_policy_that_ignores_the_tier_says_so() -> None:
    check = OffloadCheck("kairos-paper", unused_reason="ignored")
    with capture_logs() as logs:
        check.observe(64.0, 1000)
    (said,) = tier_events(logs)
    assert not said["used"] and said["hint"] == "ignored"


@pytest.mark.parametrize(
    ("policy", "standalone", "uses_tier"),
    [
        ("kairos", False, True),
        ("kairos-no-ta", False, True),  # its clock's long-context ceiling reads the tier
        ("predictive", False, True),  # runs the KAIROS law underneath
        ("kairos-paper", False, False),
        ("no-control", False, False),
        ("fixed:1000", False, False),
        ("kairos", True, False),  # standalone: U is vLLM's measured usage
    ],
)
def test_which_policies_use_the_tier(policy: str, standalone: bool, uses_tier: bool) -> None:
    controller = make_controller(policy, FrequencyLevels.from_supported(CLOCKS))
    assert (tier_unused_reason(controller, standalone) is None) == uses_tier


async def test_daemon_sends_the_tier_in_tokens_to_its_controller_and_the_router(
    vllm: ScriptedVllm, router: FakeRouter, session: aiohttp.ClientSession, clock: ManualClock
) -> None:
    vllm.vllm.kv_offloading_size = "192.0"
    daemon = await make_daemon(vllm, router, session, clock)
    rec = recording(daemon)
    with capture_logs() as logs:
        for _ in range(2):
            await daemon.run_epoch()
            clock.advance(5.0)
        vllm.vllm.mode = "down"  # a failed scrape keeps the last known tier
        await daemon.run_epoch()
    assert [s.offload_tokens for s in rec.snapshots] == [TIER_192_GIB_TOKENS] * 3
    assert [d.offload_tokens for d in router.decisions] == [TIER_192_GIB_TOKENS] * 3
    (said,) = tier_events(logs)
    assert said["used"] and said["kv_offloading_gib"] == 192.0
    exported = daemon.metrics.registry.get_sample_value(
        "kairosd_offload_tokens", {"instance": "gpu0"}
    )
    assert exported == TIER_192_GIB_TOKENS


async def test_no_tier_sends_zero_and_says_nothing(
    vllm: ScriptedVllm, router: FakeRouter, session: aiohttp.ClientSession, clock: ManualClock
) -> None:
    vllm.vllm.kv_offloading_size = "None"  # vLLM started without --kv-offloading-size
    daemon = await make_daemon(vllm, router, session, clock)
    rec = recording(daemon)
    with capture_logs() as logs:
        await daemon.run_epoch()
    assert rec.snapshots[0].offload_tokens == 0 and router.decisions[0].offload_tokens == 0
    assert tier_events(logs) == []


async def test_override_for_a_vllm_that_does_not_say(
    vllm: ScriptedVllm, router: FakeRouter, session: aiohttp.ClientSession, clock: ManualClock
) -> None:
    assert vllm.vllm.kv_offloading_size is None  # an older vLLM: no label at all
    daemon = await make_daemon(vllm, router, session, clock, kv_offloading_gib=1.5)
    rec = recording(daemon)
    await daemon.run_epoch()
    tokens = int(1.5 * 2**30 // DEFAULT_KV_BYTES_PER_TOKEN)
    assert rec.snapshots[0].offload_tokens == tokens == router.decisions[0].offload_tokens


async def test_kairos_paper_gets_the_tier_but_does_not_count_on_it(
    vllm: ScriptedVllm, router: FakeRouter, session: aiohttp.ClientSession, clock: ManualClock
) -> None:
    vllm.vllm.kv_offloading_size = "192.0"
    daemon = await make_daemon(
        vllm, router, session, clock, policy="kairos-paper", kv_bytes_per_token=2**20
    )
    rec = recording(daemon)
    with capture_logs() as logs:
        await daemon.run_epoch()
    assert rec.snapshots[0].offload_tokens == 192 * 2**10
    assert router.decisions[0].offload_tokens == 0  # the router sizes admission as the law did
    (said,) = tier_events(logs)
    assert not said["used"] and "offload_aware" in said["hint"]


async def test_the_router_gets_the_laws_activity_window_with_the_tier(
    vllm: ScriptedVllm, router: FakeRouter, session: aiohttp.ClientSession, clock: ManualClock
) -> None:
    """The router counts idle contexts out of admission between epochs; it must call
    idle what the daemon's law calls idle (``[kairos] idle_after_s``)."""
    vllm.vllm.kv_offloading_size = "192.0"
    daemon = await make_daemon(vllm, router, session, clock, kairos=KairosConfig(idle_after_s=30.0))
    await daemon.run_epoch()
    assert router.decisions[0].idle_after_s == 30.0
    assert router.decisions[0].offload_tokens == TIER_192_GIB_TOKENS


async def test_the_router_gets_the_laws_eviction_window(
    vllm: ScriptedVllm, router: FakeRouter, session: aiohttp.ClientSession, clock: ManualClock
) -> None:
    """Sessions idle past ``[kairos] evictable_after_s`` stop counting towards
    admission in the router too (control-law point 14), tier or not; ``kairos-paper``
    has no window."""
    daemon = await make_daemon(
        vllm, router, session, clock, kairos=KairosConfig(evictable_after_s=120.0)
    )
    await daemon.run_epoch()
    assert router.decisions[0].evictable_after_s == 120.0
    assert router.decisions[0].offload_tokens == 0
    paper = await make_daemon(vllm, router, session, clock, policy="kairos-paper")
    await paper.run_epoch()
    assert router.decisions[-1].evictable_after_s is None

"""kairosd reads vLLM's CPU KV tier (``kv_offloading_size``, GiB), turns it into
tokens for the control law and the router, and says once per change what it counts on."""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any

import aiohttp
import pytest
from structlog.testing import capture_logs

from controllers.frequency import FrequencyLevels
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
        self.rule = inner.rule
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
    check = OffloadCheck("kairos-alg1", unused_reason="ignored")
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
        ("kairos-alg1", False, False),
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
    assert [d.admission.offload_tokens for d in router.decisions] == [TIER_192_GIB_TOKENS] * 3
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
    assert rec.snapshots[0].offload_tokens == 0
    assert router.decisions[0].admission.offload_tokens == 0
    assert tier_events(logs) == []


async def test_override_for_a_vllm_that_does_not_say(
    vllm: ScriptedVllm, router: FakeRouter, session: aiohttp.ClientSession, clock: ManualClock
) -> None:
    assert vllm.vllm.kv_offloading_size is None  # an older vLLM: no label at all
    daemon = await make_daemon(vllm, router, session, clock, kv_offloading_gib=1.5)
    rec = recording(daemon)
    await daemon.run_epoch()
    tokens = int(1.5 * 2**30 // DEFAULT_KV_BYTES_PER_TOKEN)
    sent = router.decisions[0].admission
    assert rec.snapshots[0].offload_tokens == tokens == sent.offload_tokens


async def test_kairos_alg1_gets_the_tier_but_does_not_count_on_it(
    vllm: ScriptedVllm, router: FakeRouter, session: aiohttp.ClientSession, clock: ManualClock
) -> None:
    vllm.vllm.kv_offloading_size = "192.0"
    daemon = await make_daemon(
        vllm, router, session, clock, policy="kairos-alg1", kv_bytes_per_token=2**20
    )
    rec = recording(daemon)
    with capture_logs() as logs:
        await daemon.run_epoch()
    assert rec.snapshots[0].offload_tokens == 192 * 2**10
    assert router.decisions[0].admission.offload_tokens == 0  # the router weighs as the law
    (said,) = tier_events(logs)
    assert not said["used"] and "ignores the tier" in said["hint"]


async def test_the_router_gets_the_laws_windows_with_the_tier(
    vllm: ScriptedVllm, router: FakeRouter, session: aiohttp.ClientSession, clock: ManualClock
) -> None:
    """The router counts idle contexts out of admission between epochs; it must call
    idle and evictable what the daemon's law does (control-law points 13–14), which
    the decision's rule carries whole; ``kairos-alg1`` has no window."""
    vllm.vllm.kv_offloading_size = "192.0"
    daemon = await make_daemon(vllm, router, session, clock, variant={"idle_after_s": 30.0})
    await daemon.run_epoch()
    sent = router.decisions[0].admission
    assert (sent.rule.idle_after_s, sent.rule.evictable_after_s) == (30.0, 60.0)
    assert sent.offload_tokens == TIER_192_GIB_TOKENS
    paper = await make_daemon(vllm, router, session, clock, policy="kairos-alg1")
    await paper.run_epoch()
    assert router.decisions[-1].admission.rule.evictable_after_s is None


async def test_the_accelerated_stack_scales_the_laws_time_constants(
    vllm: ScriptedVllm, router: FakeRouter, session: aiohttp.ClientSession, clock: ManualClock
) -> None:
    """``sim_speedup``: simulated seconds run 20× faster than the daemon's clock."""
    daemon = await make_daemon(vllm, router, session, clock, sim_speedup=20.0)
    await daemon.run_epoch()
    rule = router.decisions[0].admission.rule
    assert (rule.idle_after_s, rule.evictable_after_s) == (0.5, 3.0)

"""kairosd tells the operator when its policy and vLLM's CPU KV tier disagree
(``kairos-offload`` without a tier thrashes; a tier under ``kairos`` is unused)."""

from __future__ import annotations

import aiohttp
from structlog.testing import capture_logs

from kairos_common.testing import ManualClock
from kairosd.offload_check import OffloadCheck, offload_mismatch
from kairosd.testing import FakeRouter, ScriptedVllm
from tests.kairosd.conftest import make_daemon


def test_mismatch_in_both_directions_and_silence_when_unknown() -> None:
    assert offload_mismatch(True, 0.0) == "kv_offloading_missing"
    assert offload_mismatch(False, 192.0) == "kv_offloading_unused"
    assert offload_mismatch(True, 192.0) is None
    assert offload_mismatch(False, 0.0) is None
    assert offload_mismatch(True, None) is None  # an older vLLM does not say


def test_said_once_per_change() -> None:
    check = OffloadCheck("kairos-offload", expects_tier=True)
    with capture_logs() as logs:
        for gib in (0.0, 0.0, 0.0, 192.0, 0.0):
            check.observe(gib)
    assert [e["event"] for e in logs] == ["kv_offloading_missing", "kv_offloading_missing"]
    assert logs[0]["log_level"] == "warning" and logs[0]["policy"] == "kairos-offload"


async def test_daemon_warns_when_kairos_offload_runs_without_a_tier(
    vllm: ScriptedVllm, router: FakeRouter, session: aiohttp.ClientSession, clock: ManualClock
) -> None:
    vllm.vllm.kv_offloading_size = "None"  # vLLM started without --kv-offloading-size
    daemon = await make_daemon(vllm, router, session, clock, policy="kairos-offload")
    with capture_logs() as logs:
        for _ in range(3):
            await daemon.run_epoch()
            clock.advance(5.0)
    assert [e["event"] for e in logs].count("kv_offloading_missing") == 1
    vllm.vllm.kv_offloading_size = "192.0"
    await daemon.run_epoch()
    assert daemon.offload_check.observe(192.0) is None


async def test_daemon_suggests_kairos_offload_when_vllm_has_a_tier(
    vllm: ScriptedVllm, router: FakeRouter, session: aiohttp.ClientSession, clock: ManualClock
) -> None:
    vllm.vllm.kv_offloading_size = "192.0"
    daemon = await make_daemon(vllm, router, session, clock)
    with capture_logs() as logs:
        await daemon.run_epoch()
    (said,) = [e for e in logs if e["event"] == "kv_offloading_unused"]
    assert said["policy"] == "kairos" and said["kv_offloading_gib"] == 192.0

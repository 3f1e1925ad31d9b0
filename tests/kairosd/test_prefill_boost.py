"""The daemon's end of the router's work signals: ``prefill_tokens`` on the wire lift
the clock to the top level for the epoch (control-law point 9), a long context in
flight to the memory knee (point 11) and, opted in, holds its decode there (point
12), and the metrics count them (epoch records are written when the epoch closes)."""

from __future__ import annotations

import dataclasses

import aiohttp

from kairos_common.testing import ManualClock
from kairosd.testing import FakeRouter, ScriptedVllm
from tests.kairosd.conftest import CLOCKS, agent, make_daemon


async def test_queued_prefill_from_the_router_runs_the_top_clock(
    vllm: ScriptedVllm, router: FakeRouter, session: aiohttp.ClientSession, clock: ManualClock
) -> None:
    daemon = await make_daemon(vllm, router, session, clock)
    small = agent("a", 2_000)
    router.ongoing = [small]
    quiet = await daemon.run_epoch()
    assert quiet.clock_mhz == CLOCKS[0] and quiet.reason == "context"
    router.ongoing = [dataclasses.replace(small, in_flight=True, prefill_tokens=80_000)]
    clock.advance(5.0)
    busy = await daemon.run_epoch()
    assert busy.clock_mhz == CLOCKS[-1] and busy.reason == "prefill"
    assert vllm.gpus[0].locked_mhz == CLOCKS[-1]
    router.ongoing = [small]  # first byte out: back to the context level
    clock.advance(5.0)
    assert (await daemon.run_epoch()).clock_mhz == CLOCKS[0]
    text = daemon.metrics.render().decode()
    assert 'kairosd_prefill_epochs_total{instance="gpu0"} 1.0' in text


async def test_long_context_work_from_the_router_lifts_the_clock_to_the_knee(
    vllm: ScriptedVllm, router: FakeRouter, session: aiohttp.ClientSession, clock: ManualClock
) -> None:
    """Point 11 end to end in the daemon: a 100K-token agent with a request in flight
    on a large cache runs at the first level ≥ 900 MHz, not at the context level."""
    vllm.vllm.capacity_tokens = 2_000_000  # Eq. 9 alone: level 1 (800 MHz)
    daemon = await make_daemon(vllm, router, session, clock)
    idle = agent("a", 100_000)
    router.ongoing = [dataclasses.replace(idle, last_active_s=-60.0)]
    assert (await daemon.run_epoch()).clock_mhz == CLOCKS[0]
    router.ongoing = [dataclasses.replace(idle, in_flight=True)]
    clock.advance(5.0)
    busy = await daemon.run_epoch()
    assert busy.clock_mhz == 1000 and busy.reason == "busy-floor"
    assert vllm.gpus[0].locked_mhz == 1000
    clock.advance(5.0)
    await daemon.run_epoch()  # the record of the busy epoch is written when it closes
    text = daemon.metrics.render().decode()
    assert 'kairosd_busy_floor_epochs_total{instance="gpu0"} 1.0' in text


async def test_long_context_decode_from_the_router_is_held_at_the_knee(
    vllm: ScriptedVllm, router: FakeRouter, session: aiohttp.ClientSession, clock: ManualClock
) -> None:
    """Points 12–13 end to end, on a vLLM with a CPU KV tier: Eq. 9 asks 1200 MHz for
    a 100K-token agent decoding on a 200K-token cache; the daemon locks the knee's
    level (1000 MHz) until the router reports prompt tokens waiting, then Eq. 9's
    level for that epoch."""
    vllm.vllm.capacity_tokens = 200_000
    vllm.vllm.kv_offloading_size = "192.0"
    daemon = await make_daemon(vllm, router, session, clock)
    decoding = dataclasses.replace(agent("a", 100_000), in_flight=True)
    router.ongoing = [decoding]
    held = await daemon.run_epoch()
    assert held.clock_mhz == 1000 and held.reason == "busy-ceiling"
    assert vllm.gpus[0].locked_mhz == 1000
    router.ongoing = [dataclasses.replace(decoding, prefill_tokens=4_000)]
    clock.advance(5.0)
    prefill = await daemon.run_epoch()
    assert prefill.clock_mhz == 1200 and prefill.reason == "context"
    clock.advance(5.0)
    await daemon.run_epoch()
    text = daemon.metrics.render().decode()
    assert 'kairosd_busy_ceiling_epochs_total{instance="gpu0"} 1.0' in text

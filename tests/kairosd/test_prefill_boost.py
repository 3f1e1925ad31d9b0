"""The daemon's end of the prefill signal: the router's ``prefill_tokens`` on the wire
lift the clock to the top level for the epoch, and the metric counts it (epoch
records are written when the epoch closes)."""

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

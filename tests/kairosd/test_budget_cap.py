"""The fleet power budget's clock cap, as the daemon applies it: against the fake
vLLM (+ simulated GPU) and a fake router whose acks carry a cap, epoch by epoch
on a manual clock."""

from __future__ import annotations

import aiohttp
import pytest

from controllers.reason import Cap
from controllers.types import AgentView
from kairos_common.testing import ManualClock
from kairosd.testing import FakeRouter, ScriptedVllm
from tests.kairosd.conftest import CLOCKS, ListSink, make_daemon

EPOCH_S = 5.0  # make_daemon's epoch; decisions are valid for 3 epochs


def busy(context_tokens: int = 80_000, tput: float = 100.0) -> AgentView:
    """An ongoing agent large enough that Eq. 9 picks the top clock."""
    return AgentView(
        agent_id="a",
        arrival_s=0.0,
        context_tokens=context_tokens,
        decode_tokens=int(tput * 10),
        llm_time_s=10.0,
        completed_steps=3,
    )


async def test_cap_lowers_the_clock_to_a_level_and_is_recorded(
    vllm: ScriptedVllm, router: FakeRouter, session: aiohttp.ClientSession, clock: ManualClock
) -> None:
    daemon = await make_daemon(vllm, router, session, clock)
    router.ongoing = [busy()]
    router.clock_cap_mhz = 1300  # between levels: snapped down to 1200
    decision = await daemon.run_epoch()
    assert router.decisions[-1].clock.clock_mhz == CLOCKS[-1]  # the router sees the wish
    assert router.decisions[-1].clock.levels_mhz == CLOCKS
    assert decision.clock_mhz == 1200 and vllm.gpus[0].locked_mhz == 1200
    assert decision.cap is Cap.BUDGET and decision.label.startswith("budget-cap(")
    clock.advance(EPOCH_S)
    await daemon.run_epoch()
    sink = daemon.sink
    assert isinstance(sink, ListSink)
    first = sink.records[0]
    assert first.target_clock_mhz == 1200 and first.reason.startswith("budget-cap:")
    # The second post reports what epoch 0 drew, at the capped clock.
    sent = router.decisions[-1]
    assert sent.measured.clock_mhz == 1200
    assert sent.measured.power_w == pytest.approx(100 + 0.3 * 1200)
    text = daemon.metrics.render().decode()
    assert 'kairosd_clock_cap_mhz{instance="gpu0"} 1300.0' in text
    assert 'kairosd_budget_capped_epochs_total{instance="gpu0"} 2.0' in text
    ok, health = daemon.health()
    assert ok and health["clock_cap_mhz"] == 1300 and health["applied_clock_mhz"] == 1200
    assert health["applied_under_cap_mhz"] == 1300
    assert "fleet budget cap 1300 MHz" in daemon.status_line()
    router.clock_cap_mhz = 1000  # lowered: in force, and obeyed, from this epoch
    clock.advance(EPOCH_S)
    await daemon.run_epoch()
    _, health = daemon.health()
    assert health["clock_cap_mhz"] == health["applied_under_cap_mhz"] == 1000
    assert health["applied_clock_mhz"] == 1000 == vllm.gpus[0].locked_mhz


async def test_cap_wins_over_the_slo_boost_and_conflict_is_exported(
    vllm: ScriptedVllm, router: FakeRouter, session: aiohttp.ClientSession, clock: ManualClock
) -> None:
    daemon = await make_daemon(vllm, router, session, clock)
    router.ongoing = [busy(10_000, tput=12.0)]  # below the SLO, liftable: boost to max
    router.clock_cap_mhz, router.budget_conflict = 1000, True
    decision = await daemon.run_epoch()
    assert router.decisions[-1].clock.boost and router.decisions[-1].clock.clock_mhz == CLOCKS[-1]
    assert decision.boost and decision.clock_mhz == 1000
    assert vllm.gpus[0].locked_mhz == 1000
    assert 'kairosd_budget_conflict{instance="gpu0"} 1.0' in daemon.metrics.render().decode()


async def test_clock_below_the_cap_is_left_alone(
    vllm: ScriptedVllm, router: FakeRouter, session: aiohttp.ClientSession, clock: ManualClock
) -> None:
    daemon = await make_daemon(vllm, router, session, clock)
    router.ongoing = [busy(20_000)]
    router.clock_cap_mhz = 1400
    decision = await daemon.run_epoch()
    assert decision.clock_mhz == 1000 and decision.cap is None


async def test_cap_lapses_with_the_router_then_failsafe_runs_uncapped(
    vllm: ScriptedVllm, router: FakeRouter, session: aiohttp.ClientSession, clock: ManualClock
) -> None:
    daemon = await make_daemon(vllm, router, session, clock)
    router.ongoing = [busy()]
    router.clock_cap_mhz = 1000
    await daemon.run_epoch()
    assert vllm.gpus[0].locked_mhz == 1000
    router.down = True
    clock.advance(EPOCH_S)
    held = await daemon.run_epoch()  # one missed post: the cap is still valid
    assert held.clock_mhz == 1000 and daemon.cap.cap_mhz == 1000
    for _ in range(3):
        clock.advance(EPOCH_S)
        last = await daemon.run_epoch()
    assert daemon.cap.cap_mhz is None
    assert last.clock_mhz == CLOCKS[-1] and last.cap is None
    assert vllm.gpus[0].locked_mhz == CLOCKS[-1]
    assert 'kairosd_clock_cap_mhz{instance="gpu0"} 0.0' in daemon.metrics.render().decode()


async def test_router_lifting_the_cap_restores_the_clock(
    vllm: ScriptedVllm, router: FakeRouter, session: aiohttp.ClientSession, clock: ManualClock
) -> None:
    daemon = await make_daemon(vllm, router, session, clock)
    router.ongoing = [busy()]
    router.clock_cap_mhz = 800
    await daemon.run_epoch()
    router.clock_cap_mhz = None
    clock.advance(EPOCH_S)
    decision = await daemon.run_epoch()
    assert decision.clock_mhz == CLOCKS[-1] and vllm.gpus[0].locked_mhz == CLOCKS[-1]


async def test_shutdown_resets_clocks_while_capped(
    vllm: ScriptedVllm, router: FakeRouter, session: aiohttp.ClientSession, clock: ManualClock
) -> None:
    daemon = await make_daemon(vllm, router, session, clock)
    router.ongoing = [busy()]
    router.clock_cap_mhz = 1000
    await daemon.run_epoch()
    assert vllm.gpus[0].locked_mhz == 1000
    clock.advance(EPOCH_S)
    assert await daemon.shutdown()
    assert vllm.gpus[0].locked_mhz is None


async def test_observe_mode_reports_power_but_offers_no_levels(
    vllm: ScriptedVllm, router: FakeRouter, session: aiohttp.ClientSession, clock: ManualClock
) -> None:
    vllm.deny_control = True  # unprivileged: the sim backend degrades to observe mode
    daemon = await make_daemon(vllm, router, session, clock)
    router.ongoing = [busy()]
    await daemon.run_epoch()
    clock.advance(EPOCH_S)
    await daemon.run_epoch()
    sent = router.decisions[-1]
    assert sent.clock.levels_mhz == () and sent.measured.power_w is not None

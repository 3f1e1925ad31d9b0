"""The daemon against the fake vLLM (+ simulated GPU) and fake router on loopback,
driven epoch by epoch with a manual clock."""

from __future__ import annotations

import math

import aiohttp
import pytest

from controllers import KAIROS, KAIROS_ALG1, Intents
from kairos_common.testing import ManualClock
from kairosd.testing import FakeRouter, ScriptedVllm
from tests.kairosd.conftest import CLOCKS, ListSink, agent, make_daemon

CAP = 100_000
ALPHA = 0.75


def expected_clock(usage: int) -> int:
    """Eq. 8–9 written out independently of the controller."""
    if usage >= ALPHA * CAP:
        return CLOCKS[-1]
    return CLOCKS[math.floor(usage / (ALPHA * CAP) * (len(CLOCKS) - 1))]


async def test_clock_follows_context_law_epoch_by_epoch(
    vllm: ScriptedVllm, router: FakeRouter, session: aiohttp.ClientSession, clock: ManualClock
) -> None:
    daemon = await make_daemon(vllm, router, session, clock, variant={"context_window_s": None})
    for usage in (0, 20_000, 40_000, 60_000, 80_000, 10_000):
        router.ongoing = [agent("a", usage // 2), agent("b", usage - usage // 2)]
        await daemon.run_epoch()
        assert vllm.gpus[0].locked_mhz == expected_clock(usage), usage
        clock.advance(5.0)
    assert [mhz for _, mhz in vllm.clock_writes] == [800, 1000, 1200, 1400, 1600, 800]


async def test_by_default_the_clock_follows_the_working_set_s_recent_mean(
    vllm: ScriptedVllm, router: FakeRouter, session: aiohttp.ClientSession, clock: ManualClock
) -> None:
    """Control-law point 17: the daemon keeps one controller, whose window spans
    its epochs (5 s here, 120 s window)."""
    daemon = await make_daemon(vllm, router, session, clock)
    for usage in (0, 60_000, 0, 60_000):
        router.ongoing = [agent("a", usage)] if usage else []
        await daemon.run_epoch()
        clock.advance(5.0)
    # Each epoch's own law would swing 800 → 1400 → 800 → 1400; the mean of 0,
    # 60K, 0 and 60K tokens (30K) sets 1000 MHz, and the daemon says so.
    assert vllm.gpus[0].locked_mhz == expected_clock(30_000) == 1000
    text = daemon.metrics.render().decode()
    assert 'kairosd_level_tokens{instance="gpu0"} 30000.0' in text


async def test_clock_is_written_only_when_it_changes(
    vllm: ScriptedVllm, router: FakeRouter, session: aiohttp.ClientSession, clock: ManualClock
) -> None:
    daemon = await make_daemon(vllm, router, session, clock)
    router.ongoing = [agent("a", 30_000)]
    for _ in range(4):
        await daemon.run_epoch()
        clock.advance(5.0)
    assert len(vllm.clock_writes) == 1


async def test_all_gpus_of_a_tp_instance_move_together(
    router: FakeRouter, session: aiohttp.ClientSession, clock: ManualClock
) -> None:
    fake = ScriptedVllm(num_gpus=2, clock=clock, supported_clocks_mhz=CLOCKS)
    await fake.start()
    try:
        daemon = await make_daemon(fake, router, session, clock, gpus=(0, 1))
        router.ongoing = [agent("a", 40_000)]
        await daemon.run_epoch()
        assert [g.locked_mhz for g in fake.gpus] == [1200, 1200]
        assert fake.clock_writes == [((0, 1), 1200)]
    finally:
        await fake.stop()


async def test_slo_miss_boosts_to_max_clock(
    vllm: ScriptedVllm, router: FakeRouter, session: aiohttp.ClientSession, clock: ManualClock
) -> None:
    daemon = await make_daemon(vllm, router, session, clock)
    router.ongoing = [agent("fast", 10_000, tput=50.0)]
    await daemon.run_epoch()
    assert vllm.gpus[0].locked_mhz == 800
    clock.advance(5.0)
    router.ongoing = [agent("fast", 10_000, tput=50.0), agent("slow", 1_000, tput=12.0)]
    decision = await daemon.run_epoch()
    assert decision.boost and decision.reason == "slo-boost"
    assert vllm.gpus[0].locked_mhz == CLOCKS[-1]
    clock.advance(5.0)
    await daemon.run_epoch()
    boosted = daemon.records[-1]
    assert boosted.boost and boosted.min_throughput_tok_s == pytest.approx(12.0)
    assert boosted.target_clock_mhz == boosted.actual_clock_mhz == CLOCKS[-1]


async def test_admission_decisions_reach_the_router_in_order(
    vllm: ScriptedVllm, router: FakeRouter, session: aiohttp.ClientSession, clock: ManualClock
) -> None:
    daemon = await make_daemon(vllm, router, session, clock)
    router.ongoing = [agent("old", 50_000)]
    router.pending = [
        agent("p1", 20_000, tput=None, arrival=clock() - 3),
        agent("p2", 25_000, tput=None, arrival=clock() - 2),
        agent("p3", 1_000, tput=None, arrival=clock() - 1),
    ]
    decision = await daemon.run_epoch()
    # U=50k → 70k → 95k: admission stops once U reaches γ·U_max, in arrival order.
    assert router.decisions[-1].admission.admit == ("p1", "p2")
    assert router.acks[-1].admitted == ("p1", "p2")
    assert [a.agent_id for a in router.pending] == ["p3"]
    assert not decision.boost  # pending agents are inside their grace period
    assert router.decisions[-1].epoch == 0 and router.decisions[-1].instance == "gpu0"
    clock.advance(5.0)
    router.ongoing.append(agent("big", 30_000))  # U now 120k > β·U_max
    await daemon.run_epoch()
    last = router.decisions[-1]
    assert last.admission.admit == () and last.admission.defer
    assert last.order_key > router.decisions[0].order_key
    assert daemon.records[-1].admitted == 2  # epoch 0 closed: two agents admitted
    assert last.admission.rule == KAIROS.rule  # its policy's whole rule


async def test_decisions_carry_the_policys_rule(
    vllm: ScriptedVllm, router: FakeRouter, session: aiohttp.ClientSession, clock: ManualClock
) -> None:
    """A ``kairos-alg1`` daemon sends the paper's β, γ and no eviction window, which
    the router then admits by on its instance (control-law points 14 and 18); an
    operator's intents reach it too."""
    daemon = await make_daemon(vllm, router, session, clock, policy="kairos-alg1")
    router.ongoing = [agent("old", 50_000)]
    await daemon.run_epoch()
    assert router.decisions[-1].admission.rule == KAIROS_ALG1.rule
    tight = await make_daemon(vllm, router, session, clock, kairos=Intents(beta=0.9, gamma=0.8))
    await tight.run_epoch()
    rule = router.decisions[-1].admission.rule
    assert (rule.beta, rule.gamma, rule.evictable_after_s) == (0.9, 0.8, 60.0)


async def test_power_report_pairs_energy_with_the_clock_that_produced_it(
    vllm: ScriptedVllm, router: FakeRouter, session: aiohttp.ClientSession, clock: ManualClock
) -> None:
    daemon = await make_daemon(vllm, router, session, clock, run="t1")
    sink = daemon.sink
    assert isinstance(sink, ListSink)
    router.ongoing = [agent("a", 0)]
    await daemon.run_epoch()
    clock.advance(5.0)
    vllm.vllm.generation_tokens_total = 500
    router.ongoing = [agent("a", 80_000)]
    await daemon.run_epoch()
    clock.advance(5.0)
    assert await daemon.shutdown()
    first, second = sink.records
    assert first.target_clock_mhz == first.actual_clock_mhz == 800
    assert first.energy_j == pytest.approx((100 + 0.3 * 800) * 5.0)
    assert first.avg_power_w == pytest.approx(340.0)
    assert first.epoch_s == pytest.approx(5.0) and first.output_tokens == 500
    assert second.target_clock_mhz == 1600
    assert second.avg_power_w == pytest.approx(100 + 0.3 * 1600)
    assert second.usage_tokens == 80_000 and second.capacity_tokens == CAP
    assert first.run == "t1" and first.gpus == (0,) and first.policy == "kairos"
    assert vllm.gpus[0].locked_mhz is None  # shutdown reset the clocks


async def test_standalone_mode_uses_vllm_kv_usage(
    vllm: ScriptedVllm, session: aiohttp.ClientSession, clock: ManualClock
) -> None:
    daemon = await make_daemon(vllm, None, session, clock)
    vllm.vllm.kv_usage_frac = 0.5
    vllm.vllm.running = 4
    decision = await daemon.run_epoch()
    assert decision.usage_tokens == 50_000 and not decision.boost
    assert vllm.gpus[0].locked_mhz == expected_clock(50_000)
    assert daemon.mode == "standalone"
    assert "standalone" in daemon.status_line()
    ok, body = daemon.health()
    assert ok and body["mode"] == "standalone"


@pytest.mark.parametrize(("policy", "clock_mhz"), [("no-control", 1600), ("fixed:1010", 1000)])
async def test_baseline_policies(
    vllm: ScriptedVllm,
    router: FakeRouter,
    session: aiohttp.ClientSession,
    clock: ManualClock,
    policy: str,
    clock_mhz: int,
) -> None:
    daemon = await make_daemon(vllm, router, session, clock, policy=policy)
    router.pending = [agent("p1", 90_000, tput=None), agent("p2", 90_000, tput=None)]
    await daemon.run_epoch()
    assert vllm.gpus[0].locked_mhz == clock_mhz
    assert router.decisions[-1].admission.admit == ("p1", "p2")
    assert not router.decisions[-1].admission.rule.enabled  # the router holds nobody


async def test_prometheus_metrics_reflect_the_epoch(
    vllm: ScriptedVllm, router: FakeRouter, session: aiohttp.ClientSession, clock: ManualClock
) -> None:
    daemon = await make_daemon(vllm, router, session, clock)
    router.ongoing = [agent("a", 40_000)]
    await daemon.run_epoch()
    clock.advance(5.0)
    await daemon.run_epoch()
    text = daemon.metrics.render().decode()
    assert 'kairosd_target_clock_mhz{instance="gpu0"} 1200.0' in text
    assert 'kairosd_usage_tokens{instance="gpu0"} 40000.0' in text
    assert 'kairosd_energy_joules_total{instance="gpu0"} 2300.0' in text
    assert "kairosd_epoch_duration_seconds_count" in text

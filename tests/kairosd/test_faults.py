"""Each failure has a defined behaviour, and clocks end up reset in every case."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator

import aiohttp
import pytest
from structlog.testing import capture_logs
from zeus.device.gpu.common import ZeusGPUNoPermissionError, ZeusGPUNotSupportedError
from zeus.utils.zeusd import ZeusdAuthError, ZeusdConnectionError

from controllers.frequency import FrequencyLevels
from controllers.kairos import KAIROS
from controllers.registry import make_controller
from kairos_common.testing import ManualClock, decision
from kairosd.config import KairosdConfig
from kairosd.errors import (
    GpuError,
    GpuPermissionError,
    GpuTimeoutError,
    GpuUnavailableError,
    RouterVersionError,
)
from kairosd.gpu.observe import ObserveBackend
from kairosd.gpu.zeus_backend import ZeusBackend, translate_zeus_error
from kairosd.loop import Daemon
from kairosd.metrics import DaemonMetrics
from kairosd.router_client import RouterClient
from kairosd.startup import prepare_backend
from kairosd.testing import FakeRouter, FakeZeusGpus, ScriptedVllm
from kairosd.vllm_client import VllmClient
from tests.kairosd.conftest import CLOCKS, ListSink, agent, make_daemon


async def epochs(daemon: Daemon, clock: ManualClock, n: int) -> None:
    for _ in range(n):
        await daemon.run_epoch()
        clock.advance(5.0)


async def test_router_down_holds_then_fails_safe_then_recovers(
    vllm: ScriptedVllm, router: FakeRouter, session: aiohttp.ClientSession, clock: ManualClock
) -> None:
    daemon = await make_daemon(vllm, router, session, clock, stale_epochs=2)
    router.ongoing = [agent("a", 20_000)]
    await epochs(daemon, clock, 1)
    assert vllm.gpus[0].locked_mhz == 1000
    router.down = True
    await epochs(daemon, clock, 2)  # held for stale_epochs epochs
    assert vllm.gpus[0].locked_mhz == 1000 and daemon.failsafe_reason is None
    await epochs(daemon, clock, 1)
    assert vllm.gpus[0].locked_mhz == CLOCKS[-1]
    assert daemon.failsafe_reason == "router"
    assert "FAILSAFE" in daemon.status_line()
    router.down = False
    await epochs(daemon, clock, 1)
    assert daemon.records[-1].reason.startswith("failsafe-router")  # epoch 3, closed now
    assert vllm.gpus[0].locked_mhz == 1000 and daemon.failsafe_reason is None
    assert await daemon.shutdown()
    assert vllm.gpus[0].locked_mhz is None


async def test_router_unreachable_from_start_runs_at_max_clock(
    vllm: ScriptedVllm, session: aiohttp.ClientSession, clock: ManualClock
) -> None:
    dead = FakeRouter(instance="gpu0", clock=clock)
    await dead.start()
    await dead.stop()  # nothing listens on its port any more
    daemon = await make_daemon(vllm, dead, session, clock)
    decision = await daemon.run_epoch()
    assert decision.clock_mhz == CLOCKS[-1]
    assert vllm.gpus[0].locked_mhz == CLOCKS[-1]


async def test_vllm_down_keeps_admitting_with_last_capacity_at_max_clock(
    vllm: ScriptedVllm, router: FakeRouter, session: aiohttp.ClientSession, clock: ManualClock
) -> None:
    daemon = await make_daemon(vllm, router, session, clock, stale_epochs=1)
    router.ongoing = [agent("a", 10_000)]
    await epochs(daemon, clock, 1)
    vllm.vllm.mode = "down"
    await epochs(daemon, clock, 2)
    assert daemon.failsafe_reason == "vllm"
    assert vllm.gpus[0].locked_mhz == CLOCKS[-1]
    router.pending = [agent("p", 5_000, tput=None, arrival=clock())]
    decision = await daemon.run_epoch()
    assert decision.admit == ("p",) and decision.capacity_tokens == 100_000
    assert router.acks[-1].admitted == ("p",)
    assert 'kairosd_input_errors_total{input="vllm",instance="gpu0"} 3.0' in (
        daemon.metrics.render().decode()
    )


@pytest.mark.parametrize("mode", ["malformed", "disabled"])
async def test_bad_metrics_in_standalone_mode_fail_safe(
    vllm: ScriptedVllm, session: aiohttp.ClientSession, clock: ManualClock, mode: str
) -> None:
    vllm.vllm.mode = mode
    daemon = await make_daemon(vllm, None, session, clock)
    decision = await daemon.run_epoch()
    assert decision.clock_mhz == CLOCKS[-1] and decision.reason == "no-capacity"
    assert daemon.failsafe_reason == "vllm"
    vllm.vllm.mode = "ok"
    vllm.vllm.kv_usage_frac = 0.1
    clock.advance(5.0)
    decision = await daemon.run_epoch()
    assert decision.clock_mhz == 800 and daemon.failsafe_reason is None


async def test_unreadable_gpu_merges_the_epoch_instead_of_losing_energy(
    vllm: ScriptedVllm, router: FakeRouter, session: aiohttp.ClientSession, clock: ManualClock
) -> None:
    daemon = await make_daemon(vllm, router, session, clock)
    router.ongoing = [agent("a", 0)]
    await epochs(daemon, clock, 1)
    vllm.gpu_down = True
    await epochs(daemon, clock, 1)
    vllm.gpu_down = False
    await epochs(daemon, clock, 1)
    (merged,) = daemon.records
    assert merged.epoch_s == pytest.approx(10.0)
    assert merged.energy_j == pytest.approx(340.0 * 10.0)  # nothing lost at 800 MHz
    assert 'kairosd_input_errors_total{input="gpu",instance="gpu0"} 1.0' in (
        daemon.metrics.render().decode()
    )


async def test_sim_permission_denied_falls_back_to_observe(
    vllm: ScriptedVllm, router: FakeRouter, session: aiohttp.ClientSession, clock: ManualClock
) -> None:
    vllm.deny_control = True
    daemon = await make_daemon(vllm, router, session, clock)
    assert isinstance(daemon.backend, ObserveBackend)
    router.ongoing = [agent("a", 0)]
    await epochs(daemon, clock, 2)
    assert vllm.clock_writes == []
    assert daemon.records[0].reason.endswith("(observe)")
    assert daemon.records[0].energy_j > 0  # still reports power
    with pytest.raises(GpuPermissionError):
        await make_daemon(vllm, router, session, clock, require_control=True)


# ---- zeus backend with an injected fake Zeus GPUs object ----------------------------


@pytest.fixture
async def fake_zeus() -> AsyncIterator[FakeZeusGpus]:
    gpus = FakeZeusGpus(num_gpus=2, supported_clocks_mhz=CLOCKS)
    yield gpus
    if gpus.hang is not None:
        gpus.hang.set()


async def test_zeus_backend_reads_and_writes_all_gpus(fake_zeus: FakeZeusGpus) -> None:
    backend = ZeusBackend(fake_zeus, (0, 1), timeout_s=1.0)
    assert await backend.supported_clocks_mhz() == CLOCKS
    await backend.set_locked_clock(1200)
    assert fake_zeus.locked == {0: 1200, 1: 1200}
    status = await backend.status()
    assert [s.energy_mj for s in status] == [2000, 2000]
    assert status[0].power_w == pytest.approx(250.0)
    await backend.reset_clocks()
    assert fake_zeus.locked == {0: None, 1: None}
    with pytest.raises(GpuUnavailableError, match="CUDA_VISIBLE_DEVICES"):
        ZeusBackend(fake_zeus, (5,))


async def test_a_vendor_bug_in_a_read_is_a_gpu_error_not_a_crash(
    fake_zeus: FakeZeusGpus,
) -> None:
    """Zeus 0.16 on a real H200 raised TypeError from a clock read; the daemon must
    get its own error type (handled as an unreadable GPU), with the vendor's words."""

    def broken(gpu_index: int, memory_clock_mhz: int | None = None) -> list[int]:
        raise TypeError("'NoneType' object cannot be interpreted as an integer")

    fake_zeus.get_supported_graphics_clocks = broken  # type: ignore[method-assign]
    backend = ZeusBackend(fake_zeus, (0,), timeout_s=1.0)
    with pytest.raises(GpuError, match=r"TypeError.*NoneType"):
        await backend.status()


async def test_nvml_permission_error_is_translated_and_falls_back(
    fake_zeus: FakeZeusGpus,
) -> None:
    fake_zeus.write_error = ZeusGPUNoPermissionError("Insufficient Permissions")
    backend = ZeusBackend(fake_zeus, (0,), timeout_s=1.0)
    with pytest.raises(GpuPermissionError) as info:
        await backend.set_locked_clock(1000)
    message = str(info.value)
    assert "root" in message and "ZEUSD_SOCK_PATH" in message and "zeusd" in message
    prepared = await prepare_backend(backend, require_control=False)
    assert isinstance(prepared, ObserveBackend) and not prepared.controls
    with pytest.raises(GpuPermissionError):
        await prepare_backend(backend, require_control=True)


def test_zeus_error_translation_table() -> None:
    assert isinstance(translate_zeus_error(ZeusdAuthError("no token")), GpuPermissionError)
    assert isinstance(translate_zeus_error(ZeusdConnectionError("x")), GpuUnavailableError)
    other = translate_zeus_error(ZeusGPUNotSupportedError("nope"))
    assert type(other) is GpuError


async def test_runtime_permission_loss_switches_daemon_to_observe(
    vllm: ScriptedVllm, fake_zeus: FakeZeusGpus, clock: ManualClock, session: aiohttp.ClientSession
) -> None:
    cfg = KairosdConfig(instance="gpu0", vllm_url=vllm.url, gpu_backend="zeus", listen_port=None)
    backend = ZeusBackend(fake_zeus, (0,), timeout_s=1.0)
    levels = FrequencyLevels.from_supported(CLOCKS)
    daemon = Daemon(
        cfg,
        backend=backend,
        controller=make_controller("fixed:1000", levels),
        vllm=VllmClient(session, vllm.url, 0.5),
        router=None,
        sink=ListSink(),
        metrics=DaemonMetrics("gpu0"),
        clock=clock,
    )
    fake_zeus.write_error = ZeusGPUNoPermissionError("Insufficient Permissions")
    await daemon.run_epoch()
    assert not daemon.backend.controls and "observe mode" in daemon.status_line()
    assert await daemon.shutdown()  # nothing to reset in observe mode


async def test_hung_nvml_call_times_out_and_never_blocks_the_loop(
    vllm: ScriptedVllm, fake_zeus: FakeZeusGpus, clock: ManualClock, session: aiohttp.ClientSession
) -> None:
    cfg = KairosdConfig(instance="gpu0", vllm_url=vllm.url, listen_port=None)
    backend = ZeusBackend(fake_zeus, (0,), timeout_s=0.2)
    daemon = Daemon(
        cfg,
        backend=backend,
        controller=make_controller("fixed:1000", FrequencyLevels.from_supported(CLOCKS)),
        vllm=VllmClient(session, vllm.url, 0.5),
        router=None,
        sink=ListSink(),
        metrics=DaemonMetrics("gpu0"),
        clock=clock,
    )
    fake_zeus.hang = threading.Event()
    async with asyncio.timeout(3.0):
        for _ in range(3):  # status + set both hang: each epoch is bounded anyway
            decision = await daemon.run_epoch()
    assert decision.clock_mhz == 1000
    assert daemon.applied_clock_mhz is None  # the write never confirmed
    with pytest.raises(GpuTimeoutError, match="still hung"):
        await backend.status()  # wedged driver: fail fast, no thread pile-up
    fake_zeus.hang.set()
    async with asyncio.timeout(3.0):
        await backend._caller.wait_idle()
    assert await daemon.shutdown()
    assert fake_zeus.locked[0] is None


class RejectingController:
    """A controller whose decide() refuses the snapshot (e.g. invalid agent data)."""

    name = "rejecting"
    rule = KAIROS.rule

    def __init__(self) -> None:
        self.levels = FrequencyLevels.from_supported(CLOCKS)

    def decide(self, snapshot: object) -> object:
        from controllers.errors import InvalidSnapshotError

        raise InvalidSnapshotError("bad agent")


async def test_controller_error_fails_safe_instead_of_crashing(
    vllm: ScriptedVllm, router: FakeRouter, session: aiohttp.ClientSession, clock: ManualClock
) -> None:
    daemon = await make_daemon(vllm, router, session, clock)
    daemon.controller = RejectingController()  # type: ignore[assignment]
    router.pending = [agent("p", 1000, tput=None, arrival=clock())]
    decision = await daemon.run_epoch()
    assert decision.reason == "controller-error" and decision.clock_mhz == CLOCKS[-1]
    assert router.acks[-1].admitted == ("p",)  # agents are not starved by a bug


async def test_a_router_of_another_wire_version_is_said_once_and_fails_safe(
    vllm: ScriptedVllm, router: FakeRouter, session: aiohttp.ClientSession, clock: ManualClock
) -> None:
    """A router of another release refuses the daemon's decisions (HTTP 400 naming
    the version it speaks) and sends state the daemon refuses: the daemon says so
    once, in words, and runs as with a router it cannot read (held input, then the
    fail-safe), never with a half-understood state."""
    daemon = await make_daemon(vllm, router, session, clock)
    router.ongoing = [agent("a", 20_000)]
    await daemon.run_epoch()  # the same release: understood
    router.wire_version = 1
    with capture_logs() as logs:
        for _ in range(4):  # held for stale_epochs (3) epochs, then the fail-safe
            clock.advance(5.0)
            await daemon.run_epoch()
    (said,) = [e for e in logs if e["event"] == "router_speaks_another_wire_version"]
    assert said["log_level"] == "error"
    assert "wire version 1 is not supported: this side speaks version 2" in said["error"]
    assert daemon.failsafe_reason == "router"
    client = RouterClient(session, router.url, "gpu0", 1.0)
    with pytest.raises(RouterVersionError, match="this side speaks version 1"):
        await client.post_decision(decision("gpu0", 9))

"""Faults (docs/reliability.md): each has a defined, survivable behaviour."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import structlog
from aiohttp import web

from controllers.frequency import FrequencyLevels
from controllers.registry import make_controller
from kairos_common.testing import ManualClock
from kairos_common.vllm_metrics import MetricsParseError, parse_vllm_metrics
from kairosd.config import KairosdConfig
from kairosd.gpu.zeus_backend import ZeusBackend
from kairosd.loop import Daemon
from kairosd.metrics import DaemonMetrics
from kairosd.testing import FakeRouter, FakeZeusGpus, ScriptedVllm
from kairosd.vllm_client import VllmClient
from reporting.records import EpochRecord
from router.errors import StateStoreError
from router.store import Changes, SqliteStore
from router.testing import FakeBackend, start_router
from tests.kairosd.conftest import CLOCKS, make_daemon


@pytest.mark.parametrize("value", ["NaN", "+Inf", "-Inf"])
def test_parser_rejects_non_finite_values_as_bad_input(value: str) -> None:
    text = f'vllm:num_requests_running{{engine="0"}} {value}\n'
    with pytest.raises(MetricsParseError, match="non-finite"):
        parse_vllm_metrics(text)


@pytest.mark.parametrize("label", ["inf", "nan", "1e400", "-5"])
def test_parser_ignores_absurd_capacity_labels(label: str) -> None:
    text = f'vllm:cache_config_info{{engine="0",kv_cache_size_tokens="{label}"}} 1\n'
    assert parse_vllm_metrics(text).capacity_tokens is None


class _NanBackend:
    """A backend whose /health is fine but whose /metrics says NaN."""

    def __init__(self) -> None:
        self.metrics_calls = 0
        self._runner: web.AppRunner | None = None
        self.url = ""

    async def start(self) -> None:
        app = web.Application()

        async def health(_r: web.Request) -> web.Response:
            return web.Response(text="ok")

        async def metrics(_r: web.Request) -> web.Response:
            self.metrics_calls += 1
            return web.Response(text='vllm:kv_cache_usage_perc{engine="0"} NaN\n')

        app.router.add_get("/health", health)
        app.router.add_get("/metrics", metrics)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


@pytest.fixture
async def nan_backend() -> AsyncIterator[_NanBackend]:
    b = _NanBackend()
    await b.start()
    yield b
    await b.stop()


async def test_router_health_survives_nan_metrics_and_logs_once(
    nan_backend: _NanBackend, tmp_path: Path
) -> None:
    good = FakeBackend()
    await good.start()
    router = await start_router([nan_backend.url, good.url], tmp_path / "s")
    try:
        with structlog.testing.capture_logs() as logs:
            for _ in range(3):
                await router.health.check_once()
        bad = [e for e in logs if e["event"] == "bad_backend_metrics"]
        assert len(bad) == 1 and bad[0]["instance"] == "i0"
        assert nan_backend.metrics_calls == 3  # still scraped: it may recover
        i0 = router.core.pool.get("i0")
        assert i0 is not None and i0.healthy and i0.metrics_capacity_tokens is None
    finally:
        await router.stop()
        await good.stop()


async def test_health_round_survives_an_unexpected_per_instance_error(
    backends: list[FakeBackend], tmp_path: Path
) -> None:
    router = await start_router([b.url for b in backends], tmp_path / "s")
    try:
        health = router.health
        real = health.scrape_metrics

        async def explode(inst: Any) -> None:
            if inst.name == "i0":
                raise OverflowError("cannot convert float infinity to integer")
            await real(inst)

        health.scrape_metrics = explode  # type: ignore[method-assign]
        with structlog.testing.capture_logs() as logs:
            await health.check_once()
            await health.check_once()
        errors = [e for e in logs if e["event"] == "health_check_error"]
        assert len(errors) == 1 and errors[0]["instance"] == "i0"
        i1 = router.core.pool.get("i1")
        assert i1 is not None and i1.metrics_capacity_tokens is not None  # i1 still checked
    finally:
        await router.stop()


class _FullDiskStore(SqliteStore):
    """A store whose writes fail while ``full`` (ENOSPC), as on a full state disk."""

    full = True

    async def write(self, changes: Changes) -> None:
        if self.full:
            raise StateStoreError("cannot write router state: database or disk is full")
        await super().write(changes)


async def test_changes_survive_failed_persists_until_one_succeeds(
    backends: list[FakeBackend], tmp_path: Path
) -> None:
    router = await start_router([backends[0].url], tmp_path / "s")
    core = router.core
    store = _FullDiskStore(tmp_path / "full.sqlite3")
    assert core.store is not None
    await core.store.close()
    core.store = store  # closed by router.stop()
    try:
        from kairos_common.wire import AgentEnd, AgentStart

        keep = core.agents.start(AgentStart(name="keep")).agent_id
        gone = core.agents.start(AgentStart(name="gone")).agent_id
        for _ in range(2):
            with pytest.raises(StateStoreError):
                await core.persist()
        assert {keep, gone} <= core.ledger.dirty
        store.full = False
        await core.persist()
        assert not core.ledger.dirty
        core.agents.end(gone, AgentEnd(exit_code=0))
        store.full = True
        with pytest.raises(StateStoreError):
            await core.persist()
        assert gone in core.ledger.deleted  # the end is not forgotten
        store.full = False
        await core.persist()
        rows = {r["agent_id"] for r in (await store.load()).agents}
        assert keep in rows and gone not in rows  # nothing ended comes back
    finally:
        await router.stop()


async def test_corrupt_database_is_set_aside_and_the_router_starts(
    backends: list[FakeBackend], tmp_path: Path
) -> None:
    state = tmp_path / "s"
    state.mkdir()
    (state / "router.sqlite3").write_bytes(b"this is not a database\x00" * 100)
    with structlog.testing.capture_logs() as logs:
        router = await start_router([backends[0].url], state)
    try:
        aside = list(state.glob("router.sqlite3.corrupt-*"))
        assert len(aside) == 1
        assert any(e["event"] == "state_database_corrupt_set_aside" for e in logs)
        await router.core.persist()
        with sqlite3.connect(state / "router.sqlite3") as conn:
            conn.execute("SELECT count(*) FROM agents").fetchone()
    finally:
        await router.stop()


async def test_kairosd_nan_metrics_are_a_stale_input_logged_once(
    vllm: ScriptedVllm, router: FakeRouter, session: aiohttp.ClientSession, clock: ManualClock
) -> None:
    daemon = await make_daemon(vllm, router, session, clock, stale_epochs=2)
    vllm.vllm.mode = "nan"
    with structlog.testing.capture_logs() as logs:
        for _ in range(4):
            await daemon.run_epoch()
            clock.advance(5.0)
    assert daemon.failsafe_reason == "vllm"
    assert vllm.gpus[0].locked_mhz == CLOCKS[-1]  # failsafe: max clock
    assert sum(e["event"] == "vllm_unavailable" for e in logs) == 1
    vllm.vllm.mode = "ok"
    await daemon.run_epoch()
    assert daemon.failsafe_reason is None
    assert await daemon.shutdown()


class _OrderSink:
    """Records, at each report write, whether GPU 0 was still locked."""

    def __init__(self, gpus: FakeZeusGpus) -> None:
        self.gpus = gpus
        self.locked_at_write: list[int | None] = []

    def write(self, record: EpochRecord) -> None:
        self.locked_at_write.append(self.gpus.locked[0])


async def test_kairosd_shutdown_waits_for_nvml_then_resets_then_reports(
    vllm: ScriptedVllm, clock: ManualClock, session: aiohttp.ClientSession
) -> None:
    gpus = FakeZeusGpus(num_gpus=1, supported_clocks_mhz=CLOCKS)
    backend = ZeusBackend(gpus, (0,), timeout_s=0.2)
    sink = _OrderSink(gpus)
    daemon = Daemon(
        KairosdConfig(instance="gpu0", vllm_url=vllm.url, listen_port=None, gpu_timeout_s=2.0),
        backend=backend,
        controller=make_controller("fixed:1000", FrequencyLevels.from_supported(CLOCKS)),
        vllm=VllmClient(session, vllm.url, 0.5),
        router=None,
        sink=sink,
        metrics=DaemonMetrics("gpu0"),
        clock=clock,
    )
    await daemon.run_epoch()
    gpus.hang = threading.Event()
    with pytest.raises(Exception, match="did not return"):
        await backend.set_locked_clock(1400)  # times out; its thread is still in NVML
    stopping = asyncio.create_task(daemon.shutdown())
    await asyncio.sleep(0)  # let shutdown reach its wait (no timing: it waits for idle)
    assert ("reset", 0) not in gpus.calls
    gpus.hang.set()  # the late set_locked_clock lands now, before the reset
    assert await asyncio.wait_for(stopping, 5.0)
    last = {name: i for i, (name, _) in enumerate(gpus.calls)}
    assert last["reset"] > last["set"]  # the late write landed before the reset
    assert gpus.locked[0] is None  # the reset was last
    assert sink.locked_at_write[-1] is None  # the report came after the reset

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest

from controllers.registry import make_controller
from controllers.types import AgentView
from kairos_common.testing import ManualClock
from kairosd.config import KairosdConfig
from kairosd.gpu.sim_backend import SimBackend
from kairosd.loop import Daemon
from kairosd.metrics import DaemonMetrics
from kairosd.router_client import RouterClient
from kairosd.startup import build_controller, prepare_backend
from kairosd.testing import FakeRouter, ScriptedVllm
from kairosd.vllm_client import VllmClient
from reporting.records import EpochRecord

CLOCKS = (800, 1000, 1200, 1400, 1600)


def agent(aid: str, ctx: int | None, tput: float | None = 100.0, arrival: float = 0.0) -> AgentView:
    if tput is None:
        return AgentView(agent_id=aid, arrival_s=arrival, context_tokens=ctx)
    return AgentView(
        agent_id=aid,
        arrival_s=arrival,
        context_tokens=ctx,
        decode_tokens=int(tput * 10),
        llm_time_s=10.0,
        completed_steps=3,
    )


@dataclass
class ListSink:
    records: list[EpochRecord] = field(default_factory=list)

    def write(self, record: EpochRecord) -> None:
        self.records.append(record)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
async def vllm(clock: ManualClock) -> AsyncIterator[ScriptedVllm]:
    fake = ScriptedVllm(clock=clock, supported_clocks_mhz=CLOCKS)
    await fake.start()
    yield fake
    fake.release_hangs()
    await fake.stop()


@pytest.fixture
async def router(clock: ManualClock) -> AsyncIterator[FakeRouter]:
    fake = FakeRouter(instance="gpu0", clock=clock)
    await fake.start()
    yield fake
    await fake.stop()


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


async def make_daemon(
    vllm: ScriptedVllm,
    router: FakeRouter | None,
    session: aiohttp.ClientSession,
    clock: ManualClock,
    router_urls: list[str] | None = None,
    router_token: str | None = None,
    variant: Mapping[str, Any] | None = None,
    **overrides: Any,
) -> Daemon:
    """A daemon on the sim backend against the fakes, driven epoch by epoch
    (``router_urls``: several router URLs, instead of ``router``'s alone);
    ``variant`` changes constants of its policy in code (research variants, which
    no configuration can set)."""
    urls = router_urls or ([router.url] if router else [])
    cfg = KairosdConfig(
        instance="gpu0",
        vllm_url=vllm.url,
        router_url=tuple(urls),
        gpu_backend="sim",
        epoch_s=5.0,
        http_timeout_s=0.5,
        gpu_timeout_s=0.5,
        listen_port=None,
        **overrides,
    )
    backend = await prepare_backend(
        SimBackend(vllm.url, cfg.gpus, session, cfg.gpu_timeout_s),
        require_control=cfg.require_control,
    )
    link = None
    if urls:
        link = RouterClient(session, urls, cfg.instance, cfg.http_timeout_s, router_token)
    controller = await build_controller(backend, cfg)
    if variant:
        controller = make_controller(cfg.policy, controller.levels, cfg.kairos, variant)
    return Daemon(
        cfg,
        backend=backend,
        controller=controller,
        vllm=VllmClient(session, vllm.url, cfg.http_timeout_s),
        router=link,
        sink=ListSink(),
        metrics=DaemonMetrics(cfg.instance),
        clock=clock,
        wall_clock=lambda: 1.7e9 + clock(),
    )

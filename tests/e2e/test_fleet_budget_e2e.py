"""The fleet power budget on real processes: ``kairos-router`` with ``[fleet_budget]
cap_w`` and two ``kairosd`` daemons (sim backend, ``no-control`` policy, so each
wants the top clock) on 127.0.0.1, against two fake vLLMs with simulated GPUs
(power 100 W + 0.3 W/MHz each, so the uncapped fleet draws ~1390 W).

Asserts the daemons' applied clocks end up capped so the fleet's power fits the
cap, that ``/kairos/v1/fleet`` and the daemons' metrics report it, that a daemon
still resets its clocks on exit and the router then counts that instance as
stale at its top clock (capping the survivor harder), and that the cap lapses
(fail-safe, uncapped) when the router dies. Waits are on the fake GPUs' clock-write events,
each bounded by a deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from kairosd.testing import ScriptedVllm
from simulator.stack import free_port

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

CAP_W = 1000.0
EPOCH_S = 0.5
TOP_MHZ = 1980  # ScriptedVllm's H100-like clock list ends here
# Generous bounds: on a busy 2-core machine three Python processes take many
# seconds to start. Waits end at the first clock write that satisfies them.
START_TIMEOUT_S = 90.0
WAIT_S = 30.0


class HealthyScriptedVllm(ScriptedVllm):
    """The fake vLLM plus ``/health``, so the router keeps the instance eligible."""

    def app(self) -> web.Application:
        app = super().app()
        app.router.add_get("/health", self._health)
        return app

    async def _health(self, _req: web.Request) -> web.Response:
        return web.Response(text="ok")


@pytest.fixture
async def vllms() -> AsyncIterator[list[ScriptedVllm]]:
    fakes: list[ScriptedVllm] = [HealthyScriptedVllm(), HealthyScriptedVllm()]
    for fake in fakes:
        await fake.start()
    yield fakes
    for fake in fakes:
        fake.release_hangs()
        await fake.stop()


def _tool(name: str) -> str:
    return str(Path(sys.executable).parent / name)


async def _spawn(log: Path, *argv: str, env: dict[str, str] | None = None) -> Any:
    with log.open("ab") as out:
        return await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        )


async def _stop(proc: Any, timeout_s: float = 10.0) -> int:
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
    try:
        async with asyncio.timeout(timeout_s):
            return int(await proc.wait())
    except TimeoutError:
        proc.kill()
        return int(await proc.wait())


async def _get_json(session: aiohttp.ClientSession, url: str) -> Any:
    async with session.get(url) as resp:
        assert resp.status == 200, await resp.text()
        return await resp.json()


async def _wait_all(fakes: list[ScriptedVllm], cond: Any, timeout_s: float) -> None:
    """Until ``cond(gpus)`` holds over every fake's GPUs (re-checked on clock writes)."""
    gpus = [f.gpus[0] for f in fakes]
    async with asyncio.timeout(timeout_s):
        while not cond(gpus):
            waits = [asyncio.ensure_future(f.changed.wait()) for f in fakes]
            try:
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waits:
                    w.cancel()


def _logs(tmp: Path) -> str:
    return "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(tmp.glob("*.log")))


async def test_router_caps_two_real_daemons_under_the_fleet_budget(
    vllms: list[ScriptedVllm], tmp_path: Path
) -> None:
    router_port = free_port()
    router_url = f"http://127.0.0.1:{router_port}"
    config = tmp_path / "router.toml"
    backends = ", ".join(f'"gpu{i}={v.url}"' for i, v in enumerate(vllms))
    config.write_text(
        f"backends = [{backends}]\nport = {router_port}\n"
        f'state_dir = "{tmp_path / "router-state"}"\n\n[fleet_budget]\ncap_w = {CAP_W}\n'
    )
    router = await _spawn(tmp_path / "router.log", _tool("kairos-router"), "run", "-c", str(config))
    daemons, daemon_urls = [], []
    for i, fake in enumerate(vllms):
        port = free_port()
        daemon_urls.append(f"http://127.0.0.1:{port}")
        argv = [
            _tool("kairosd"), "run", "--instance", f"gpu{i}", "--vllm-url", fake.url,
            "--router-url", router_url, "--gpu-backend", "sim", "--policy", "no-control",
            "--epoch-s", str(EPOCH_S), "--listen-port", str(port),
        ]  # fmt: skip
        timeouts = {"KAIROSD_HTTP_TIMEOUT_S": "0.2", "KAIROSD_GPU_TIMEOUT_S": "0.2"}
        daemons.append(await _spawn(tmp_path / f"kairosd-{i}.log", *argv, env=timeouts))
    try:
        # Capped: both below the top clock, and the fleet's simulated power under the cap.
        await _wait_all(
            vllms,
            lambda gpus: (
                all(g.locked_mhz is not None and g.locked_mhz < TOP_MHZ for g in gpus)
                and sum(g.power_w for g in gpus) <= CAP_W
            ),
            timeout_s=START_TIMEOUT_S,
        )
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as s:
            fleet = await _get_json(s, router_url + "/kairos/v1/fleet")
            assert fleet["enabled"] and fleet["cap_w"] == CAP_W
            assert fleet["rounds"] >= 2 and not fleet["infeasible"]
            assert fleet["predicted_power_w"] <= CAP_W
            for i in range(2):
                inst = fleet["instances"][f"gpu{i}"]
                assert inst["kind"] == "capped" and inst["clock_cap_mhz"] < TOP_MHZ
                assert inst["decided_clock_mhz"] == TOP_MHZ  # no-control wants the top
            for url in daemon_urls:
                health = await _get_json(s, url + "/healthz")
                assert health["clock_cap_mhz"] is not None and health["clock_cap_mhz"] < TOP_MHZ
                # The clock obeys the cap it was decided under; a cap lowered since
                # (the next round) is in force while the GPU write is under way.
                under = health["applied_under_cap_mhz"]
                assert under is not None and health["applied_clock_mhz"] <= under < TOP_MHZ
                async with s.get(url + "/metrics") as resp:
                    text = await resp.text()
                assert "kairosd_budget_capped_epochs_total" in text
                assert 'kairosd_clock_cap_mhz{instance="gpu' in text
        # A daemon that exits resets its clocks, capped or not; once its decision
        # expires the router counts it at its top clock and caps the survivor harder.
        assert await _stop(daemons[1]) == 0
        assert vllms[1].gpus[0].locked_mhz is None
        await _wait_all(vllms, lambda gpus: sum(g.power_w for g in gpus) <= CAP_W, WAIT_S)
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as s:
            fleet = await _get_json(s, router_url + "/kairos/v1/fleet")
        assert fleet["instances"]["gpu1"]["kind"] == "stale"
        assert fleet["reserved_w"] >= vllms[1].gpus[0].power_w * 0.95
        # Router gone: the cap lapses with the decision, then the fail-safe runs uncapped.
        assert await _stop(router) == 0
        await _wait_all(vllms[:1], lambda gpus: gpus[0].locked_mhz == TOP_MHZ, WAIT_S)
        assert await _stop(daemons[0]) == 0
        assert vllms[0].gpus[0].locked_mhz is None
    except (AssertionError, TimeoutError):
        print(_logs(tmp_path))
        raise
    finally:
        for proc in [router, *daemons]:
            await _stop(proc, 5.0)

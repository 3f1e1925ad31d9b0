"""id-tracker and kairosd follow the leader of a real router pair (two ``kairos-router``
processes electing a leader through a real ``redis-server``): the standby listed
first is passed over, and after the leader is killed the next calls — the agent's
end report included — reach the router that took over."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest

from kairos_common.testing import ManualClock
from kairosd.testing import ScriptedVllm
from simulator.stack import free_port
from tests.kairosd.conftest import CLOCKS, make_daemon
from tests.scaleout.services import RedisServer

pytestmark = [pytest.mark.e2e, pytest.mark.scaleout, pytest.mark.timeout(120)]


@dataclass
class Pair:
    urls: list[str]
    procs: list[subprocess.Popen[bytes]]
    records: list[Path]
    creds: Path

    async def roles(self) -> list[int]:
        out = []
        async with aiohttp.ClientSession() as s:
            for url in self.urls:
                status = 0
                with contextlib.suppress(aiohttp.ClientError, OSError):
                    async with s.get(url + "/health/ready") as r:
                        status = r.status
                out.append(status)
        return out

    async def leader(self, deadline_s: float = 30.0) -> int:
        """The index of the router that leads (polls until exactly one does)."""
        async with asyncio.timeout(deadline_s):
            while True:
                roles = await self.roles()
                if roles.count(200) == 1:
                    return roles.index(200)
                await asyncio.sleep(0.1)

    def kill(self, k: int) -> None:
        self.procs[k].kill()
        self.procs[k].wait(10)

    def ended(self) -> dict[str, dict[str, object]]:
        rows = [
            json.loads(x)
            for p in self.records
            if p.exists()
            for x in p.read_text().split("\n")
            if x
        ]
        return {str(r["agent_id"]): r for r in rows}


@pytest.fixture
async def pair(redis: RedisServer, tmp_path: Path) -> AsyncIterator[Pair]:
    backend = ScriptedVllm(clock=ManualClock(), supported_clocks_mhz=CLOCKS)
    await backend.start()
    creds = tmp_path / "credentials"
    env = {**os.environ, "KAIROS_ROUTER_CREDENTIALS_DIR": str(creds)}
    ports = [free_port(), free_port()]
    procs, records = [], []
    for k, port in enumerate(ports):
        records.append(tmp_path / f"agents{k}.jsonl")
        log = (tmp_path / f"router{k}.log").open("ab")
        procs.append(subprocess.Popen(
            [str(Path(sys.executable).parent / "kairos-router"), "run",
             "--backend", f"gpu0={backend.url}", "--port", str(port),
             "--state-dir", str(tmp_path / f"state{k}"), "--records", str(records[-1]),
             "--store", redis.url, "--advertise-url", f"http://127.0.0.1:{port}"],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
        ))  # fmt: skip
    pair = Pair([f"http://127.0.0.1:{p}" for p in ports], procs, records, creds)
    try:
        await pair.leader()
        yield pair
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(15)
            if proc.poll() is None:
                proc.kill()
        await backend.stop()


def _tracker_env(pair: Pair) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KAIROS_", "OPENAI_"))}
    token = (pair.creds / "lifecycle.token").read_text().strip()
    return env | {"KAIROS_CONTROL_TOKEN": token, "OPENAI_API_KEY": "sk-user"}


async def test_id_tracker_passes_over_the_standby_and_ends_on_the_new_leader(
    pair: Pair,
) -> None:
    lead = await pair.leader()
    standby = 1 - lead
    cmd = [sys.executable, "-m", "idtracker", "--router-url", pair.urls[standby],
           "--router-url", pair.urls[lead], "--end-timeout-s", "30", "--",
           "sh", "-c", 'echo "$KAIROS_AGENT_ID|$KAIROS_ROUTER_URL"; read line; exit 3']  # fmt: skip
    proc = subprocess.Popen(
        cmd, env=_tracker_env(pair), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout is not None and proc.stdin is not None
    agent_id, router_urls = (await asyncio.to_thread(proc.stdout.readline)).strip().split("|")
    # The agent's nested id-trackers would follow the leader over the same URLs.
    assert router_urls == f"{pair.urls[standby]},{pair.urls[lead]}"
    pair.kill(lead)  # the router that handled the start dies while the agent runs
    assert await pair.leader() == standby  # the standby took over
    proc.stdin.write("go\n")
    proc.stdin.close()
    assert await asyncio.to_thread(proc.wait, 60) == 3
    assert proc.stderr is not None
    assert "could not report agent end" not in proc.stderr.read()
    record = pair.ended()[agent_id]  # written by the new leader
    assert (record["end_reason"], record["exit_code"]) == ("error", 3)


async def test_kairosd_follows_the_leader_across_a_failover(pair: Pair, tmp_path: Path) -> None:
    lead = await pair.leader()
    standby = 1 - lead
    token = (pair.creds / "daemon-gpu0.token").read_text().strip()
    clock = ManualClock()
    vllm = ScriptedVllm(clock=clock, supported_clocks_mhz=CLOCKS)
    await vllm.start()
    try:
        async with aiohttp.ClientSession() as session:
            daemon = await make_daemon(
                vllm, None, session, clock, router_token=token,
                router_urls=[pair.urls[standby], pair.urls[lead]],
            )  # fmt: skip
            await daemon.run_epoch()
            assert daemon.router is not None
            assert daemon.router.routers.current == pair.urls[lead]
            assert await _daemon_fresh(pair.urls[lead])
            pair.kill(lead)
            assert await pair.leader() == standby
            clock.advance(5.0)
            await daemon.run_epoch()
            assert daemon.router.routers.current == pair.urls[standby]
            assert await _daemon_fresh(pair.urls[standby])  # its decision reached the new leader
            assert daemon.failsafe_reason is None
            await daemon.shutdown()
    finally:
        await vllm.stop()


async def _daemon_fresh(url: str) -> bool:
    """Whether this router process itself applied a decision of the daemon (its own
    counter: a decision another router applied does not count)."""
    async with aiohttp.ClientSession() as s, s.get(url + "/metrics") as r:
        text = await r.text()
    applied = 'kairos_router_daemon_decisions_total{instance="gpu0",result="applied"}'
    return any(line.startswith(applied) and float(line.split()[-1]) >= 1 for line in
               text.splitlines())  # fmt: skip

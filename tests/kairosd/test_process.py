"""``kairosd`` as a real process against the fakes on loopback."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from controllers.types import AgentView
from kairosd.testing import FakeRouter, ScriptedVllm
from reporting.records import EpochRecord, read_records

pytestmark = pytest.mark.e2e


@pytest.fixture
async def live_vllm() -> AsyncIterator[ScriptedVllm]:
    fake = ScriptedVllm()
    await fake.start()
    yield fake
    fake.release_hangs()
    await fake.stop()


@pytest.fixture
async def live_router() -> AsyncIterator[FakeRouter]:
    fake = FakeRouter(instance="gpu0")
    await fake.start()
    yield fake
    await fake.stop()


async def kairosd(*args: str, env: dict[str, str] | None = None) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "kairosd",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, **(env or {})},
    )


async def test_sigterm_mid_epoch_resets_clocks_and_exits_cleanly(
    live_vllm: ScriptedVllm, live_router: FakeRouter, tmp_path: Path
) -> None:
    live_router.ongoing = [AgentView(agent_id="a", arrival_s=0.0, context_tokens=40_000)]
    report = tmp_path / "power.jsonl"
    sock_dir = tempfile.mkdtemp(prefix="kd", dir="/tmp")
    notify_path = os.path.join(sock_dir, "notify")
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(notify_path)
    notify.setblocking(False)
    proc = await kairosd(
        "run", "--instance", "gpu0", "--vllm-url", live_vllm.url,
        "--router-url", live_router.url, "--gpu-backend", "sim", "--epoch-s", "0.5",
        "--listen-port", "0", "--report", str(report), "--log-level", "info",
        env={
            "KAIROSD_HTTP_TIMEOUT_S": "0.4",
            "KAIROSD_GPU_TIMEOUT_S": "0.4",
            "NOTIFY_SOCKET": notify_path,
        },
    )  # fmt: skip
    try:
        await live_vllm.wait_for(lambda: live_vllm.gpus[0].locked_mhz is not None, 15.0)
        locked = live_vllm.gpus[0].locked_mhz
        assert locked is not None and locked < live_vllm.gpus[0].supported_clocks_mhz[-1]
        await live_router.wait_for(lambda: len(live_router.decisions) >= 2, 10.0)
        live_vllm.vllm.mode = "hang"  # the next epoch blocks on its metrics scrape
        await live_vllm.wait_for(lambda: live_vllm.hung_requests >= 1, 10.0)
        proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(10.0):
            _, err = await proc.communicate()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 0, err.decode()[-2000:]
    assert live_vllm.gpus[0].locked_mhz is None, "clocks must be reset on SIGTERM"
    records = [r for r in read_records([report]) if isinstance(r, EpochRecord)]
    assert records and all(r.instance == "gpu0" for r in records)
    assert records[0].target_clock_mhz == locked
    assert live_router.decisions[0].instance == "gpu0"
    messages = []
    while True:
        try:
            messages.append(notify.recv(4096).decode())
        except BlockingIOError:
            break
    notify.close()
    os.unlink(notify_path)
    os.rmdir(sock_dir)
    assert any("READY=1" in m for m in messages)
    assert any("WATCHDOG=1" in m for m in messages)
    assert any("STOPPING=1" in m for m in messages)


async def test_require_control_without_permission_exits_3(live_vllm: ScriptedVllm) -> None:
    live_vllm.deny_control = True
    proc = await kairosd(
        "run", "--instance", "gpu0", "--vllm-url", live_vllm.url, "--gpu-backend", "sim",
        "--require-control", "--listen-port", "0", "--epoch-s", "5",
    )  # fmt: skip
    async with asyncio.timeout(15.0):
        _, err = await proc.communicate()
    assert proc.returncode == 3
    assert b"ZEUSD_SOCK_PATH" in err


async def test_gpus_and_reset_commands(live_vllm: ScriptedVllm) -> None:
    live_vllm.gpus[0].locked_mhz = 900  # as if a crashed daemon left it locked
    proc = await kairosd("gpus", "--gpu-backend", "sim", "--vllm-url", live_vllm.url, "--json")
    async with asyncio.timeout(15.0):
        out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    rows = json.loads(out)
    assert rows[0]["current_clock_mhz"] == 900 and rows[0]["locked_clock_mhz"] == 900
    assert rows[0]["control"].startswith("yes")
    proc = await kairosd("reset", "--gpu-backend", "sim", "--vllm-url", live_vllm.url)
    async with asyncio.timeout(15.0):
        out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    assert live_vllm.gpus[0].locked_mhz is None


async def test_reset_with_instance_config_touches_only_its_gpus(
    tmp_path: Path, live_router: FakeRouter
) -> None:
    fake = ScriptedVllm(num_gpus=3)
    await fake.start()
    try:
        for g in fake.gpus:
            g.locked_mhz = 900
        cfg = tmp_path / "gpu12.toml"
        cfg.write_text(
            f'instance = "gpu12"\nvllm_url = "{fake.url}"\ngpu_backend = "sim"\ngpus = [1, 2]\n'
        )
        proc = await kairosd("reset", "--config", str(cfg))
        async with asyncio.timeout(15.0):
            _, err = await proc.communicate()
        assert proc.returncode == 0, err.decode()
        assert [g.locked_mhz for g in fake.gpus] == [900, None, None]
    finally:
        await fake.stop()


async def test_old_gpu_flag_resets_only_the_gpus_it_names() -> None:
    """``--gpu N`` (repeatable), the old spelling of ``--gpus``, still selects the GPUs
    to unlock, alone or beside ``--gpus``; ignored, reset would unlock every GPU."""
    fake = ScriptedVllm(num_gpus=4)
    await fake.start()
    try:
        for flags, left_locked in (
            (["--gpu", "0", "--gpu", "2"], [False, True, False, True]),
            (["--gpu", "1", "--gpus", "3"], [True, False, True, False]),
        ):
            for g in fake.gpus:
                g.locked_mhz = 900
            proc = await kairosd("reset", "--gpu-backend", "sim", "--vllm-url", fake.url, *flags)
            async with asyncio.timeout(15.0):
                _, err = await proc.communicate()
            assert proc.returncode == 0, err.decode()
            assert [g.locked_mhz is not None for g in fake.gpus] == left_locked, flags
    finally:
        await fake.stop()


async def test_bad_config_exits_2(tmp_path: Path) -> None:
    cfg = tmp_path / "k.toml"
    cfg.write_text('instance = "g"\nvllm_url = "http://127.0.0.1:1"\nepoch_sec = 5\n')
    proc = await kairosd("run", "--config", str(cfg))
    async with asyncio.timeout(15.0):
        _, err = await proc.communicate()
    assert proc.returncode == 2
    assert b"epoch_sec" in err

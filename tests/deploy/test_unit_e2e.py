"""The kairosd unit's own command lines, run as real processes against the fakes.

What systemd would do, without systemd: start ``ExecStart=`` with the shipped
example configuration and a notify socket, check READY=1 and WATCHDOG=1 arrive
at the cadence WatchdogSec assumes, SIGKILL the daemon while it holds a GPU
clocked down (nothing in-process can clean up), then run ``ExecStopPost=`` and
check the clock is unlocked. The GPU is the simulated one served by the fake
vLLM (``gpu_backend`` and URLs are overridden through ``KAIROSD_*`` variables,
as an EnvironmentFile would).
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from controllers.types import AgentView
from kairosd.testing import FakeRouter, ScriptedVllm
from tests.deploy.units import (
    INSTALL_PREFIX,
    SYSTEMD,
    etc_source,
    exec_argv,
    parse_unit,
    seconds,
)

pytestmark = pytest.mark.e2e

EPOCH_S = 0.5


@pytest.fixture
async def fakes() -> AsyncIterator[tuple[ScriptedVllm, FakeRouter]]:
    vllm, router = ScriptedVllm(), FakeRouter(instance="gpu0")
    router.ongoing = [AgentView(agent_id="a", arrival_s=0.0, context_tokens=40_000)]
    await vllm.start()
    await router.start()
    yield vllm, router
    vllm.release_hangs()
    await router.stop()
    await vllm.stop()


@pytest.fixture
def notify_socket() -> Iterator[socket.socket]:
    directory = tempfile.mkdtemp(prefix="kd", dir="/tmp")  # short path for AF_UNIX
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(os.path.join(directory, "notify"))
    sock.setblocking(False)
    yield sock
    path = sock.getsockname()
    sock.close()
    os.unlink(path)
    os.rmdir(directory)


def unit_command(key: str) -> list[str]:
    """The unit's ``key=`` command for instance gpu0, runnable from this checkout."""
    argv = exec_argv(parse_unit(SYSTEMD / "kairosd@.service").one("Service", key))
    program = Path(sys.executable).parent / argv[0].removeprefix(INSTALL_PREFIX)
    config = argv.index("--config") + 1
    argv[config] = str(etc_source(argv[config], "gpu0"))
    return [str(program), *argv[1:]]


async def received(sock: socket.socket, field: str, timeout_s: float) -> float:
    """Wait (bounded) for a datagram containing ``field``; returns its arrival time."""
    loop = asyncio.get_running_loop()
    async with asyncio.timeout(timeout_s):
        while True:
            message = (await loop.sock_recv(sock, 4096)).decode()
            if field in message.splitlines():
                return loop.time()


async def test_sigkilled_daemon_is_cleaned_up_by_exec_stop_post(
    fakes: tuple[ScriptedVllm, FakeRouter], notify_socket: socket.socket, tmp_path: Path
) -> None:
    vllm, router = fakes
    env = {
        **os.environ,
        "NOTIFY_SOCKET": notify_socket.getsockname(),
        "KAIROSD_GPU_BACKEND": "sim",
        "KAIROSD_VLLM_URL": vllm.url,
        "KAIROSD_ROUTER_URL": router.url,
        "KAIROSD_EPOCH_S": str(EPOCH_S),
        "KAIROSD_HTTP_TIMEOUT_S": "0.4",
        "KAIROSD_GPU_TIMEOUT_S": "0.4",
        "KAIROSD_LISTEN_PORT": "0",
        "KAIROSD_REPORT_PATH": str(tmp_path / "gpu0.jsonl"),
    }
    log = (tmp_path / "kairosd.log").open("wb")  # a file: a full pipe would block it
    daemon = await asyncio.create_subprocess_exec(
        *unit_command("ExecStart"), env=env, stdout=log, stderr=log
    )
    log.close()
    try:
        await received(notify_socket, "READY=1", 20.0)
        first = await received(notify_socket, "WATCHDOG=1", 10.0)
        second = await received(notify_socket, "WATCHDOG=1", 10.0)
        watchdog_s = seconds(parse_unit(SYSTEMD / "kairosd@.service").one("Service", "WatchdogSec"))
        # Scaled to the real epoch: pings at most one epoch (plus slack) apart.
        assert (second - first) / EPOCH_S * 5.0 < watchdog_s / 3
        await vllm.wait_for(lambda: vllm.gpus[0].locked_mhz is not None, 10.0)
        assert vllm.gpus[0].clock_mhz < vllm.gpus[0].supported_clocks_mhz[-1]
        daemon.send_signal(signal.SIGKILL)
        async with asyncio.timeout(10.0):
            await daemon.wait()
    except BaseException:
        print((tmp_path / "kairosd.log").read_text()[-3000:])
        raise
    finally:
        if daemon.returncode is None:
            daemon.kill()
            await daemon.wait()
    assert daemon.returncode == -signal.SIGKILL
    assert vllm.gpus[0].locked_mhz is not None, "SIGKILL leaves the clock locked"

    cleanup = await asyncio.create_subprocess_exec(
        *unit_command("ExecStopPost"),
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    async with asyncio.timeout(20.0):
        _, err = await cleanup.communicate()
    assert cleanup.returncode == 0, err.decode()[-2000:]
    assert vllm.gpus[0].locked_mhz is None, "ExecStopPost must unlock the GPU"
    assert vllm.resets and vllm.resets[-1] == (0,), "only the instance's GPU (gpus = [0])"

"""End to end: ``kairos-router run`` as a real process on loopback, the sync OpenAI SDK,
SIGTERM shutdown persisting state, and no secret in the logs."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import openai
import pytest

from kairos_common.testing import free_port
from router.testing import FakeBackend
from tests.router.conftest import CHAT, agent_key, start_agent

pytestmark = pytest.mark.e2e


async def _wait_listening(
    proc: asyncio.subprocess.Process, marker: bytes = b'"listening"'
) -> list[bytes]:
    """Read the child's log until its ``listening`` line (logged after the bind);
    ``marker`` is that event as the log format writes it."""
    assert proc.stderr is not None
    seen: list[bytes] = []
    async with asyncio.timeout(20):
        while True:
            line = await proc.stderr.readline()
            assert line, b"router exited during start-up: " + b"".join(seen)
            seen.append(line)
            if marker in line:
                return seen


async def test_router_process_end_to_end(backend: FakeBackend, tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "KAIROS_ROUTER_IDLE_EXPIRY_S": "120"}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "router.cli", "run", "--backend", f"gpu0={backend.url}",
        "--port", str(port), "--state-dir", str(tmp_path), "--log-json",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env,
    )  # fmt: skip
    try:
        early = await _wait_listening(proc)
        token = await start_agent(url)

        def sync_calls() -> str:
            key = agent_key(token, "sk-secret-user")
            with openai.OpenAI(base_url=url + "/v1", api_key=key) as client:
                client.chat.completions.create(model="fake-model", messages=CHAT)
                stream = client.completions.create(model="fake-model", prompt="x", stream=True)
                return "".join(c.choices[0].text for c in stream)

        assert await asyncio.to_thread(sync_calls) == "tok " * 4
        assert backend.received[0].headers["Authorization"] == "Bearer sk-secret-user"
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(20):
            _, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()[-2000:]
    log = (b"".join(early) + err).decode()
    assert "listening" in log and "router_started" in log
    assert "sk-secret-user" not in log and token not in log
    assert (tmp_path / "router.sqlite3").exists() and (tmp_path / "signing.key").exists()
    assert oct((tmp_path / "signing.key").stat().st_mode & 0o777) == "0o600"


async def test_cli_rejects_bad_config(tmp_path: Path) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "router.cli", "run", "--backend", "not-a-url",
        "--state-dir", str(tmp_path),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    async with asyncio.timeout(20):
        _, err = await proc.communicate()
    assert proc.returncode == 2 and b"expected http(s)://host:port" in err


async def test_old_log_console_flag_writes_text_logs(backend: FakeBackend, tmp_path: Path) -> None:
    """``--log-console``, the old spelling of ``--log-text``, still wins over JSON
    asked for in the environment (and over JSON's default off a terminal)."""
    env = {**os.environ, "KAIROS_ROUTER_LOG_JSON": "true"}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "router.cli", "run", "--backend", f"gpu0={backend.url}",
        "--port", str(free_port()), "--state-dir", str(tmp_path), "--log-console",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env,
    )  # fmt: skip
    try:
        early = await _wait_listening(proc, b"listening")  # in either format
    finally:
        proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(20):
            await proc.communicate()
    lines = [ln for ln in b"".join(early).decode().splitlines() if ln.strip()]
    assert not any(ln.lstrip().startswith("{") for ln in lines), lines
    assert "[info" in lines[-1] and " listening " in lines[-1], lines[-1]

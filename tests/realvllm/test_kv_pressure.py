"""KV cache truth against the real engine: the ledger's U, preemptions, kairosd.

* U: while agents generate, the router's ``U = Σ C_a`` is compared with what vLLM
  really holds, ``kv_cache_usage_perc × capacity``.
* Preemption: the same burst of agents with large, growing contexts on the small
  cache (32 blocks × 128 tokens), once with no admission control, once with
  Kairos admission driven by a real ``kairosd`` that reads the real ``/metrics``
  every epoch and controls a simulated GPU (``kairos fake-vllm`` as a separate
  process, ``KAIROSD_SIM_GPU_URL``). vLLM's own ``num_preemptions`` counter is
  the judge.

Agents are synchronised by their own output lines and stdin (never by sleeps), and
vLLM is paused (``/pause?mode=keep``) while the test reads it or gathers a burst,
so the outcome does not depend on how fast the machine decodes.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.realvllm.engine import (
    Router,
    VllmServer,
    agents,
    finish_agents,
    free_port,
    held_agents,
    preemptions_between,
    running_router,
    spawn,
    tool,
    until_conclusive,
    wait_for,
    wait_healthy,
    wait_usage,
)

pytestmark = [pytest.mark.realvllm, pytest.mark.e2e, pytest.mark.timeout(900)]

BLOCK = 128
# Second-turn output of each of the 3 agents in the U test: ~300-token prompts plus
# 800 tokens is 9 blocks each, 27 of the 31 usable, so nothing is preempted while the
# sampler gets the longest window the cache allows.
OUT2 = 800


@dataclass
class UsageTry:
    u: int
    contexts: list[int]
    prompts2: list[int]
    during: list[float]
    polls: int


SAMPLES = 6


def _sample_while_all_run(
    vllm: VllmServer, router: Router, u: int, k: int
) -> tuple[list[float], int]:
    """``kv_usage_perc`` at up to ``SAMPLES`` steps at which all ``k`` second turns
    run, and the scrapes made. Each sample pauses vLLM and resumes it after, so
    the engine runs only while the sampler waits; it is left paused.

    A scrape showing all k running is one scheduler step's snapshot (vLLM sets both
    gauges from one SchedulerStats) taken while no step runs: no request had
    finished, so no stream had ended and the ledger still holds U (checked)."""
    during: list[float] = []
    polls = [0]

    def sample() -> bool | None:
        vllm.pause()
        polls[0] += 1
        ledger_u = router.instances()[0]["usage_tokens"]
        m = vllm.metrics()
        all_run = ledger_u == u and m.num_running == k and m.kv_usage_frac is not None
        if all_run:
            during.append(m.kv_usage_frac or 0.0)
        if len(during) >= SAMPLES or ledger_u != u or (during and not all_run):
            return True
        vllm.resume()
        return None

    wait_for("the second turns to run", sample, timeout_s=300, every_s=0.2)
    return during, polls[0]


def _usage_try(vllm: VllmServer, workdir: Path, name: str, k: int) -> UsageTry:
    """``k`` agents take a first turn, then a second one together; the second turns
    are sampled while all ``k`` run."""
    with (
        running_router(workdir, vllm.url, name=name) as router,
        agents(router, workdir, k, "turns", "2", "100", "100", f"40,{OUT2}", "--wait") as procs,
    ):
        first = [p.line() for p in procs]
        ready = [p.line() for p in procs]
        assert all(r == {"ready": 1} for r in ready)
        contexts = [f["usage"]["prompt_tokens"] + f["usage"]["completion_tokens"] for f in first]
        u = sum(contexts)
        wait_usage(router, u)  # U = Σ C_a, exact once every first turn is accounted
        vllm.wait_idle()
        # vLLM is frozen (pause, mode keep) for every sample: the scrape reads the KV
        # cache of one scheduler step however long it takes, and between samples the
        # engine runs only while the sampler sleeps. The turns queue until the first
        # resume, so no window closes before it is seen, on any machine (a scrape
        # while vLLM decodes can take longer than the 800 tokens do).
        with vllm.paused():
            for p in procs:
                p.release()
            during, polls = _sample_while_all_run(vllm, router, u, k)
        second = [p.line() for p in procs]
        for p in procs:
            assert p.wait() == 0
    prompts2 = [s["usage"]["prompt_tokens"] for s in second]
    return UsageTry(u, contexts, prompts2, during, polls)


def test_ledger_usage_against_vllm_kv_usage(
    vllm: VllmServer, vllm_workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    k = 3
    capacity = vllm.metrics().capacity_tokens  # static: read before the sampled window
    assert capacity is not None
    # Sampled with vLLM paused, a try sees every second turn running unless the
    # engine ran all 800 steps during one sampler wait. Such a try compares nothing
    # and is run again (bounded).
    tries = until_conclusive(
        lambda i: _usage_try(vllm, vllm_workdir, f"router-usage-{i}", k), lambda t: bool(t.during)
    )
    last = tries[-1]
    u, contexts, prompts2, during = last.u, last.contexts, last.prompts2, last.during
    assert during, (
        f"no scrape caught all {k} second turns running, in {len(tries)} tries "
        f"of {[x.polls for x in tries]} scrapes"
    )
    # vLLM's fraction counts blocks over num_gpu_blocks - 1 (one block is its null block)
    usable_blocks = capacity // BLOCK - 1
    blocks = sorted({round(frac * usable_blocks) for frac in during})
    kv_tokens = sorted({round(frac * capacity) for frac in during})  # what Kairos reads
    errors = [t - u for t in kv_tokens]
    with capsys.disabled():
        print(
            f"\nrealvllm U: {k} agents, ledger U={u} (C_a {contexts}); second-turn prompts "
            f"{prompts2} + up to {OUT2} generated; {len(during)} samples while all ran: "
            f"vLLM blocks {blocks}, kv_usage_perc x capacity {kv_tokens}, error vs U {errors}; "
            f"at the first sample: new turn input {sum(prompts2) - u}, block rounding "
            f"{blocks[0] * BLOCK - sum(prompts2)} (with the tokens generated so far), null-block "
            f"denominator {kv_tokens[0] - blocks[0] * BLOCK}"
        )
    # vLLM holds at least each second turn's prompt (which contains C_a), block-rounded ...
    low = sum(-(-p // BLOCK) for p in prompts2)
    # ... and at most that plus the OUT2 tokens each may generate
    high = sum(-(-(p + OUT2) // BLOCK) for p in prompts2)
    assert low <= blocks[0] and blocks[-1] <= high
    assert kv_tokens[0] >= u


@dataclass
class BurstResult:
    preemptions: int
    max_running: int
    held_agents: int
    records: list[dict[str, Any]]


def _burst(vllm: VllmServer, router: Router, workdir: Path, n: int) -> BurstResult:
    """``n`` agents released together. Each: a 905-token prompt (8 blocks), then one
    more turn of +30 words, 400 output tokens a turn (ignore_eos): at most ~1650
    tokens (13 blocks). Two fit in the 31 usable blocks with all their growth; three
    prompts fit but not their first turns' growth, so without admission control
    vLLM must preempt."""
    before = vllm.wait_idle()
    with (
        agents(router, workdir, n, "turns", "2", "700", "30", "400", "--wait-first") as procs,
        running_sampler(vllm) as peak,
    ):
        for p in procs:
            assert p.line() == {"ready": 0}
        # The first turns meet in vLLM on any machine: it is paused until the router
        # has every agent (admitted or held), so none can end before the last is sent.
        with vllm.paused():
            for p in procs:
                p.release()
            wait_for(
                "the router to have every first turn",
                lambda: _arrived(router) >= n or None,
                timeout_s=60,
            )
        records = finish_agents(router, procs)
    after = vllm.wait_idle()
    return BurstResult(
        preemptions=preemptions_between(before, after),
        max_running=peak[0],
        held_agents=held_agents(records),
        records=records,
    )


def _arrived(router: Router) -> int:
    """Agents whose first request the router has: admitted (ongoing) or held."""
    inst = router.instances()[0]
    return int(inst["ongoing"]) + int(inst["pending"])


@contextlib.contextmanager
def running_sampler(vllm: VllmServer) -> Iterator[list[int]]:
    """Track vLLM's peak ``num_requests_running`` from a thread while the body runs
    (informational: what the assertions rest on is the preemption counter)."""
    peak = [0]
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(0.1):
            with contextlib.suppress(OSError, ValueError):
                peak[0] = max(peak[0], vllm.metrics().num_running or 0)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield peak
    finally:
        stop.set()
        thread.join(timeout=30)


ADMISSION = """policy = "{policy}"

[admission]
beta = 0.6
gamma = 0.55
"""


@pytest.fixture(scope="module")
def sim_gpu(vllm_workdir: Path) -> Iterator[str]:
    """A simulated GPU as its own process (a fake vLLM, used only for its GPU)."""
    port = free_port()
    proc = spawn("sim-gpu", [*tool("kairos"), "fake-vllm", "--port", str(port)], vllm_workdir)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(proc, url + "/health", 60)
        yield url
    finally:
        proc.stop()


def test_preemptions_no_control_against_kairos_admission(
    vllm: VllmServer, vllm_workdir: Path, sim_gpu: str, capsys: pytest.CaptureFixture[str]
) -> None:
    n = 4
    with running_router(
        vllm_workdir, vllm.url, ADMISSION.format(policy="no-control"), name="router-nocontrol"
    ) as router:
        free = _burst(vllm, router, vllm_workdir, n)
    report = vllm_workdir / "kairosd-epochs.jsonl"
    with running_router(
        vllm_workdir, vllm.url, ADMISSION.format(policy="kairos"), name="router-kairos"
    ) as router:
        port = free_port()
        daemon = spawn(
            "kairosd",
            [
                *tool("kairosd"),
                "run",
                "--instance",
                "i0",
                "--vllm-url",
                vllm.url,
                "--router-url",
                router.url,
                "--gpu-backend",
                "sim",
                "--epoch-s",
                "1.0",
                "--report",
                str(report),
                "--listen-port",
                str(port),
                "--log-json",
            ],
            vllm_workdir,
            env={
                "KAIROSD_SIM_GPU_URL": sim_gpu,
                "KAIROSD_HTTP_TIMEOUT_S": "0.8",
                "KAIROSD_GPU_TIMEOUT_S": "0.8",
                "KAIROSD_KAIROS__BETA": "0.6",
                "KAIROSD_KAIROS__GAMMA": "0.55",
            },
        )
        try:
            wait_for("kairosd's first epochs", lambda: _epochs(report, 2), timeout_s=60)
            kairos = _burst(vllm, router, vllm_workdir, n)
            epochs = _epochs(report, 1) or []
        finally:
            daemon.stop()
    with capsys.disabled():
        print(
            f"\nrealvllm preemptions, {n} agents on 32 blocks: no control {free.preemptions} "
            f"(max running {free.max_running}), kairos admission {kairos.preemptions} "
            f"(max running {kairos.max_running}, {kairos.held_agents} agents held); "
            f"kairosd epochs {len(epochs)}"
        )
    assert free.preemptions > 0
    assert kairos.held_agents > 0
    assert kairos.preemptions < free.preemptions
    # kairosd read the real /metrics every epoch: capacity from cache_config_info,
    # vLLM's preemption counter, a clock decision applied to the simulated GPU.
    assert len(epochs) >= 3
    assert {e["capacity_tokens"] for e in epochs} == {32 * BLOCK}
    # vLLM's counter is read at both ends of each epoch. On a busy machine a scrape
    # can miss kairosd's 0.8 s timeout: that epoch records None (unknown, never 0).
    known = [e["preemptions"] for e in epochs if e["preemptions"] is not None]
    assert known and sum(known) <= kairos.preemptions
    assert max(e["ongoing"] for e in epochs) >= 1
    assert all(e["actual_clock_mhz"] for e in epochs)


def _epochs(path: Path, at_least: int) -> list[dict[str, Any]] | None:
    if not path.exists():
        return None
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    rows = [r for r in rows if r.get("kind", "epoch") == "epoch"]
    return rows if len(rows) >= at_least else None

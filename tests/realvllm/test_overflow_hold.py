"""Point 16 and vLLM's admission gate against the real engine: what happens when the
admitted agents' contexts outgrow the KV cache (docs/control-law.md, point 16;
docs/simulator.md, "Engine model").

Three agents are admitted one by one while their first turns are small enough for
Eq. 13, and those turns leave each with a context of ~1400 tokens: together more
than the cache (32 blocks × 128 tokens). Then their second turns are released
together. The servers here chunk these ~1400-token prompts (256 tokens a step) as
a production server chunks a 100K-token Claude Code prompt, and run without prefix
caching, so that every second turn prefills its whole prompt (what survives of the
first turns' cached blocks would otherwise decide the outcome).

* vLLM's default (``--scheduler-reserve-full-isl``) admits a waiting request only
  when its whole prompt fits: the third waits in vLLM's queue and nothing is
  preempted. The simulator's engine models this gate (``EngineParams.reserve_full_isl``).
* Without that gate (``--no-scheduler-reserve-full-isl``, as V1 admitted before
  it) the third is admitted on its first chunk and a later chunk that finds no free
  block preempts, again and again: thrashing. Point 16 holds that request in the
  router instead (under ``kairos``; ``kairos-no-ta``, without admission control,
  has no hold-back), and nothing is preempted.

vLLM's own ``num_preemptions`` counter is the judge. Agents are synchronised by
their own output lines and stdin, never by sleeps, and vLLM is paused
(``/pause?mode=keep``) until the router has all three second turns, so they meet
in the engine however slow the machine.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.realvllm.engine import (
    VllmServer,
    VllmSpec,
    agents,
    finish_agents,
    held_agents,
    preemptions_between,
    running_router,
    running_vllm,
    unavailable_reason,
    wait_for,
    wait_usage,
)

pytestmark = [pytest.mark.realvllm, pytest.mark.e2e, pytest.mark.timeout(900)]

CHUNKED = ("--enforce-eager", "--max-num-batched-tokens", "256", "--max-num-seqs", "8")
FULL_ISL = VllmSpec(
    num_gpu_blocks=32, max_model_len=2048, extra=(*CHUNKED, "--no-enable-prefix-caching")
)
FIRST_CHUNK = dataclasses.replace(
    FULL_ISL, extra=(*FULL_ISL.extra, "--no-scheduler-reserve-full-isl")
)
# First turn: 800 words (~1050 tokens, estimated ~1100 from the body) and 350 output
# tokens: C_a ≈ 1400, three of them 4200 > U_max = 4096. Second turn: the history,
# 10 more words, 300 output tokens: ~1700 tokens (14 blocks) each; two fit in the 31
# usable blocks, three do not.
TURNS = ("turns", "2", "800", "10", "350,300", "--wait-first", "--wait")
# No daemon: the router admits by its policy's rule. Under ``kairos`` (β, γ = 0.98,
# 0.95) Eq. 13 admits the third newcomer on top of two ~1400-token contexts (2800 +
# ~1100 ≤ 0.98·4096 = 4014, and 2800 < 0.95·4096): all three are admitted before
# their contexts outgrow the cache. ``kairos-no-ta`` admits them all and holds no
# request back.
ADMISSION = 'policy = "{policy}"\n'


@contextlib.contextmanager
def _server(workdir: Path, spec: VllmSpec, name: str) -> Iterator[VllmServer]:
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    with running_vllm(workdir, spec, name=name) as server:
        print(f"\nrealvllm: {name} up in {server.startup_s:.0f}s")
        assert server.metrics().capacity_tokens == 32 * 128
        yield server


@dataclass
class Outgrown:
    preemptions: int
    held_back: int
    contexts: list[int]
    records: list[dict[str, Any]]


def _outgrow(vllm: VllmServer, workdir: Path, hold: bool, name: str) -> Outgrown:
    before = vllm.wait_idle()
    config = ADMISSION.format(policy="kairos" if hold else "kairos-no-ta")
    with (
        running_router(workdir, vllm.url, config, name=name) as router,
        agents(router, workdir, 3, *TURNS) as procs,
    ):
        contexts, ids = [], []
        for p in procs:  # first turns one at a time: each admitted, nothing preempted
            assert p.line() == {"ready": 0}
            p.release()
            first = p.line()
            contexts.append(first["usage"]["prompt_tokens"] + first["usage"]["completion_tokens"])
            ids.append(first["agent"])
            assert p.line() == {"ready": 1}
        wait_usage(router, sum(contexts))
        # The second turns meet in vLLM on any machine: it is paused until the router
        # has all three (forwarded, or held back), so none can end before the last
        # is sent.
        with vllm.paused():
            for p in procs:
                p.release()
            wait_for(
                "the router to have every second turn",
                lambda: all(router.agent(i)["in_flight"] for i in ids) or None,
                timeout_s=60,
            )
        records = finish_agents(router, procs)
        after = vllm.wait_idle()
    return Outgrown(
        preemptions=preemptions_between(before, after),
        held_back=held_agents(records),
        contexts=contexts,
        records=records,
    )


def test_outgrown_contexts_against_vllm_gate_and_the_hold_back(
    vllm_workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # One server at a time: each holds its own KV cache and CPU threads.
    with _server(vllm_workdir, FULL_ISL, "vllm-full-isl") as vllm:
        gated = _outgrow(vllm, vllm_workdir, False, "router-full-isl")
    with _server(vllm_workdir, FIRST_CHUNK, "vllm-first-chunk") as vllm:
        free = _outgrow(vllm, vllm_workdir, False, "router-nohold")
        held = _outgrow(vllm, vllm_workdir, True, "router-hold")
    with capsys.disabled():
        print(
            f"\nrealvllm outgrown contexts {free.contexts} on a 4096-token cache: "
            f"preemptions with vLLM's full-ISL gate {gated.preemptions}; admitting on the "
            f"first chunk {free.preemptions}, with point 16's hold-back {held.preemptions} "
            f"({held.held_back} agent held back)"
        )
    assert sum(held.contexts) > 32 * 128  # the admitted contexts outgrew the cache
    assert free.held_back == 0 and free.preemptions > 0  # admitted on a chunk: thrashing
    # vLLM's gate stops most of it: it checks a whole prompt against the blocks free
    # now (not those the running prefills will still take), as the simulator does.
    assert gated.held_back == 0 and gated.preemptions < free.preemptions
    assert held.held_back == 1 and held.preemptions == 0  # point 16: none at all
    assert all(r["end_reason"] == "exit" for r in [*gated.records, *held.records])

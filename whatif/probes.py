"""The calibration's probes: what each one sends, what its steps add up to, its timing.

Two shapes, each run alone on an otherwise idle engine so that the steps it
causes are known exactly:

* **prefill** — one request of ``cached + uncached`` prompt tokens and one output
  token, after a request of the ``cached`` prefix alone has left it in the prefix
  cache. Its steps are vLLM's chunks of at most ``max_num_batched_tokens`` of the
  uncached part (the last also samples the token), plus the request's admission;
  its time is send → token. The warm-up request is a probe too (``cached``
  uncached tokens). vLLM's ``prefix_cache_hits`` counter must move by exactly
  the cached part: a check that the engine caches as the simulator does (whole
  blocks, never the prompt's last token).
* **decode** — ``batch`` requests of ``context`` distinct prompt tokens sent
  together, each generating ``tokens``. Once the last one has its first token
  and before the first one finishes, every step decodes all of them: a window
  of ``k`` steps timed on the last one's tokens, with ``batch`` sequences a step
  and a known context each.

Prompts are random token ids from a range every tokenizer has (a fresh random
start each run), so probes never share a prefix with each other or with what a
production engine holds, except where a probe means to.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass

from simulator.timing import attention_pairs
from whatif.errors import ProbeError
from whatif.fit import Observation, features
from whatif.probe import TimedCall, VllmProbe

TOKEN_IDS = (100, 1000)
"""Prompt token ids are drawn from here: below every tokenizer's size, above the
special tokens small vocabularies put first."""
MIN_WINDOW_STEPS = 24
"""A decode probe's window must hold this many steps to count."""


@dataclass(frozen=True, slots=True)
class EngineShape:
    """The engine's limits the probes and their step schedules depend on."""

    capacity_tokens: int
    block_size: int
    max_model_len: int
    max_num_batched_tokens: int
    max_num_seqs: int


@dataclass(frozen=True, slots=True)
class PrefillProbe:
    cached: int
    uncached: int

    @property
    def label(self) -> str:
        return f"prefill cached={self.cached} uncached={self.uncached}"


@dataclass(frozen=True, slots=True)
class DecodeProbe:
    batch: int
    context: int
    tokens: int

    @property
    def label(self) -> str:
        return f"decode batch={self.batch} context={self.context} tokens={self.tokens}"


Probe = PrefillProbe | DecodeProbe


@dataclass(frozen=True, slots=True)
class ProbeResult:
    observations: tuple[Observation, ...]
    expected_hits: int
    measured_hits: int | None
    """vLLM's ``prefix_cache_hits`` delta over the probe (None: not exported)."""


def prefill_features(cached: int, uncached: int, budget: int, block_size: int) -> tuple[float, ...]:
    """What the steps of a lone request of ``cached + uncached`` prompt tokens add up
    to when ``cached`` (whole blocks) come from the prefix cache."""
    hit = min(cached, cached + uncached - 1) // block_size * block_size
    computed = hit
    total = cached + uncached
    steps = tokens = pairs = 0
    while computed < total:
        n = min(budget, total - computed)
        steps += 1
        tokens += n
        pairs += attention_pairs(n, computed)
        computed += n
    return features(
        steps=steps,
        seq_steps=steps,
        prefill_tokens=tokens,
        attn_pairs=pairs,
        requests=1,
        request_prompt_tokens=total,
    )


def decode_window(calls: list[TimedCall], context: int, label: str) -> Observation | None:
    """The steps in which every call decodes, timed on the last call to start;
    None when the window is too short to time."""
    end = min(c.last_s for c in calls)
    ref = max(calls, key=lambda c: c.first_s)
    times = [t for t in ref.token_s if t <= end]
    # Tokens the API server sent together arrive with the later one's time: only the
    # last token of such a group is on time, so the window runs between two of those.
    on_time = [j for j in range(len(times) - 1) if times[j] < times[j + 1]]
    if len(on_time) < 2:
        return None
    first, last = on_time[0], on_time[-1]
    k = last - first  # steps: the reference call gains one token a step
    duration = times[last] - times[first]
    if k < MIN_WINDOW_STEPS or duration <= 0:
        return None
    batch = len(calls)
    # Tokens each call had when the window opened (its first one included). A call
    # with g tokens has prompt + g - 1 of them in the KV cache (the newest is the
    # next step's input), which the step model prices: during step j (1..k) that
    # is its prompt + had + j - 2.
    opened = times[first]
    had = [sum(1 for t in c.token_s if t <= opened) for c in calls]
    context_sum = k * sum(context + g - 1 for g in had) + batch * k * (k - 1) / 2
    return Observation(
        "decode",
        label,
        features(steps=k, seq_steps=k * batch, decode_context_tokens=context_sum),
        duration,
    )


class ProbeRunner:
    """Runs probes one at a time on an idle engine, checking it stays ours."""

    def __init__(self, probe: VllmProbe, shape: EngineShape, seed: int) -> None:
        self.probe = probe
        self.shape = shape
        self._rng = random.Random(seed)
        self.foreign = 0
        """Probes dropped because other traffic reached the engine meanwhile."""

    def prompt(self, n: int) -> list[int]:
        lo, hi = TOKEN_IDS
        return [self._rng.randrange(lo, hi) for _ in range(n)]

    async def wait_idle(self, timeout_s: float = 120.0) -> None:
        """Until vLLM runs and queues nothing (bounded)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            m = await self.probe.metrics()
            if not (m.num_running or m.num_waiting):
                return
            if loop.time() > deadline:
                raise ProbeError(
                    f"vLLM stayed busy for {timeout_s:.0f} s ({m.num_running} running, "
                    f"{m.num_waiting} waiting): calibrate an engine without other traffic"
                )
            await asyncio.sleep(0.2)  # polling another process, bounded by the deadline

    async def run(self, probe: Probe) -> ProbeResult | None:
        """One probe; None when other traffic reached the engine while it ran."""
        await self.wait_idle()
        before = await self.probe.metrics()
        if isinstance(probe, PrefillProbe):
            result, prompt_tokens = await self._prefill(probe)
        else:
            result, prompt_tokens = await self._decode(probe)
        after = await self.probe.metrics()
        if (
            before.prompt_tokens_total is not None
            and after.prompt_tokens_total is not None
            and after.prompt_tokens_total - before.prompt_tokens_total != prompt_tokens
        ):
            self.foreign += 1
            return None
        hits = None
        if before.prefix_cache_hits_total is not None and after.prefix_cache_hits_total is not None:
            hits = after.prefix_cache_hits_total - before.prefix_cache_hits_total
        return ProbeResult(result[0], result[1], hits)

    async def _prefill(
        self, probe: PrefillProbe
    ) -> tuple[tuple[tuple[Observation, ...], int], int]:
        s = self.shape
        prefix = self.prompt(probe.cached)
        observations = []
        sent = 0
        if probe.cached:
            warm = await self.probe.complete(prefix, 1)
            feats = prefill_features(0, probe.cached, s.max_num_batched_tokens, s.block_size)
            label = f"{probe.label} (warm-up)"
            observations.append(Observation("prefill", label, feats, warm.first_s - warm.sent_s))
            sent += probe.cached
        prompt = prefix + self.prompt(probe.uncached)
        call = await self.probe.complete(prompt, 1)
        sent += len(prompt)
        feats = prefill_features(
            probe.cached, probe.uncached, s.max_num_batched_tokens, s.block_size
        )
        observations.append(Observation("prefill", probe.label, feats, call.first_s - call.sent_s))
        hit = min(probe.cached, len(prompt) - 1) // s.block_size * s.block_size
        return (tuple(observations), hit), sent

    async def _decode(self, probe: DecodeProbe) -> tuple[tuple[tuple[Observation, ...], int], int]:
        prompts = [self.prompt(probe.context) for _ in range(probe.batch)]
        calls = await asyncio.gather(*(self.probe.complete(p, probe.tokens) for p in prompts))
        window = decode_window(list(calls), probe.context, probe.label)
        return ((window,) if window is not None else (), 0), probe.batch * probe.context

"""The CPU stack's check of its own time acceleration.

The stack runs simulated GPUs ``speedup`` times faster than real time, so every
real-time delay of a process — an agent arriving late, a daemon epoch running
late, a fake-vLLM engine step delivered late — is ``speedup`` times larger in
simulated time. On a slow or busy machine those delays, not Kairos, decide the
result. So the stack

* chooses the speed-up from what the machine holds (:func:`choose_speedup`:
  how many cores it may use and how long one agent launch takes), and
* measures its own lag in each run (:class:`LagReport`) and calls the run's
  numbers invalid when any lag exceeds :data:`LAG_BOUND_SIM_S`.

The bound is one KAIROS epoch (5 simulated seconds): below it no control
decision is skipped, no agent arrives later than one epoch (the demo's agents
arrive ≈16 simulated seconds apart), and one late engine step adds at most one
epoch to a single request of an agent's ≈100.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import os
import sys
import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

import aiohttp

from reporting.records import EpochRecord

LAG_BOUND_SIM_S = 5.0
"""Largest lag (simulated seconds) at which a run's numbers still count."""

STEP_LAG_METRIC = "kairos_fake_step_lag_max_seconds"

REFERENCE_LAUNCH_S = 1.5
"""Real seconds a fresh Python takes to import the agent runtime on an idle
2-core machine of the kind the demo's figures come from (README)."""
STACK_SPEEDUP_PER_CORE = 20.0
"""One stack (2 fake vLLMs, 2 daemons, router, agent host) at ×20 keeps about
half such a core busy with the demo's workload: ×20 per core leaves room for
the bursts."""
MIN_SPEEDUP = 4.0


@dataclass(frozen=True, slots=True)
class MachineProbe:
    """What the machine holds right now, measured before the stack starts."""

    cores: int
    launch_s: float
    """Real seconds a fresh Python took to import the agent runtime."""


@dataclass(frozen=True, slots=True)
class LagReport:
    """The largest lags of one run, simulated seconds."""

    speedup: float
    arrival_s: float
    epoch_s: float
    step_s: float
    bound_s: float = LAG_BOUND_SIM_S

    @property
    def max_s(self) -> float:
        return max(self.arrival_s, self.epoch_s, self.step_s)

    @property
    def valid(self) -> bool:
        return self.max_s <= self.bound_s

    def describe(self) -> str:
        return (
            f"lag (simulated s, bound {self.bound_s:g}): agent arrival {self.arrival_s:.2f}, "
            f"kairosd epoch {self.epoch_s:.2f}, fake-vLLM step {self.step_s:.2f} "
            f"at ×{self.speedup:g}"
        )

    def verdict(self) -> str:
        """One line: valid, or why this machine's numbers do not count."""
        if self.valid:
            return f"self-check passed: {self.describe()}"
        return (
            f"NOT VALID ON THIS MACHINE: {self.describe()} — the stack could not keep up "
            f"with ×{self.speedup:g} time; these numbers measure the machine, not Kairos "
            "(rerun on a quieter machine or with a lower --speedup)"
        )


def epoch_lateness_s(epochs: Iterable[EpochRecord], period_real_s: float) -> float:
    """Largest real delay of a daemon epoch: gap between consecutive records of
    one instance beyond the period (a skipped epoch counts as a period late)."""
    by_instance: dict[str, list[float]] = defaultdict(list)
    for e in epochs:
        by_instance[e.instance].append(e.t_s)
    worst = 0.0
    for times in by_instance.values():
        for a, b in itertools.pairwise(sorted(times)):
            worst = max(worst, b - a - period_real_s)
    return worst


async def step_lag_s(vllm_urls: Iterable[str], timeout_s: float = 5.0) -> float:
    """Largest fake-vLLM engine step lag (real seconds) so far, over the servers."""
    worst = 0.0
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as s:
        for url in vllm_urls:
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                async with s.get(f"{url}/metrics") as resp:
                    text = await resp.text()
                for line in text.splitlines():
                    if line.startswith(STEP_LAG_METRIC):
                        worst = max(worst, float(line.rsplit(" ", 1)[1]))
    return worst


async def probe_machine(python: str = sys.executable) -> MachineProbe:
    """Cores we may use, and the cost of one agent launch (a fresh Python
    importing the agent runtime) on this machine under its current load."""
    started = time.monotonic()
    proc = await asyncio.create_subprocess_exec(
        python,
        "-c",
        "import simulator.agent_host",
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    await asyncio.wait_for(proc.wait(), timeout=120.0)
    return MachineProbe(cores=len(os.sched_getaffinity(0)), launch_s=time.monotonic() - started)


def choose_speedup(
    max_speedup: float, probe: MachineProbe, *, stacks: int = 1, min_speedup: float = MIN_SPEEDUP
) -> float:
    """The speed-up this machine holds for ``stacks`` stacks running at once:
    proportional to the cores we may use (up to 2: the stack's busiest
    processes are two or three) and to single-core speed under the current load
    (reference launch time over measured), within ``[min_speedup, max_speedup]``,
    rounded down to a whole number."""
    slowness = max(1.0, probe.launch_s / REFERENCE_LAUNCH_S)
    fit = STACK_SPEEDUP_PER_CORE * min(probe.cores, 2) / (max(stacks, 1) * slowness)
    least = min(max_speedup, math.ceil(min_speedup))
    return float(max(least, min(max_speedup, int(fit))))

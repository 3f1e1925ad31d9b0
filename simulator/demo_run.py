"""One policy run of the CPU end-to-end stack, and its summary.

``make demo`` and the end-to-end tests call :func:`run_policies` (every policy
side by side on identical arrivals, one stack each) or :func:`run_policy` (one):
choose the speed-up this machine holds (:func:`calibrated`), start the stack
(:mod:`simulator.stack`), start the agents before the clock
(:mod:`simulator.agent_driver`), run a fixed window, stop everything, and
summarise the daemons' power reports and the router's agent records with the
shared metric definitions (:mod:`reporting.metrics`). The window has the same
length for every policy (arrivals plus a drain period), so energy and average
power compare directly. Each result carries the run's measured lag
(:class:`~simulator.selfcheck.LagReport`): when ``result.lag.valid`` is false
the numbers describe the machine, not the policy.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from dataclasses import dataclass, field
from pathlib import Path

from reporting.metrics import Summary, summarize
from reporting.plots import plot_group
from reporting.records import AgentRecord, EpochRecord, read_records
from reporting.report import Group
from simulator.agent_driver import DriverConfig, DriverResult, drive
from simulator.arrivals import poisson_arrivals
from simulator.selfcheck import (
    LagReport,
    choose_speedup,
    epoch_lateness_s,
    probe_machine,
    step_lag_s,
)
from simulator.stack import StackConfig, running_stack, to_simulated_units
from simulator.workload import AgentProgram, Workload


@dataclass(frozen=True, slots=True)
class DemoConfig:
    """Everything that must be identical across the policies being compared."""

    out_dir: Path
    rate_per_s: float = 0.06
    window_s: float = 1200.0
    drain_s: float = 400.0
    speedup: float = 20.0
    """The largest time acceleration to use; with ``auto_speedup`` the machine may
    get less (:func:`calibrated`)."""
    auto_speedup: bool = True
    min_speedup: float = 4.0
    """With ``auto_speedup``, never slower than this (the demo's time budget);
    the self-check says when the machine cannot hold it."""
    instances: int = 2
    preset: str = "h100-nvl-qwen3-30b-small-kv"
    slo_tok_s: float = 20.0
    seed: int = 7
    placement: str = "consolidating"
    kv_capacity_tokens: int | None = 192_000
    """Half an H100 NVL's cache for this model: with two instances and the paper's
    agents at 0.06/s the cache gets busy (admission control has work to do)
    without spending the whole demo past capacity."""
    kv_offloading_size_gib: float = 0.0
    """A CPU KV tier on every fake vLLM (vLLM's ``--kv-offloading-size``); 0: none."""


@dataclass(slots=True)
class PolicyResult:
    """What one policy run produced (summary in simulated-GPU units)."""

    policy: str
    summary: Summary
    driver: DriverResult
    epochs: list[EpochRecord] = field(default_factory=list)
    agents: list[AgentRecord] = field(default_factory=list)
    plot: Path | None = None
    workdir: Path = Path()
    lag: LagReport | None = None
    speedup: float = 0.0

    @property
    def done(self) -> int:
        """Agents that ended with status 0 (router records)."""
        return sum(1 for a in self.agents if a.exit_code == 0)

    def headline(self) -> dict[str, float | int | None]:
        """The ``demo-summary`` fields of this policy (simulated-GPU units)."""
        s = self.summary
        return {
            "avg_power_w": round(s.avg_power_w, 2),
            "energy_per_output_token_j": _round(s.energy_per_output_token_j, 4),
            "p5_agent_throughput_tok_s": _round(s.p5_agent_throughput_tok_s, 2),
            "slo_attainment": _round(s.slo_attainment, 4),
            "agents_arrived": self.driver.launched,
            "agents_done": self.done,
            "max_lag_s": None if self.lag is None else round(self.lag.max_s, 3),
        }

    @property
    def admitted(self) -> int:
        return sum(e.admitted for e in self.epochs)

    @property
    def max_pending(self) -> int:
        return max((e.pending for e in self.epochs), default=0)

    @property
    def clocks_mhz(self) -> set[int]:
        return {e.target_clock_mhz for e in self.epochs}

    @property
    def deferred_epochs(self) -> int:
        return sum(1 for e in self.epochs if e.deferred)


def _round(x: float | None, digits: int) -> float | None:
    return None if x is None else round(x, digits)


async def calibrated(cfg: DemoConfig, stacks: int = 1) -> DemoConfig:
    """``cfg`` with the speed-up this machine holds now for ``stacks`` stacks at
    once (at most ``cfg.speedup``, at least ``cfg.min_speedup``), fixed, so
    every policy of one comparison runs at the same one."""
    if not cfg.auto_speedup:
        return cfg
    probe = await probe_machine()
    speedup = choose_speedup(cfg.speedup, probe, stacks=stacks, min_speedup=cfg.min_speedup)
    return dataclasses.replace(cfg, speedup=speedup, auto_speedup=False)


async def run_policies(
    cfg: DemoConfig, policies: list[str], arrivals: list[tuple[float, AgentProgram]]
) -> list[PolicyResult]:
    """Run every policy on the same arrivals *at the same time*, one stack each:
    the machine's load falls on all of them alike, and the comparison takes the
    wall time of one run."""
    cfg = await calibrated(cfg, stacks=len(policies))
    return list(await asyncio.gather(*(run_policy(cfg, p, arrivals) for p in policies)))


def arrivals_for(cfg: DemoConfig, workload: Workload) -> list[tuple[float, AgentProgram]]:
    """Seeded Poisson arrivals of the workload's agents (same for every policy)."""
    times = poisson_arrivals(cfg.rate_per_s, cfg.window_s, cfg.seed)
    return [(t, workload.program(i)) for i, t in enumerate(times)]


def _load(
    workdir: Path, instances: int, t0: float, t1: float
) -> tuple[list[EpochRecord], list[AgentRecord]]:
    paths = [workdir / f"kairosd-i{i}.jsonl" for i in range(instances)]
    paths.append(workdir / "agents.jsonl")
    records = list(read_records(p for p in paths if p.exists()))
    epochs = [r for r in records if isinstance(r, EpochRecord) and t0 <= r.t_s <= t1]
    agents = [r for r in records if isinstance(r, AgentRecord)]
    return epochs, agents


async def run_policy(
    cfg: DemoConfig, policy: str, arrivals: list[tuple[float, AgentProgram]]
) -> PolicyResult:
    """Run ``policy`` on ``arrivals`` for the fixed window; summarise it and
    measure the run's lag (``result.lag``; check ``result.lag.valid``)."""
    cfg = await calibrated(cfg)
    workdir = cfg.out_dir / policy.replace(":", "-")
    stack_cfg = StackConfig(
        workdir=workdir,
        policy=policy,
        instances=cfg.instances,
        speedup=cfg.speedup,
        preset=cfg.preset,
        slo_tok_s=cfg.slo_tok_s,
        placement=cfg.placement,
        kv_capacity_tokens=cfg.kv_capacity_tokens,
        kv_offloading_size_gib=cfg.kv_offloading_size_gib,
    )
    window_real_s = (cfg.window_s + cfg.drain_s) / cfg.speedup
    async with running_stack(stack_cfg) as stack:
        driver = await drive(
            DriverConfig(
                router_url=stack.router_url, speedup=cfg.speedup, deadline_real_s=window_real_s
            ),
            arrivals,
            workdir / "agents.log",
        )
        t0 = driver.t0_unix_s
        # A fixed window for every policy, even when its agents finished early.
        await asyncio.sleep(max(0.0, t0 + window_real_s - time.time()))
        t1 = time.time()
        step_lag = await step_lag_s(stack.vllm_urls)
    epochs, agents = _load(workdir, cfg.instances, t0, t1)
    completed = [a for a in agents if a.exit_code == 0]
    real = summarize(
        policy, epochs, completed, slo_tok_s=cfg.slo_tok_s * cfg.speedup, duration_s=t1 - t0
    )
    plot = plot_group(
        Group(policy=policy, run=policy, epochs=epochs, agents=completed),
        workdir / f"{policy.replace(':', '-')}.png",
    )
    lag = LagReport(
        speedup=cfg.speedup,
        arrival_s=driver.max_late_s * cfg.speedup,
        epoch_s=epoch_lateness_s(epochs, stack_cfg.epoch_s / cfg.speedup) * cfg.speedup,
        step_s=step_lag * cfg.speedup,
    )
    return PolicyResult(
        policy=policy,
        summary=to_simulated_units(real, cfg.speedup),
        driver=driver,
        epochs=epochs,
        agents=agents,
        plot=plot,
        workdir=workdir,
        lag=lag,
        speedup=cfg.speedup,
    )


def render(results: list[PolicyResult], cfg: DemoConfig) -> str:
    """Side-by-side table of the headline metrics, simulated-H100 units."""
    head = (
        f"{'policy':<12} {'avg W':>7} {'J/token':>8} {'P5 tok/s':>9} {'SLO %':>6} "
        f"{'jobs/s':>7} {'done':>5} {'admitted':>8} {'max pend':>8} {'clocks MHz':>14}"
    )
    lines = [
        f"{cfg.instances} simulated H100 instances ({cfg.preset}"
        + (f", KV {cfg.kv_capacity_tokens:,} tokens" if cfg.kv_capacity_tokens else "")
        + "), "
        f"{cfg.rate_per_s} agents/s for {cfg.window_s:.0f} s + {cfg.drain_s:.0f} s drain, "
        f"×{cfg.speedup:g} time, SLO {cfg.slo_tok_s:g} tok/s per agent",
        head,
    ]
    base = results[0].summary.avg_power_w if results else 0.0
    for r in results:
        s = r.summary
        clocks = f"{min(r.clocks_mhz, default=0)}–{max(r.clocks_mhz, default=0)}"
        p5 = "-" if s.p5_agent_throughput_tok_s is None else f"{s.p5_agent_throughput_tok_s:.1f}"
        slo = "-" if s.slo_attainment is None else f"{s.slo_attainment * 100:.0f}"
        jpt = "-" if s.energy_per_output_token_j is None else f"{s.energy_per_output_token_j:.3f}"
        lines.append(
            f"{r.policy:<12} {s.avg_power_w:>7.1f} {jpt:>8} {p5:>9} {slo:>6} "
            f"{s.job_throughput_per_s:>7.4f} {s.completed_agents:>5} {r.admitted:>8} "
            f"{r.max_pending:>8} {clocks:>14}"
        )
    if len(results) > 1 and base > 0:
        for r in results[1:]:
            saved = 1 - r.summary.avg_power_w / base
            lines.append(f"{r.policy} vs {results[0].policy}: {saved:+.1%} average power saved")
    return "\n".join(lines)

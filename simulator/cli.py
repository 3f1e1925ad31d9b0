"""``kairos sim``: simulate agents on vLLM instances under one or more power policies.

Every flag can also come from a TOML file (``--config``, keys as the flag names
with ``_``) or the environment (``KAIROS_SIM_<FIELD>``); flags win.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import structlog
import typer

from controllers import ReassignmentConfig, make_controller, make_placement_policy
from controllers.errors import ControllerError
from kairos_common.cli import (
    LogLevelOpt,
    check_fixed_clock,
    check_log_level,
    check_positive,
    check_slo,
    fail,
)
from kairos_common.config import load_config
from kairos_common.errors import ConfigError
from kairos_common.logs import configure_logging
from simulator.cluster import DEFAULT_CLIENT_PATIENCE_S
from simulator.errors import SimulatorError
from simulator.preset_file import resolve_preset
from simulator.presets import (
    DEFAULT_PRESET,
    PRESET_NAMES,
    control_levels,
    with_full_isl,
    with_kv_offload,
    with_num_levels,
)
from simulator.runner import SimResult, SimSpec, result_json, run_many, run_sim, write_jsonl

log = structlog.get_logger()
PROG = "kairos sim"


@dataclass(frozen=True, slots=True)
class SimCliConfig:
    """Settings of ``kairos sim`` (TOML / ``KAIROS_SIM_*`` / flags)."""

    workload: str = "paper"
    rate: float = 0.08
    duration_s: float = 3 * 3600.0
    instances: int = 1
    slo: float = 20.0
    policy: str = "kairos"
    compare: str = ""
    seed: int = 1
    preset: str = DEFAULT_PRESET
    placement: str = "consolidating"
    reassign: bool = True
    epoch_s: float | None = None
    think_cap_s: float = 60.0
    client_patience_s: float = DEFAULT_CLIENT_PATIENCE_S
    arrivals: Path | None = None
    arrival_offset_s: float = 0.0
    num_levels: int | None = None
    kv_offload_gib: float = 0.0
    reserve_full_isl: bool = True
    out: Path = Path("sim-out")
    plots: bool = True
    processes: int = 0


def _specs(cfg: SimCliConfig) -> list[SimSpec]:
    policies = [p.strip() for p in cfg.compare.split(",") if p.strip()] or [cfg.policy]
    if len(set(policies)) != len(policies):
        raise ConfigError(f"--compare lists a policy twice: {cfg.compare}")
    base = SimSpec(
        workload=cfg.workload,
        rate_per_s=cfg.rate,
        duration_s=cfg.duration_s,
        instances=cfg.instances,
        slo_tok_s=cfg.slo,
        seed=cfg.seed,
        placement=cfg.placement,
        preset=with_full_isl(
            with_kv_offload(
                with_num_levels(resolve_preset(cfg.preset), cfg.num_levels), cfg.kv_offload_gib
            ),
            cfg.reserve_full_isl,
        ),
        epoch_s=cfg.epoch_s,
        think_cap_s=cfg.think_cap_s,
        client_patience_s=cfg.client_patience_s or None,
        arrivals_file=cfg.arrivals,
        arrival_offset_s=cfg.arrival_offset_s,
        reassignment=ReassignmentConfig(enabled=cfg.reassign),
    )
    return [dataclasses.replace(base, policy=p) for p in policies]


def _validate(cfg: SimCliConfig) -> None:
    """Every value checked before any work, each error naming its flag."""
    if cfg.arrivals is None:
        check_positive(cfg.rate, "--rate", " of arrivals per second")
    check_positive(cfg.duration_s, "--duration-s", " of seconds")
    check_positive(cfg.epoch_s, "--epoch-s", " of seconds (omit for the preset's)")
    check_positive(cfg.think_cap_s, "--think-cap-s", " of seconds")
    if cfg.client_patience_s != 0:
        check_positive(cfg.client_patience_s, "--client-patience-s", " of seconds (0: forever)")
    check_slo(cfg.slo)
    if not (math.isfinite(cfg.arrival_offset_s) and 0 <= cfg.arrival_offset_s < cfg.duration_s):
        raise ConfigError(
            f"--arrival-offset-s {cfg.arrival_offset_s}: expected seconds from 0 to under "
            "--duration-s"
        )
    if cfg.instances < 1:
        raise ConfigError(f"--instances {cfg.instances}: expected at least 1")
    if not 0 <= cfg.seed < 2**32:
        raise ConfigError(f"--seed {cfg.seed}: expected an integer from 0 to {2**32 - 1}")
    if cfg.processes < 0:
        raise ConfigError(f"--processes {cfg.processes}: expected 0 (one per CPU) or more")
    if cfg.arrivals is not None and not cfg.arrivals.is_file():
        raise ConfigError(f"--arrivals {cfg.arrivals}: no such file")
    if cfg.out.exists() and not cfg.out.is_dir():
        raise ConfigError(f"--out {cfg.out}: exists and is not a directory")


def _fmt(value: float | None, spec: str) -> str:
    """``value`` in ``spec``; a missing one as ``-`` padded to the same width, so
    the columns after it stay under their headers."""
    if value is None:
        return "-".rjust(int(spec.split(".")[0] or 0))
    return format(value, spec)


TABLE_NOTE = (
    "SLO %: finished agents meeting the SLO (those that gave up while held count as misses);\n"
    "all %: the same over every agent that arrived, the unfinished by their throughput so far;\n"
    "boost %: epochs at the SLO boost clock; pend s: mean admission wait;\n"
    "recomp tok: tokens recomputed after preemption; "
    "agents/inst: mean concurrent agents per instance."
)


def summary_table(results: list[SimResult]) -> str:
    """Side-by-side table of the headline metrics, one row per policy (percentages
    as in ``kairos report``), with a note that explains the less obvious columns."""
    head = (
        f"{'policy':14s} {'avg W':>7s} {'J/tok':>6s} {'kJ/job':>7s} {'P5 tok/s':>8s} "
        f"{'SLO %':>6s} {'all %':>6s} {'jobs/s':>7s} {'done':>5s} {'preempt':>7s} "
        f"{'recomp tok':>11s} {'boost %':>7s} {'pend s':>6s} {'agents/inst':>11s}"
    )
    lines = [head, "-" * len(head)]
    for r in results:
        s = r.summary
        epj = s.energy_j / s.completed_agents / 1e3 if s.completed_agents else None
        att = None if s.slo_attainment is None else s.slo_attainment * 100.0
        att_all = None if s.slo_attainment_all is None else s.slo_attainment_all * 100.0
        lines.append(
            f"{s.policy:14s} {s.avg_power_w:7.1f} {_fmt(s.energy_per_output_token_j, '6.3f')} "
            f"{_fmt(epj, '7.2f')} {_fmt(s.p5_agent_throughput_tok_s, '8.1f')} "
            f"{_fmt(att, '6.1f')} {_fmt(att_all, '6.1f')} "
            f"{s.job_throughput_per_s:7.4f} "
            f"{s.completed_agents:5d} {s.preemptions:7d} {s.recomputed_tokens:11,d} "
            f"{s.boost_fraction * 100.0:7.1f} {_fmt(s.mean_pending_s, '6.1f')} "
            f"{r.run.counters.get('mean_ongoing_per_instance', 0.0):11.1f}"
        )
    lines.append(TABLE_NOTE)
    return "\n".join(lines)


def _run(cfg: SimCliConfig, as_json: bool) -> list[SimResult]:
    specs = _specs(cfg)
    for spec in specs:  # fail fast on bad names before spawning processes
        levels = control_levels(spec.preset, spec.policy)
        check_fixed_clock(spec.policy, levels.clocks_mhz, f"preset {spec.preset.name}")
        make_controller(spec.policy, levels)
        make_placement_policy(spec.placement)
    show = not as_json and sys.stderr.isatty()
    if len(specs) == 1:
        if not show:
            return [run_sim(specs[0])]
        with typer.progressbar(
            length=int(cfg.duration_s), label="simulating", file=sys.stderr
        ) as bar:
            done = [0]

            def tick(t: float) -> None:
                step = int(t) - done[0]
                if step > 0:
                    bar.update(step)
                    done[0] += step

            return [run_sim(specs[0], progress=tick)]
    procs = cfg.processes or None
    if not show:
        return run_many(specs, procs)
    with typer.progressbar(length=len(specs), label="policies", file=sys.stderr) as bar:
        return run_many(specs, procs, on_done=lambda _r: bar.update(1))


def _write(results: list[SimResult], cfg: SimCliConfig) -> None:
    """Records, and plots named like ``kairos report --plots`` names them."""
    paths = [write_jsonl(r, cfg.out) for r in results]
    if cfg.plots:
        from simulator.plots import plot_compare, plot_run

        for r, p in zip(results, paths, strict=True):
            plot_run(r, p.with_suffix(".png"))
        if len(results) > 1:
            plot_compare(results, cfg.out / "compare.png")


HELP: dict[str, str] = {
    "workload": "'paper' (synthetic mini-swe-agent, default) or 'trace:PATH'",
    "rate": "agent arrivals per second, Poisson (default 0.08)",
    "duration_s": "simulated seconds (default 10800 = 3 h)",
    "instances": "vLLM instances, one GPU each (default 1)",
    "slo": "per-agent SLO τ in tokens/s, Eq. 4 (default 20)",
    "policy": "kairos (default) | kairos-alg1 | kairos-no-ta | predictive | no-control | fixed:MHZ",
    "compare": "comma-separated policies run side by side on identical arrivals",
    "seed": "seed of arrivals and workload (default 1)",
    "preset": f"GPU/model preset (default {DEFAULT_PRESET}): {', '.join(PRESET_NAMES)}, "
    "or a preset file (FILE.toml) that kairos calibrate fitted to an engine",
    "placement": (
        "router placement: consolidating (default) | round-robin | least-context | confident"
    ),
    "reassign": "Algorithm 3 reassignment of agents between instances (default on)",
    "epoch_s": "control epoch in seconds (default from the preset: 5)",
    "think_cap_s": "cap on trace think times, drops human pauses (default 60 s)",
    "client_patience_s": "seconds a held session's client keeps retrying before the session "
    f"fails (default {DEFAULT_CLIENT_PATIENCE_S:g}: the router's 600 s hold, the OpenAI SDK's "
    "two retries; 0: forever)",
    "arrivals": "replay arrival times from a file instead of Poisson",
    "arrival_offset_s": "shift every arrival by this many seconds (default 0): where the "
    "control epochs fall against the workload; a result that moves with it is the policy's "
    "own chaos",
    "kv_offload_gib": "GiB of host memory per instance for vLLM's CPU KV tier "
    "(vllm serve --kv-offloading-backend native --kv-offloading-size; default 0: off)",
    "reserve_full_isl": "vLLM admits a waiting prompt only when all of it fits the free KV "
    "cache (vllm serve --scheduler-reserve-full-isl, its default); --no-reserve-full-isl "
    "admits it on its first prefill chunk, as vLLM did before that gate",
    "num_levels": "clock levels the adaptive policies use, evenly spaced over the preset's "
    "range (default from the preset: 8), as kairosd run --num-levels",
    "out": "directory for JSONL records and PNGs (default sim-out)",
    "plots": "write PNG plots of power, clock and context (default on)",
    "processes": "parallel processes for --compare (default 0: one per CPU)",
    "config": "TOML file with these settings (keys = flag names with _; env KAIROS_SIM_*)",
    "as_json": "print one JSON object per policy (a list when several)",
}

Opt = typer.Option


def register(app: typer.Typer) -> None:
    @app.command()
    def sim(
        workload: Annotated[str | None, Opt(help=HELP["workload"])] = None,
        rate: Annotated[float | None, Opt(help=HELP["rate"])] = None,
        duration_s: Annotated[float | None, Opt(help=HELP["duration_s"])] = None,
        instances: Annotated[int | None, Opt(help=HELP["instances"])] = None,
        slo: Annotated[float | None, Opt(help=HELP["slo"])] = None,
        policy: Annotated[str | None, Opt(help=HELP["policy"])] = None,
        compare: Annotated[str | None, Opt(help=HELP["compare"])] = None,
        seed: Annotated[int | None, Opt(help=HELP["seed"])] = None,
        preset: Annotated[str | None, Opt(help=HELP["preset"])] = None,
        placement: Annotated[str | None, Opt(help=HELP["placement"])] = None,
        reassign: Annotated[bool | None, Opt(help=HELP["reassign"])] = None,
        epoch_s: Annotated[float | None, Opt(help=HELP["epoch_s"])] = None,
        think_cap_s: Annotated[float | None, Opt(help=HELP["think_cap_s"])] = None,
        client_patience_s: Annotated[float | None, Opt(help=HELP["client_patience_s"])] = None,
        arrivals: Annotated[Path | None, Opt(help=HELP["arrivals"])] = None,
        arrival_offset_s: Annotated[float | None, Opt(help=HELP["arrival_offset_s"])] = None,
        num_levels: Annotated[int | None, Opt(help=HELP["num_levels"])] = None,
        kv_offload_gib: Annotated[float | None, Opt(help=HELP["kv_offload_gib"])] = None,
        reserve_full_isl: Annotated[bool | None, Opt(help=HELP["reserve_full_isl"])] = None,
        out: Annotated[Path | None, Opt(help=HELP["out"])] = None,
        plots: Annotated[bool | None, Opt(help=HELP["plots"])] = None,
        processes: Annotated[int | None, Opt(help=HELP["processes"])] = None,
        config: Annotated[Path | None, Opt(help=HELP["config"])] = None,
        as_json: Annotated[bool, Opt("--json", help=HELP["as_json"])] = False,
        log_level: LogLevelOpt = None,
    ) -> None:
        """Simulate agents on vLLM instances under power policies (virtual time)."""
        try:
            configure_logging(check_log_level(log_level) or "warning")
        except ConfigError as exc:
            fail(PROG, str(exc))
        overrides = {
            "workload": workload,
            "rate": rate,
            "duration_s": duration_s,
            "instances": instances,
            "slo": slo,
            "policy": policy,
            "compare": compare,
            "seed": seed,
            "preset": preset,
            "placement": placement,
            "reassign": reassign,
            "epoch_s": epoch_s,
            "think_cap_s": think_cap_s,
            "client_patience_s": client_patience_s,
            "arrivals": arrivals,
            "arrival_offset_s": arrival_offset_s,
            "num_levels": num_levels,
            "kv_offload_gib": kv_offload_gib,
            "reserve_full_isl": reserve_full_isl,
            "out": out,
            "plots": plots,
            "processes": processes,
        }
        try:
            cfg = load_config(
                SimCliConfig,
                path=config,
                env_prefix="KAIROS_SIM",
                overrides=overrides,
                strict_env=True,
            )
            _validate(cfg)
            results = _run(cfg, as_json)
        except (ConfigError, SimulatorError, ControllerError) as exc:
            fail(PROG, str(exc))
        try:
            _write(results, cfg)
        except OSError as exc:
            fail(PROG, f"--out {cfg.out}: cannot write: {exc.strerror or exc}")
        log.info("sim.done", out=str(cfg.out), runs=len(results))
        if as_json:
            objs = [result_json(r) for r in results]
            typer.echo(json.dumps(objs[0] if len(objs) == 1 else objs, indent=2))
            return
        typer.echo(summary_table(results))
        typer.echo(f"records and plots in {cfg.out}/")

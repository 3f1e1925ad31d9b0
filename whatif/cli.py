"""``kairos whatif``: what would Kairos save on this fleet, on this engine, at this SLO?

    kairos whatif --trace agents-trace.jsonl --preset my-engine.toml
    kairos whatif --trace run1.jsonl --trace run2.jsonl --preset my-engine.toml --compare

The first form replays the recording (the router's ``--trace-file``) on the
fitted engine (``kairos calibrate``'s preset) under every policy and prints one
table (power, energy per output token, P5 throughput, SLO attainment, sessions
done and not done) with the oracle lower bound, and a plot of the policies over
time. The second sets a no-control replay beside the recorded runs themselves
(repeats of one run; their vLLM counters from ``RUN.counters.json`` beside each,
when present) and plots simulated against measured per agent. Bad input is one
line and exit status 2.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Annotated, Any

import typer

from controllers.errors import ControllerError
from kairos_common.cli import check_fixed_clock, check_slo, fail
from kairos_common.errors import ConfigError
from simulator.errors import SimulatorError
from simulator.oracle import OracleResult
from simulator.preset_file import resolve_preset
from simulator.presets import Preset, control_levels
from simulator.runner import SimResult, result_json
from simulator.workload_recorded import load_recording, recording_files
from whatif.compare import Comparison, compare
from whatif.errors import WhatIfError
from whatif.recorded import counters_beside, load_measured
from whatif.replay import DEFAULT_POLICIES, base_spec, oracle, run_policies

PROG = "kairos whatif"
Opt = typer.Option


def register(app: typer.Typer) -> None:
    @app.command("whatif")
    def whatif_cmd(
        trace: Annotated[
            list[Path], Opt(help="recorded trace (kairos-router --trace-file); repeatable")
        ],
        preset: Annotated[str, Opt(help="preset file from kairos calibrate, or a preset name")],
        policies: Annotated[str, Opt(help="comma-separated policies to replay under")] = ",".join(
            DEFAULT_POLICIES
        ),
        compare_runs: Annotated[
            bool,
            Opt("--compare", help="set a no-control replay beside the recorded runs (repeats)"),
        ] = False,
        oracle_bound: Annotated[
            bool, Opt("--oracle/--no-oracle", help="search the oracle lower bound (default on)")
        ] = True,
        oracle_window_s: Annotated[
            float, Opt(help="the oracle's clock-schedule window in seconds (default 60)")
        ] = 60.0,
        duration_s: Annotated[
            float | None, Opt(help="replay window (default: the recorded span × 1.2 + 60 s)")
        ] = None,
        slo: Annotated[
            float | None, Opt(help="SLO τ in tok/s (default: the recording's most common)")
        ] = None,
        out: Annotated[Path, Opt(help="directory for plots (default whatif-out)")] = Path(
            "whatif-out"
        ),
        as_json: Annotated[bool, Opt("--json", help="print JSON instead of tables")] = False,
        processes: Annotated[int, Opt(help="parallel simulations (0: one per CPU)")] = 0,
    ) -> None:
        """Replay a recorded fleet on a fitted engine under Kairos and the baselines."""
        try:
            fitted = resolve_preset(preset)
            names = _policies(policies, fitted)
            for path in trace:
                if not path.is_file():
                    raise ConfigError(f"--trace {path}: no such file")
                load_recording(recording_files(path))  # a recording, or one clear line
            if slo is not None:
                check_slo(slo)
            if duration_s is not None and not (math.isfinite(duration_s) and duration_s > 0):
                raise ConfigError(f"--duration-s {duration_s}: expected a positive number")
            if not (math.isfinite(oracle_window_s) and oracle_window_s > 0):
                raise ConfigError(f"--oracle-window-s {oracle_window_s}: expected seconds > 0")
            if out.exists() and not out.is_dir():
                raise ConfigError(f"--out {out}: exists and is not a directory")
        except (ConfigError, SimulatorError, ControllerError) as exc:
            fail(PROG, str(exc))
        try:
            out.mkdir(parents=True, exist_ok=True)
            if compare_runs:
                _compare(trace, fitted, out, as_json)
            else:
                _policies_table(
                    trace[0], fitted, names, out, as_json, duration_s, slo,
                    oracle_window_s if oracle_bound else None, processes or None,
                )  # fmt: skip
        except (WhatIfError, SimulatorError) as exc:
            fail(PROG, str(exc), 1)
        except OSError as exc:
            fail(PROG, f"cannot write to {out}: {exc.strerror or exc}")


def _policies(raw: str, preset: Preset) -> list[str]:
    names = [p.strip() for p in raw.split(",") if p.strip()]
    if not names:
        raise ConfigError("--policies: give at least one policy")
    if len(set(names)) != len(names):
        raise ConfigError(f"--policies lists a policy twice: {raw}")
    for name in names:
        check_fixed_clock(name, control_levels(preset, name).clocks_mhz, f"preset {preset.name}")
    return names


def _policies_table(
    path: Path, preset: Preset, policies: list[str], out: Path, as_json: bool,
    duration_s: float | None, slo: float | None, window_s: float | None,
    processes: int | None,
) -> None:  # fmt: skip
    spec = base_spec(path, preset, duration_s)
    if slo is not None:
        spec = dataclasses.replace(spec, slo_tok_s=slo)
    results = run_policies(spec, policies, processes)
    bound = oracle(spec, window_s) if window_s is not None else None
    from simulator.plots import plot_compare

    plot = plot_compare(results, out / "policies.png")
    if as_json:
        obj: dict[str, Any] = {"policies": [result_json(r) for r in results]}
        obj["oracle"] = None if bound is None else _oracle_json(bound)
        typer.echo(json.dumps(obj, indent=2))
        return
    typer.echo(policies_table(results, bound, preset, spec.duration_s, spec.slo_tok_s))
    typer.echo(f"plot: {plot}")


def _oracle_json(bound: OracleResult) -> dict[str, Any]:
    return {**bound.metrics, "feasible": bound.feasible, "schedule_mhz": bound.schedule_mhz}


def policies_table(
    results: list[SimResult],
    bound: OracleResult | None,
    preset: Preset,
    window_s: float,
    slo: float,
) -> str:
    """One row per policy (and the oracle), savings against no control."""
    base = next((r.summary.avg_power_w for r in results if r.summary.policy == "no-control"), None)
    head = (
        f"{'policy':16s} {'avg W':>7s} {'saved':>6s} {'J/tok':>7s} {'P5 tok/s':>8s} "
        f"{'SLO %':>6s} {'done':>5s} {'not done':>8s} {'pend s':>6s} {'preempt':>7s}"
    )
    lines = [
        f"replay of {results[0].spec.workload.removeprefix('recorded:')} on {preset.name}, "
        f"window {window_s:.0f} s, SLO {slo:g} tok/s",
        head,
        "-" * len(head),
    ]
    for r in results:
        s = r.summary
        saved = f"{(1 - s.avg_power_w / base) * 100:5.1f}%" if base else "     -"
        lines.append(
            f"{s.policy:16s} {s.avg_power_w:7.1f} {saved} "
            f"{_f(s.energy_per_output_token_j, '7.3f')} {_f(s.p5_agent_throughput_tok_s, '8.1f')} "
            f"{_f(None if s.slo_attainment is None else s.slo_attainment * 100, '6.1f')} "
            f"{s.completed_agents:5d} {int(r.run.counters.get('unfinished_agents', 0)):8d} "
            f"{_f(s.mean_pending_s, '6.1f')} {s.preemptions:7d}"
        )
    if bound is not None:
        m = bound.metrics
        saved = f"{(1 - m['avg_power_w'] / base) * 100:5.1f}%" if base else "     -"
        tag = "oracle" if bound.feasible else "oracle (none)"
        att = m.get("slo_attainment")
        lines.append(
            f"{tag:16s} {m['avg_power_w']:7.1f} {saved} "
            f"{_f(m.get('energy_per_output_token_j'), '7.3f')} "
            f"{_f(m.get('p5_agent_throughput_tok_s'), '8.1f')} "
            f"{_f(None if att is None else att * 100, '6.1f')} {m['completed_agents']:5d}"
        )
    lines.append(
        "saved: average power below no control's; not done: sessions the window ended before; "
        "oracle: best fixed-per-window clock schedule meeting the SLO (a lower bound for "
        "clock-only policies)."
    )
    return "\n".join(lines)


def _f(value: float | None, spec: str) -> str:
    return "-".rjust(int(spec.split(".")[0] or 0)) if value is None else format(value, spec)


def _compare(traces: list[Path], preset: Preset, out: Path, as_json: bool) -> None:
    runs = [load_measured(path, counters_beside(path)) for path in traces]
    result = compare(runs, preset)
    from whatif.plots import plot_comparison

    plot = plot_comparison(result, out / "compare.png", traces[0].stem)
    if as_json:
        typer.echo(json.dumps(result.figures(), indent=2))
        return
    typer.echo(comparison_table(result, preset))
    typer.echo(f"plot: {plot}")


def comparison_table(c: Comparison, preset: Preset) -> str:
    """The comparison's figures, simulated against measured."""
    f = c.figures()

    def pct(value: float | None) -> str:
        return "-" if value is None else f"{value:+.1%}" if value < 0 else f"{value:.1%}"

    def num(value: float | None, spec: str = ".3f") -> str:
        return "-" if value is None else format(value, spec)

    rows = [
        ("per-agent LLM time |error|, median", pct(f["llm_time_median_abs_error"])),
        ("per-agent LLM time |error|, P90", pct(f["llm_time_p90_abs_error"])),
        ("per-agent LLM time error, mean (bias)", pct(f["llm_time_mean_error"])),
        ("per-agent completion time |error|, median", pct(f["completion_median_abs_error"])),
        ("per-agent completion time |error|, P90", pct(f["completion_p90_abs_error"])),
        ("per-call latency |error|, median", pct(f["call_latency_median_abs_error"])),
        ("per-call latency |error|, P90", pct(f["call_latency_p90_abs_error"])),
        (
            "mean TTFT s, simulated / measured (error)",
            f"{num(f['ttft_simulated_s'])} / {num(f['ttft_measured_s'])} ({pct(f['ttft_error'])})",
        ),
        (
            "preemptions, simulated / measured",
            f"{num(f['preemptions_simulated'], '.0f')} / {num(f['preemptions_measured'], '.0f')}",
        ),
        (
            "prefix-cache hit tokens, simulated / measured (error)",
            f"{num(f['prefix_hits_simulated'], '.0f')} / {num(f['prefix_hits_measured'], '.0f')}"
            f" ({pct(f['prefix_hits_error'])})",
        ),
        ("noise floor: a repeat's LLM time from the median, median", pct(f["noise_median_abs"])),
        ("noise floor, P90", pct(f["noise_p90_abs"])),
    ]
    head = f"replay on {preset.name} beside {c.repeats} recorded run(s), {f['agents']} agents"
    if c.unfinished_simulated:
        head += f" ({c.unfinished_simulated} not finished in a replay)"
    return "\n".join([head, *(f"  {label:58s} {value}" for label, value in rows)])

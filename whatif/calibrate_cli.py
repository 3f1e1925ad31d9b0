"""``kairos calibrate``: fit the simulator's engine to a running vLLM (docs/whatif.md).

    kairos calibrate --vllm-url http://127.0.0.1:8000 --out my-engine.toml

Bounded: it says how many probes it will send and how long they take before it
starts (``--budget-s``, default 240 s; it stops sending probes when the budget
is spent, should the engine be slower than its pilot said), sends one probe at
a time (a decode probe is at most ``max_num_seqs`` requests), and uses no more
than half the KV cache.
It wants the engine to itself: it waits up to two minutes for vLLM to be idle,
and drops a probe during which other traffic arrived (and says how many). It
never changes clocks. Bad input is one line and exit status 2.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
from pathlib import Path
from typing import Annotated

import typer

from kairos_common.cli import check_http_url, check_positive, fail
from kairos_common.errors import ConfigError
from simulator.errors import PresetError
from simulator.preset_file import dump_preset_file
from simulator.presets import PRESET_NAMES
from whatif.calibrate import (
    POWER_NOTE,
    Calibration,
    CalibrationSettings,
    calibrate,
    coefficient_rows,
    worst,
)
from whatif.errors import WhatIfError
from whatif.fit import FEATURES, FitResult

PROG = "kairos calibrate"
API_KEY_ENV = "VLLM_API_KEY"
Opt = typer.Option


def register(app: typer.Typer) -> None:
    @app.command("calibrate")
    def calibrate_cmd(
        vllm_url: Annotated[str, Opt(help="base URL of the vLLM server to probe")],
        out: Annotated[Path, Opt(help="preset file to write (default calibrated.toml)")] = Path(
            "calibrated.toml"
        ),
        budget_s: Annotated[
            float, Opt(help="seconds of probing (default 240; the plan is cut to fit)")
        ] = 240.0,
        model: Annotated[
            str | None, Opt(help="served model to probe (default: the first /v1/models lists)")
        ] = None,
        base_preset: Annotated[
            str,
            Opt(help=f"preset whose power model and clocks are kept ({', '.join(PRESET_NAMES)})"),
        ] = PRESET_NAMES[0],
        max_num_batched_tokens: Annotated[
            int | None,
            Opt(help="the server's --max-num-batched-tokens (default: vLLM's for the device)"),
        ] = None,
        max_num_seqs: Annotated[
            int | None, Opt(help="the server's --max-num-seqs (default: vLLM's for the device)")
        ] = None,
        reserve_full_isl: Annotated[
            bool,
            Opt(help="the server admits a prompt only when all of it fits (vLLM's default)"),
        ] = True,
        name: Annotated[str | None, Opt(help="the preset's name (default from the model)")] = None,
        api_key_file: Annotated[
            Path | None,
            Opt(help=f"file holding vLLM's API key (else ${API_KEY_ENV}); sent to vLLM only"),
        ] = None,
        seed: Annotated[int | None, Opt(help="seed of the probes' token ids")] = None,
        quiet: Annotated[bool, Opt("--quiet", help="no line per probe")] = False,
        probes_out: Annotated[
            Path | None,
            Opt(help="also write every probe (counts, measured and fitted seconds) as JSONL"),
        ] = None,
    ) -> None:
        """Probe a running vLLM and fit the simulator's timing model to it."""
        try:
            settings = _settings(
                vllm_url, budget_s, model, base_preset, max_num_batched_tokens,
                max_num_seqs, reserve_full_isl, name, api_key_file, seed,
            )  # fmt: skip
            if out.exists() and out.is_dir():
                raise ConfigError(f"--out {out}: is a directory")
        except ConfigError as exc:
            fail(PROG, str(exc))
        try:
            cal = asyncio.run(calibrate(settings, typer.echo, progress=not quiet))
            assert cal.preset is not None
            text = dump_preset_file(
                cal.preset,
                base=settings.base_preset,
                fitted_on=cal.fitted_on(),
                fit=cal.fit_summary(),
            )
        except (WhatIfError, PresetError) as exc:
            fail(PROG, str(exc), 1)
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(text, encoding="utf-8")
            if probes_out is not None and cal.fit is not None:
                probes_out.write_text(probe_lines(cal.fit), encoding="utf-8")
        except OSError as exc:
            fail(PROG, f"--out {out}: cannot write: {exc.strerror or exc}")
        typer.echo(report(cal))
        typer.echo(f"preset written to {out} (kairos sim --preset {out}; kairos whatif --preset)")


def _settings(
    vllm_url: str, budget_s: float, model: str | None, base_preset: str,
    batched: int | None, seqs: int | None, full_isl: bool, name: str | None,
    api_key_file: Path | None, seed: int | None,
) -> CalibrationSettings:  # fmt: skip
    check_http_url(vllm_url.rstrip("/"), "--vllm-url")
    check_positive(budget_s, "--budget-s", " of seconds")
    if not (math.isfinite(budget_s) and 10 <= budget_s <= 24 * 3600):
        raise ConfigError(f"--budget-s {budget_s}: expected 10 s to a day")
    if base_preset not in PRESET_NAMES:
        raise ConfigError(f"--base-preset {base_preset!r}: one of {', '.join(PRESET_NAMES)}")
    for flag, value in (("--max-num-batched-tokens", batched), ("--max-num-seqs", seqs)):
        if value is not None and not 1 <= value <= 10_000_000:
            raise ConfigError(f"{flag} {value}: expected 1 to 10000000")
    if seed is not None and not 0 <= seed < 2**32:
        raise ConfigError(f"--seed {seed}: expected 0 to {2**32 - 1}")
    key = os.environ.get(API_KEY_ENV) or None
    if api_key_file is not None:
        try:
            key = api_key_file.read_text(encoding="utf-8").strip() or None
        except OSError as exc:
            raise ConfigError(f"--api-key-file {api_key_file}: {exc.strerror or exc}") from None
    return CalibrationSettings(
        vllm_url=vllm_url.rstrip("/"), api_key=key, model=model, budget_s=budget_s,
        base_preset=base_preset, max_num_batched_tokens=batched, max_num_seqs=seqs,
        reserve_full_isl=full_isl, name=name, seed=seed,
    )  # fmt: skip


def probe_lines(fit: FitResult) -> str:
    """One JSON line per probe: its kind, label, step counts, measured and fitted s."""
    rows = []
    for o, predicted in zip(fit.observations, fit.predicted_s, strict=True):
        counts = dict(zip(FEATURES, o.features, strict=True))
        rows.append(
            json.dumps(
                {"kind": o.kind, "label": o.label, **counts,
                 "measured_s": o.measured_s, "fitted_s": predicted}
            )
        )  # fmt: skip
    return "".join(f"{row}\n" for row in rows)


def report(cal: Calibration) -> str:
    """What was fitted, how well, and what was assumed."""
    s = cal.shape
    lines = [
        f"engine: vLLM {cal.version}, {cal.model}, KV {s.capacity_tokens} tokens in blocks of "
        f"{s.block_size}, max_model_len {s.max_model_len}, "
        f"max_num_batched_tokens {s.max_num_batched_tokens}, max_num_seqs {s.max_num_seqs}",
        f"assumed: {'; '.join(cal.assumed) or 'nothing'}",
        f"probing took {cal.elapsed_s:.0f} s",
        "fitted step model:",
        *(f"  {label:55s} {value}" for label, value in coefficient_rows(cal)),
    ]
    if cal.fit is not None:
        summary = cal.fit.summary()
        lines.append("residuals (|predicted − measured| / measured):")
        kinds = sorted({o.kind for o in cal.fit.observations})
        for kind in [*kinds, "all"]:
            n = int(summary.get(f"{kind}_count", 0))
            lines.append(
                f"  {kind:8s} {n:4d} probes: median {summary[f'{kind}_median_abs_rel_error']:6.1%}"
                f"  P90 {summary[f'{kind}_p90_abs_rel_error']:6.1%}"
                f"  max {summary[f'{kind}_max_abs_rel_error']:6.1%}"
            )
        if cal.fit.outliers:
            lines.append(
                f"  ({cal.fit.outliers} outlying probes left out of the fit, kept in these "
                "figures: bursts of other work on the machine)"
            )
        pairs = dict(zip(cal.fit.observations, cal.fit.relative_errors(), strict=True))
        lines.append("worst reproduced probes:")
        for o in worst(cal.fit):
            lines.append(f"  {pairs[o]:+7.1%}  {o.label}: measured {o.measured_s * 1e3:.1f} ms")
    lines.append(
        f"prefix cache: {cal.hits_checked} probes checked, {len(cal.hit_mismatches)} differ "
        "from the simulator's cache model"
    )
    lines += [f"  {m}" for m in cal.hit_mismatches[:5]]
    if cal.foreign:
        lines.append(f"{cal.foreign} probes dropped: other traffic reached vLLM meanwhile")
    if cal.unrun:
        lines.append(f"{cal.unrun} planned probes not run: the budget ran out")
    lines.append(f"power: {POWER_NOTE}")
    return "\n".join(lines)

"""Preset files: a preset fitted to one engine (``kairos calibrate``), saved as TOML.

A named preset (:mod:`simulator.presets`) describes the paper's testbed. A preset
*file* describes an operator's engine: ``kairos calibrate`` probes a running vLLM,
fits the timing model to it and writes one; ``kairos sim --preset FILE`` and
``kairos whatif --preset FILE`` load it. The file names the preset it extends
(``base``: every coefficient it does not set, the power model and the clocks
among them, comes from there) and what it was fitted on, so a result can say
which engine, model and configuration it stands for::

    format = "kairos-preset"
    version = 1

    [preset]
    name = "vllm-cpu-tiny-llama"
    description = "..."
    base = "h100-nvl-qwen3-30b"

    [fitted_on]          # free-form: engine, model, url, served config, date, notes
    model = "tiny-llama"

    [timing]             # any TimingParams field
    cpu_overhead_s = 0.004

    [engine]             # any EngineParams field
    kv_capacity_tokens = 131072

    [fit]                # free-form numbers: the fit's residuals

Loading checks everything: the format and version, known sections and keys,
every number finite and within a bound that a real engine can have, and an
integer where the model needs one. A bad file is one :class:`PresetError` naming
the file and the key.
"""

from __future__ import annotations

import dataclasses
import json
import math
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from simulator.errors import PresetError
from simulator.presets import (
    PRESET_NAMES,
    EngineParams,
    GpuParams,
    PowerParams,
    Preset,
    TimingParams,
    get_preset,
)

FORMAT = "kairos-preset"
VERSION = 1
_FREE_SECTIONS = ("fitted_on", "fit")
"""Sections of plain values, kept but not applied (what the fit was, how good)."""
_SECTIONS: dict[str, type[Any]] = {
    "timing": TimingParams,
    "power": PowerParams,
    "engine": EngineParams,
    "gpu": GpuParams,
}
_LIMITS: dict[str, tuple[float, float]] = {
    # seconds per step, sequence, request, token, pair
    "cpu_overhead_s": (0.0, 10.0),
    "gpu_fixed_s": (0.0, 10.0),
    "seq_overhead_s": (0.0, 1.0),
    "request_overhead_s": (0.0, 60.0),
    "request_s_per_prompt_token": (0.0, 0.1),
    "prefill_s_per_token": (0.0, 1.0),
    "attn_s_per_pair": (0.0, 1e-3),
    "mem_bw_bytes_s": (1e3, 1e18),
    "h2d_bytes_s": (1e3, 1e15),
    "weight_bw_efficiency": (1e-6, 1.0),
    "kv_bw_efficiency": (1e-6, 1.0),
    "base_weight_bytes": (0.0, 1e13),
    "expert_weight_bytes": (0.0, 1e13),
    "num_experts": (1, 1_000_000),
    "experts_per_token": (1, 1_000_000),
    "kv_bytes_per_token": (1, 1e9),
    "ref_clock_mhz": (1, 100_000),
    "compute_cap_mhz": (1, 100_000),
    "mem_knee_mhz": (0, 100_000),
    "mem_slope_above_knee": (0.0, 10.0),
    "kv_capacity_tokens": (1, 1e11),
    "block_size": (1, 65_536),
    "max_num_batched_tokens": (1, 1e8),
    "max_num_seqs": (1, 1e7),
    "max_model_len": (1, 1e9),
    "kv_offload_tokens": (0, 1e13),
    "clock_latency_s": (0.0, 60.0),
    "supported_clocks_mhz": (1, 100_000),
}
_WATTS = (0.0, 100_000.0)
"""Every power-model field: watts, watts per GHz or GHz³, or a fraction."""


def is_preset_file(name: str) -> bool:
    """Whether ``--preset`` names a file rather than a built-in preset."""
    return name not in PRESET_NAMES and (name.endswith(".toml") or "/" in name)


def resolve_preset(name: str) -> Preset:
    """A built-in preset by name, or the preset in the file ``name``."""
    if is_preset_file(name):
        return load_preset_file(Path(name))
    return get_preset(name)


def load_preset_file(path: Path) -> Preset:
    """The preset ``path`` describes: its base preset with the file's values."""
    where = str(path)
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise PresetError(f"preset file {where}: cannot read: {exc.strerror or exc}") from None
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise PresetError(f"preset file {where}: not TOML: {exc}") from None
    return preset_from_mapping(raw, where)


def preset_from_mapping(raw: Mapping[str, Any], where: str) -> Preset:
    """Validate a parsed preset file and build its preset (``where`` names it)."""
    if raw.get("format") != FORMAT:
        raise PresetError(f"{where}: format must be {FORMAT!r}, got {raw.get('format')!r}")
    if raw.get("version") != VERSION:
        raise PresetError(
            f"{where}: version {raw.get('version')!r} is not supported "
            f"(this Kairos reads {VERSION})"
        )
    allowed = {"format", "version", "preset", *_FREE_SECTIONS, *_SECTIONS}
    unknown = sorted(set(raw) - allowed)
    if unknown:
        raise PresetError(f"{where}: unknown section(s) {', '.join(unknown)}")
    head = _table(raw, "preset", where)
    name = head.get("name")
    if not isinstance(name, str) or not name.strip() or len(name) > 200:
        raise PresetError(f"{where}: [preset] name must be a non-empty string")
    base_name = head.get("base", PRESET_NAMES[0])
    if base_name not in PRESET_NAMES:
        raise PresetError(
            f"{where}: [preset] base {base_name!r} is not a built-in preset "
            f"({', '.join(PRESET_NAMES)})"
        )
    description = head.get("description", "")
    if not isinstance(description, str):
        raise PresetError(f"{where}: [preset] description must be a string")
    extra = sorted(set(head) - {"name", "base", "description"})
    if extra:
        raise PresetError(f"{where}: [preset] unknown key(s) {', '.join(extra)}")
    for section in _FREE_SECTIONS:
        _check_free(_table(raw, section, where), f"{where} [{section}]")
    base = get_preset(base_name)
    parts: dict[str, Any] = {}
    for section, cls in _SECTIONS.items():
        values = _table(raw, section, where)
        current = getattr(base, section)
        parts[section] = dataclasses.replace(
            current, **_fields(cls, values, f"{where} [{section}]")
        )
    preset = dataclasses.replace(
        base,
        name=name,
        description=description or f"fitted preset (base {base_name})",
        energy_weights=None,  # derived from the fitted timing, not the base model's
        **parts,
    )
    _check_consistent(preset, where)
    return preset


def _table(raw: Mapping[str, Any], section: str, where: str) -> dict[str, Any]:
    value = raw.get(section, {})
    if not isinstance(value, dict):
        raise PresetError(f"{where}: [{section}] must be a table")
    return value


def _check_free(values: Mapping[str, Any], where: str) -> None:
    for key, value in values.items():
        ok = isinstance(value, str | bool | int) or (
            isinstance(value, float) and math.isfinite(value)
        )
        if not ok:
            raise PresetError(f"{where}: {key} must be a string, a boolean or a finite number")


def _fields(cls: type[Any], values: Mapping[str, Any], where: str) -> dict[str, Any]:
    """``values`` checked against ``cls``'s fields: names, types and bounds."""
    known = {f.name: f for f in dataclasses.fields(cls)}
    out: dict[str, Any] = {}
    for key, value in values.items():
        if key not in known:
            raise PresetError(f"{where}: unknown key {key!r}")
        default = getattr(cls(), key)
        out[key] = _value(key, value, default, cls is PowerParams, where)
    return out


def _value(key: str, value: Any, default: Any, watts: bool, where: str) -> Any:
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise PresetError(f"{where}: {key} must be true or false")
        return value
    if isinstance(default, str):
        if not isinstance(value, str):
            raise PresetError(f"{where}: {key} must be a string")
        return value
    if isinstance(default, tuple):
        if not isinstance(value, list) or not value:
            raise PresetError(f"{where}: {key} must be a non-empty list")
        items = tuple(_number(key, v, 0, watts, where) for v in value)
        if list(items) != sorted(set(items)):
            raise PresetError(f"{where}: {key} must be increasing, without repeats")
        return items
    return _number(key, value, default, watts, where)


def _number(key: str, value: Any, default: Any, watts: bool, where: str) -> int | float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise PresetError(f"{where}: {key} must be a number, got {value!r}")
    if not math.isfinite(value):
        raise PresetError(f"{where}: {key} must be finite, got {value!r}")
    lo, hi = _WATTS if watts else _LIMITS.get(key, (0.0, 1e18))
    if not lo <= value <= hi:
        raise PresetError(f"{where}: {key} = {value!r} is outside [{lo:g}, {hi:g}]")
    if isinstance(default, int):
        if value != int(value):
            raise PresetError(f"{where}: {key} must be a whole number, got {value!r}")
        return int(value)
    return float(value)


def _check_consistent(preset: Preset, where: str) -> None:
    e, t = preset.engine, preset.timing
    if e.kv_capacity_tokens < e.block_size:
        raise PresetError(f"{where}: kv_capacity_tokens is less than one block")
    if t.ref_clock_mhz > max(preset.gpu.supported_clocks_mhz):
        raise PresetError(f"{where}: ref_clock_mhz is above every supported clock")
    if t.experts_per_token > t.num_experts:
        raise PresetError(f"{where}: experts_per_token exceeds num_experts")


def dump_preset_file(
    preset: Preset,
    *,
    base: str,
    fitted_on: Mapping[str, str | bool | int | float],
    fit: Mapping[str, str | bool | int | float],
) -> str:
    """The TOML text of a preset file: ``preset``'s timing, engine, power and GPU
    values that differ from ``base``'s, with where and how well it was fitted. A
    file read back gives ``preset`` again (tested)."""
    reference = get_preset(base)
    lines = [f'format = "{FORMAT}"', f"version = {VERSION}", "", "[preset]"]
    lines += [
        f"name = {_toml(preset.name)}",
        f"description = {_toml(preset.description)}",
        f"base = {_toml(base)}",
    ]
    for section, values in (("fitted_on", dict(fitted_on)), ("fit", dict(fit))):
        lines += ["", f"[{section}]", *(f"{k} = {_toml(v)}" for k, v in values.items())]
    for section in _SECTIONS:
        mine, theirs = getattr(preset, section), getattr(reference, section)
        changed = [
            f"{f.name} = {_toml(getattr(mine, f.name))}"
            for f in dataclasses.fields(mine)
            if getattr(mine, f.name) != getattr(theirs, f.name)
        ]
        if changed:
            lines += ["", f"[{section}]", *changed]
    return "\n".join(lines) + "\n"


def _toml(value: Any) -> str:
    """One TOML value: strings as JSON strings (valid TOML basic strings), numbers
    by ``repr`` (valid TOML; non-finite ones are refused), lists of numbers."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise PresetError(f"cannot write a non-finite number ({value!r}) to a preset file")
        return repr(value)
    if isinstance(value, tuple | list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    raise PresetError(f"cannot write {value!r} to a preset file")

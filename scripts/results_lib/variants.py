"""Policy variants for the comparison scripts: ``NAME[FIELD=VALUE,...]``.

A comparison measures one change to a control law against the default on the
same arrivals; the change is named in the policy string, and goes to the config
that has the field, as ``kairosd``'s configuration would set it in production.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from controllers import KairosConfig, PredictiveConfig
from controllers.perf_model import PerfModelConfig
from controllers.registry import kairos_config_for
from simulator.runner import SimSpec


def parse_variant(text: str) -> dict[str, Any]:
    """``"a=None,b=3"`` → ``{"a": None, "b": 3}`` (config field changes)."""
    changes: dict[str, Any] = {}
    for item in filter(None, text.split(",")):
        name, sep, raw = item.partition("=")
        if not sep:
            raise ValueError(f"variant items are FIELD=VALUE, got {item!r}")
        low = raw.lower()
        if low == "none":
            value: Any = None
        elif low in ("true", "false"):
            value = low == "true"
        else:
            value = float(raw) if any(c in raw for c in ".e") else int(raw)
        changes[name.strip()] = value
    return changes


def with_variant(spec: SimSpec, policy: str) -> SimSpec:
    """``spec`` with ``policy``'s bracketed FIELD=VALUE changes applied.

    Each field goes to the config that has it: for ``predictive``, its
    :class:`PredictiveConfig`, or its online model's
    :class:`~controllers.perf_model.PerfModelConfig` as ``perf.FIELD``
    (``perf.warmup=20``); else :class:`KairosConfig`. An unknown field is a
    ``ValueError`` naming it (checked in the parent, before any worker runs).
    """
    base, _, variant = policy.partition("[")
    if not variant:
        return spec
    changes = parse_variant(variant.rstrip("]"))
    predictive = base == "predictive"
    own = {f.name for f in dataclasses.fields(PredictiveConfig)} if predictive else set()
    if predictive:
        own |= {f"perf.{f.name}" for f in dataclasses.fields(PerfModelConfig)}
    mine = {k: v for k, v in changes.items() if k in own and not k.startswith("perf.")}
    perf = {k.removeprefix("perf."): v for k, v in changes.items() if k in own and k not in mine}
    rest = {k: v for k, v in changes.items() if k not in own}
    unknown = sorted(set(rest) - {f.name for f in dataclasses.fields(KairosConfig)})
    if unknown:
        raise ValueError(f"{policy}: no such field {', '.join(unknown)}")
    if mine or perf:
        config = dataclasses.replace(spec.predictive or PredictiveConfig(), **mine)
        config = dataclasses.replace(config, perf=dataclasses.replace(config.perf, **perf))
        spec = dataclasses.replace(spec, predictive=config)
    if rest:
        spec = dataclasses.replace(
            spec, kairos=dataclasses.replace(spec.kairos or kairos_config_for(base), **rest)
        )
    return spec

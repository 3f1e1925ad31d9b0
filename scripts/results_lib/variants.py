"""Policy variants for the comparison scripts: ``NAME[FIELD=VALUE,...]``.

A comparison measures one change to a control law against the default on the
same arrivals; the change is named in the policy string and applied in code to
the policy's definition (:meth:`controllers.policy.Policy.varied`: a constant of
its rule or of one of its stages, by field name; ``None`` for a stage's required
constant drops that stage), or for ``predictive`` to its
:class:`~controllers.predictive.PredictiveConfig` (``perf.FIELD``: its online
model's). Operators set none of these: they are the law's constants.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from controllers.registry import law_for
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
    """``spec`` with ``policy``'s bracketed FIELD=VALUE changes as its variant.

    An unknown field is an error naming it (checked here, in the parent, before
    any worker runs)."""
    base, _, variant = policy.partition("[")
    if not variant:
        return spec
    changes = parse_variant(variant.rstrip("]"))
    law_for(base, variant=changes)  # raises on a field the policy does not have
    return dataclasses.replace(spec, variant=tuple(changes.items()))

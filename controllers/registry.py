"""Build a per-instance controller from its operator-facing policy name.

Names: ``kairos``, ``kairos-no-ta`` (thrashing avoidance off, for Fig. 10–11),
``no-control``, ``fixed:MHZ``. Later policies register here too, so the daemon,
the simulator and reports accept the same names.
"""

from __future__ import annotations

import dataclasses

from controllers.baselines import FixedClock, NoControl
from controllers.errors import UnknownPolicyError
from controllers.frequency import FrequencyLevels
from controllers.kairos import KairosConfig, KairosController
from controllers.types import Controller

POLICY_NAMES = ("kairos", "kairos-no-ta", "no-control", "fixed:MHZ")


def make_controller(
    name: str, levels: FrequencyLevels, kairos: KairosConfig | None = None
) -> Controller:
    """Return the controller named ``name`` over ``levels``."""
    cfg = kairos or KairosConfig()
    if name == "kairos":
        return KairosController(levels, cfg)
    if name == "kairos-no-ta":
        ctrl = KairosController(levels, dataclasses.replace(cfg, thrashing_avoidance=False))
        ctrl.name = "kairos-no-ta"
        return ctrl
    if name == "no-control":
        return NoControl(levels, cfg.new_agent_context_tokens)
    if name.startswith("fixed:"):
        raw = name.removeprefix("fixed:")
        try:
            mhz = int(raw)
        except ValueError:
            raise UnknownPolicyError(
                f"fixed clock needs MHz, e.g. fixed:900; got {name!r}"
            ) from None
        return FixedClock(levels, mhz, cfg.new_agent_context_tokens)
    raise UnknownPolicyError(f"unknown policy {name!r}; known: {', '.join(POLICY_NAMES)}")

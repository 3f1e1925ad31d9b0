"""Why a decision set the clock it did: one closed list, shared by every policy.

A decision's :attr:`~controllers.types.ControlDecision.reason` names the stage
of its policy that set the level last (docs/control-law.md lists the stages).
The values are strings so that power reports, metrics and scripts read the
same text as before the enum existed (``context``, ``slo-boost``, …);
:func:`label` adds the two qualifiers a decision can carry on top of it: a
predictive decision made while its model warms up (``warmup-context``) and a
clock lowered by a power cap (``fleet-cap(slo-boost)``).
"""

from __future__ import annotations

from enum import StrEnum


class Reason(StrEnum):
    """The stage (or fallback) that set a decision's level."""

    CONTEXT = "context"
    """Eq. 8–9 below the top level."""
    CONTEXT_HIGH = "context-high"
    """Eq. 8: the context reached ``α·U_max``, the top level."""
    BUSY_FLOOR = "busy-floor"
    """Long-context work: at least the memory knee's level (point 11)."""
    BUSY_CEILING = "busy-ceiling"
    """Long-context decode held at the knee, with a CPU KV tier (points 12–13)."""
    PREFILL = "prefill"
    """Enough prefill queued to run it at the top clock (point 9)."""
    SLO_BOOST = "slo-boost"
    """An agent under τ (Eq. 10–12): the top level."""
    EFFICIENT_FLOOR = "efficient-floor"
    """``predictive``: raised to the lowest level where a lower clock still pays."""
    PREDICTED_SLO_UP = "predicted-slo-up"
    """``predictive``: up to the lowest level predicted to keep its margins."""
    PREDICTED_SLO_BARE = "predicted-slo-bare"
    """``predictive``: up to the lowest level predicted to meet τ itself."""
    HOLD = "hold"
    """``predictive``: stays where it is."""
    CONFIDENT_DOWN = "confident-down"
    """``predictive``: down to a level whose margin is confidently positive."""
    KAIROS_CEILING = "kairos-ceiling"
    """``predictive``: held at KAIROS's own context level, its ceiling."""
    NO_CONTROL = "no-control"
    FIXED = "fixed"
    ORACLE = "oracle-schedule"
    """A research schedule of clocks (``scripts/results_lib/oracle.py``)."""
    DAEMON = "daemon"
    """A decision the router rebuilt from a daemon's post (the fleet budget's view)."""
    CONTROLLER_ERROR = "controller-error"
    """The daemon's fallback: the controller rejected its snapshot."""
    NO_CAPACITY = "no-capacity"
    """The daemon's fallback: ``U_max`` is not known yet."""
    NO_INPUT = "no-input"
    """The daemon's fallback: no input to decide from."""


class Cap(StrEnum):
    """A power cap that lowered a decision's clock below its policy's choice."""

    FLEET = "fleet-cap"
    """The fleet power budget, allocated in the simulator (``FleetBudget``)."""
    BUDGET = "budget-cap"
    """The router's fleet-budget cap, applied by the daemon (``ClockCap``)."""


def label(reason: Reason, *, warmup: bool = False, cap: Cap | None = None) -> str:
    """The text reports show: ``reason``, ``warmup-reason``, ``cap(…)`` around either."""
    text = f"warmup-{reason}" if warmup else str(reason)
    return f"{cap}({text})" if cap is not None else text

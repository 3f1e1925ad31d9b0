"""What a field that crosses the wire may hold: typed, finite, bounded (docs/design.md §9).

Split from :mod:`kairos_common.wire` so the contract module holds the messages
and this one the rules every field of them is read with, and the bounds that
other components clamp to before sending (``MAX_TOKENS``) or check their own
settings against (``MAX_SUMMARY_WAIT_S``). Standard library only, like the wire
itself (id-tracker imports it before blocking its signals).
"""

from __future__ import annotations

import math
from typing import Any

from kairos_common.errors import WireFormatError

# Bounds for numbers that cross the wire (docs/design.md §9: finite, bounded). Generous for
# any real deployment; what they stop is 1e300, -1, NaN and 10**400.
MAX_TOKENS = 10**12
MAX_MHZ = 100_000
MAX_UNIX_S = 4.0e9  # the year 2096
MAX_DURATION_S = 1.0e9
MAX_RATE = 1.0e9
MAX_POWER_W = 1.0e6
MAX_ENERGY_J = 1.0e15
"""A megawatt for thirty years: far beyond any instance's energy counter."""
MAX_COUNT = 2**53
MAX_STRING = 4096
MAX_LIST = 1_000_000
MAX_LEVELS = 4096
MAX_MARGIN = 1.0e12
MAX_VALID_FOR_S = 3600.0
"""A decision older than an hour is stale whatever it claimed (1e300 s deferred forever)."""
MAX_SUMMARY_WAIT_S = 60.0
"""The longest an end call may wait for the agent's final record (a few epochs)."""


def get_field(
    obj: dict[str, Any],
    key: str,
    kind: type,
    default: Any = ...,
    *,
    lo: float | None = None,
    hi: float | None = None,
) -> Any:
    """Typed field access that raises :class:`WireFormatError` instead of KeyError.

    Numbers must be finite and, when given, within ``[lo, hi]``; strings and lists
    are bounded in length, so no field can carry 1e300, NaN or a 100 MB string.
    """
    if not isinstance(obj, dict):
        raise WireFormatError("expected a JSON object")
    value = obj.get(key)
    if value is None:
        if default is ...:
            raise WireFormatError(f"missing field {key!r}")
        return default
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        if abs(value) > MAX_COUNT:
            raise WireFormatError(f"field {key!r} is out of range")
        value = float(value)
    if (isinstance(value, bool) and kind is not bool) or not isinstance(value, kind):
        raise WireFormatError(f"field {key!r} must be of type {kind.__name__}")
    if isinstance(value, int | float) and not isinstance(value, bool):
        if isinstance(value, float) and not math.isfinite(value):
            raise WireFormatError(f"field {key!r} must be a finite number")
        low = -MAX_COUNT if lo is None else lo
        high = MAX_COUNT if hi is None else hi
        if not low <= value <= high:
            raise WireFormatError(f"field {key!r} must be within [{low:g}, {high:g}]")
    if isinstance(value, str) and len(value) > MAX_STRING:
        raise WireFormatError(f"field {key!r} is longer than {MAX_STRING} characters")
    if isinstance(value, list) and len(value) > MAX_LIST:
        raise WireFormatError(f"field {key!r} has more than {MAX_LIST} items")
    return value


def finite(value: Any, limit: float) -> bool:
    """A JSON number (not a bool) that is finite and within ``±limit``."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return abs(value) <= limit and (isinstance(value, int) or math.isfinite(value))


def finite_or_none(value: float | None) -> float | None:
    """Strict JSON has no NaN or infinity: a non-finite number is sent as unknown."""
    return value if value is not None and math.isfinite(value) else None

"""The error hierarchy of the what-if package (calibration, replay, comparison)."""


class WhatIfError(Exception):
    """Base class for every error the what-if tools raise on purpose."""


class ProbeError(WhatIfError):
    """vLLM could not be probed: unreachable, refusing, or answering nonsense."""


class FitError(WhatIfError, ValueError):
    """The probes cannot determine the timing model (too few or degenerate)."""


class RecordingError(WhatIfError, ValueError):
    """A recorded run cannot be compared (its trace or records are missing or bad)."""

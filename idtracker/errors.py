"""The error hierarchy of ``idtracker``.

Every error carries the exit status ``id-tracker`` ends with when it is raised
before the child runs. The codes follow ``sysexits.h`` so scripts can tell
"Kairos could not be reached" (69) from "the agent itself failed" (whatever the
agent returns) — see docs/idtracker.md for the table.
"""

from __future__ import annotations

EXIT_ROUTER_UNAVAILABLE = 69  # EX_UNAVAILABLE: router unreachable / 5xx after retries
EXIT_PROTOCOL = 76  # EX_PROTOCOL: router answered something id-tracker does not understand
EXIT_REJECTED = 77  # EX_NOPERM: router refused the control token (401/403)
EXIT_CONFIG = 78  # EX_CONFIG: bad flag, config file, token file or environment
EXIT_NOT_EXECUTABLE = 126  # shell convention: CMD exists but cannot be executed
EXIT_NOT_FOUND = 127  # shell convention: CMD not found


class IdTrackerError(Exception):
    """Base class; ``exit_code`` is what id-tracker exits with."""

    exit_code: int = 1


class ConfigurationError(IdTrackerError):
    """A flag, config file, token file or inherited variable has a bad value."""

    exit_code = EXIT_CONFIG


class RegistrationError(IdTrackerError):
    """The router did not hand out an identity (``--fail-open`` runs the child anyway)."""


class RouterUnavailableError(RegistrationError):
    """The router could not be reached (or kept failing) within the start deadline."""

    exit_code = EXIT_ROUTER_UNAVAILABLE


class RegistrationRejectedError(RegistrationError):
    """The router refused the control token."""

    exit_code = EXIT_REJECTED


class RouterProtocolError(RegistrationError):
    """The router answered with a status or body outside the lifecycle contract."""

    exit_code = EXIT_PROTOCOL


class InterruptedBySignalError(IdTrackerError):
    """A forwarded signal arrived while id-tracker was talking to the router."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"interrupted by signal {signum}")
        self.signum = signum
        self.exit_code = 128 + signum


class SpawnError(IdTrackerError):
    """CMD could not be started (not found, not executable)."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code

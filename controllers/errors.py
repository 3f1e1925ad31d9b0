"""The error hierarchy of the ``controllers`` package."""


class ControllerError(Exception):
    """Base class for every error raised by the decision logic."""


class InvalidSnapshotError(ControllerError, ValueError):
    """A snapshot or other per-call input violates a precondition (e.g. ``U_max <= 0``)."""


class InvalidConfigError(ControllerError, ValueError):
    """A policy's configuration is unusable (e.g. ``alpha`` outside ``(0, 1]``, no
    clock level in range): raised when the config or controller is built."""


class UnknownPolicyError(ControllerError, ValueError):
    """A policy name given by an operator does not name a known policy."""

"""The error hierarchy of the ``controllers`` package."""


class ControllerError(Exception):
    """Base class for every error raised by the decision logic."""


class InvalidSnapshotError(ControllerError, ValueError):
    """A snapshot or configuration violates a precondition (e.g. ``U_max <= 0``)."""


class UnknownPolicyError(ControllerError, ValueError):
    """A policy name given by an operator does not name a known policy."""

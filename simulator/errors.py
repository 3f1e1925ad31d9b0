"""The error hierarchy of the simulator package."""


class SimulatorError(Exception):
    """Base class for every error the simulator raises on purpose."""


class WorkloadError(SimulatorError, ValueError):
    """A workload file or generator parameter is invalid (names the file/line)."""


class EngineError(SimulatorError, RuntimeError):
    """The engine model was driven in a way that breaks its contract."""


class PresetError(SimulatorError, ValueError):
    """An unknown preset name or an inconsistent preset parameter."""

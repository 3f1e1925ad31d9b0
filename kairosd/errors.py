"""The error hierarchy of ``kairosd``; vendor (Zeus/NVML, HTTP) errors are
translated into these at the module that talks to the vendor, so the loop and
the CLI handle one vocabulary."""

from __future__ import annotations

# Process exit codes (docs/kairosd.md): stopped, crashed, bad configuration, control required
# but not permitted, no usable GPU. Here so the CLI needs no heavy import for them.
EXIT_OK, EXIT_ERROR, EXIT_CONFIG, EXIT_NO_CONTROL, EXIT_NO_GPU = 0, 1, 2, 3, 4

PERMISSION_FIXES = (
    "changing GPU clocks needs privileges: either run kairosd as root (or with "
    "CAP_SYS_ADMIN), or run Zeus's privileged daemon zeusd and set ZEUSD_SOCK_PATH "
    "to its socket (ZEUSD_HOST_PORT for TCP) in kairosd's environment"
)


class KairosdError(Exception):
    """Base class for every error raised by the daemon."""


class GpuError(KairosdError):
    """A GPU backend call failed."""


class GpuPermissionError(GpuError, PermissionError):
    """The process may read the GPU but not change its clocks."""

    def __init__(self, detail: str) -> None:
        super().__init__(f"{detail}; {PERMISSION_FIXES}")
        self.detail = detail


class GpuTimeoutError(GpuError, TimeoutError):
    """A GPU call (NVML, zeusd or the simulated GPU) did not answer in time."""


class GpuUnavailableError(GpuError):
    """No usable GPU (NVML missing, index out of range, simulated GPU unreachable)."""


class InputError(KairosdError):
    """An epoch input (vLLM metrics or router state) could not be obtained."""


class VllmUnavailableError(InputError):
    """vLLM's ``/metrics`` did not answer, or answered an error status."""


class VllmMetricsError(InputError):
    """vLLM answered, but the page is malformed or its statistics are disabled."""


class RouterInputError(InputError):
    """The router's ``/kairos/v1`` control endpoints did not answer usefully
    (unreachable, an error status, or a malformed body): an input the epoch
    goes without. Not id-tracker's ``RouterUnavailableError``, which ends a launch."""


class RouterVersionError(RouterInputError):
    """The router speaks another version of the ``/kairos/v1`` wire (it refused the
    daemon's message with HTTP 400, or sent one of another version): the router,
    the daemons and id-tracker of one release must be upgraded together."""

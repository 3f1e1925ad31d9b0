"""Test helpers every package's fakes share (shipped, so tests need no mocks).

Only the standard library: any component's tests may use it without pulling in
another component.
"""

from __future__ import annotations

import socket

from kairos_common.views import AdmissionRule, ModelReport
from kairos_common.wire import AdmissionDecision, DecisionAdmission, DecisionClock, Measurement


class ManualClock:
    """A monotonic clock that moves only when a test says so.

    Pass it wherever a component takes ``clock: Callable[[], float]``
    (``time.monotonic`` in production), then :meth:`advance` it: timing-dependent
    behaviour is tested without sleeping and whatever the machine's speed.
    """

    def __init__(self, start_s: float = 1000.0) -> None:
        self.now_s = start_s

    def __call__(self) -> float:
        return self.now_s

    def advance(self, seconds: float) -> None:
        self.now_s += seconds


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on right now, for a process a test starts."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def decision(
    instance: str,
    epoch: int,
    *,
    admit: tuple[str, ...] = (),
    defer: bool = False,
    rule: AdmissionRule | None = None,
    capacity_tokens: int | None = None,
    offload_tokens: int = 0,
    clock_mhz: int | None = None,
    boost: bool = False,
    levels_mhz: tuple[int, ...] = (),
    min_throughput_tok_s: float | None = None,
    report: ModelReport | None = None,
    power_w: float | None = None,
    measured_clock_mhz: int | None = None,
    energy_total_j: float | None = None,
    daemon_id: str = "d1",
    start_unix_s: float = 100.0,
    valid_for_s: float = 15.0,
    policy: str = "kairos",
) -> AdmissionDecision:
    """A daemon's decision, every part by keyword (the default rule: ``kairos``'s)."""
    return AdmissionDecision(
        instance=instance,
        daemon_id=daemon_id,
        daemon_start_unix_s=start_unix_s,
        epoch=epoch,
        policy=policy,
        valid_for_s=valid_for_s,
        admission=DecisionAdmission(
            admit=admit,
            defer=defer,
            rule=rule or AdmissionRule(),
            capacity_tokens=capacity_tokens,
            offload_tokens=offload_tokens,
        ),
        clock=DecisionClock(clock_mhz, boost, levels_mhz, min_throughput_tok_s, report),
        measured=Measurement(power_w, measured_clock_mhz, energy_total_j),
    )

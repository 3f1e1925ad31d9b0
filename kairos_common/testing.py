"""Test helpers every package's fakes share (shipped, so tests need no mocks).

Only the standard library: any component's tests may use it without pulling in
another component.
"""

from __future__ import annotations


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

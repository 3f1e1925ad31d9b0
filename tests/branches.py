"""Count which branch of a property test its examples took, and require a minimum.

A hypothesis test whose assertions sit under ``if`` checks something only in the
examples that take that branch. With a strategy that rarely gets there it passes
while checking nothing (a move test once reached its assertions in 0 of 80
examples in half of its runs). ``hypothesis.event`` only reports (and not for a
nested ``@given``), so a test that cannot build its strategy to always reach the
branch wraps its ``@given`` body in a plain test, counts here, and requires a
floor once every example has run::

    def test_x() -> None:
        branches = Branches()

        @given(...)
        def check(...) -> None:
            if ...:
                branches.reached("moved")
                assert ...

        check()
        branches.require(moved=20)

Pick floors far below what a run reaches (the tests in tests/controllers give the
counts of ``--hypothesis-seed`` 1-20 in their docstrings; ``pytest -s`` prints
them), so only a strategy that stopped reaching the branch fails, never an
unlucky seed.
"""

from __future__ import annotations

from collections import Counter


class Branches:
    """Per-branch example counts of one property test run."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()

    def reached(self, branch: str) -> None:
        """Count ``branch`` for this example."""
        self.counts[branch] += 1

    def require(self, **minimum: int) -> None:
        """Fail unless every named branch was reached at least its minimum number of times."""
        print(f"branches reached: {dict(self.counts)}")  # shown by pytest -s / -rP
        short = {b: self.counts[b] for b, n in minimum.items() if self.counts[b] < n}
        assert not short, (
            f"branches reached too rarely: {short}, need {minimum} (all: {dict(self.counts)})"
        )

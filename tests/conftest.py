"""Suite-wide fixtures."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import structlog


@pytest.fixture(autouse=True)
def _structlog_defaults_after_each_test() -> Iterator[None]:
    """A test that runs a CLI in-process configures structlog for the process
    (``kairos sim`` at level warning, say); the next test's ``capture_logs`` then
    never saw info events, and a fleet-budget test failed after the simulator's
    CLI tests. Each test starts from structlog's defaults."""
    yield
    structlog.reset_defaults()

"""Fixtures shared by the hardening tests: the daemon fixtures of tests/kairosd, the
router tests' fake backends, and a started pair of fake backends."""

from collections.abc import AsyncIterator

import pytest

from router.testing import FakeBackend
from tests.kairosd.conftest import clock, router, session, vllm
from tests.router.conftest import backend, backend2

__all__ = ["backend", "backend2", "backends", "clock", "router", "session", "vllm"]


@pytest.fixture
async def backends() -> AsyncIterator[list[FakeBackend]]:
    """Two started fake backends; a gate a test left closed is dropped before stopping."""
    fakes = [FakeBackend(), FakeBackend()]
    for f in fakes:
        await f.start()
    yield fakes
    for f in fakes:
        f.behaviour.gate = None
        await f.stop()

"""Fixtures of the scale-out tier: a real ``redis-server`` per test (skipped, saying
why, where it is not installed)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.scaleout.services import RedisServer, redis_server


@pytest.fixture
def redis(tmp_path: Path) -> Iterator[RedisServer]:
    with redis_server(tmp_path) as server:
        yield server

"""``event_loop``: uvloop when installed (``auto``), required (``uvloop``), or asyncio's."""

from __future__ import annotations

import asyncio
import sys

import pytest

from kairos_common.errors import ConfigError
from router.cli import loop_factory
from router.config import RouterConfig


def test_asyncio_means_the_standard_loop() -> None:
    assert loop_factory("asyncio") is None


def test_auto_takes_uvloop_when_installed() -> None:
    uvloop = pytest.importorskip("uvloop")
    factory = loop_factory("auto")
    assert factory is uvloop.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        assert isinstance(runner.get_loop(), uvloop.Loop)


def test_without_uvloop_auto_falls_back_and_uvloop_is_an_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # import uvloop → ImportError
    assert loop_factory("auto") is None
    with pytest.raises(ConfigError, match="not installed"):
        loop_factory("uvloop")


def test_unknown_loop_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="event_loop"):
        RouterConfig(event_loop="trio")

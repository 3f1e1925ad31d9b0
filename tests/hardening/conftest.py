"""The daemon fixtures (fake vLLM, fake router, manual clock) shared with tests/kairosd."""

from tests.kairosd.conftest import clock, router, session, vllm

__all__ = ["clock", "router", "session", "vllm"]

"""Session fixtures of the real-vLLM tier: one real vLLM server for the whole session.

The server runs the tiny locally built model with a deliberately small KV cache
(``VllmSpec``: 32 blocks of 128 tokens = 4096 tokens) so that the same engine
serves the accounting tests and, under a burst of growing agents, real
preemptions. Tests that need it are marked ``realvllm``; they skip only on a CPU
without AVX2, and fail (not skip) when the environment was not built, since
``make test`` builds it. ``KAIROS_REALVLLM_URL`` points the tier at a server
already running with ``SPEC`` and ``VLLM_SERVER_DEV_MODE=1`` instead (to iterate
on the tests without waiting for vLLM to start each time; see docs/real-engine.md).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.realvllm.engine import VllmServer, VllmSpec, running_vllm, unavailable_reason

SPEC = VllmSpec(num_gpu_blocks=32, max_model_len=2048)


@pytest.fixture(scope="package")
def vllm_workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("realvllm")


@pytest.fixture(scope="package")
def vllm(vllm_workdir: Path) -> Iterator[VllmServer]:
    reason = unavailable_reason()
    if reason is not None:
        print(f"\nrealvllm: skipping the real-engine tier: {reason}")
        pytest.skip(reason)
    reuse = os.environ.get("KAIROS_REALVLLM_URL")
    if reuse:  # a developer's server already running this tier's spec: iterate faster
        yield VllmServer(reuse.rstrip("/"), None, SPEC)
        return
    with running_vllm(vllm_workdir, SPEC) as server:
        print(f"\nrealvllm: vLLM up in {server.startup_s:.0f}s at {server.url}")
        yield server

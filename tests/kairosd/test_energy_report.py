"""kairosd reports its cumulative measured energy on every decision (energy per
agent, docs/energy.md), in observe mode too: the router attributes its increases."""

from __future__ import annotations

import itertools
import math

import aiohttp
import pytest

from kairos_common.testing import ManualClock
from kairosd.testing import FakeRouter, ScriptedVllm
from tests.kairosd.conftest import ListSink, make_daemon


@pytest.mark.parametrize("observe", [False, True])
async def test_decisions_carry_the_sum_of_closed_epochs_energy(
    vllm: ScriptedVllm,
    router: FakeRouter,
    session: aiohttp.ClientSession,
    clock: ManualClock,
    observe: bool,
) -> None:
    vllm.deny_control = observe  # unprivileged: the sim backend degrades to observe mode
    daemon = await make_daemon(vllm, router, session, clock)
    for _ in range(4):
        await daemon.run_epoch()
        clock.advance(5.0)
    sent = [d.measured.energy_total_j for d in router.decisions]
    assert sent[0] == 0.0  # nothing closed before the first epoch
    assert all(b is not None and a is not None and b > a for a, b in itertools.pairwise(sent))
    sink = daemon.sink
    assert isinstance(sink, ListSink)
    assert sent[-1] == pytest.approx(math.fsum(r.energy_j for r in sink.records), rel=1e-12)
    assert not daemon.backend.controls if observe else daemon.backend.controls

"""Shared builders for simulator tests: a real engine on a small KV cache."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import pytest

from simulator.engine import Engine
from simulator.engine_types import EngineEvent
from simulator.gpu import SimulatedGpu
from simulator.power import PowerModel
from simulator.presets import Preset, get_preset
from simulator.timing import TimingModel
from simulator.workload import AgentProgram, Turn

DATA = Path(__file__).parent / "data"


def small_preset(
    kv_tokens: int = 4096, max_seqs: int = 256, budget: int = 8192, full_isl: bool = True
) -> Preset:
    """``full_isl=False``: an older V1 engine that admits on the first chunk."""
    p = get_preset()
    return dataclasses.replace(
        p,
        engine=dataclasses.replace(
            p.engine,
            kv_capacity_tokens=kv_tokens,
            max_model_len=kv_tokens,
            max_num_seqs=max_seqs,
            max_num_batched_tokens=budget,
            reserve_full_isl=full_isl,
        ),
    )


def make_engine(preset: Preset | None = None, **kw: bool) -> Engine:
    p = preset or get_preset()
    return Engine(p.engine, TimingModel(p.timing), PowerModel(p.power), SimulatedGpu(p.gpu), **kw)


def drain(engine: Engine, limit_s: float = 1e6) -> list[EngineEvent]:
    """Run the engine until idle (bounded), returning every event."""
    events: list[EngineEvent] = []
    for _ in range(1_000_000):
        t = engine.next_event_time()
        if t is None or t > limit_s:
            return events
        events.extend(engine.advance_to(t))
    raise AssertionError("engine did not go idle")


@pytest.fixture
def engine_factory() -> Callable[..., Engine]:
    return make_engine


class ListWorkload:
    name = "list"

    def __init__(self, programs: list[AgentProgram]) -> None:
        self.programs = programs

    def program(self, index: int) -> AgentProgram:
        return self.programs[index]


def list_agent(i: int, turns: int = 3, think_s: float = 2.0, prompt: int = 1000) -> AgentProgram:
    out: list[Turn] = []
    ctx = prompt
    shared = 0
    for k in range(turns):
        out.append(Turn(ctx, shared, 50, 0.0 if k == 0 else think_s))
        shared = ctx + 50
        ctx = shared + 200
    return AgentProgram(f"a{i}", tuple(out))

"""Loader for agent-session traces (the JSONL format of docs/simulator.md, "Traces").

One JSON object per line and session: ``session_id``, ``parent`` (null or the
parent's id), ``offset_s`` (a sub-agent's start after its parent's), ``turns[]``
with ``prompt_tokens``, ``shared_prefix_tokens``, ``output_tokens`` and
``think_s`` (the recorded gap before the call). Human pauses in ``think_s`` are
capped at ``think_cap_s`` (default 60 s). Sessions carry no global arrival time,
so :class:`TraceWorkload` hands out top-level sessions (with their sub-agents)
in a seeded random order, cycling with fresh agent ids when the arrivals
outnumber the sessions.

A router's recorded traces (``kairos-router --trace-file``,
:mod:`reporting.agent_trace`) are the same format with more fields, which this
loader ignores; a session whose parent is not in the file (a recording that
rotated between them) runs as a top-level session. Replaying them with their
recorded arrivals is :mod:`simulator.workload_recorded`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from simulator.errors import WorkloadError
from simulator.workload import AgentProgram, Turn

DEFAULT_THINK_CAP_S = 60.0


@dataclass(frozen=True, slots=True)
class Session:
    """One parsed trace line: a session's program and what places it in time."""

    session_id: str
    parent: str | None
    offset_s: float
    turns: tuple[Turn, ...]
    start_unix_s: float | None = None
    """When a recorded session started (wall clock), for a replay at its arrival."""


def _int(obj: dict[str, Any], key: str, where: str) -> int:
    value = obj.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise WorkloadError(f"{where}: {key} must be a non-negative number, got {value!r}")
    return int(value)


def _parse_turn(obj: Any, where: str, think_cap_s: float) -> Turn:
    if not isinstance(obj, dict):
        raise WorkloadError(f"{where}: a turn must be an object")
    prompt = _int(obj, "prompt_tokens", where)
    output = max(1, _int(obj, "output_tokens", where))
    shared = min(_int(obj, "shared_prefix_tokens", where), prompt)
    think = obj.get("think_s", 0.0)
    if isinstance(think, bool) or not isinstance(think, int | float) or think < 0:
        raise WorkloadError(f"{where}: think_s must be a non-negative number")
    return Turn(max(1, prompt), shared, output, min(float(think), think_cap_s))


def _parse_line(line: str, where: str, think_cap_s: float) -> Session:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        raise WorkloadError(f"{where}: not JSON: {exc.msg}") from exc
    return parse_session(obj, where, think_cap_s)


def parse_session(obj: Any, where: str, think_cap_s: float) -> Session:
    """One session object of a trace, checked (``where`` names it in errors)."""
    if not isinstance(obj, dict):
        raise WorkloadError(f"{where}: expected a JSON object")
    sid = obj.get("session_id")
    if not isinstance(sid, str) or not sid:
        raise WorkloadError(f"{where}: session_id must be a non-empty string")
    parent = obj.get("parent")
    if parent is not None and not isinstance(parent, str):
        raise WorkloadError(f"{where}: parent must be a string or null")
    raw_turns = obj.get("turns")
    if not isinstance(raw_turns, list) or not raw_turns:
        raise WorkloadError(f"{where}: turns must be a non-empty list")
    turns = tuple(_parse_turn(t, f"{where} turn {i}", think_cap_s) for i, t in enumerate(raw_turns))
    offset = obj.get("offset_s", 0.0)
    if isinstance(offset, bool) or not isinstance(offset, int | float) or offset < 0:
        raise WorkloadError(f"{where}: offset_s must be a non-negative number")
    start = obj.get("start_unix_s")
    if start is not None and (
        isinstance(start, bool) or not isinstance(start, int | float) or not start >= 0
    ):
        raise WorkloadError(f"{where}: start_unix_s must be a non-negative number")
    return Session(sid, parent, float(offset), turns, None if start is None else float(start))


def load_trace(path: Path, think_cap_s: float = DEFAULT_THINK_CAP_S) -> list[AgentProgram]:
    """Top-level agent programs of a trace file, sub-agents attached as children."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise WorkloadError(f"cannot read trace {path}: {exc}") from exc
    sessions = [
        _parse_line(line, f"{path}:{n}", think_cap_s)
        for n, line in enumerate(lines, start=1)
        if line.strip()
    ]
    return build_programs(sessions, str(path))


def build_programs(sessions: Iterable[Session], where: str) -> list[AgentProgram]:
    """The top-level programs, sub-sessions attached as children (a session whose
    parent is not among ``sessions`` is top-level), in the order of ``sessions``."""
    by_id: dict[str, Session] = {}
    for s in sessions:
        if s.session_id in by_id:
            raise WorkloadError(f"{where}: duplicate session_id {s.session_id!r}")
        by_id[s.session_id] = s
    kids: dict[str, list[Session]] = {}
    for s in by_id.values():
        if s.parent is not None and s.parent in by_id:
            kids.setdefault(s.parent, []).append(s)

    def build(s: Session, depth: int) -> AgentProgram:
        if depth > 32:
            raise WorkloadError(f"{where}: sub-agent nesting too deep at {s.session_id}")
        children = tuple(
            build(k, depth + 1)
            for k in sorted(kids.get(s.session_id, []), key=lambda k: k.offset_s)
        )
        return AgentProgram(s.session_id, s.turns, s.parent, s.offset_s, children)

    roots = [build(s, 0) for s in by_id.values() if s.parent is None or s.parent not in by_id]
    if not roots:
        raise WorkloadError(f"{where}: no top-level session")
    return roots


def _renamed(program: AgentProgram, suffix: str, parent: str | None) -> AgentProgram:
    new_id = program.agent_id + suffix
    return replace(
        program,
        agent_id=new_id,
        parent_id=parent,
        children=tuple(_renamed(c, suffix, new_id) for c in program.children),
    )


class TraceWorkload:
    """Top-level sessions in a seeded order; arrival ``i`` gets a distinct id."""

    def __init__(self, programs: list[AgentProgram], seed: int, name: str = "trace") -> None:
        if not programs:
            raise WorkloadError("a trace workload needs at least one session")
        self.programs = programs
        self.name = name
        self._order = [
            int(i) for i in np.random.default_rng([seed, 0x7ACE]).permutation(len(programs))
        ]

    @classmethod
    def from_file(
        cls, path: Path, seed: int, think_cap_s: float = DEFAULT_THINK_CAP_S
    ) -> TraceWorkload:
        return cls(load_trace(path, think_cap_s), seed, name=f"trace:{path.name}")

    def program(self, index: int) -> AgentProgram:
        n = len(self.programs)
        base = self.programs[self._order[index % n]]
        return _renamed(base, f"#{index}", None)

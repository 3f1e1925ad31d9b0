"""A recorded trace replayed as it happened: its sessions, at their recorded arrivals.

``kairos sim --workload trace:FILE`` draws sessions from a trace in a seeded
order at Poisson arrivals: a trace is a sample of agents. A router's recording
(``kairos-router --trace-file``, :mod:`router.trace_recorder`) is more: a day of
one fleet, each session stamped with when it started (``start_unix_s``). This
workload replays that day (``recorded:FILE``): top-level sessions in the order
they arrived, at their recorded offsets from the first, under their recorded ids,
so a simulated agent record can be set beside the measured one
(:mod:`whatif.compare`). Sub-sessions start at their recorded offsets after their
parent, as in any trace.

Several files (a rotated recording: ``FILE``, ``FILE.1``, …) are one recording.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from simulator.errors import WorkloadError
from simulator.workload import AgentProgram
from simulator.workload_trace import Session, build_programs, parse_session

NO_THINK_CAP_S = math.inf
"""A recorded day's gaps are what its agents did: replayed uncapped by default."""


@dataclass(frozen=True, slots=True)
class Recording:
    """The sessions of one recording and where each top-level one arrives."""

    programs: tuple[AgentProgram, ...]
    """Top-level programs (sub-sessions attached), in arrival order."""
    arrivals_s: tuple[float, ...]
    """Arrival of each of ``programs``, seconds after the first (0)."""
    start_unix_s: float
    """Wall-clock time of the first arrival."""


def session_objects(paths: Sequence[Path]) -> Iterator[tuple[str, Any]]:
    """``(file:line, parsed JSON)`` of every non-blank line of ``paths``."""
    for path in paths:
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise WorkloadError(f"cannot read recorded trace {path}: {exc}") from exc
        for n, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            where = f"{path}:{n}"
            try:
                yield where, json.loads(line)
            except json.JSONDecodeError as exc:
                raise WorkloadError(f"{where}: not JSON: {exc.msg}") from exc


def read_sessions(paths: Sequence[Path], think_cap_s: float) -> list[Session]:
    """Every session line of ``paths`` (a rotated recording), checked."""
    sessions = [parse_session(obj, where, think_cap_s) for where, obj in session_objects(paths)]
    if not sessions:
        raise WorkloadError(f"{', '.join(map(str, paths))}: no session")
    return sessions


def load_recording(paths: Sequence[Path], think_cap_s: float = NO_THINK_CAP_S) -> Recording:
    """The recording in ``paths``: sessions without ``start_unix_s`` (a trace that
    was not recorded by a router) are refused, since nothing says when they came."""
    sessions = read_sessions(paths, think_cap_s)
    where = ", ".join(map(str, paths))
    ids = {s.session_id for s in sessions}
    roots = [s for s in sessions if s.parent is None or s.parent not in ids]
    missing = [s.session_id for s in roots if s.start_unix_s is None]
    if missing:
        raise WorkloadError(
            f"{where}: session {missing[0]} has no start_unix_s: not a recorded trace "
            "(use --workload trace:FILE to draw its sessions at Poisson arrivals)"
        )
    roots.sort(key=lambda s: (s.start_unix_s or 0.0, s.session_id))
    order = {s.session_id: i for i, s in enumerate(roots)}
    programs = build_programs(sessions, where)
    programs.sort(key=lambda p: order[p.agent_id])
    first = roots[0].start_unix_s or 0.0
    arrivals = tuple((s.start_unix_s or 0.0) - first for s in roots)
    return Recording(tuple(programs), arrivals, first)


class RecordedWorkload:
    """``program(i)`` is the i-th session to arrive, under its recorded id."""

    def __init__(self, recording: Recording, name: str = "recorded") -> None:
        self.recording = recording
        self.name = name

    @classmethod
    def from_file(cls, path: Path, think_cap_s: float = NO_THINK_CAP_S) -> RecordedWorkload:
        return cls(load_recording(recording_files(path), think_cap_s), f"recorded:{path.name}")

    def program(self, index: int) -> AgentProgram:
        programs = self.recording.programs
        if index >= len(programs):
            raise WorkloadError(f"a recording of {len(programs)} sessions has no arrival {index}")
        return programs[index]

    def arrivals(self) -> list[float]:
        return list(self.recording.arrivals_s)


def recording_files(path: Path) -> list[Path]:
    """``path`` and its rotated predecessors (``path.1``, ``path.2``, …), oldest first."""
    rotated = []
    n = 1
    while (older := path.with_name(f"{path.name}.{n}")).is_file():
        rotated.append(older)
        n += 1
    return [*reversed(rotated), path]

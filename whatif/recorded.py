"""What a recorded run measured, per session and per call (the comparison's truth).

A router's recording (:mod:`reporting.agent_trace`) carries, beside each
session's program, what the router measured of every call: its latency (arrival
to last byte, time held included), its time held, its time to first byte. Here
they become per-session sums, the run's totals, and the key by which the same
agent is found in another repeat of the run or in a replay: its name when every
session has a distinct one (the agent's ``id-tracker --name``), else its place in
the order of arrival.

Run totals only vLLM knows (preemptions, prefix-cache hits) are not in the
trace; a ``COUNTERS.json`` beside it (``{"preemptions": N,
"prefix_cache_hits_tokens": N}``, the deltas of ``vllm:num_preemptions`` and
``vllm:prefix_cache_hits`` over the run) adds them.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from simulator.errors import WorkloadError
from simulator.workload_recorded import recording_files, session_objects
from whatif.errors import RecordingError


@dataclass(frozen=True, slots=True)
class MeasuredCall:
    at_s: float
    """Arrival, seconds after its session's first call."""
    latency_s: float
    queue_s: float
    ttft_s: float | None
    prompt_tokens: int
    output_tokens: int


@dataclass(frozen=True, slots=True)
class MeasuredSession:
    session_id: str
    key: str
    """The same agent's key in every repeat and replay of the run."""
    start_s: float
    """Seconds after the run's first arrival."""
    calls: tuple[MeasuredCall, ...]

    @property
    def llm_time_s(self) -> float:
        """Σ call latency: the part of the session the engine decides."""
        return sum(c.latency_s for c in self.calls)

    @property
    def completion_s(self) -> float:
        """First call's arrival to the last call's last byte."""
        last = self.calls[-1]
        return last.at_s + last.latency_s


@dataclass(frozen=True, slots=True)
class MeasuredRun:
    path: Path
    sessions: tuple[MeasuredSession, ...]
    preemptions: int | None = None
    prefix_cache_hits_tokens: int | None = None

    def by_key(self) -> dict[str, MeasuredSession]:
        return {s.key: s for s in self.sessions}


def _number(obj: dict[str, Any], key: str, where: str, default: float | None = None) -> float:
    value = obj.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise RecordingError(f"{where}: {key} must be a finite number, got {value!r}")
    return float(value)


def _call(obj: Any, where: str) -> MeasuredCall:
    if not isinstance(obj, dict):
        raise RecordingError(f"{where}: a turn must be an object")
    if "latency_s" not in obj:
        raise RecordingError(f"{where}: no latency_s: not a router's recording")
    ttft = obj.get("ttft_s")
    return MeasuredCall(
        at_s=_number(obj, "at_s", where, 0.0),
        latency_s=_number(obj, "latency_s", where),
        queue_s=_number(obj, "queue_s", where, 0.0),
        ttft_s=None if ttft is None else _number(obj, "ttft_s", where),
        prompt_tokens=int(_number(obj, "prompt_tokens", where)),
        output_tokens=int(_number(obj, "output_tokens", where)),
    )


def load_measured(path: Path, counters: Path | None = None) -> MeasuredRun:
    """The measured run in the recording ``path`` (with its rotated files)."""
    rows: list[tuple[str, str | None, float, tuple[MeasuredCall, ...]]] = []
    try:
        objects = list(session_objects(recording_files(path)))
    except WorkloadError as exc:
        raise RecordingError(str(exc)) from None
    for where, obj in objects:
        if not isinstance(obj, dict) or not isinstance(obj.get("session_id"), str):
            raise RecordingError(f"{where}: not a session")
        turns = obj.get("turns")
        if not isinstance(turns, list) or not turns:
            raise RecordingError(f"{where}: turns must be a non-empty list")
        calls = tuple(_call(t, f"{where} turn {i}") for i, t in enumerate(turns))
        name = obj.get("name") if isinstance(obj.get("name"), str) else None
        start = _number(obj, "start_unix_s", where)
        rows.append((obj["session_id"], name, start, calls))
    if not rows:
        raise RecordingError(f"{path}: no session")
    rows.sort(key=lambda r: (r[2], r[0]))
    first = rows[0][2]
    names = [r[1] for r in rows]
    by_name = all(names) and len(set(names)) == len(names)
    sessions = tuple(
        MeasuredSession(sid, name if by_name and name else f"#{i}", start - first, calls)
        for i, (sid, name, start, calls) in enumerate(rows)
    )
    preemptions = hits = None
    if counters is not None:
        preemptions, hits = _counters(counters)
    return MeasuredRun(path, sessions, preemptions, hits)


def _counters(path: Path) -> tuple[int | None, int | None]:
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RecordingError(f"cannot read counters {path}: {exc}") from exc
    if not isinstance(obj, dict):
        raise RecordingError(f"{path}: expected a JSON object")
    out: list[int | None] = []
    for key in ("preemptions", "prefix_cache_hits_tokens"):
        value = obj.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise RecordingError(f"{path}: {key} must be a whole number")
        out.append(value)
    return out[0], out[1]


def counters_beside(path: Path) -> Path | None:
    """``RUN.counters.json`` next to the recording ``RUN.jsonl``, if there is one."""
    candidate = path.with_name(path.stem + ".counters.json")
    return candidate if candidate.is_file() else None


def session_keys(runs: Sequence[MeasuredRun]) -> list[str]:
    """Keys present in every run (the agents a comparison can use)."""
    common = set(runs[0].by_key())
    for run in runs[1:]:
        common &= set(run.by_key())
    return sorted(common)

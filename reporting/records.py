"""JSONL record formats written by the daemon, the router and the simulator.

Every line is one JSON object with a ``kind`` field so one reader handles mixed
files:

* ``epoch`` — :class:`EpochRecord`, one per control epoch per instance (daemon and
  simulator): the power report.
* ``agent`` — :class:`AgentRecord`, one per finished agent (router and simulator).
* ``run`` — :class:`RunRecord`, one per run (simulator, demo): what produced the
  file, so reports can label and group it.
* ``energy`` — :class:`EnergyRecord`, one per instance when the router stops:
  how its measured energy was split (energy per agent, docs/energy.md).

Times are seconds. ``t_s`` in epoch records is the end of the epoch, on the
writer's clock (Unix time for real components, virtual seconds for the simulator).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import IO, Any, TypeVar

SCHEMA_VERSION = 1


class RecordError(ValueError):
    """A record line is malformed (raised with file and line number)."""


@dataclass(frozen=True, slots=True)
class EpochRecord:
    """One control epoch of one instance (the daemon's per-epoch power report)."""

    t_s: float
    instance: str
    epoch: int
    epoch_s: float
    policy: str
    target_clock_mhz: int
    actual_clock_mhz: int | None
    energy_j: float
    avg_power_w: float
    usage_tokens: int
    capacity_tokens: int
    ongoing: int
    pending: int
    min_throughput_tok_s: float | None
    boost: bool
    deferred: bool
    admitted: int = 0
    reason: str = ""
    gpus: tuple[int, ...] = ()
    run: str = ""
    output_tokens: int | None = None
    preemptions: int | None = None
    kind: str = "epoch"


GAVE_UP = "gave-up"
"""``AgentRecord.end_reason`` of a session whose client stopped retrying while it
was held for admission: it ended without running (docs/simulator.md, "Client
patience"). Metrics count it as a missed SLO, not as a finished session."""


@dataclass(frozen=True, slots=True)
class AgentRecord:
    """One finished agent (router per-agent completion record).

    ``llm_time_s`` is Σ request latency (arrival at the router to last byte,
    including time held pending) over the agent's requests; ``throughput_tok_s``
    is Eq. 3 = ``decode_tokens / llm_time_s``.

    Energy (docs/energy.md; None where nothing measured it): ``energy_own_j`` is
    the GPU energy attributed to this agent's own requests, split into
    ``energy_prefill_j`` + ``energy_decode_j``; ``energy_j`` adds its sub-agents'
    ``energy_j``. An estimate: the instance's idle draw is not in it, and
    Σ ``energy_own_j`` + the instances' unattributed joules = measured energy.
    """

    agent_id: str
    start_s: float
    end_s: float
    turns: int
    decode_tokens: int
    prompt_tokens: int
    llm_time_s: float
    pending_s: float
    throughput_tok_s: float | None
    slo_tok_s: float | None
    slo_met: bool | None
    parent_id: str | None = None
    name: str | None = None
    instances: tuple[str, ...] = ()
    exit_code: int | None = None
    end_reason: str = "end"
    max_context_tokens: int = 0
    run: str = ""
    energy_j: float | None = None
    energy_own_j: float | None = None
    energy_prefill_j: float | None = None
    energy_decode_j: float | None = None
    kind: str = "agent"


@dataclass(frozen=True, slots=True)
class RunRecord:
    """Describes one run (simulator or demo) so a report can label its records."""

    run: str
    policy: str
    source: str
    duration_s: float
    instances: tuple[str, ...] = ()
    arrival_rate_per_s: float | None = None
    slo_tok_s: float | None = None
    seed: int | None = None
    workload: str = ""
    counters: dict[str, float] = field(default_factory=dict)
    kind: str = "run"


@dataclass(frozen=True, slots=True)
class EnergyRecord:
    """One instance's measured energy as the router split it, written when it stops.

    ``measured_j`` = ``attributed_j`` + ``unattributed_j``, exactly;
    ``unrecorded_j`` is the part of ``attributed_j`` in no agent record (agents
    still live, anonymous one-turn requests), so Σ agents' ``energy_own_j`` +
    ``unrecorded_j`` + ``unattributed_j`` = ``measured_j``. ``measured_j`` is the
    daemon's counter at the decision of epoch ``daemon_epoch``: Σ of its power
    report's epochs before that one.
    """

    t_s: float
    instance: str
    measured_j: float
    attributed_j: float
    unattributed_j: float
    unrecorded_j: float
    daemon_epoch: int | None = None
    idle_power_w: float | None = None
    run: str = ""
    kind: str = "energy"


Record = EpochRecord | AgentRecord | RunRecord | EnergyRecord
_KINDS: dict[str, type[Any]] = {
    "epoch": EpochRecord,
    "agent": AgentRecord,
    "run": RunRecord,
    "energy": EnergyRecord,
}
R = TypeVar("R", EpochRecord, AgentRecord, RunRecord)
_FIELD_NAMES: dict[type[Any], tuple[str, ...]] = {
    cls: tuple(f.name for f in fields(cls)) for cls in _KINDS.values()
}


def to_json_line(record: Record) -> str:
    """One JSONL line (no trailing newline) for ``record``.

    The records are flat (scalars, tuples of scalars, a dict of floats), so a
    shallow field dict serialises exactly as ``asdict`` would, without its deep
    copy (a simulation writes thousands of records; ``asdict`` was most of it)."""
    data = {name: getattr(record, name) for name in _FIELD_NAMES[type(record)]}
    return json.dumps(data, separators=(",", ":"), allow_nan=False)


_SCALARS = ("float", "int", "str", "bool", "None")


def _is(kind: str, value: Any) -> bool:
    """Whether a JSON ``value`` can stand for the annotated scalar ``kind``."""
    if kind == "None":
        return value is None
    if kind == "bool" or isinstance(value, bool):
        return kind == "bool" and isinstance(value, bool)
    types: dict[str, tuple[type, ...]] = {"float": (int, float), "int": (int,), "str": (str,)}
    return isinstance(value, types[kind])


def _bad_fields(cls: type[Any], data: dict[str, Any]) -> list[str]:
    """Fields whose JSON value cannot be the annotated scalar type (``"x"`` for a float),
    so a bad record is named at its line instead of failing later in the metrics."""
    bad = []
    for f in fields(cls):
        kinds = [k.strip() for k in str(f.type).split("|")]
        checked = f.name in data and all(k in _SCALARS for k in kinds)
        if checked and not any(_is(k, data[f.name]) for k in kinds):
            bad.append(f"{f.name}={data[f.name]!r} (expected {f.type})")
    return bad


def _from_obj(obj: dict[str, Any]) -> Record:
    kind = obj.get("kind")
    cls = _KINDS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise RecordError(f"unknown record kind {kind!r}; expected one of {', '.join(_KINDS)}")
    names = {f.name for f in fields(cls)}
    data = {k: v for k, v in obj.items() if k in names}
    required = [
        f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING
    ]
    missing = [name for name in required if name not in data]
    if missing:
        raise RecordError(f"{kind} record: missing field(s) {', '.join(missing)}")
    bad = _bad_fields(cls, data)
    if bad:
        raise RecordError(f"{kind} record: bad value(s) {', '.join(bad)}")
    for key in ("gpus", "instances"):
        if key in data and isinstance(data[key], list):
            data[key] = tuple(data[key])
    try:
        return cls(**data)  # type: ignore[no-any-return]
    except (TypeError, ValueError) as exc:
        raise RecordError(f"{kind} record: {exc}") from exc


def record_from_json(obj: dict[str, Any]) -> Record:
    """A record from its JSON object (as :func:`to_json_line` wrote it); RecordError
    when it is not one."""
    return _from_obj(obj)


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    """Numbered lines of a JSONL text file; a binary file (a PNG picked up by a glob)
    or an unreadable one is one :class:`RecordError` naming the file."""
    try:
        with path.open(encoding="utf-8") as fh:
            yield from enumerate(fh, start=1)
    except UnicodeDecodeError:
        raise RecordError(
            f"{path}: not a JSONL text file (binary content); pass the .jsonl files"
        ) from None
    except OSError as exc:
        raise RecordError(f"{path}: cannot read: {exc.strerror or exc}") from None


def read_records(paths: Iterable[Path]) -> Iterator[Record]:
    """Yield every record in the JSONL files ``paths`` (blank lines skipped)."""
    for path in paths:
        for lineno, line in _lines(path):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise RecordError(f"{path}:{lineno}: not JSON: {exc.msg}") from exc
            if not isinstance(obj, dict):
                raise RecordError(f"{path}:{lineno}: expected a JSON object")
            try:
                yield _from_obj(obj)
            except RecordError as exc:
                raise RecordError(f"{path}:{lineno}: {exc}") from exc


def file_slug(text: str) -> str:
    """A file-name-safe form of a policy or run label (``fixed:810`` → ``fixed-810``):
    the one rule ``kairos sim`` and ``kairos report --plots`` both name files by."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-") or "run"


class JsonlWriter:
    """Append records to a JSONL file, one flushed line each (crash-safe enough
    for a power report: at most the line being written is lost)."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._fh: IO[str] = path.open("a", encoding="utf-8")

    def write(self, record: Record) -> None:
        self._fh.write(to_json_line(record) + "\n")
        self._fh.flush()

    def close(self) -> None:
        self._fh.close()

    def __enter__(self) -> JsonlWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

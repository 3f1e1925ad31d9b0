"""The HTTP contract between the router, the daemons and id-tracker.

All endpoints live on the router under ``/kairos/v1``; bodies are JSON objects
built and parsed by the functions here so both sides agree by construction.

=======  =======================================  =====================================
method   path                                     body → response
=======  =======================================  =====================================
POST     /kairos/v1/agents                        :class:`AgentStart` → :class:`AgentStarted`
POST     /kairos/v1/agents/{agent_id}/end         :class:`AgentEnd` → :class:`AgentEndReply`
GET      /kairos/v1/agents/{agent_id}             → agent status object (router-defined)
GET      /kairos/v1/instances                     → ``{"instances": [...]}`` (router-defined)
GET      /kairos/v1/instances/{name}/state        → :class:`InstanceState`
POST     /kairos/v1/instances/{name}/decision     :class:`AdmissionDecision` → :class:`DecisionAck`
GET      /kairos/v1/fleet                         → fleet power budget state (router-defined)
=======  =======================================  =====================================

Control endpoints are authenticated with ``Authorization: Bearer <control
token>`` when the router has a control token configured; without one the router
accepts control calls only from loopback peers.

Admission decisions are idempotent and versioned: a decision carries the
daemon's ``(daemon_start_unix_s, epoch)``; the router applies it only if that
pair is newer than the last one it applied for the instance, and admitting an
agent that is not pending is a no-op. A late or repeated message therefore can
never admit twice.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from kairos_common.errors import WireFormatError
from kairos_common.views import AgentView, ModelReport, RequestObservation

API_PREFIX = "/kairos/v1"
WIRE_VERSION = 1


# Bounds for numbers that cross the wire (SPEC §9: finite, bounded). Generous for
# any real deployment; what they stop is 1e300, -1, NaN and 10**400.
MAX_TOKENS = 10**12
MAX_MHZ = 100_000
MAX_UNIX_S = 4.0e9  # the year 2096
MAX_DURATION_S = 1.0e9
MAX_RATE = 1.0e9
MAX_POWER_W = 1.0e6
MAX_ENERGY_J = 1.0e15
"""A megawatt for thirty years: far beyond any instance's energy counter."""
MAX_COUNT = 2**53
MAX_STRING = 4096
MAX_LIST = 1_000_000
MAX_LEVELS = 4096
MAX_MARGIN = 1.0e12
MAX_VALID_FOR_S = 3600.0
"""A decision older than an hour is stale whatever it claimed (1e300 s deferred forever)."""
MAX_SUMMARY_WAIT_S = 60.0
"""The longest an end call may wait for the agent's final record (a few epochs)."""


def _get(
    obj: dict[str, Any],
    key: str,
    kind: type,
    default: Any = ...,
    *,
    lo: float | None = None,
    hi: float | None = None,
) -> Any:
    """Typed field access that raises :class:`WireFormatError` instead of KeyError.

    Numbers must be finite and, when given, within ``[lo, hi]``; strings and lists
    are bounded in length, so no field can carry 1e300, NaN or a 100 MB string.
    """
    if not isinstance(obj, dict):
        raise WireFormatError("expected a JSON object")
    value = obj.get(key)
    if value is None:
        if default is ...:
            raise WireFormatError(f"missing field {key!r}")
        return default
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        if abs(value) > MAX_COUNT:
            raise WireFormatError(f"field {key!r} is out of range")
        value = float(value)
    if (isinstance(value, bool) and kind is not bool) or not isinstance(value, kind):
        raise WireFormatError(f"field {key!r} must be of type {kind.__name__}")
    if isinstance(value, int | float) and not isinstance(value, bool):
        if isinstance(value, float) and not math.isfinite(value):
            raise WireFormatError(f"field {key!r} must be a finite number")
        low = -MAX_COUNT if lo is None else lo
        high = MAX_COUNT if hi is None else hi
        if not low <= value <= high:
            raise WireFormatError(f"field {key!r} must be within [{low:g}, {high:g}]")
    if isinstance(value, str) and len(value) > MAX_STRING:
        raise WireFormatError(f"field {key!r} is longer than {MAX_STRING} characters")
    if isinstance(value, list) and len(value) > MAX_LIST:
        raise WireFormatError(f"field {key!r} has more than {MAX_LIST} items")
    return value


def _finite(value: Any, limit: float) -> bool:
    """A JSON number (not a bool) that is finite and within ``±limit``."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return abs(value) <= limit and (isinstance(value, int) or math.isfinite(value))


@dataclass(frozen=True, slots=True)
class AgentStart:
    """id-tracker → router: a new agent starts."""

    name: str | None = None
    parent_id: str | None = None
    slo_tok_s: float | None = None
    pid: int | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> AgentStart:
        return cls(
            name=_get(obj, "name", str, None),
            parent_id=_get(obj, "parent_id", str, None),
            slo_tok_s=_get(obj, "slo_tok_s", float, None, lo=1e-9, hi=MAX_RATE),
            pid=_get(obj, "pid", int, None, lo=0, hi=2**31),
        )


@dataclass(frozen=True, slots=True)
class AgentStarted:
    """router → id-tracker: the identity of the new agent."""

    agent_id: str
    token: str
    idle_expiry_s: float
    end_key: str = field(default="", repr=False)
    """Present it to end this agent with the lifecycle credential (empty: not needed)."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> AgentStarted:
        return cls(
            agent_id=_get(obj, "agent_id", str),
            token=_get(obj, "token", str),
            idle_expiry_s=_get(obj, "idle_expiry_s", float, lo=0, hi=MAX_DURATION_S),
            end_key=_get(obj, "end_key", str, ""),
        )


@dataclass(frozen=True, slots=True)
class AgentEnd:
    """id-tracker → router: the agent's process ended.

    ``exit_code`` is the shell-style status (128+N when killed by signal N).
    """

    exit_code: int
    signal: int | None = None
    reason: str = "exit"
    end_key: str = field(default="", repr=False)
    """From :class:`AgentStarted`; required with the lifecycle credential (not admin)."""
    summary_wait_s: float = 0.0
    """Above 0: answer with the agent's :class:`AgentSummary`, waiting up to this long
    for its final record (its energy is attributed an epoch or two after its last
    request). 0: answer at once, without a summary. Older routers ignore it."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> AgentEnd:
        return cls(
            exit_code=_get(obj, "exit_code", int, lo=-(2**31), hi=2**31),
            signal=_get(obj, "signal", int, None, lo=0, hi=1024),
            reason=_get(obj, "reason", str, "exit"),
            end_key=_get(obj, "end_key", str, ""),
            summary_wait_s=_get(obj, "summary_wait_s", float, 0.0, lo=0, hi=MAX_SUMMARY_WAIT_S),
        )


@dataclass(frozen=True, slots=True)
class AgentSummary:
    """What one agent run cost: the router's record of it, as its launcher sees it.

    ``final`` is False when the record was not yet written when the end call
    stopped waiting: the figures are those so far (``energy_j`` then lacks the
    last epoch or two). ``energy_j`` is None where no daemon measured energy.
    """

    agent_id: str
    turns: int
    decode_tokens: int
    prompt_tokens: int
    llm_time_s: float
    pending_s: float
    end_reason: str
    final: bool
    name: str | None = None
    throughput_tok_s: float | None = None
    slo_tok_s: float | None = None
    slo_met: bool | None = None
    energy_j: float | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> AgentSummary:
        return cls(
            agent_id=_get(obj, "agent_id", str),
            turns=_get(obj, "turns", int, lo=0, hi=MAX_COUNT),
            decode_tokens=_get(obj, "decode_tokens", int, lo=0, hi=MAX_TOKENS),
            prompt_tokens=_get(obj, "prompt_tokens", int, lo=0, hi=MAX_TOKENS),
            llm_time_s=_get(obj, "llm_time_s", float, lo=0, hi=MAX_DURATION_S),
            pending_s=_get(obj, "pending_s", float, lo=0, hi=MAX_DURATION_S),
            end_reason=_get(obj, "end_reason", str),
            final=_get(obj, "final", bool),
            name=_get(obj, "name", str, None),
            throughput_tok_s=_get(obj, "throughput_tok_s", float, None, lo=0, hi=MAX_RATE),
            slo_tok_s=_get(obj, "slo_tok_s", float, None, lo=0, hi=MAX_RATE),
            slo_met=_get(obj, "slo_met", bool, None),
            energy_j=_get(obj, "energy_j", float, None, lo=0, hi=MAX_ENERGY_J),
        )


@dataclass(frozen=True, slots=True)
class AgentEndReply:
    """router → id-tracker: the end is recorded; with its summary when one was asked for."""

    summary: AgentSummary | None = None
    ok: bool = True

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"ok": self.ok}
        if self.summary is not None:
            out["summary"] = self.summary.to_json()
        return out

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> AgentEndReply:
        raw = _get(obj, "summary", dict, None)
        return cls(
            summary=None if raw is None else AgentSummary.from_json(raw),
            ok=_get(obj, "ok", bool, True),
        )


def agent_to_json(agent: AgentView) -> dict[str, Any]:
    return asdict(agent)


def agent_from_json(obj: dict[str, Any]) -> AgentView:
    return AgentView(
        agent_id=_get(obj, "agent_id", str),
        arrival_s=_get(obj, "arrival_s", float),
        context_tokens=_get(obj, "context_tokens", int, None, lo=0, hi=MAX_TOKENS),
        estimated_context_tokens=_get(
            obj, "estimated_context_tokens", int, None, lo=0, hi=MAX_TOKENS
        ),
        decode_tokens=_get(obj, "decode_tokens", int, 0, lo=0, hi=MAX_TOKENS),
        llm_time_s=_get(obj, "llm_time_s", float, 0.0, lo=0, hi=MAX_DURATION_S),
        completed_steps=_get(obj, "completed_steps", int, 0, lo=0),
        waiting_since_s=_get(obj, "waiting_since_s", float, None),
        in_flight=_get(obj, "in_flight", bool, False),
        last_active_s=_get(obj, "last_active_s", float, None),
        prefill_tokens=_get(obj, "prefill_tokens", int, 0, lo=0, hi=MAX_TOKENS),
    )


def observation_to_json(ob: RequestObservation) -> dict[str, Any]:
    return asdict(ob)


def observation_from_json(obj: dict[str, Any]) -> RequestObservation:
    """``clock_mhz`` 0 means the router did not know it (the daemon fills it in)."""
    return RequestObservation(
        t_s=_get(obj, "t_s", float),
        prompt_tokens=_get(obj, "prompt_tokens", int, 0, lo=0, hi=MAX_TOKENS),
        cached_tokens=_get(obj, "cached_tokens", int, 0, lo=0, hi=MAX_TOKENS),
        completion_tokens=_get(obj, "completion_tokens", int, 0, lo=0, hi=MAX_TOKENS),
        ttft_s=_get(obj, "ttft_s", float, 0.0, lo=0, hi=MAX_DURATION_S),
        decode_s_per_token=_get(obj, "decode_s_per_token", float, 0.0, lo=0, hi=MAX_DURATION_S),
        running=_get(obj, "running", int, 0, lo=0, hi=MAX_TOKENS),
        active_context_tokens=_get(obj, "active_context_tokens", int, 0, lo=0, hi=MAX_TOKENS),
        clock_mhz=_get(obj, "clock_mhz", int, 0, lo=0, hi=MAX_MHZ),
    )


def _finite_or_none(value: float | None) -> float | None:
    """Strict JSON has no NaN or infinity: a non-finite number is sent as unknown."""
    return value if value is not None and math.isfinite(value) else None


def report_to_json(report: ModelReport) -> dict[str, Any]:
    """Margins as ``[[level, margin], ...]`` (JSON keys are strings; levels are not)."""
    return {
        "slo_margins": [
            [lv, m] for lv, m in sorted(report.slo_margin_by_level.items()) if math.isfinite(m)
        ],
        "slo_slack": _finite_or_none(report.slo_slack),
        "efficient_floor_level": report.efficient_floor_level,
        "model_error": _finite_or_none(report.model_error),
        "model_observations": report.model_observations,
    }


def report_from_json(obj: dict[str, Any]) -> ModelReport:
    margins = _get(obj, "slo_margins", list, [])
    if len(margins) > MAX_LEVELS or not all(
        isinstance(p, list)
        and len(p) == 2
        and isinstance(p[0], int)
        and not isinstance(p[0], bool)
        and 1 <= p[0] <= MAX_LEVELS
        and _finite(p[1], MAX_MARGIN)
        for p in margins
    ):
        raise WireFormatError("field 'slo_margins' must list [level, finite margin] pairs")
    return ModelReport(
        slo_margin_by_level={int(lv): float(m) for lv, m in margins},
        slo_slack=_get(obj, "slo_slack", float, None, lo=-MAX_MARGIN, hi=MAX_MARGIN),
        efficient_floor_level=_get(obj, "efficient_floor_level", int, None, lo=1, hi=MAX_LEVELS),
        model_error=_get(obj, "model_error", float, None, lo=0, hi=MAX_MARGIN),
        model_observations=_get(obj, "model_observations", int, 0, lo=0),
    )


@dataclass(frozen=True, slots=True)
class InstanceState:
    """router → daemon: one instance's agents, as the router's ledger sees them.

    Times (``now_s``, agents' ``arrival_s``/``waiting_since_s``) are on the
    router's monotonic clock; only differences between them are meaningful.
    ``pending`` is in arrival order. ``capacity_tokens`` is what the router last
    learned (from the daemon or vLLM), or None.
    """

    instance: str
    now_s: float
    ongoing: tuple[AgentView, ...] = ()
    pending: tuple[AgentView, ...] = ()
    capacity_tokens: int | None = None
    healthy: bool = True
    draining: bool = False
    version: int = WIRE_VERSION
    observations: tuple[RequestObservation, ...] = ()
    """Recent finished requests on this instance (optional; issue 10's online model)."""

    def to_json(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "instance": self.instance,
            "now_s": self.now_s,
            "ongoing": [agent_to_json(a) for a in self.ongoing],
            "pending": [agent_to_json(a) for a in self.pending],
            "capacity_tokens": self.capacity_tokens,
            "healthy": self.healthy,
            "draining": self.draining,
            "observations": [observation_to_json(o) for o in self.observations],
        }

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> InstanceState:
        ongoing = _get(obj, "ongoing", list, [])
        pending = _get(obj, "pending", list, [])
        observations = _get(obj, "observations", list, [])
        return cls(
            instance=_get(obj, "instance", str),
            now_s=_get(obj, "now_s", float),
            ongoing=tuple(agent_from_json(a) for a in ongoing),
            pending=tuple(agent_from_json(a) for a in pending),
            capacity_tokens=_get(obj, "capacity_tokens", int, None, lo=1, hi=MAX_TOKENS),
            healthy=_get(obj, "healthy", bool, True),
            draining=_get(obj, "draining", bool, False),
            version=_get(obj, "version", int, WIRE_VERSION),
            observations=tuple(observation_from_json(o) for o in observations),
        )


@dataclass(frozen=True, slots=True)
class AdmissionDecision:
    """daemon → router: what the instance's controller decided this epoch.

    ``valid_for_s``: after this long without a newer decision the router treats
    the daemon as stale and falls back to its local same-rule admission.
    ``admission_control``: false when the daemon's policy admits everyone at once
    (no-control, fixed clocks, kairos-no-ta); the router then holds no agent.

    Fleet power budget (optional; old daemons omit them and are not capped):
    ``levels_mhz`` are the clocks the daemon may be capped to (empty when it
    cannot change clocks, e.g. observe mode); ``measured_power_w`` and
    ``measured_clock_mhz`` are what the instance drew over its last closed
    epoch and at which clock; ``min_throughput_tok_s`` is the slowest agent's
    Eq. 3 throughput and ``report`` the controller's own numbers (the predictive
    controller's per-level SLO margins and efficient floor; None for the others).
    A message from a daemon that still sends the old ``extras`` map decodes;
    the map is ignored (the router then falls back to its throughput-scaled slack).

    ``offload_tokens``: the instance's CPU KV tier as the daemon read it from vLLM
    (0: none, or an old daemon); the router then admits against the resident usage
    (:func:`controllers.admission.resident_tokens`; docs/control-law.md, point 13),
    counting as idle the agents with no request for ``idle_after_s`` (the daemon's
    ``[kairos] idle_after_s``, so both judge activity alike).
    ``evictable_after_s``: the law's eviction window (``[kairos] evictable_after_s``;
    docs/control-law.md, point 14): the router does not count the contexts of
    agents idle this long towards admission. None: off (``kairos-paper``, or an
    old daemon).

    Energy per agent (optional; docs/energy.md): ``energy_total_j`` is the GPU
    energy the instance measured from the daemon's start to the end of its last
    closed epoch — a monotone counter, so a lost message loses no joules (the
    router attributes each increase to the work since the previous one).
    """

    instance: str
    daemon_id: str
    daemon_start_unix_s: float
    epoch: int
    admit: tuple[str, ...] = ()
    defer_admissions: bool = False
    capacity_tokens: int | None = None
    clock_mhz: int | None = None
    boost: bool = False
    valid_for_s: float = 15.0
    policy: str = "kairos"
    admission_control: bool = True
    report: ModelReport | None = None
    version: int = WIRE_VERSION
    levels_mhz: tuple[int, ...] = ()
    measured_power_w: float | None = None
    measured_clock_mhz: int | None = None
    min_throughput_tok_s: float | None = None
    energy_total_j: float | None = None
    offload_tokens: int = 0
    idle_after_s: float = 10.0
    evictable_after_s: float | None = None

    @property
    def order_key(self) -> tuple[float, int]:
        """Decisions are applied only in strictly increasing order of this key."""
        return (self.daemon_start_unix_s, self.epoch)

    def to_json(self) -> dict[str, Any]:
        out = {k: getattr(self, k) for k in self.__dataclass_fields__ if k != "report"}
        out["admit"] = list(self.admit)
        out["levels_mhz"] = list(self.levels_mhz)
        out["report"] = None if self.report is None else report_to_json(self.report)
        return out

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> AdmissionDecision:
        admit = _get(obj, "admit", list, [])
        if not all(isinstance(a, str) and len(a) <= 256 for a in admit):
            raise WireFormatError("field 'admit' must be a list of agent ids")
        report = _get(obj, "report", dict, None)
        levels = _get(obj, "levels_mhz", list, [])
        if len(levels) > MAX_LEVELS or not all(
            isinstance(c, int) and not isinstance(c, bool) and 0 < c <= MAX_MHZ for c in levels
        ):
            raise WireFormatError("field 'levels_mhz' must be a list of positive MHz integers")
        return cls(
            instance=_get(obj, "instance", str),
            daemon_id=_get(obj, "daemon_id", str),
            daemon_start_unix_s=_get(obj, "daemon_start_unix_s", float, lo=0, hi=MAX_UNIX_S),
            epoch=_get(obj, "epoch", int, lo=0),
            admit=tuple(admit),
            defer_admissions=_get(obj, "defer_admissions", bool, False),
            capacity_tokens=_get(obj, "capacity_tokens", int, None, lo=1, hi=MAX_TOKENS),
            clock_mhz=_get(obj, "clock_mhz", int, None, lo=1, hi=MAX_MHZ),
            boost=_get(obj, "boost", bool, False),
            valid_for_s=_get(obj, "valid_for_s", float, 15.0, lo=1e-3, hi=MAX_VALID_FOR_S),
            policy=_get(obj, "policy", str, "kairos"),
            admission_control=_get(obj, "admission_control", bool, True),
            report=None if report is None else report_from_json(report),
            version=_get(obj, "version", int, WIRE_VERSION),
            levels_mhz=tuple(sorted(set(levels))),
            measured_power_w=_get(obj, "measured_power_w", float, None, lo=0, hi=MAX_POWER_W),
            measured_clock_mhz=_get(obj, "measured_clock_mhz", int, None, lo=0, hi=MAX_MHZ),
            min_throughput_tok_s=_get(obj, "min_throughput_tok_s", float, None, lo=0, hi=MAX_RATE),
            energy_total_j=_get(obj, "energy_total_j", float, None, lo=0, hi=MAX_ENERGY_J),
            offload_tokens=_get(obj, "offload_tokens", int, 0, lo=0, hi=MAX_TOKENS),
            idle_after_s=_get(obj, "idle_after_s", float, 10.0, lo=1e-3, hi=MAX_VALID_FOR_S),
            evictable_after_s=_get(
                obj, "evictable_after_s", float, None, lo=1e-3, hi=MAX_VALID_FOR_S
            ),
        )


@dataclass(frozen=True, slots=True)
class DecisionAck:
    """router → daemon: whether the decision was applied and whom it admitted.

    ``clock_cap_mhz``: the fleet power budget's upper bound on this instance's
    clock, valid for the decision's ``valid_for_s`` (None: no cap);
    ``budget_conflict``: meeting the fleet cap needed an SLO-unsafe step (or was
    impossible). Old routers omit both, which means no cap.
    """

    accepted: bool
    admitted: tuple[str, ...] = ()
    reason: str = ""
    clock_cap_mhz: int | None = None
    budget_conflict: bool = False

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "accepted": self.accepted,
            "admitted": list(self.admitted),
            "reason": self.reason,
        }
        if self.clock_cap_mhz is not None or self.budget_conflict:  # only with a budget
            out["clock_cap_mhz"] = self.clock_cap_mhz
            out["budget_conflict"] = self.budget_conflict
        return out

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> DecisionAck:
        return cls(
            accepted=_get(obj, "accepted", bool),
            admitted=tuple(_get(obj, "admitted", list, [])),
            reason=_get(obj, "reason", str, ""),
            clock_cap_mhz=_get(obj, "clock_cap_mhz", int, None, lo=1, hi=MAX_MHZ),
            budget_conflict=_get(obj, "budget_conflict", bool, False),
        )

"""The HTTP contract between the router, the daemons and id-tracker.

All endpoints live on the router under ``/kairos/v1``; bodies are JSON objects
built and parsed by the functions here so both sides agree by construction (the
views inside them by :mod:`kairos_common.wire_views`; every field is read with the
bounds of :mod:`kairos_common.wire_fields`).

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

Every message carries the schema's ``version`` (:data:`WIRE_VERSION`, one for
the whole contract); a message of another version is refused with a
:class:`~kairos_common.errors.WireVersionError` naming the version this side
speaks (the router answers it with HTTP 400), since the router, the daemons and
id-tracker of one release change together. A message without one (a hand-made
request, an empty end body) is read as this version.

Admission decisions are idempotent and ordered: a decision carries the daemon's
``(daemon_start_unix_s, epoch)``; the router applies it only if that pair is
newer than the last one it applied for the instance, and admitting an agent
that is not pending is a no-op. A late or repeated message therefore can never
admit twice.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from kairos_common.errors import WireFormatError, WireVersionError
from kairos_common.views import AdmissionRule, AgentView, ModelReport, RequestObservation
from kairos_common.wire_fields import (
    MAX_COUNT,
    MAX_DURATION_S,
    MAX_ENERGY_J,
    MAX_LEVELS,
    MAX_MHZ,
    MAX_POWER_W,
    MAX_RATE,
    MAX_SUMMARY_WAIT_S,
    MAX_TOKENS,
    MAX_UNIX_S,
    MAX_VALID_FOR_S,
    get_field,
)
from kairos_common.wire_views import (
    agent_from_json,
    agent_to_json,
    observation_from_json,
    observation_to_json,
    report_from_json,
    report_to_json,
    rule_from_json,
    rule_to_json,
)

API_PREFIX = "/kairos/v1"
CELL_HEADER = "X-Kairos-Cell"
"""On an agent start: the cell to start it in (a nested id-tracker sends its
parent's, so a front balancer starts a sub-agent beside its parent; docs/cells.md)."""
REQUIRE_ROOM_HEADER = "X-Kairos-Require-Room"
"""On an agent start: decline it (503 ``cell_full``) unless this cell has room now;
the front balancer sets it on the starts it steers by room (docs/cells.md)."""
WIRE_VERSION = 2
"""The schema version of every message below. 2: decisions carry their policy's
whole admission rule and group their fields."""
SUPPORTED_VERSIONS = (WIRE_VERSION,)


def check_version(obj: dict[str, Any]) -> None:
    """Refuse a message of a version this side does not speak (absent: this one)."""
    version = get_field(obj, "version", int, WIRE_VERSION)
    if version not in SUPPORTED_VERSIONS:
        speaks = ", ".join(str(v) for v in SUPPORTED_VERSIONS)
        raise WireVersionError(
            f"wire version {version} is not supported: this side speaks version {speaks} "
            "(upgrade the router, kairosd and id-tracker together)"
        )


def _versioned(body: dict[str, Any]) -> dict[str, Any]:
    return {"version": WIRE_VERSION, **body}


# -- Leader and standby (docs/scale-out.md) ---------------------------------------------
# Routers that share a Redis store elect one leader; only it serves. These names are
# the whole contract a client (id-tracker, kairosd, a front balancer) relies on.
LIVENESS_PATH = "/health"
"""200 while the process serves HTTP, leader or not (liveness)."""
READY_PATH = "/health/ready"
"""200 ``{"ready": true, "role": "leader", "store": {...}, ...}`` on the router that
holds the lease (a router on the embedded SQLite store always does); 503
``{"ready": false, "role": "standby", "reason": "...", "store": {...}, ...}``
otherwise. A front balancer checks it to send traffic to the leader only."""
ROLE_LEADER = "leader"
ROLE_STANDBY = "standby"
NOT_LEADER_STATUS = 503
NOT_LEADER_CODE = "not_leader"
"""``error.code`` of the OpenAI-style body a standby answers every route with except
:data:`LIVENESS_PATH`, :data:`READY_PATH` and ``/metrics``."""
LEADER_HEADER = "X-Kairos-Leader"
"""On a ``not_leader`` answer: the leader's advertised URL, when the standby knows it."""
NOT_LEADER_RETRY_AFTER_S = 1
"""``Retry-After`` (whole seconds) on a ``not_leader`` answer."""


def is_not_leader(status: int, body: Any) -> bool:
    """Whether an answer (status, parsed JSON body) is a standby's ``not_leader``: the
    caller should try another router URL (or the one in :data:`LEADER_HEADER`)."""
    if status != NOT_LEADER_STATUS or not isinstance(body, dict):
        return False
    error = body.get("error")
    return isinstance(error, dict) and error.get("code") == NOT_LEADER_CODE


@dataclass(frozen=True, slots=True)
class AgentStart:
    """id-tracker → router: a new agent starts."""

    name: str | None = None
    parent_id: str | None = None
    slo_tok_s: float | None = None
    pid: int | None = None

    def to_json(self) -> dict[str, Any]:
        return _versioned(asdict(self))

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> AgentStart:
        check_version(obj)
        return cls(
            name=get_field(obj, "name", str, None),
            parent_id=get_field(obj, "parent_id", str, None),
            slo_tok_s=get_field(obj, "slo_tok_s", float, None, lo=1e-9, hi=MAX_RATE),
            pid=get_field(obj, "pid", int, None, lo=0, hi=2**31),
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
        return _versioned(asdict(self))

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> AgentStarted:
        check_version(obj)
        return cls(
            agent_id=get_field(obj, "agent_id", str),
            token=get_field(obj, "token", str),
            idle_expiry_s=get_field(obj, "idle_expiry_s", float, lo=0, hi=MAX_DURATION_S),
            end_key=get_field(obj, "end_key", str, ""),
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
        return _versioned(asdict(self))

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> AgentEnd:
        check_version(obj)
        return cls(
            exit_code=get_field(obj, "exit_code", int, lo=-(2**31), hi=2**31),
            signal=get_field(obj, "signal", int, None, lo=0, hi=1024),
            reason=get_field(obj, "reason", str, "exit"),
            end_key=get_field(obj, "end_key", str, ""),
            summary_wait_s=get_field(
                obj, "summary_wait_s", float, 0.0, lo=0, hi=MAX_SUMMARY_WAIT_S
            ),
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
        return _versioned(asdict(self))

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> AgentSummary:
        check_version(obj)
        return cls(
            agent_id=get_field(obj, "agent_id", str),
            turns=get_field(obj, "turns", int, lo=0, hi=MAX_COUNT),
            decode_tokens=get_field(obj, "decode_tokens", int, lo=0, hi=MAX_TOKENS),
            prompt_tokens=get_field(obj, "prompt_tokens", int, lo=0, hi=MAX_TOKENS),
            llm_time_s=get_field(obj, "llm_time_s", float, lo=0, hi=MAX_DURATION_S),
            pending_s=get_field(obj, "pending_s", float, lo=0, hi=MAX_DURATION_S),
            end_reason=get_field(obj, "end_reason", str),
            final=get_field(obj, "final", bool),
            name=get_field(obj, "name", str, None),
            throughput_tok_s=get_field(obj, "throughput_tok_s", float, None, lo=0, hi=MAX_RATE),
            slo_tok_s=get_field(obj, "slo_tok_s", float, None, lo=0, hi=MAX_RATE),
            slo_met=get_field(obj, "slo_met", bool, None),
            energy_j=get_field(obj, "energy_j", float, None, lo=0, hi=MAX_ENERGY_J),
        )


@dataclass(frozen=True, slots=True)
class AgentEndReply:
    """router → id-tracker: the end is recorded; with its summary when one was asked for."""

    summary: AgentSummary | None = None
    ok: bool = True

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = _versioned({"ok": self.ok})
        if self.summary is not None:
            out["summary"] = self.summary.to_json()
        return out

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> AgentEndReply:
        check_version(obj)
        raw = get_field(obj, "summary", dict, None)
        return cls(
            summary=None if raw is None else AgentSummary.from_json(raw),
            ok=get_field(obj, "ok", bool, True),
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
    observations: tuple[RequestObservation, ...] = ()
    """Recent finished requests on this instance (optional; docs/beyond.md §1)."""

    def to_json(self) -> dict[str, Any]:
        return {
            "version": WIRE_VERSION,
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
        check_version(obj)
        ongoing = get_field(obj, "ongoing", list, [])
        pending = get_field(obj, "pending", list, [])
        observations = get_field(obj, "observations", list, [])
        return cls(
            instance=get_field(obj, "instance", str),
            now_s=get_field(obj, "now_s", float),
            ongoing=tuple(agent_from_json(a) for a in ongoing),
            pending=tuple(agent_from_json(a) for a in pending),
            capacity_tokens=get_field(obj, "capacity_tokens", int, None, lo=1, hi=MAX_TOKENS),
            healthy=get_field(obj, "healthy", bool, True),
            draining=get_field(obj, "draining", bool, False),
            observations=tuple(observation_from_json(o) for o in observations),
        )


@dataclass(frozen=True, slots=True)
class DecisionAdmission:
    """Whom the decision admits and by what rule the router admits meanwhile.

    ``rule``: the daemon's policy's whole admission rule (Eq. 13's β and γ, whether
    it holds anyone at all, its activity and eviction windows, whether it reads the
    CPU KV tier: :class:`~kairos_common.views.AdmissionRule`), which the router
    applies on this instance while the decision is fresh (docs/control-law.md,
    points 13, 14, 18). ``defer``: hold newcomers until the next decision.
    ``offload_tokens``: the CPU KV tier the daemon read from vLLM and its law counts
    on (0: none), so the router weighs the same resident usage.
    """

    admit: tuple[str, ...] = ()
    defer: bool = False
    rule: AdmissionRule = field(default_factory=AdmissionRule)
    capacity_tokens: int | None = None
    offload_tokens: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "admit": list(self.admit),
            "defer": self.defer,
            "rule": rule_to_json(self.rule),
            "capacity_tokens": self.capacity_tokens,
            "offload_tokens": self.offload_tokens,
        }

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> DecisionAdmission:
        admit = get_field(obj, "admit", list, [])
        if not all(isinstance(a, str) and len(a) <= 256 for a in admit):
            raise WireFormatError("field 'admit' must be a list of agent ids")
        return cls(
            admit=tuple(admit),
            defer=get_field(obj, "defer", bool, False),
            rule=rule_from_json(get_field(obj, "rule", dict)),
            capacity_tokens=get_field(obj, "capacity_tokens", int, None, lo=1, hi=MAX_TOKENS),
            offload_tokens=get_field(obj, "offload_tokens", int, 0, lo=0, hi=MAX_TOKENS),
        )


@dataclass(frozen=True, slots=True)
class DecisionClock:
    """The clock the daemon chose, and what the fleet power budget reads of it.

    ``levels_mhz``: the clocks the daemon may be capped to (empty when it cannot
    change clocks, e.g. observe mode); ``min_throughput_tok_s``: the slowest
    agent's Eq. 3 throughput; ``report``: the controller's own numbers (the
    predictive controller's per-level SLO margins and efficient floor; None for
    the others).
    """

    clock_mhz: int | None = None
    boost: bool = False
    levels_mhz: tuple[int, ...] = ()
    min_throughput_tok_s: float | None = None
    report: ModelReport | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "clock_mhz": self.clock_mhz,
            "boost": self.boost,
            "levels_mhz": list(self.levels_mhz),
            "min_throughput_tok_s": self.min_throughput_tok_s,
            "report": None if self.report is None else report_to_json(self.report),
        }

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> DecisionClock:
        report = get_field(obj, "report", dict, None)
        levels = get_field(obj, "levels_mhz", list, [])
        if len(levels) > MAX_LEVELS or not all(
            isinstance(c, int) and not isinstance(c, bool) and 0 < c <= MAX_MHZ for c in levels
        ):
            raise WireFormatError("field 'levels_mhz' must be a list of positive MHz integers")
        return cls(
            clock_mhz=get_field(obj, "clock_mhz", int, None, lo=1, hi=MAX_MHZ),
            boost=get_field(obj, "boost", bool, False),
            levels_mhz=tuple(sorted(set(levels))),
            min_throughput_tok_s=get_field(
                obj, "min_throughput_tok_s", float, None, lo=0, hi=MAX_RATE
            ),
            report=None if report is None else report_from_json(report),
        )


@dataclass(frozen=True, slots=True)
class Measurement:
    """What the instance drew: over its last closed epoch (``power_w`` at
    ``clock_mhz``; the fleet budget's input) and since the daemon started
    (``energy_total_j``, a monotone counter, so a lost message loses no joules:
    the router attributes each increase to the work since the previous one,
    docs/energy.md)."""

    power_w: float | None = None
    clock_mhz: int | None = None
    energy_total_j: float | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Measurement:
        return cls(
            power_w=get_field(obj, "power_w", float, None, lo=0, hi=MAX_POWER_W),
            clock_mhz=get_field(obj, "clock_mhz", int, None, lo=0, hi=MAX_MHZ),
            energy_total_j=get_field(obj, "energy_total_j", float, None, lo=0, hi=MAX_ENERGY_J),
        )


@dataclass(frozen=True, slots=True)
class AdmissionDecision:
    """daemon → router: what the instance's controller decided this epoch.

    Who and when (the order key ``(daemon_start_unix_s, epoch)``), the policy by
    name, and three typed parts: :class:`DecisionAdmission` (whom it admits, and
    the policy's rule), :class:`DecisionClock` (its clock, for the fleet power
    budget) and :class:`Measurement` (power and energy, for the budget and energy
    per agent). ``valid_for_s``: after this long without a newer decision the
    router treats the daemon as stale and admits by the rule of its own
    ``policy`` instead.
    """

    instance: str
    daemon_id: str
    daemon_start_unix_s: float
    epoch: int
    policy: str = "kairos"
    valid_for_s: float = 15.0
    admission: DecisionAdmission = field(default_factory=DecisionAdmission)
    clock: DecisionClock = field(default_factory=DecisionClock)
    measured: Measurement = field(default_factory=Measurement)

    @property
    def order_key(self) -> tuple[float, int]:
        """Decisions are applied only in strictly increasing order of this key."""
        return (self.daemon_start_unix_s, self.epoch)

    def to_json(self) -> dict[str, Any]:
        return {
            "version": WIRE_VERSION,
            "instance": self.instance,
            "daemon_id": self.daemon_id,
            "daemon_start_unix_s": self.daemon_start_unix_s,
            "epoch": self.epoch,
            "policy": self.policy,
            "valid_for_s": self.valid_for_s,
            "admission": self.admission.to_json(),
            "clock": self.clock.to_json(),
            "measured": self.measured.to_json(),
        }

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> AdmissionDecision:
        check_version(obj)
        return cls(
            instance=get_field(obj, "instance", str),
            daemon_id=get_field(obj, "daemon_id", str),
            daemon_start_unix_s=get_field(obj, "daemon_start_unix_s", float, lo=0, hi=MAX_UNIX_S),
            epoch=get_field(obj, "epoch", int, lo=0),
            policy=get_field(obj, "policy", str, "kairos"),
            valid_for_s=get_field(obj, "valid_for_s", float, 15.0, lo=1e-3, hi=MAX_VALID_FOR_S),
            admission=DecisionAdmission.from_json(get_field(obj, "admission", dict)),
            clock=DecisionClock.from_json(get_field(obj, "clock", dict, {})),
            measured=Measurement.from_json(get_field(obj, "measured", dict, {})),
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
            "version": WIRE_VERSION,
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
        check_version(obj)
        return cls(
            accepted=get_field(obj, "accepted", bool),
            admitted=tuple(get_field(obj, "admitted", list, [])),
            reason=get_field(obj, "reason", str, ""),
            clock_cap_mhz=get_field(obj, "clock_cap_mhz", int, None, lo=1, hi=MAX_MHZ),
            budget_conflict=get_field(obj, "budget_conflict", bool, False),
        )

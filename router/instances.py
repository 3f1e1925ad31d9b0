"""The pool of vLLM instances the router fronts, with their health and control state.

An instance is *eligible* for new work when it is healthy and not draining; the
placement policies only ever see eligible instances. Capacity ``U_max`` comes
from (in order of preference) the instance's daemon decision, the backend's
``/metrics`` (``vllm:cache_config_info``), or the configured fallback.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict, dataclass
from urllib.parse import urlsplit

from kairos_common.errors import WireFormatError
from kairos_common.views import AdmissionRule
from kairos_common.wire import WIRE_VERSION
from kairos_common.wire_views import rule_from_json, rule_to_json
from router.errors import BadRequestError, NotFoundError


@dataclass(slots=True)
class Instance:
    """One vLLM serving instance (one GPU or one TP group)."""

    name: str
    base_url: str
    index: int
    healthy: bool = True
    draining: bool = False
    consecutive_failures: int = 0
    metrics_capacity_tokens: int | None = None
    daemon_capacity_tokens: int | None = None
    config_capacity_tokens: int | None = None
    metrics_enabled: bool | None = None
    decision_key: tuple[float, int] | None = None
    decision_valid_until_s: float = 0.0
    decision_defer: bool = False
    decision_rule: AdmissionRule | None = None
    """The admission rule the daemon's last decision carried (its policy's, whole);
    applied on this instance while the decision is fresh. None: no decision yet."""
    decision_offload_tokens: int = 0
    """The instance's CPU KV tier as its daemon last reported it (0: none)."""
    daemon_id: str | None = None
    clock_mhz: int | None = None
    boost: bool = False
    breaker_open: bool = False
    """Set by :mod:`router.breaker` after consecutive timeouts/5xx."""
    last_answered_s: float | None = None
    """When this instance last answered a proxied request (status < 500): a backend
    busy serving may answer a health probe late without being down."""
    served_models: tuple[str, ...] = ()
    """The model names its ``/metrics`` carry (empty: not known)."""

    @property
    def eligible(self) -> bool:
        return self.healthy and not self.draining and not self.breaker_open

    @property
    def capacity_tokens(self) -> int | None:
        """``U_max``: daemon's value, else vLLM's metrics, else the configured one."""
        return (
            self.daemon_capacity_tokens
            or self.metrics_capacity_tokens
            or (self.config_capacity_tokens)
        )

    @property
    def host_port(self) -> str:
        return urlsplit(self.base_url).netloc

    def daemon_fresh(self, now_s: float) -> bool:
        """True while the daemon's latest decision is within its validity window."""
        return self.decision_key is not None and now_s < self.decision_valid_until_s

    def to_json(self, usage_tokens: int, ongoing: int, pending: int) -> dict[str, object]:
        return {
            "name": self.name,
            "url": self.base_url,
            "index": self.index,
            "healthy": self.healthy,
            "draining": self.draining,
            "breaker_open": self.breaker_open,
            "usage_tokens": usage_tokens,
            "capacity_tokens": self.capacity_tokens,
            "ongoing": ongoing,
            "pending": pending,
            "daemon_id": self.daemon_id,
            "clock_mhz": self.clock_mhz,
            "boost": self.boost,
            "models": list(self.served_models),
            "defer_admissions": self.decision_defer,
            "offload_tokens": self.decision_offload_tokens,
            "admission_rule": None if self.decision_rule is None else asdict(self.decision_rule),
        }


_SHARED_FIELDS = (
    "draining",
    "metrics_capacity_tokens",
    "daemon_capacity_tokens",
    "decision_defer",
    "decision_offload_tokens",
    "daemon_id",
    "clock_mhz",
    "boost",
)
"""What a router taking over needs of an instance besides its URL: its draining flag
and its daemon's latest decision (health it checks for itself)."""


def shared_state(inst: Instance) -> tuple[object, ...]:
    """An instance's shared state in monotonic terms (compared to see a change)."""
    return (
        inst.base_url,
        *(getattr(inst, f) for f in _SHARED_FIELDS),
        inst.decision_key,
        inst.decision_valid_until_s,
        inst.decision_rule,
        inst.served_models,
    )


def state_to_json(inst: Instance, now_s: float, now_unix_s: float) -> dict[str, object]:
    """The registry entry of ``inst`` (the decision's validity as a wall-clock time).

    The decision's admission rule is written in the wire's form
    (:func:`kairos_common.wire_views.rule_to_json`) and the entry names the wire
    version, so a router of another release taking over ignores a decision it
    would read differently rather than misapplying it."""
    entry: dict[str, object] = {f: getattr(inst, f) for f in _SHARED_FIELDS}
    entry["version"] = WIRE_VERSION
    entry["url"] = inst.base_url
    entry["decision_key"] = None if inst.decision_key is None else list(inst.decision_key)
    entry["decision_valid_until_unix_s"] = now_unix_s + (inst.decision_valid_until_s - now_s)
    rule = inst.decision_rule
    entry["decision_rule"] = None if rule is None else rule_to_json(rule)
    entry["served_models"] = list(inst.served_models)
    return entry


def apply_state(inst: Instance, entry: dict[str, object], now_s: float, now_unix_s: float) -> None:
    """Take over a registry entry written by :func:`state_to_json` (bad fields are
    skipped: a half-understood entry must not stop a takeover).

    An entry of another wire version, or whose rule does not parse, leaves the
    instance with no decision: the router's own rule applies to it until its
    daemon's next decision (within an epoch)."""
    for f in _SHARED_FIELDS:
        if f in entry:
            setattr(inst, f, entry[f])
    models = entry.get("served_models")
    if isinstance(models, list):
        inst.served_models = tuple(str(m) for m in models)
    rule = _decision_rule(entry)
    key = entry.get("decision_key")
    if rule is None or not (isinstance(key, list) and len(key) == 2):
        inst.decision_key = None
        inst.decision_rule = None
        return
    inst.decision_rule = rule
    inst.decision_key = (float(key[0]), int(key[1]))
    until = entry.get("decision_valid_until_unix_s")
    if isinstance(until, int | float):
        inst.decision_valid_until_s = now_s + (float(until) - now_unix_s)


def _decision_rule(entry: dict[str, object]) -> AdmissionRule | None:
    """The entry's decision rule if it is this wire version's and well formed."""
    raw = entry.get("decision_rule")
    if entry.get("version") != WIRE_VERSION or not isinstance(raw, dict):
        return None
    try:
        return rule_from_json(raw)
    except WireFormatError:
        return None


class InstancePool:
    """Instances by name, in index order (Algorithm 2 consolidates onto low indices)."""

    def __init__(self, default_capacity_tokens: int | None = None) -> None:
        self._by_name: dict[str, Instance] = {}
        self._next_index = 0
        self.default_capacity_tokens = default_capacity_tokens

    def __iter__(self) -> Iterator[Instance]:
        return iter(list(self._by_name.values()))

    def __len__(self) -> int:
        return len(self._by_name)

    def add(self, name: str, base_url: str) -> Instance:
        if name in self._by_name:
            raise BadRequestError(f"instance {name!r} already exists")
        if any(i.base_url == base_url for i in self._by_name.values()):
            raise BadRequestError(f"an instance with URL {base_url} already exists")
        inst = Instance(
            name=name,
            base_url=base_url,
            index=self._next_index,
            config_capacity_tokens=self.default_capacity_tokens,
        )
        self._next_index += 1
        self._by_name[name] = inst
        return inst

    def remove(self, name: str) -> Instance:
        inst = self._by_name.pop(name, None)
        if inst is None:
            raise NotFoundError(f"no instance named {name!r}")
        return inst

    def get(self, name: str | None) -> Instance | None:
        return self._by_name.get(name) if name is not None else None

    def resolve(self, name: str) -> Instance:
        """By name, or by ``host:port`` of its URL (what a daemon knows from ``--vllm-url``)."""
        inst = self._by_name.get(name)
        if inst is not None:
            return inst
        for candidate in self._by_name.values():
            if candidate.host_port == name:
                return candidate
        raise NotFoundError(f"no instance named {name!r}")

    def max_capacity_tokens(self) -> int:
        """The largest known KV capacity (0 when none is known)."""
        return max((i.capacity_tokens or 0 for i in self._by_name.values()), default=0)

    def eligible(self) -> list[Instance]:
        return [i for i in self._by_name.values() if i.eligible]

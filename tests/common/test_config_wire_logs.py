from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from controllers import KAIROS, KAIROS_ALG1, AgentView
from controllers.types import ADMIT_ALL
from kairos_common.config import CODE_ONLY, config_reference, load_config
from kairos_common.errors import ConfigError, WireFormatError, WireVersionError
from kairos_common.logs import redact_secrets
from kairos_common.testing import decision
from kairos_common.views import ModelReport
from kairos_common.wire import (
    WIRE_VERSION,
    AdmissionDecision,
    AgentEnd,
    AgentEndReply,
    AgentStart,
    AgentStarted,
    DecisionAck,
    InstanceState,
)


@dataclass(frozen=True)
class Sub:
    rate: float = 1.0
    names: tuple[str, ...] = ()


@dataclass(frozen=True)
class Cfg:
    port: int = 80
    host: str = "127.0.0.1"
    debug: bool = False
    limit: int | None = None
    sub: Sub = field(default_factory=Sub)


def test_layers_in_order(tmp_path: Path) -> None:
    p = tmp_path / "c.toml"
    p.write_text('port = 81\nhost = "h"\n[sub]\nrate = 2\nnames = ["a"]\n')
    env = {"X_PORT": "82", "X_SUB__RATE": "3.5", "X_DEBUG": "yes"}
    cfg = load_config(Cfg, path=p, env_prefix="X", env=env, overrides={"port": 83, "host": None})
    assert cfg == Cfg(port=83, host="h", debug=True, limit=None, sub=Sub(rate=3.5, names=("a",)))


def test_unknown_key_and_bad_type_are_errors(tmp_path: Path) -> None:
    p = tmp_path / "c.toml"
    p.write_text("prot = 1\n")
    with pytest.raises(ConfigError, match="unknown key"):
        load_config(Cfg, path=p, env_prefix="X", env={})
    with pytest.raises(ConfigError, match="integer"):
        load_config(Cfg, env_prefix="X", env={"X_PORT": "eighty"})
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(Cfg, path=tmp_path / "missing.toml", env_prefix="X", env={})


def test_config_reference_lists_nested_keys() -> None:
    keys = [row[0] for row in config_reference(Cfg)]
    assert keys == ["port", "host", "debug", "limit", "sub.rate", "sub.names"]


@dataclass(frozen=True)
class Tuned:
    port: int = 80
    retries: int = field(default=3, metadata=CODE_ONLY)
    sub: Sub = field(default_factory=Sub, metadata=CODE_ONLY)


RETIRED = {"alpha": "a constant of the law", "sub.rate": "gone"}


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("alpha = 0.7\n", "alpha was removed: a constant of the law"),
        ("retries = 5\n", "retries is a constant of the code, not configuration"),
        ("[sub]\nrate = 2\n", "sub is a constant of the code"),
    ],
)
def test_removed_keys_and_code_constants_are_refused_saying_why(
    tmp_path: Path, text: str, says: str
) -> None:
    p = tmp_path / "c.toml"
    p.write_text(text)
    with pytest.raises(ConfigError, match=says):
        load_config(Tuned, path=p, env_prefix="X", env={}, retired=RETIRED)


@pytest.mark.parametrize("strict", [True, False])
def test_variables_for_removed_keys_and_code_constants_are_refused(strict: bool) -> None:
    for env, says in (({"X_ALPHA": "1"}, "X_ALPHA: alpha was removed"),
                      ({"X_RETRIES": "5"}, "X_RETRIES: retries is a constant"),
                      ({"X_SUB__RATE": "2"}, "X_SUB__RATE: sub.rate was removed")):  # fmt: skip
        with pytest.raises(ConfigError, match=says):
            load_config(Tuned, env_prefix="X", env=env, strict_env=strict, retired=RETIRED)
    assert load_config(Tuned, env_prefix="X", env={"X_PORT": "81"}, retired=RETIRED).port == 81


def test_code_constants_stay_settable_in_code_and_out_of_the_reference() -> None:
    assert Tuned(retries=5).retries == 5
    assert [row[0] for row in config_reference(Tuned)] == ["port"]


def test_instance_state_roundtrip() -> None:
    st = InstanceState(
        instance="g0",
        now_s=5.0,
        ongoing=(AgentView("a", 1.0, 100, in_flight=True, prefill_tokens=4096),),
        pending=(AgentView("b", 2.0),),
        capacity_tokens=1000,
    )
    assert InstanceState.from_json(st.to_json()) == st


def test_decision_roundtrip_and_ordering() -> None:
    d = decision(
        "g0", 3, admit=("a",), start_unix_s=10.0,
        report=ModelReport({1: -0.5, 2: 0.25}, slo_slack=0.25, efficient_floor_level=2),
    )  # fmt: skip
    back = AdmissionDecision.from_json(d.to_json())
    assert back == d
    later = AdmissionDecision(instance="g0", daemon_id="d2", daemon_start_unix_s=11.0, epoch=0)
    assert later.order_key > d.order_key


def test_the_decision_carries_its_rule_whole() -> None:
    """The admission rule of the daemon's policy (Eq. 13's β and γ, whether it holds
    anyone, its activity and eviction windows, whether it reads the tier) crosses
    the wire as one typed value, and back."""
    for rule in (KAIROS.rule, KAIROS_ALG1.rule, ADMIT_ALL):
        d = decision("g0", 1, rule=rule)
        assert AdmissionDecision.from_json(d.to_json()).admission.rule == rule
    body = decision("g0", 1).to_json()
    assert set(body) == {"version", "instance", "daemon_id", "daemon_start_unix_s", "epoch",
                         "policy", "valid_for_s", "admission", "clock", "measured"}  # fmt: skip
    del body["admission"]["rule"]
    with pytest.raises(WireFormatError, match="missing field 'rule'"):
        AdmissionDecision.from_json(body)


@pytest.mark.parametrize(
    ("field", "bad"),
    [
        ("beta", 0), ("beta", 1.5), ("beta", float("nan")), ("beta", "0.9"), ("gamma", True),
        ("idle_after_s", 0), ("idle_after_s", 1e9), ("evictable_after_s", -1.0),
        ("evictable_after_s", "60"), ("enabled", "yes"), ("offload_aware", 1),
    ],
)  # fmt: skip
def test_a_bad_rule_is_a_wire_error(field: str, bad: object) -> None:
    body = decision("g0", 1).to_json()
    body["admission"]["rule"][field] = bad
    with pytest.raises(WireFormatError, match=field):
        AdmissionDecision.from_json(body)


def test_a_rule_out_of_order_is_a_wire_error() -> None:
    body = decision("g0", 1).to_json()
    body["admission"]["rule"]["beta"] = 0.8  # below kairos's γ = 0.95
    with pytest.raises(WireFormatError, match="gamma <= beta"):
        AdmissionDecision.from_json(body)


MESSAGES: list[Any] = [
    AgentStart(name="a"),
    AgentStarted("a1", "tok", 1800.0),
    AgentEnd(0),
    AgentEndReply(),
    InstanceState("g0", 1.0),
    decision("g0", 1),
    DecisionAck(True),
]


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: type(m).__name__)
def test_every_message_carries_the_one_wire_version(message: Any) -> None:
    body = message.to_json()
    assert body["version"] == WIRE_VERSION == 2
    assert type(message).from_json(body) == message
    del body["version"]  # a hand-made request: read as this version
    assert type(message).from_json(body) == message


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: type(m).__name__)
@pytest.mark.parametrize("version", [1, 3, 0])
def test_another_version_is_refused_naming_the_one_spoken(message: Any, version: int) -> None:
    body = {**message.to_json(), "version": version}
    with pytest.raises(WireVersionError, match=f"version {version} is not supported: this "
                       "side speaks version 2"):  # fmt: skip
        type(message).from_json(body)


@pytest.mark.parametrize(
    "bad",
    [
        {},
        {"instance": 1, "now_s": 0},
        {"instance": "g", "now_s": True},
        {"instance": "g", "now_s": 0, "ongoing": [{"agent_id": 3}]},
        {
            "instance": "g",
            "now_s": 0,
            "ongoing": [{"agent_id": "a", "arrival_s": 0, "prefill_tokens": -1}],
        },
    ],
)
def test_malformed_state_raises_wire_error(bad: dict[str, object]) -> None:
    with pytest.raises(WireFormatError):
        InstanceState.from_json(bad)  # type: ignore[arg-type]


def test_redaction() -> None:
    ev = redact_secrets(
        None,
        "info",
        {
            "authorization": "Bearer x",
            "api_key": "k",
            "control_token": "t",
            "capacity_tokens": 5,
            "msg": "key kairos1.abc.sig.cmVhbA was used",
            "h": "Bearer sk-123",
        },
    )
    assert ev["authorization"] == "<redacted>" and ev["api_key"] == "<redacted>"
    assert "abc" not in ev["msg"] and "sk-123" not in ev["h"]
    assert ev["control_token"] == "<redacted>" and ev["capacity_tokens"] == 5


def test_logging_follows_the_current_stderr(monkeypatch: pytest.MonkeyPatch) -> None:
    """A CLI run under a test runner configures logging while stderr is a capture
    buffer; after that buffer is closed, later log lines must still work."""
    import io

    import structlog

    from kairos_common.logs import configure_logging

    temporary = io.StringIO()
    monkeypatch.setattr("sys.stderr", temporary)
    configure_logging("info", json=True)
    structlog.get_logger("t").info("first")
    assert '"first"' in temporary.getvalue()
    temporary.close()
    later = io.StringIO()
    monkeypatch.setattr("sys.stderr", later)
    structlog.get_logger("t").info("second")
    assert '"second"' in later.getvalue()

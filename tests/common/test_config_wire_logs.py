from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from controllers import AgentView
from kairos_common.config import config_reference, load_config
from kairos_common.errors import ConfigError, WireFormatError
from kairos_common.logs import redact_secrets
from kairos_common.views import ModelReport
from kairos_common.wire import AdmissionDecision, InstanceState


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
    d = AdmissionDecision(
        instance="g0",
        daemon_id="d",
        daemon_start_unix_s=10.0,
        epoch=3,
        admit=("a",),
        report=ModelReport({1: -0.5, 2: 0.25}, slo_slack=0.25, efficient_floor_level=2),
    )
    back = AdmissionDecision.from_json(d.to_json())
    assert back == d
    later = AdmissionDecision(instance="g0", daemon_id="d2", daemon_start_unix_s=11.0, epoch=0)
    assert later.order_key > d.order_key


def test_decision_eviction_window_is_optional_and_bounded() -> None:
    """``evictable_after_s`` (control-law point 14): absent (an old daemon) or null
    means off; any number must be finite and within (0, 1 h]."""
    d = AdmissionDecision("g0", "d", 10.0, 3, evictable_after_s=60.0)
    assert AdmissionDecision.from_json(d.to_json()).evictable_after_s == 60.0
    body = d.to_json()
    body.pop("evictable_after_s")
    assert AdmissionDecision.from_json(body).evictable_after_s is None
    for bad in (0, -1.0, 1e9, "60", True):
        with pytest.raises(WireFormatError, match="evictable_after_s"):
            AdmissionDecision.from_json({**d.to_json(), "evictable_after_s": bad})


def test_decision_thresholds_come_together_and_in_order() -> None:
    """``beta`` / ``gamma`` (control-law point 18): absent (an old daemon) means the
    router's own; both or neither, each in (0, 1], γ ≤ β."""
    d = AdmissionDecision("g0", "d", 10.0, 3, beta=0.95, gamma=0.90)
    back = AdmissionDecision.from_json(d.to_json())
    assert (back.beta, back.gamma) == (0.95, 0.90)
    body = d.to_json()
    body.pop("beta"), body.pop("gamma")
    assert AdmissionDecision.from_json(body).beta is None
    for bad in (0, -1.0, 1.5, float("nan"), "0.9", True):
        with pytest.raises(WireFormatError, match="beta"):
            AdmissionDecision.from_json({**d.to_json(), "beta": bad})
    with pytest.raises(WireFormatError, match="together"):
        AdmissionDecision.from_json({**d.to_json(), "gamma": None})
    with pytest.raises(WireFormatError, match="gamma <= beta"):
        AdmissionDecision.from_json({**d.to_json(), "beta": 0.8})


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

"""docs/design.md §9: numbers that cross the wire are finite and bounded."""

from __future__ import annotations

import json
from typing import Any

import pytest

from kairos_common.errors import WireFormatError
from kairos_common.testing import decision
from kairos_common.views import ModelReport
from kairos_common.wire import (
    AdmissionDecision,
    AgentEnd,
    AgentStart,
    DecisionAck,
    InstanceState,
)

PART = {
    "admit": ("admission", "admit"),
    "capacity_tokens": ("admission", "capacity_tokens"),
    "offload_tokens": ("admission", "offload_tokens"),
    "clock_mhz": ("clock", "clock_mhz"),
    "report": ("clock", "report"),
    "levels_mhz": ("clock", "levels_mhz"),
    "min_throughput_tok_s": ("clock", "min_throughput_tok_s"),
    "measured_power_w": ("measured", "power_w"),
    "measured_clock_mhz": ("measured", "clock_mhz"),
    "energy_total_j": ("measured", "energy_total_j"),
}
"""Where each field of the decision sits in its typed parts."""


def _decision(**fields: Any) -> dict[str, Any]:
    """A valid decision's JSON with ``fields`` put where they belong."""
    body = decision("i0", 3, start_unix_s=1.7e9).to_json()
    for name, value in fields.items():
        if name in PART:
            part, key = PART[name]
            body[part][key] = value
        else:
            body[name] = value
    return body


def test_a_normal_decision_round_trips() -> None:
    d = decision(
        "i0", 3, daemon_id="d", start_unix_s=1.7e9, admit=("a",), capacity_tokens=1000,
        clock_mhz=1410, valid_for_s=15.0, report=ModelReport({1: 0.2}, model_error=0.1),
        levels_mhz=(810, 1410), power_w=350.0, measured_clock_mhz=1410,
        min_throughput_tok_s=22.5,
    )  # fmt: skip
    assert AdmissionDecision.from_json(json.loads(json.dumps(d.to_json()))) == d
    assert AdmissionDecision.from_json(_decision()) == decision("i0", 3, start_unix_s=1.7e9)


@pytest.mark.parametrize(
    "fields",
    [
        {"daemon_start_unix_s": 1e300},
        {"daemon_start_unix_s": float("nan")},
        {"daemon_start_unix_s": -1.0},
        {"valid_for_s": 1e300},
        {"valid_for_s": 0.0},
        {"valid_for_s": float("inf")},
        {"capacity_tokens": -1},
        {"capacity_tokens": 0},
        {"capacity_tokens": 10**400},
        {"measured_power_w": 1e300},
        {"measured_power_w": -5.0},
        {"measured_power_w": float("nan")},
        {"min_throughput_tok_s": float("-inf")},
        {"clock_mhz": 10**9},
        {"epoch": -1},
        {"epoch": 10**30},
        {"report": {"slo_margins": [[1, float("nan")]]}},
        {"report": {"slo_margins": [[1, 1e300]]}},
        {"report": {"slo_margins": [[True, 0.1]]}},
        {"report": {"slo_margins": [[0, 0.1]]}},
        {"report": {"slo_margins": {"1": 0.1}}},
        {"report": {"efficient_floor_level": 10**9}},
        {"report": {"model_error": -1.0}},
        {"report": "margins"},
        {"levels_mhz": [0]},
        {"levels_mhz": [10**9]},
        {"admit": ["x" * 300]},
        {"daemon_id": "d" * 5000},
        {"measured_clock_mhz": -3},
        {"energy_total_j": 1e300},
        {"offload_tokens": -1},
        {"admission": {"rule": {"beta": 1e300}}},
        {"admission": "all"},
        {"clock": [1410]},
    ],
)
def test_decisions_with_absurd_numbers_are_refused(fields: dict[str, Any]) -> None:
    with pytest.raises(WireFormatError):
        AdmissionDecision.from_json(_decision(**fields))


@pytest.mark.parametrize(
    ("cls", "obj"),
    [
        (AgentStart, {"slo_tok_s": float("nan")}),
        (AgentStart, {"slo_tok_s": -1.0}),
        (AgentStart, {"slo_tok_s": 1e300}),
        (AgentStart, {"pid": -1}),
        (AgentStart, {"name": "n" * 10_000}),
        (AgentEnd, {"exit_code": 10**40}),
        (AgentEnd, {"exit_code": 0, "signal": -9}),
        (InstanceState, {"instance": "i0", "now_s": float("inf")}),
        (InstanceState, {"instance": "i0", "now_s": 1.0, "capacity_tokens": -4}),
        (
            InstanceState,
            {"instance": "i0", "now_s": 1.0, "ongoing": [{"agent_id": "a", "arrival_s": 1e999}]},
        ),
        (
            InstanceState,
            {
                "instance": "i0",
                "now_s": 1.0,
                "ongoing": [{"agent_id": "a", "arrival_s": 1.0, "context_tokens": -10}],
            },
        ),
        (DecisionAck, {"accepted": True, "clock_cap_mhz": -1}),
    ],
)
def test_other_messages_are_bounded_too(cls: Any, obj: dict[str, Any]) -> None:
    with pytest.raises(WireFormatError):
        cls.from_json(obj)


def test_python_json_nan_literals_are_refused() -> None:
    """``json.loads`` accepts ``NaN``/``Infinity``; the wire must not."""
    obj = json.loads('{"instance": "i0", "daemon_id": "d", "epoch": 1, '
                     '"daemon_start_unix_s": Infinity}')  # fmt: skip
    with pytest.raises(WireFormatError, match="daemon_start_unix_s"):
        AdmissionDecision.from_json({**_decision(), **obj})

"""``scripts/split_trace.py``: disjoint folds of whole sessions, the same everywhere."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from scripts.split_trace import main, split_lines
from simulator.errors import WorkloadError
from simulator.workload_trace import load_trace

TURN = {
    "at_s": 0.0,
    "prompt_tokens": 900,
    "shared_prefix_tokens": 0,
    "output_tokens": 40,
    "think_s": 1.0,
}


def _line(sid: str, parent: str | None = None) -> str:
    return json.dumps(
        {"session_id": sid, "parent": parent, "offset_s": 5.0 if parent else 0.0, "turns": [TURN]}
    )


def _trace(roots: int) -> list[str]:
    """``roots`` sessions; s0 has a sub-agent with a sub-agent of its own."""
    lines = [_line(f"s{i}") for i in range(roots)]
    return [*lines, _line("s0.sub1", "s0"), _line("s0.sub1.sub1", "s0.sub1")]


def _ids(fold: list[str]) -> set[str]:
    return {json.loads(line)["session_id"] for line in fold}


def test_folds_are_disjoint_balanced_and_cover_the_trace() -> None:
    lines = _trace(9)
    folds = split_lines(lines, 3)
    ids = [_ids(f) for f in folds]
    assert set().union(*ids) == _ids(lines)
    assert sum(len(i) for i in ids) == len(lines)  # no session in two folds
    roots = [{s for s in i if "." not in s} for i in ids]
    assert sorted(len(r) for r in roots) == [3, 3, 3]
    home = next(i for i in ids if "s0" in i)
    assert {"s0.sub1", "s0.sub1.sub1"} <= home  # sub-agents at any depth follow their root


def test_assignment_does_not_depend_on_line_order() -> None:
    lines = _trace(12)
    shuffled = lines[:]
    random.Random(7).shuffle(shuffled)
    assert [_ids(f) for f in split_lines(lines, 2)] == [_ids(f) for f in split_lines(shuffled, 2)]


@pytest.mark.parametrize(
    ("lines", "folds", "match"),
    [
        (_trace(4), 1, "at least 2"),
        (_trace(2), 3, "cannot fill"),
        ([_line("a"), _line("a")], 2, "duplicate"),
        ([_line("a"), _line("c"), _line("b", "ghost")], 2, "parent chain"),
        ([_line("a", "b"), _line("b", "a"), _line("c"), _line("d")], 2, "parent chain"),
        (["{not json"], 2, "line 1"),
    ],
)
def test_bad_traces_are_refused_with_the_reason(lines: list[str], folds: int, match: str) -> None:
    with pytest.raises(WorkloadError, match=match):
        split_lines(lines, folds)


def test_written_folds_load_in_the_simulator(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text("\n".join(_trace(6)) + "\n\n", encoding="utf-8")
    assert main([str(trace), "--folds", "2", "--out", str(tmp_path / "out")]) == 0
    paths = sorted((tmp_path / "out").glob("t-fold*of2.jsonl"))
    assert [p.name for p in paths] == ["t-fold1of2.jsonl", "t-fold2of2.jsonl"]
    assert sum(len(load_trace(p)) for p in paths) == 6
    report = capsys.readouterr().out
    assert "3 sessions, 2 sub-agents" in report and "3 sessions, 0 sub-agents" in report


def test_a_bad_trace_exits_2_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text(_line("a") + "\n", encoding="utf-8")
    assert main([str(trace), "--out", str(tmp_path / "out")]) == 2
    assert "cannot fill" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()

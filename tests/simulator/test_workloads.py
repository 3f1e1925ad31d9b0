"""Workloads: the synthetic paper workload matches its targets, the trace loader
reads the shared format, arrivals are seeded."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from simulator.arrivals import poisson_arrivals, replay_arrivals
from simulator.errors import WorkloadError
from simulator.workload_paper import PaperWorkload, PaperWorkloadParams, workload_stats
from simulator.workload_trace import TraceWorkload, load_trace
from tests.simulator.conftest import DATA

SAMPLE = DATA / "claude-code-sample.jsonl"


def test_paper_workload_statistics_match_targets() -> None:
    s = workload_stats(PaperWorkload(seed=11), 2000)
    assert 32.0 <= s.mean_turns <= 42.0  # ≈ 37
    assert 14 <= s.p25_turns <= 21  # 18 (§A.4)
    assert s.max_turns >= 300  # heavy tail towards thousands
    assert 2500 <= s.mean_initial_prompt <= 5000  # a few thousand
    assert 8_000 <= s.median_max_context <= 40_000  # tens of thousands
    assert s.max_max_context >= 100_000  # tail to hundreds of thousands
    assert 1.0 <= s.mean_tool_s <= 5.0  # seconds


def test_paper_workload_is_deterministic_and_grows_contexts() -> None:
    a, b = PaperWorkload(3).program(5), PaperWorkload(3).program(5)
    assert a == b
    assert PaperWorkload(4).program(5) != a
    for prev, turn in zip(a.turns, a.turns[1:], strict=False):
        assert turn.shared_prefix_tokens == prev.prompt_tokens + prev.output_tokens
        assert turn.prompt_tokens > turn.shared_prefix_tokens
    assert a.turns[0].shared_prefix_tokens == 0
    assert all(t.prompt_tokens + t.output_tokens <= 262_144 for t in a.turns)


def test_paper_params_validated() -> None:
    with pytest.raises(WorkloadError):
        PaperWorkloadParams(p_runaway=1.5)


def test_trace_loader_sessions_subagents_and_think_cap() -> None:
    roots = load_trace(SAMPLE, think_cap_s=60.0)
    by_id = {p.agent_id: p for p in roots}
    parent = by_id["trace_0295"]
    assert len(parent.children) == 8
    assert all(c.parent_id == "trace_0295" and c.offset_s > 0 for c in parent.children)
    assert max(t.think_s for p in roots for t in p.turns) <= 60.0
    raw = json.loads(SAMPLE.read_text().splitlines()[0])
    assert parent.turns[1].prompt_tokens == raw["turns"][1]["prompt_tokens"]
    assert parent.turns[1].shared_prefix_tokens == raw["turns"][1]["shared_prefix_tokens"]


def test_trace_workload_cycles_with_fresh_ids() -> None:
    w = TraceWorkload.from_file(SAMPLE, seed=1)
    n = len(w.programs)
    ids = {w.program(i).agent_id for i in range(2 * n)}
    assert len(ids) == 2 * n
    assert w.program(0).agent_id.split("#")[0] == w.program(n).agent_id.split("#")[0]


def test_trace_errors_name_file_and_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"session_id": "a", "parent": null, "turns": []}\n')
    with pytest.raises(WorkloadError, match=r"bad\.jsonl:1"):
        load_trace(bad)
    bad.write_text(
        '{"session_id": "a", "parent": "zz", "turns": [{"prompt_tokens": 1, '
        '"shared_prefix_tokens": 0, "output_tokens": 1, "think_s": 0}]}\n'
    )
    # A recording that rotated between a sub-session and its parent: the orphan
    # runs as a top-level session instead of the whole file being refused.
    (orphan,) = load_trace(bad)
    assert orphan.agent_id == "a"
    assert orphan.parent_id == "zz"


def test_poisson_arrivals_seeded_and_rate() -> None:
    a = poisson_arrivals(0.08, 36_000, seed=5)
    assert a == poisson_arrivals(0.08, 36_000, seed=5)
    assert a != poisson_arrivals(0.08, 36_000, seed=6)
    assert 0.07 <= len(a) / 36_000 <= 0.09
    assert all(x < y for x, y in itertools.pairwise(a))


def test_replay_arrivals(tmp_path: Path) -> None:
    f = tmp_path / "arr.txt"
    f.write_text("# t\n100\n105.5\n130\n")
    assert replay_arrivals(f) == [0.0, 5.5, 30.0]
    assert replay_arrivals(f, duration_s=10.0) == [0.0, 5.5]
    f.write_text("[3, 1]")
    assert replay_arrivals(f) == [0.0, 2.0]
    f.write_text("x\n")
    with pytest.raises(WorkloadError):
        replay_arrivals(f)

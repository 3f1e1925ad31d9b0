"""Replaying a recording (simulator/workload_recorded.py, whatif/replay.py,
whatif/compare.py, ``kairos whatif``): a run the simulator itself produced is
predicted exactly; policies run on the recorded arrivals; bad input is clear."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kairos_cli.main import build_app
from reporting.agent_trace import TraceSession, TraceTurn
from simulator.errors import WorkloadError
from simulator.preset_file import dump_preset_file, load_preset_file
from simulator.presets import Preset
from simulator.workload_recorded import load_recording
from tests.whatif.test_fit import cpu_like_preset
from whatif.compare import compare
from whatif.recorded import load_measured
from whatif.replay import simulate_calls

PROGRAMS = {  # name: (arrival s, [(prompt, shared, output, think)])
    "a": (0.0, [(3000, 0, 60, 0.0), (3300, 3060, 40, 1.5), (3600, 3340, 80, 0.7)]),
    "b": (2.0, [(1500, 0, 120, 0.0), (1900, 1620, 30, 2.0)]),
    "c": (2.5, [(6000, 0, 50, 0.0), (6400, 6050, 90, 0.3), (6800, 6490, 20, 1.0)]),
}


def _write(path: Path, latencies: dict[tuple[str, int], tuple[float, float, float]]) -> Path:
    """A recording of :data:`PROGRAMS`; per call ``(at_s, latency_s, ttft_s)``."""
    lines = []
    for name, (arrival, turns) in PROGRAMS.items():
        calls = []
        for k, (prompt, shared, out, think) in enumerate(turns):
            at, latency, ttft = latencies.get((name, k), (10.0 * k, 1.0, 0.1))
            calls.append(TraceTurn(at, prompt, shared, out, think, latency, 0.0, ttft_s=ttft))
        session = TraceSession(name, None, 0.0, 1e9 + arrival, tuple(calls), name=name)
        lines.append(session.to_json_line())
    path.write_text("\n".join(lines) + "\n")
    return path


def _preset_file(tmp_path: Path) -> Path:
    path = tmp_path / "engine.toml"
    text = dump_preset_file(cpu_like_preset(), base="h100-nvl-qwen3-30b", fitted_on={}, fit={})
    path.write_text(text)
    return path


def _self_recorded(tmp_path: Path, preset: Preset) -> Path:
    """What the simulator itself does with the programs, written as a recording."""
    draft = _write(tmp_path / "draft.jsonl", {})
    sim = simulate_calls(draft, preset)
    arrivals = {name: a for name, (a, _) in PROGRAMS.items()}
    latencies = {}
    for (name, k), call in sim.calls.items():
        release = arrivals[name] + sum(
            sim.calls[(name, j)].latency_s + PROGRAMS[name][1][j + 1][3] for j in range(k)
        )
        latencies[(name, k)] = (release - arrivals[name], call.latency_s, call.ttft_s)
    return _write(tmp_path / "run.jsonl", latencies)


def test_a_run_the_simulator_made_is_predicted_exactly(tmp_path: Path) -> None:
    preset = load_preset_file(_preset_file(tmp_path))
    run = _self_recorded(tmp_path, preset)
    (tmp_path / "run.counters.json").write_text(
        json.dumps({"preemptions": 0, "prefix_cache_hits_tokens": 20224})
    )
    measured = [load_measured(run, tmp_path / "run.counters.json")] * 2
    figures = compare(measured, preset).figures()
    # (times are written to the microsecond: the errors are that rounding)
    assert figures["agents"] == 3 and figures["repeats"] == 2
    assert figures["llm_time_median_abs_error"] == pytest.approx(0.0, abs=1e-4)
    assert figures["completion_p90_abs_error"] == pytest.approx(0.0, abs=1e-4)
    assert figures["call_latency_p90_abs_error"] == pytest.approx(0.0, abs=1e-4)
    assert figures["ttft_error"] == pytest.approx(0.0, abs=1e-4)
    assert figures["noise_p90_abs"] == 0.0
    # Whole blocks of what each later turn shares with its cached context (128-token
    # blocks; the previous reply's last token is never cached): a 2944 + 3328, b 1536,
    # c 6016 + 6400.
    assert figures["prefix_hits_simulated"] == 20224 and figures["prefix_hits_error"] == 0.0


def test_a_recording_replays_at_its_arrivals_in_arrival_order(tmp_path: Path) -> None:
    recording = load_recording([_write(tmp_path / "r.jsonl", {})])
    assert [p.agent_id for p in recording.programs] == ["a", "b", "c"]
    assert recording.arrivals_s == (0.0, 2.0, 2.5)
    assert recording.programs[0].turns[1].shared_prefix_tokens == 3060


def test_a_trace_without_start_times_is_not_a_recording(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(
        '{"session_id": "s", "parent": null, "turns": [{"prompt_tokens": 10, '
        '"shared_prefix_tokens": 0, "output_tokens": 2, "think_s": 0}]}\n'
    )
    with pytest.raises(WorkloadError, match="start_unix_s"):
        load_recording([path])


def test_kairos_whatif_prints_every_policy_and_the_oracle(tmp_path: Path) -> None:
    trace = _write(tmp_path / "r.jsonl", {})
    preset = _preset_file(tmp_path)
    out = tmp_path / "out"
    result = CliRunner().invoke(
        build_app(),
        ["whatif", "--trace", str(trace), "--preset", str(preset), "--policies",
         "no-control,kairos,fixed:900", "--oracle-window-s", "30", "--out", str(out),
         "--processes", "1"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    for policy in ("no-control", "kairos", "fixed:900", "oracle"):
        assert policy in result.output
    assert (out / "policies.png").is_file()
    compared = CliRunner().invoke(
        build_app(),
        ["whatif", "--trace", str(trace), "--preset", str(preset), "--compare", "--json",
         "--out", str(out)],
    )  # fmt: skip
    assert compared.exit_code == 0, compared.output
    assert json.loads(compared.output)["agents"] == 3
    assert (out / "compare.png").is_file()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--policies", "fixed:5"], "fixed:5"),
        (["--policies", "kairos,kairos"], "twice"),
        (["--slo", "-1"], "--slo"),
        (["--preset", "no-such-preset"], "preset"),
    ],
)
def test_kairos_whatif_bad_input_is_one_line_and_exit_2(
    tmp_path: Path, args: list[str], message: str
) -> None:
    trace = _write(tmp_path / "r.jsonl", {})
    base = ["whatif", "--trace", str(trace), "--preset", str(_preset_file(tmp_path))]
    result = CliRunner().invoke(build_app(), [*base, *args])
    assert result.exit_code == 2
    assert message in result.output

"""``kairos sim`` as a user runs it: JSON contract, compare, records, plots, errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kairos_cli.main import build_app
from reporting.metrics import SPEC_JSON_KEYS
from simulator.cli import summary_table
from simulator.presets import control_levels, get_preset, with_num_levels
from simulator.runner import SimSpec, run_sim
from tests.simulator.conftest import DATA

SPEC_KEYS = SPEC_JSON_KEYS


def test_compare_json_list_with_spec_keys_records_and_plots(tmp_path: Path) -> None:
    out = tmp_path / "o"
    res = CliRunner().invoke(
        build_app(),
        [
            "sim", "--compare", "no-control,fixed:810,kairos", "--duration-s", "900",
            "--rate", "0.08", "--seed", "3", "--out", str(out), "--processes", "1", "--json",
        ],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    objs = json.loads(res.stdout)
    assert [o["policy"] for o in objs] == ["no-control", "fixed:810", "kairos"]
    for o in objs:
        assert set(o) >= SPEC_KEYS
    assert objs[1]["avg_power_w"] < objs[0]["avg_power_w"]
    names = {p.name for p in out.iterdir()}
    assert {"no-control.jsonl", "fixed-810.jsonl", "kairos.jsonl", "compare.png"} <= names
    assert (out / "kairos.png").stat().st_size > 10_000


def test_single_policy_table_on_trace_sample(tmp_path: Path) -> None:
    res = CliRunner().invoke(
        build_app(),
        [
            "sim", "--workload", f"trace:{DATA / 'claude-code-sample.jsonl'}",
            "--policy", "kairos", "--rate", "0.005", "--duration-s", "600",
            "--out", str(tmp_path), "--no-plots",
        ],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "policy" in res.stdout and "kairos" in res.stdout
    assert (tmp_path / "kairos.jsonl").exists()


def test_table_shows_attainment_over_finished_and_over_all_sessions() -> None:
    """``SLO %`` judges finished sessions (Eq. 4); ``all %`` every arrival, the
    unfinished by their Eq. 3 so far: in 60 s of the paper workload nothing has
    finished, so only the second has a value."""
    result = run_sim(SimSpec(policy="kairos", rate_per_s=0.5, duration_s=60.0))
    header, _rule, row, *_ = summary_table([result]).splitlines()

    def column(name: str) -> str:  # right-aligned: a value ends where its name ends
        end = header.index(name) + len(name)
        return row[end - 6 : end].strip()

    assert column("SLO %") == "-"
    all_pct = result.summary.slo_attainment_all
    assert all_pct is not None and column("all %") == f"{all_pct * 100.0:.1f}"


def test_single_policy_json_is_an_object(tmp_path: Path) -> None:
    res = CliRunner().invoke(
        build_app(),
        ["sim", "--policy", "no-control", "--duration-s", "300", "--out", str(tmp_path),
         "--no-plots", "--json"],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    obj = json.loads(res.stdout)
    assert obj["policy"] == "no-control"
    assert obj["arrival_offset_s"] == 0.0  # the run's spec, to reproduce it
    assert obj["num_levels"] == 8  # the preset's


def test_num_levels_sets_the_adaptive_policies_levels(tmp_path: Path) -> None:
    """``--num-levels 11`` gives ``kairos`` 11 clocks to choose from (885 MHz among
    them, which the default 8 levels lack); a fixed clock stays where it is."""
    res = CliRunner().invoke(
        build_app(),
        ["sim", "--compare", "kairos,fixed:900", "--num-levels", "11", "--rate", "0.08",
         "--duration-s", "900", "--out", str(tmp_path), "--no-plots", "--json"],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    kairos, fixed = json.loads(res.stdout)
    assert kairos["num_levels"] == 11
    levels = control_levels(with_num_levels(get_preset(), 11), "kairos").clocks_mhz
    assert len(levels) == 11 and 885 in levels
    assert set(map(int, kairos["time_at_clock_s"])) <= set(levels)
    assert set(fixed["time_at_clock_s"]) == {"900"}


def test_kv_offload_gives_the_engines_a_cpu_tier(tmp_path: Path) -> None:
    """``--kv-offload-gib 64`` is vLLM's ``--kv-offloading-size 64``: every instance
    gets a host tier of 64 GiB / 96 KiB per token, and the JSON says so."""
    res = CliRunner().invoke(
        build_app(),
        ["sim", "--workload", f"trace:{DATA / 'claude-code-sample.jsonl'}", "--policy",
         "kairos", "--kv-offload-gib", "64", "--rate", "0.05", "--duration-s", "600",
         "--out", str(tmp_path), "--no-plots", "--json"],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["policy"] == "kairos"
    assert out["kv_offload_tokens"] == 64 * 2**30 // get_preset().timing.kv_bytes_per_token
    assert isinstance(out["loaded_tokens"], int)  # the tier's loads are reported
    # requests vLLM would refuse, or cut at the model's length (docs/simulator.md)
    assert isinstance(out["rejected_requests"], int) and isinstance(out["truncated_requests"], int)


def test_no_reserve_full_isl_models_first_chunk_admission(tmp_path: Path) -> None:
    """``--no-reserve-full-isl`` is ``vllm serve --no-scheduler-reserve-full-isl``:
    prompts admitted on their first chunk into a full cache are preempted mid-prefill,
    which vLLM's default gate (on unless told otherwise) keeps queued instead."""

    def run(*flag: str) -> dict[str, object]:
        res = CliRunner().invoke(
            build_app(),
            ["sim", "--workload", f"trace:{DATA / 'claude-code-sample.jsonl'}", "--policy",
             "no-control", *flag, "--rate", "0.05", "--duration-s", "1800",
             "--out", str(tmp_path), "--no-plots", "--json"],
        )  # fmt: skip
        assert res.exit_code == 0, res.output
        return dict(json.loads(res.stdout))

    gated, first_chunk = run(), run("--no-reserve-full-isl")
    assert gated["reserve_full_isl"] is True and first_chunk["reserve_full_isl"] is False
    assert first_chunk["preemptions"] > gated["preemptions"]


def test_bad_input_is_a_clear_error(tmp_path: Path) -> None:
    app = build_app()
    for args, needle in (
        (["--policy", "warp-speed"], "unknown policy"),
        (["--workload", "bogus"], "unknown workload"),
        (["--placement", "random"], "unknown placement"),
        (["--rate", "-1"], "--rate"),
        (["--client-patience-s", "-5"], "--client-patience-s"),
        (["--client-patience-s", "nan"], "--client-patience-s"),
        (["--arrival-offset-s", "-1"], "--arrival-offset-s"),
        (["--arrival-offset-s", "60"], "--arrival-offset-s"),  # not under --duration-s
        (["--arrival-offset-s", "inf"], "--arrival-offset-s"),
        (["--num-levels", "1"], "--num-levels"),
        (["--num-levels", "100000"], "--num-levels"),  # more than the preset's clocks
        (["--kv-offload-gib", "-1"], "--kv-offload-gib"),
        (["--kv-offload-gib", "nan"], "--kv-offload-gib"),
        (["--workload", f"trace:{tmp_path / 'missing.jsonl'}"], "cannot read trace"),
    ):
        res = CliRunner().invoke(
            app, ["sim", *args, "--duration-s", "60", "--out", str(tmp_path), "--no-plots"]
        )
        assert res.exit_code == 2, (args, res.output)
        assert needle in res.output, (args, res.output)


def test_config_file_and_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "sim.toml"
    cfg.write_text('policy = "fixed:900"\nduration_s = 120.0\nplots = false\n')
    monkeypatch.setenv("KAIROS_SIM_SEED", "5")
    res = CliRunner().invoke(
        build_app(), ["sim", "--config", str(cfg), "--out", str(tmp_path), "--json"]
    )
    assert res.exit_code == 0, res.output
    obj = json.loads(res.stdout)
    assert obj["policy"] == "fixed:900" and obj["seed"] == 5 and obj["duration_s"] == 120.0

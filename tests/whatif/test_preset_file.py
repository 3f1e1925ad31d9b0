"""Preset files: what kairos calibrate writes, kairos sim and kairos whatif read back."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from simulator.errors import PresetError
from simulator.preset_file import dump_preset_file, load_preset_file, resolve_preset
from simulator.presets import get_preset
from tests.whatif.test_fit import cpu_like_preset


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "p.toml"
    path.write_text(text)
    return path


def _fitted_text() -> str:
    preset = dataclasses.replace(cpu_like_preset(), name="fitted-x", description="a test engine")
    return dump_preset_file(
        preset,
        base="h100-nvl-qwen3-30b",
        fitted_on={"model": "tiny-llama", "engine": "vllm 0.32.0", "power": "base preset's"},
        fit={"all_median_abs_rel_error": 0.02},
    )


def test_a_written_preset_reads_back_as_the_same_preset(tmp_path: Path) -> None:
    path = _write(tmp_path, _fitted_text())
    loaded = load_preset_file(path)
    original = cpu_like_preset()
    assert loaded.timing == original.timing
    assert loaded.engine == original.engine
    assert loaded.power == original.power == get_preset().power  # kept from the base
    assert loaded.gpu == original.gpu
    assert loaded.name == "fitted-x"
    assert loaded.energy_weights is None  # derived from the fitted timing
    assert resolve_preset(str(path)).timing == original.timing
    assert resolve_preset("h100-nvl-qwen3-30b") == get_preset()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda t: t.replace('format = "kairos-preset"', 'format = "other"'), "format"),
        (lambda t: t.replace("version = 1", "version = 9"), "version 9"),
        (lambda t: t + "\n[extra]\nx = 1\n", "unknown section"),
        (lambda t: t.replace("[timing]\n", "[timing]\nwarp_s = 1.0\n"), "unknown key 'warp_s'"),
        (lambda t: t.replace("[timing]\n", "[timing]\nh2d_bytes_s = nan\n"), "finite"),
        (lambda t: t.replace("[timing]\n", "[timing]\nmem_slope_above_knee = -1.0\n"), "outside"),
        (lambda t: t.replace("[engine]\n", "[engine]\nkv_offload_tokens = 1.5\n"), "whole number"),
        (lambda t: t.replace("[engine]\n", 'block_size = "128"\n[engine]\n'), "unknown"),
        (lambda t: t.replace('base = "h100-nvl-qwen3-30b"', 'base = "a100"'), "base"),
        (lambda t: t.replace('name = "fitted-x"', 'name = ""'), "name"),
        (lambda t: t.replace("[engine]\n", "[engine]\nreserve_full_isl = 1\n"), "true or false"),
    ],
)
def test_a_bad_preset_file_is_one_clear_error(tmp_path: Path, change: object, message: str) -> None:
    text = change(_fitted_text())  # type: ignore[operator]
    with pytest.raises(PresetError, match=message) as info:
        load_preset_file(_write(tmp_path, text))
    assert "p.toml" in str(info.value)


def test_unreadable_and_non_toml_files(tmp_path: Path) -> None:
    with pytest.raises(PresetError, match="cannot read"):
        load_preset_file(tmp_path / "missing.toml")
    with pytest.raises(PresetError, match="not TOML"):
        load_preset_file(_write(tmp_path, "[[[ nope"))


def test_kairos_sim_runs_on_a_preset_file(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from kairos_cli.main import build_app

    path = _write(tmp_path, _fitted_text())
    result = CliRunner().invoke(
        build_app(),
        ["sim", "--preset", str(path), "--duration-s", "300", "--rate", "0.05", "--json",
         "--no-plots", "--out", str(tmp_path / "out")],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output)
    assert summary["preset"] == "fitted-x"
    assert summary["capacity_tokens"] == 131_072

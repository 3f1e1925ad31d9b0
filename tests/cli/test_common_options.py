"""The options and behaviour the four programs share (kairos_common.cli)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import typer

from kairos_common.cli import make_app, run_app, version
from kairosd.config import load_daemon_config
from tests.deploy.cli_check import PROGRAMS, command_for, parse

BIN = Path(sys.executable).parent


def test_every_program_prints_the_same_version() -> None:
    """The installed console scripts, as a user runs them."""
    outputs = {
        p: subprocess.run(
            [str(BIN / p), "--version"], capture_output=True, text=True, timeout=60, check=True
        ).stdout.strip()
        for p in PROGRAMS
    }
    assert outputs == {p: f"{p} {version()}" for p in PROGRAMS}
    assert version() != "0+unknown"  # the package is installed, so its metadata is found


def _paths(program: str) -> list[list[str]]:
    cmd = command_for(program)
    names = sorted(getattr(cmd, "commands", {}) or [])
    return [[n] for n in names] or [[]]


@pytest.mark.parametrize("program", PROGRAMS)
def test_dash_h_and_long_help_on_every_command(program: str) -> None:
    for sub in [[], *_paths(program)]:
        for flag in ("-h", "--help"):
            with pytest.raises(Exception) as info:
                parse(program, [*sub, flag])
            assert type(info.value).__name__ == "Exit" and info.value.exit_code == 0  # type: ignore[attr-defined]


@pytest.mark.parametrize("program", PROGRAMS)
def test_log_format_flags_are_spelled_alike(program: str) -> None:
    """Every long-running command takes --log-json/--log-text and --log-level."""
    runs = {"kairosd": ["run"], "kairos-router": ["run"], "id-tracker": [], "kairos": ["fake-vllm"]}
    sub = runs[program]
    cmd = command_for(program)
    target = cmd.commands[sub[0]] if sub else cmd  # type: ignore[attr-defined]
    opts = {o for p in target.params for o in (*p.opts, *p.secondary_opts)}
    assert {"--log-json", "--log-text", "--log-level"} <= opts, opts


def test_an_unexpected_error_is_one_line_and_the_traceback_needs_debug(
    capsys: pytest.CaptureFixture[str],
) -> None:
    app = make_app()

    @app.command()
    def boom(log_level: str = "info") -> None:
        raise RuntimeError("disk on fire")

    with pytest.raises(SystemExit) as info:
        run_app(app, "prog", [])
    err = capsys.readouterr().err
    assert info.value.code == 1
    assert err.strip().splitlines() == [
        "prog: unexpected error: RuntimeError: disk on fire "
        "(rerun with --log-level debug for the traceback)"
    ]
    with pytest.raises(SystemExit):
        run_app(app, "prog", ["--log-level", "debug"])
    assert "Traceback" in capsys.readouterr().err


def test_typer_exit_codes_pass_through(capsys: pytest.CaptureFixture[str]) -> None:
    app = make_app()

    @app.command()
    def stop() -> None:
        raise typer.Exit(4)

    with pytest.raises(SystemExit) as info:
        run_app(app, "prog", [])
    assert info.value.code == 4


@pytest.mark.parametrize(("epoch_s", "timeout_s"), [(1.0, 0.2), (0.5, 0.1), (5.0, 1.0), (60, 1.0)])
def test_kairosd_timeouts_follow_a_short_epoch(epoch_s: float, timeout_s: float) -> None:
    cfg = load_daemon_config(
        None, env={}, overrides={"instance": "i0", "vllm_url": "http://x:1", "epoch_s": epoch_s}
    )
    assert cfg.http_timeout_s == pytest.approx(timeout_s)
    assert cfg.gpu_timeout_s == pytest.approx(timeout_s)


def test_kairosd_explicit_timeouts_are_kept() -> None:
    cfg = load_daemon_config(
        None,
        env={},
        overrides={"instance": "i", "vllm_url": "http://x:1", "epoch_s": 1, "http_timeout_s": 0.5},
    )
    assert cfg.http_timeout_s == 0.5 and cfg.gpu_timeout_s == pytest.approx(0.2)

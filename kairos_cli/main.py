"""``kairos`` command line: ``kairos sim``, ``kairos report`` and friends.

Each subcommand lives with the package it belongs to and registers itself here,
so this module stays a thin index. Errors go through the shared path
(:func:`kairos_common.cli.run_app`): one line, exit 2 for bad input.
"""

from __future__ import annotations

import typer

from kairos_common.cli import VersionOpt, make_app, run_app
from reporting.cli import register as register_report
from simulator.cli import register as register_sim
from simulator.fakevllm_cli import register as register_fake_vllm
from whatif.calibrate_cli import register as register_calibrate
from whatif.cli import register as register_whatif

PROG = "kairos"


def build_app() -> typer.Typer:
    app = make_app(
        "Kairos tools: simulate policies, summarise power reports, run a fake vLLM, "
        "fit an engine and replay a recorded fleet on it.",
        no_args_is_help=True,
    )

    @app.callback()
    def _root(version: VersionOpt = False) -> None:
        """Kairos tools: simulate, report, run a fake vLLM, calibrate an engine, what-if."""

    register_sim(app)
    register_report(app)
    register_fake_vllm(app)
    register_calibrate(app)
    register_whatif(app)
    return app


def main(argv: list[str] | None = None) -> None:
    """Entry point ``kairos``."""
    run_app(build_app(), PROG, argv)

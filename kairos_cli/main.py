"""``kairos`` command line: ``kairos sim``, ``kairos report`` and friends.

Each subcommand lives with the package it belongs to and registers itself here,
so this module stays a thin index.
"""

from __future__ import annotations

import typer

from reporting.cli import register as register_report
from simulator.cli import register as register_sim
from simulator.fakevllm_cli import register as register_fake_vllm


def build_app() -> typer.Typer:
    app = typer.Typer(
        help="Kairos tools: simulate policies, summarise power reports, run a fake vLLM.",
        no_args_is_help=True,
    )
    register_sim(app)
    register_report(app)
    register_fake_vllm(app)
    return app


def main() -> None:
    build_app()()

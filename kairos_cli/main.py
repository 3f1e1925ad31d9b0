"""``kairos`` command line: ``kairos sim``, ``kairos report`` and friends."""

from __future__ import annotations

import typer

app = typer.Typer(help="Kairos tools: simulate, report, fake vLLM.", no_args_is_help=True)


@app.command()
def sim() -> None:
    """Simulate agents on vLLM instances under a power policy."""
    typer.echo("kairos sim: not implemented yet", err=True)
    raise typer.Exit(2)


@app.command()
def report() -> None:
    """Summarise daemon / router / simulator JSONL records."""
    typer.echo("kairos report: not implemented yet", err=True)
    raise typer.Exit(2)


def main() -> None:
    app()

"""``kairos-router`` command line (typer)."""

from __future__ import annotations

import typer

app = typer.Typer(help="Kairos agent-aware OpenAI-compatible router.", no_args_is_help=True)


@app.command()
def run() -> None:
    """Start the router in front of vLLM instances."""
    typer.echo("kairos-router run: not implemented yet", err=True)
    raise typer.Exit(2)


def main() -> None:
    app()

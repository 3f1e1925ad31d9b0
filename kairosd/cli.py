"""``kairosd`` command line (typer)."""

from __future__ import annotations

import typer

app = typer.Typer(help="Kairos per-instance power daemon.", no_args_is_help=True)


@app.command()
def run() -> None:
    """Run the control loop for one serving instance."""
    typer.echo("kairosd run: not implemented yet", err=True)
    raise typer.Exit(2)


def main() -> None:
    app()

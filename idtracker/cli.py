"""``id-tracker`` command line."""

from __future__ import annotations

import typer

app = typer.Typer(help="Launch an agent under a Kairos identity: id-tracker -- CMD ARGS…")


@app.command()
def launch() -> None:
    """Launch CMD under a new agent identity."""
    typer.echo("id-tracker: not implemented yet", err=True)
    raise typer.Exit(2)


def main() -> None:
    app()

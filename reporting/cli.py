"""``kairos report``."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    @app.command()
    def report() -> None:
        """Summarise daemon / router / simulator JSONL records."""
        typer.echo("kairos report: not implemented yet", err=True)
        raise typer.Exit(2)

"""``kairos sim`` (and later ``kairos fake-vllm``)."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    @app.command()
    def sim() -> None:
        """Simulate agents on vLLM instances under a power policy."""
        typer.echo("kairos sim: not implemented yet", err=True)
        raise typer.Exit(2)

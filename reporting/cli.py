"""``kairos report PATHS… [--json] [--plots DIR] [--slo TOK_S]``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from reporting.records import RecordError
from reporting.report import build_reports, group_records, load, render_table


def register(app: typer.Typer) -> None:
    @app.command()
    def report(
        paths: Annotated[
            list[Path],
            typer.Argument(
                help="JSONL files: kairosd power reports, router agent records, simulator "
                "output (any mix; grouped by run and policy).",
                show_default=False,
            ),
        ],
        as_json: Annotated[
            bool,
            typer.Option(
                "--json",
                help="Print one JSON object per policy (a list when several) instead of a table.",
            ),
        ] = False,
        plots: Annotated[
            Path | None,
            typer.Option(
                "--plots",
                help="Write PNG plots of power / clock / context over time into this directory.",
            ),
        ] = None,
        slo: Annotated[
            float | None,
            typer.Option(
                "--slo",
                help="Per-agent SLO in decode tokens/s for SLO attainment (Eq. 4). Default: "
                "the run's recorded SLO, else 20.",
            ),
        ] = None,
    ) -> None:
        """Summarise daemon / router / simulator records into the paper's metrics."""
        try:
            records = load(paths)
        except (RecordError, OSError) as exc:
            typer.echo(f"kairos report: {exc}", err=True)
            raise typer.Exit(2) from None
        if not records:
            typer.echo("kairos report: no records in the given files", err=True)
            raise typer.Exit(2)
        reports = build_reports(records, slo)
        if as_json:
            objs = [r.to_json() for r in reports]
            typer.echo(json.dumps(objs[0] if len(objs) == 1 else objs, indent=2))
        else:
            typer.echo(render_table(reports), nl=False)
        if plots is not None:
            from reporting.plots import write_plots

            for path in write_plots(group_records(records), plots):
                typer.echo(f"wrote {path}", err=True)

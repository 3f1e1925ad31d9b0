"""``kairos report PATHS… [--json] [--plots DIR] [--slo TOK_S]``.

Bad input — an unreadable or binary file, a malformed line, a ``--plots`` path
that is not a directory, an SLO that is not positive — is one line on stderr
naming the file (``file:line`` for a record) and exit status 2, before anything
is printed (docs/report.md).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from kairos_common.cli import check_slo, fail
from kairos_common.errors import ConfigError
from reporting.energy import energy_json, render_energy
from reporting.records import RecordError
from reporting.report import build_reports, group_records, load, render_table

PROG = "kairos report"


def _expand(paths: list[Path]) -> list[Path]:
    """A directory stands for the ``*.jsonl`` files in it (``kairos report sim-out``)."""
    out: list[Path] = []
    for path in paths:
        if path.is_dir():
            found = sorted(path.glob("*.jsonl"))
            if not found:
                raise ConfigError(f"{path}: a directory with no *.jsonl files")
            out += found
        else:
            out.append(path)
    return out


def _plots_dir(plots: Path | None) -> None:
    """Create ``--plots`` up front, so a bad path fails before any output."""
    if plots is None:
        return
    if plots.exists() and not plots.is_dir():
        raise ConfigError(f"--plots {plots}: exists and is not a directory")
    try:
        plots.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"--plots {plots}: cannot create: {exc.strerror or exc}") from None


def register(app: typer.Typer) -> None:
    @app.command()
    def report(
        paths: Annotated[
            list[Path],
            typer.Argument(
                metavar="PATH",
                help="JSONL files: kairosd power reports, router agent records, simulator "
                "output (any mix; grouped by run and policy). A directory means its *.jsonl.",
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
            check_slo(slo)
            _plots_dir(plots)
            records = load(_expand(paths))
        except (ConfigError, RecordError) as exc:
            fail(PROG, str(exc))
        if not records:
            fail(PROG, "no records in the given files")
        reports = build_reports(records, slo)
        groups = group_records(records)
        if as_json:
            objs = [r.to_json() for r in reports]
            for obj, group in zip(objs, groups, strict=True):
                if any(a.energy_own_j is not None for a in group.agents):
                    obj["agent_energy"] = energy_json(group.agents)
            typer.echo(json.dumps(objs[0] if len(objs) == 1 else objs, indent=2))
        else:
            typer.echo(render_table(reports), nl=False)
            for rep, group in zip(reports, groups, strict=True):
                measured = sum(e.energy_j for e in group.epochs)
                energy = render_energy(group.agents, measured or None)
                if energy:
                    label = f"policy {rep.policy}" + (f"  run {rep.run}" if rep.run else "")
                    typer.echo(f"\n{label}: {energy}", nl=False)
        if plots is not None:
            from reporting.plots import write_plots

            try:
                written = write_plots(groups, plots)
            except OSError as exc:
                fail(PROG, f"--plots {plots}: cannot write: {exc.strerror or exc}")
            for path in written:
                typer.echo(f"wrote {path}", err=True)

"""Item 7: energy per output token next to power, gathered from the other items."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from scripts.results_lib.render import command, fmt, mean, table

Data = dict[str, Any]


def energy_render(_: Data, out: Path, quick: bool, all_data: dict[str, Data]) -> str:
    rows: list[list[str]] = []
    for r in all_data.get("fig7", {}).get("rows", []):
        rows.append(
            _row(
                f"1 instance, {r['rate']:g} jobs/s",
                r,
                r.get("power_saving_pct"),
                r.get("energy_token_saving_pct"),
            )
        )
    for r in all_data.get("fig12", {}).get("rows", []):
        rows.append(_row(f"4 instances, 0.16 jobs/s, {r['placement']}", r, r.get("saving"), None))
    for r in all_data.get("trace", {}).get("rows", []):
        if r["group"] == "single":
            rows.append(
                _row(
                    f"Claude Code trace, {r['rate']:g} sessions/s",
                    r,
                    r.get("saving"),
                    r.get("energy_token_saving"),
                )
            )
    k = [r for r in all_data.get("fig7", {}).get("rows", []) if r["policy"] == "kairos"]
    summary = ""
    if k:
        ps = [mean(r["power_saving_pct"]) for r in k]
        es = [mean(r["energy_token_saving_pct"]) for r in k]
        summary = (
            f"On the synthetic workload KAIROS's energy-per-token saving ({min(es):.1f}–"
            f"{max(es):.1f}%) tracks its power saving ({min(ps):.1f}–{max(ps):.1f}%): it finishes "
            "the same work in the same window, so energy per token falls with average power. A "
            "policy that falls behind the arrivals (fixed clocks below the knee, no thrashing "
            "avoidance near capacity) shows it here first: its energy per token rises while its "
            "power still looks low."
        )
    return "\n\n".join(
        [
            "Energy per output token (total GPU energy / decode tokens) is the metric "
            "energy-focused systems (DynamoLLM, BiScale, throttLL'eM) report; it is a column of "
            "every table above and collected here. Savings are paired by seed against no control.",
            command("energy", quick) + "\n(re-renders from the other items' JSON; no runs)",
            table(
                [
                    "scenario",
                    "policy",
                    "power (W)",
                    "power saving",
                    "energy/token (J)",
                    "J/token saving",
                    "energy/job (kJ)",
                ],
                rows,
            ),
            summary,
        ]
    )


def _row(scenario: str, r: Data, psave: Any, esave: Any) -> list[str]:
    base = r["policy"] == "no-control"
    epj = r.get("energy_per_job_j") or {}
    epj_k = {k: (v / 1e3 if isinstance(v, float) else v) for k, v in epj.items()}
    return [
        scenario,
        r["policy"],
        fmt(r["avg_power_w"]),
        "–" if base or psave is None else fmt(psave, 1, pct=True),
        fmt(r["energy_per_output_token_j"], 3),
        "–" if base or esave is None else fmt(esave, 1, pct=True),
        fmt(epj_k, 1),
    ]

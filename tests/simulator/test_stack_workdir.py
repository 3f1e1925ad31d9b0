"""The CPU stack starts from a clean working directory (reruns of ``make demo``)."""

from __future__ import annotations

from pathlib import Path

from simulator.stack import fresh_workdir


def test_fresh_workdir_drops_earlier_runs_outputs_only(tmp_path: Path) -> None:
    work = tmp_path / "kairos"
    (work / "router-state").mkdir(parents=True)
    (work / "router-state" / "router.sqlite3").write_text("old agents")
    for name in ("agents.jsonl", "kairosd-i0.jsonl", "kairosd-i1.jsonl", "router.log"):
        (work / name).write_text("old run\n")
    (work / "kairos.png").write_bytes(b"plot")
    (work / "notes.txt").write_text("operator's file")

    fresh_workdir(work)

    assert sorted(p.name for p in work.iterdir()) == ["kairos.png", "notes.txt"]


def test_fresh_workdir_creates_a_missing_directory(tmp_path: Path) -> None:
    fresh_workdir(tmp_path / "a" / "b")
    assert (tmp_path / "a" / "b").is_dir()

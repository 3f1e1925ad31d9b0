"""The repository's documents stand alone: docs for users, notes for us.

Reference documents (README.md and docs/ outside docs/notes/) describe the system
as it is: no dated runs, no issue numbers and no path outside the repository (the
specification and the development machine's trace folder are not shipped; what
the code relies on from them is docs/design.md). Dated runs, experiments and
dropped variants live in docs/notes/, and every link or docs/ path a reference
document names exists, so that moving a section cannot leave a reader stranded.
"""

from __future__ import annotations

import re
import tomllib
from importlib.metadata import version
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
NOTES = DOCS / "notes"
README = ROOT / "README.md"
README_MAX_LINES = 150

REFERENCE = [README, *sorted(p for p in DOCS.rglob("*.md") if NOTES not in p.parents)]
"""Every Markdown document a user reads; the notes and the CHANGELOG are history."""

FORBIDDEN = {
    "a date": re.compile(r"20\d\d-\d\d-\d\d"),
    "an issue number": re.compile(r"\bissues?[ -]#?\d+", re.IGNORECASE),
    "a path outside the repository": re.compile(
        r"\.\./shared|/work/shared|\bshared/(?:traces|seeds|bench)"
    ),
    "the specification's file": re.compile(r"SPEC\.md"),
}
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
"""Markdown links and images: ``[text](target)``."""
DOCS_PATH = re.compile(r"(?<![\w/.-])docs/[\w./*<>-]*[\w/*>]")
"""A repository path under docs/ named in prose or code (``docs/notes/x.md``)."""


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


@pytest.mark.parametrize("doc", REFERENCE, ids=_rel)
def test_reference_documents_hold_no_dates_issue_numbers_or_outside_paths(doc: Path) -> None:
    found = [
        f"{_rel(doc)}:{n}: {what}: {m.group(0)!r}"
        for n, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1)
        for what, pattern in FORBIDDEN.items()
        for m in pattern.finditer(line)
    ]
    assert not found, "\n".join(found)


def test_readme_is_short() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) < README_MAX_LINES, f"README.md has {len(lines)} lines"


def _targets(doc: Path) -> list[str]:
    text = doc.read_text(encoding="utf-8")
    links = [t for t in LINK.findall(text) if not re.match(r"[a-z][a-z0-9+.-]*:", t)]
    return [t.split("#", 1)[0] for t in links if not t.startswith("#")]


@pytest.mark.parametrize("doc", REFERENCE, ids=_rel)
def test_every_relative_link_points_at_a_file_in_the_repository(doc: Path) -> None:
    broken = [t for t in _targets(doc) if not (doc.parent / t).resolve().exists()]
    assert not broken, f"{_rel(doc)}: {broken}"


@pytest.mark.parametrize("doc", REFERENCE, ids=_rel)
def test_every_docs_path_a_document_names_exists(doc: Path) -> None:
    """``docs/notes/law-point-10-overflow-relief.md`` in prose is a link too."""
    named = set(DOCS_PATH.findall(doc.read_text(encoding="utf-8")))
    literal = {p for p in named if not re.search(r"[*<>]", p)}  # patterns name no one file
    missing = sorted(p for p in literal if not (ROOT / p).exists())
    assert not missing, f"{_rel(doc)}: {missing}"


def test_the_checks_see_the_documents_they_guard() -> None:
    """The globs find the reference documents and leave the notes out."""
    names = {_rel(p) for p in REFERENCE}
    assert {"README.md", "docs/control-law.md", "docs/design.md"} <= names
    assert not any(n.startswith("docs/notes/") for n in names)
    assert any(NOTES.glob("*.md"))


def test_the_patterns_catch_what_they_forbid() -> None:
    """Each pattern matches the form it exists for, and a plain sentence passes."""
    samples = {
        "a date": "measured 2026-12-04",
        "an issue number": "since issue 58",
        "a path outside the repository": "see ../shared/SPEC.md",
        "the specification's file": "SPEC.md §9",
    }
    for what, sample in samples.items():
        assert FORBIDDEN[what].search(sample), what
    assert not any(
        p.search("issues are tracked elsewhere; see docs/design.md §9") for p in FORBIDDEN.values()
    )


def test_the_changelog_has_a_section_for_the_version_every_program_prints() -> None:
    """``--version`` prints the installed metadata (tests/cli/test_common_options.py);
    it is pyproject's version, and the CHANGELOG says what that version holds."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    declared = pyproject["project"]["version"]
    assert version("kairos-sidecar") == declared, "stale install: run `make venv`"
    changelog = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    assert re.search(rf"^## \[{re.escape(declared)}\] - \d{{4}}-\d\d-\d\d$", changelog, re.M)
    assert changelog.index("## [Unreleased]") < changelog.index(f"## [{declared}]")

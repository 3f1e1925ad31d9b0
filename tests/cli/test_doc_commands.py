"""README and the component docs: every command they show is checked here.

Each Kairos command in a code block or quoted inline is parsed by the real
typer apps (an unknown flag, subcommand or malformed value fails, as it would
on the host); ``--version``/``-h`` lines are run; the scripts and make targets
they name exist; several daemons shown together do not clash on a port or a
GPU; and install lines install from a checkout or a wheel, never from an index
Kairos is not published on. docs/deploy.md has the same checks and more in
tests/deploy/test_docs.py.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.deploy.cli_check import FENCE, INLINE, STARTS, parse, program_call, segments, shell_lines

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
NOT_SHELL = ("toml", "json", "python", "yaml", "ini")
SYNOPSIS = re.compile(r"\[|…|\.\.\.|^[A-Z_]+$")
DIAGRAM = re.compile(r"[─│▶┌└]")


def _blocks(doc: Path) -> list[str]:
    return [body for tag, body in FENCE.findall(doc.read_text()) if tag not in NOT_SHELL]


def _commands(block: str) -> list[str]:
    """The command lines of a block: only the ``$ `` lines when it shows a session
    (the rest is output); never diagram lines."""
    lines = [ln.strip() for ln in shell_lines(block)]
    if any(ln.startswith("$ ") for ln in lines):
        lines = [ln[2:] for ln in lines if ln.startswith("$ ")]
    return [ln for ln in lines if not DIAGRAM.search(ln)]


def _lines(doc: Path) -> list[str]:
    return [ln for block in _blocks(doc) for ln in _commands(block)]


def _calls(doc: Path) -> list[tuple[str, str, str, list[str]]]:
    """(doc, line, program, args) for every Kairos program run in a code block."""
    found = []
    for line in _lines(doc):
        try:
            words_list = segments(line)
        except ValueError:  # not shell (a diagram, a table)
            continue
        for words in words_list:
            call = program_call(words)
            if call is not None and not any(SYNOPSIS.search(a) for a in call[1]):
                found.append((doc.name, line, *call))
    return found


def _inline(doc: Path) -> list[tuple[str, str, str, list[str]]]:
    found = []
    for span in INLINE.findall(FENCE.sub("", doc.read_text())):
        try:
            words_list = segments(span)
        except ValueError:
            continue
        for words in words_list:
            call = program_call(words)
            if (
                call
                and call[1]
                and words[0] in STARTS
                and not any(SYNOPSIS.search(a) for a in call[1])
            ):
                found.append((doc.name, span, *call))
    return found


CALLS = [c for d in DOCS for c in _calls(d)]
INLINES = [c for d in DOCS for c in _inline(d)]


def _id(item: tuple[str, str, str, list[str]]) -> str:
    return f"{item[0]}: {item[1]}"[:80]


def _check(program: str, args: list[str], *, allow_missing: bool) -> str | None:
    try:
        parse(program, args, allow_missing=allow_missing)
    except Exception as exc:
        if type(exc).__name__ == "Exit" and getattr(exc, "exit_code", 1) == 0:
            return None  # --help / --version
        fmt = getattr(exc, "format_message", None)
        return str(fmt() if fmt else exc)
    return None


@pytest.mark.parametrize("doc,line,program,args", CALLS, ids=map(_id, CALLS))
def test_every_command_in_a_code_block_parses(
    doc: str, line: str, program: str, args: list[str]
) -> None:
    assert _check(program, args, allow_missing=False) is None, f"{doc}: {line!r}"


@pytest.mark.parametrize("doc,span,program,args", INLINES, ids=map(_id, INLINES))
def test_every_inline_command_parses(doc: str, span: str, program: str, args: list[str]) -> None:
    assert _check(program, args, allow_missing=True) is None, f"{doc}: `{span}`"


def test_readme_and_component_docs_are_covered() -> None:
    docs = {d for d, *_ in CALLS}
    assert {"README.md", "kairosd.md", "router.md", "idtracker.md", "simulator.md"} <= docs
    programs = {p for *_, p, _ in CALLS}
    assert programs == {"kairosd", "kairos-router", "id-tracker", "kairos"}


INFO = sorted({(p, a[0]) for *_, p, a in CALLS if a and a[0] in ("--version", "-h", "--help")})


@pytest.mark.parametrize("program,flag", INFO)
def test_version_and_help_lines_run(program: str, flag: str) -> None:
    exe = Path(sys.executable).parent / program
    proc = subprocess.run([str(exe), flag], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() and not proc.stderr, proc


def _script_refs() -> list[tuple[str, str]]:
    refs = []
    for doc in DOCS:
        for line in _lines(doc):
            refs += [(doc.name, p) for p in re.findall(r"\bscripts/[\w/]+\.py", line)]
            refs += [
                (doc.name, m.replace(".", "/") + ".py")
                for m in re.findall(r"-m (scripts\.[\w.]+)", line)
            ]
    return refs


@pytest.mark.parametrize("doc,script", _script_refs())
def test_every_script_a_doc_runs_exists(doc: str, script: str) -> None:
    assert (ROOT / script).is_file(), f"{doc}: {script}"


def test_every_make_target_a_doc_runs_exists() -> None:
    targets = set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.M))
    used = {(d.name, t) for d in DOCS for ln in _lines(d) for t in re.findall(r"^make (\w+)", ln)}
    assert used and all(t in targets for _, t in used), used


def _flag(args: list[str], name: str, default: str) -> str:
    return args[args.index(name) + 1] if name in args else default


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: d.name)
def test_daemons_shown_together_do_not_clash(doc: Path) -> None:
    """Two `kairosd run` lines in one block need their own /metrics port and GPUs."""
    for block in _blocks(doc):
        daemons = [
            a
            for line in _commands(block)
            for words in segments(line)
            if (c := program_call(words)) and c[0] == "kairosd" and c[1][:1] == ["run"]
            for a in [c[1]]
            if "--config" not in a  # a config file carries its own port and GPUs
        ]
        ports = [_flag(a, "--listen-port", "9470") for a in daemons]
        gpus = [g for a in daemons for g in _flag(a, "--gpus", "0").split(",")]
        assert len(set(ports)) == len(ports), (doc.name, ports)
        assert len(set(gpus)) == len(gpus), (doc.name, gpus)


def test_install_lines_work_without_a_package_index() -> None:
    """Kairos is not on PyPI: every `pip install` installs a checkout path or a wheel."""
    seen = 0
    for doc in [*DOCS]:
        text = doc.read_text()
        for line in [*_lines(doc), *INLINE.findall(text)]:
            for words in segments(line) if "pip install" in line else []:
                if "install" not in words:
                    continue
                seen += 1
                targets = [w for w in words[words.index("install") + 1 :] if not w.startswith("-")]
                for t in targets:
                    assert t.startswith((".", "/")) or t.endswith(".whl"), (doc.name, line)
    assert seen >= 3


def test_readme_install_command_names_this_checkout() -> None:
    lines = [ln for ln in _lines(ROOT / "README.md") if ln.startswith("pip install")]
    assert lines and shlex.split(lines[0])[2] == "."
    assert (ROOT / "pyproject.toml").is_file()

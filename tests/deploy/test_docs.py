"""docs/deploy.md: every Kairos command in it exists, every file it names ships,
its TOML snippets load, and it covers what an operator needs."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from idtracker.config import ENV_PREFIX as IDTRACKER_ENV
from idtracker.config import IdTrackerConfig
from kairos_common.config import load_config
from kairos_common.errors import ConfigError
from kairosd.config import ENV_PREFIX as KAIROSD_ENV
from kairosd.config import KairosdConfig
from router.config import ENV_PREFIX as ROUTER_ENV
from router.config import RouterConfig
from tests.deploy.cli_check import (
    FENCE,
    INLINE,
    STARTS,
    parse,
    program_call,
    segments,
    shell_lines,
)
from tests.deploy.units import DROPIN_FILES, ETC, ROOT, UNIT_FILES

DOC = ROOT / "docs" / "deploy.md"
SHELL = ("bash", "sh", "shell", "console")


def doc() -> str:
    return DOC.read_text(encoding="utf-8")


def code_blocks(lang: str | None = None) -> list[str]:
    return [body for tag, body in FENCE.findall(doc()) if lang is None or tag == lang]


def block_commands() -> list[tuple[str, str, list[str]]]:
    """(source line, program, args) for every Kairos program run in a code block."""
    found = []
    for block in [b for lang in SHELL for b in code_blocks(lang)]:
        for line in shell_lines(block):
            for words in segments(line):
                call = program_call(words)
                if call is not None:
                    found.append((line.strip(), *call))
    return found


def inline_commands() -> list[tuple[str, str, list[str]]]:
    """Kairos commands quoted inline in the prose (`kairosd reset --gpu 0`)."""
    prose = FENCE.sub("", doc())
    found = []
    for span in INLINE.findall(prose):
        for words in segments(span):
            call = program_call(words)
            # A bare name (`kairos`, the user; `id-tracker`, the tool) is not a command.
            if call is not None and call[1] and words[0] in STARTS:
                found.append((span, *call))
    return found


def _parses(program: str, args: list[str], *, allow_missing: bool = False) -> str | None:
    """None if the command line parses (``--help`` counts), else the usage error."""
    try:
        parse(program, args, allow_missing=allow_missing)
    except Exception as exc:
        if type(exc).__name__ == "Exit" and getattr(exc, "exit_code", 1) == 0:
            return None
        format_message = getattr(exc, "format_message", None)
        return str(format_message() if format_message else exc)
    return None


def _id(item: tuple[str, str, list[str]]) -> str:
    return item[0][:60]


@pytest.mark.parametrize("line,program,args", block_commands(), ids=map(_id, block_commands()))
def test_every_command_in_a_code_block_parses(line: str, program: str, args: list[str]) -> None:
    error = _parses(program, args)
    assert error is None, f"{line!r}: {error}"


@pytest.mark.parametrize("span,program,args", inline_commands(), ids=map(_id, inline_commands()))
def test_every_inline_command_exists(span: str, program: str, args: list[str]) -> None:
    error = _parses(program, args, allow_missing=True)
    assert error is None, f"`{span}`: {error}"


def test_the_doc_exercises_every_program_and_subcommand() -> None:
    """Guards the two tests above against extracting nothing."""
    info = ("--help", "-h", "--version")
    paths = {tuple(parse(p, a)) for _, p, a in block_commands() if not set(info) & set(a)}
    for expected in (
        ("kairosd", "gpus"),
        ("kairosd", "run"),
        ("kairosd", "reset"),
        ("kairos-router", "run"),
        ("id-tracker",),
        ("kairos", "report"),
    ):
        assert expected in paths, expected
    assert len(block_commands()) >= 15


def test_the_paper_harbor_example_is_wrapped_in_id_tracker() -> None:
    harbor = [(line, a) for line, p, a in block_commands() if p == "id-tracker" and "harbor" in a]
    assert harbor, "the Harbor launch (paper Appendix A.6) is missing"
    line, args = harbor[0]
    assert args[args.index("--") + 1 :][:2] == ["harbor", "run"]
    assert "KAIROS_ROUTER_URL=" in line


@pytest.mark.parametrize("block", code_blocks("toml"), ids=lambda b: b.split("\n", 1)[0])
def test_every_toml_snippet_loads_with_a_real_schema(block: str, tmp_path: Path) -> None:
    path = tmp_path / "snippet.toml"
    path.write_text(block)
    tomllib.loads(block)
    errors = []
    for cls, prefix in (
        (KairosdConfig, KAIROSD_ENV),
        (RouterConfig, ROUTER_ENV),
        (IdTrackerConfig, IDTRACKER_ENV),
    ):
        try:
            load_config(cls, path=path, env_prefix=prefix, env={})
            return
        except ConfigError as exc:
            errors.append(f"{cls.__name__}: {exc}")
    pytest.fail("snippet fits no schema: " + "; ".join(errors))


def test_every_repository_path_in_the_doc_exists() -> None:
    text = doc()
    paths = set(re.findall(r"(?<![\w/.])((?:systemd|docs|tests|scripts)/[\w@./-]*\w)", text))
    assert paths, "no repository paths found"
    missing = sorted(p for p in paths if not (ROOT / p).exists())
    assert not missing, missing
    links = re.findall(r"\]\(([\w.-]+\.md)\)", text)
    assert all((DOC.parent / link).is_file() for link in links), links


def test_every_shipped_unit_and_example_is_documented() -> None:
    text = doc()
    for path in [*UNIT_FILES, *DROPIN_FILES]:
        assert f"systemd/{path.relative_to(ROOT / 'systemd')}" in text, path.name
    for path in ETC.iterdir():
        assert path.name in text or path.suffix == ".env" or "gpu1" in path.name, path.name


@pytest.mark.parametrize(
    "topic",
    [
        "NVML permission",
        "Persistence mode",
        "zeusd socket",
        "vLLM metrics disabled",
        "Clocks stuck locked",
        "Router unreachable",
        "Turning Kairos off",
        "Reading reports",
        "Monitoring",
    ],
)
def test_the_doc_covers(topic: str) -> None:
    assert topic.lower() in doc().lower()

"""Check command lines (from unit files and docs) against the real typer apps.

A command line is parsed by the very click/typer command objects the installed
programs run, down to the subcommand, without invoking anything: an unknown
subcommand or flag, a missing argument or a bad value is a parse error here,
exactly as it would be on the host.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Callable
from typing import Any

import typer
import typer.main

PROGRAMS = ("kairosd", "kairos-router", "id-tracker", "kairos")
STARTS = {*PROGRAMS, "sudo", *(f"/opt/kairos/bin/{p}" for p in PROGRAMS)}
"""Words that start a Kairos command line in the docs."""
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)
"""A fenced code block of a Markdown document: (language tag, body)."""
INLINE = re.compile(r"`([^`\n]+)`")
"""An inline code span of a Markdown document."""


def shell_lines(block: str) -> list[str]:
    """Logical lines: backslash continuations joined."""
    return block.replace("\\\n", " ").splitlines()


# Words that may precede the program on a doc line without being part of it.
_WRAPPERS = {"sudo", "env", "exec", "nohup", "time", "command"}
_OPERATORS = {"&&", "||", ";", "|", "(", ")", "&", ";;"}


def _kairosd() -> typer.Typer:
    from kairosd.cli import app

    return app


def _router() -> typer.Typer:
    from router.cli import app

    return app


def _idtracker() -> typer.Typer:
    from idtracker.cli import app

    return app


def _kairos() -> typer.Typer:
    from kairos_cli.main import build_app

    return build_app()


_APPS: dict[str, Callable[[], typer.Typer]] = {
    "kairosd": _kairosd,
    "kairos-router": _router,
    "id-tracker": _idtracker,
    "kairos": _kairos,
}


def command_for(program: str) -> Any:
    """The click command object ``program`` runs (``typer.main.get_command``)."""
    return typer.main.get_command(_APPS[program]())


def parse(program: str, args: list[str], *, allow_missing: bool = False) -> list[str]:
    """Parse ``args`` like ``program`` would; returns the resolved subcommand path.

    Raises the click usage error (``exc.format_message()``) on any problem; with
    ``allow_missing`` a missing required argument is accepted (a command named in
    prose, like ``kairos report``, rather than one to run).
    """
    cmd = command_for(program)
    path = [program]
    ctx = None
    remaining = list(args)
    try:
        while True:
            ctx = cmd.make_context(path[-1], remaining, parent=ctx)
            if not hasattr(cmd, "resolve_command"):
                break
            protected = "_protected_args" if hasattr(ctx, "_protected_args") else "protected_args"
            rest = [*getattr(ctx, protected), *ctx.args]
            if not rest:
                break
            name, cmd, remaining = cmd.resolve_command(ctx, rest)
            path.append(name)
    except Exception as exc:
        if not (allow_missing and type(exc).__name__ == "MissingParameter"):
            raise
    return path


def segments(line: str) -> list[list[str]]:
    """Shell words of ``line`` split at operators (&&, |, ;), comments dropped."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    out: list[list[str]] = [[]]
    for tok in lexer:
        if tok in _OPERATORS:
            out.append([])
        else:
            out[-1].append(tok)
    return [s for s in out if s]


def program_call(words: list[str]) -> tuple[str, list[str]] | None:
    """``(program, args)`` if ``words`` runs one of PROGRAMS (after env/sudo), else None."""
    i = 0
    while i < len(words):
        w = words[i]
        if w in _WRAPPERS:
            i += 1
            if w == "sudo":
                while i < len(words) and words[i].startswith("-"):
                    i += 2 if words[i] in ("-u", "-g") else 1
            continue
        if "=" in w and not w.startswith("-") and w.split("=", 1)[0].isidentifier():
            i += 1  # VAR=value prefix
            continue
        name = os.path.basename(w)
        if name in PROGRAMS:
            return name, words[i + 1 :]
        return None
    return None

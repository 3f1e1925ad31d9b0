"""Split an agent-session trace into disjoint folds of whole sessions.

Policies are judged also on real Claude Code sessions kept out of the repository,
so a result on the dev trace should hold on sessions it was not measured on. This
writes ``N`` trace files that share no session: each top-level session goes, with
its sub-agents, to one fold. Assignment is by a hash of the session id (the roots
sorted by SHA-256 and dealt in turn), so the folds are the same on every machine
and balanced in session count, and do not depend on the file's line order. The
lines are copied verbatim; every fold is loaded back with the simulator's own
parser before it is written.

    .venv/bin/python -m scripts.split_trace claude-code-dev.jsonl \\
        --folds 2 --out /tmp/folds
    .venv/bin/python -m scripts.compare_claude --trace /tmp/folds/claude-code-dev-fold1of2.jsonl

Prints one line per fold: sessions, sub-agents, turns and the median prompt.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import sys
from pathlib import Path

from simulator.errors import WorkloadError
from simulator.workload_trace import load_trace


def _root_of(session_id: str, parents: dict[str, str | None]) -> str:
    """The top-level session ``session_id`` descends from (cycles are refused)."""
    seen = {session_id}
    while (parent := parents.get(session_id)) is not None:
        if parent in seen or parent not in parents:
            raise WorkloadError(f"session {session_id!r} has a broken parent chain")
        seen.add(parent)
        session_id = parent
    return session_id


def split_lines(lines: list[str], folds: int) -> list[list[str]]:
    """The trace's non-blank ``lines`` dealt into ``folds`` lists by top-level session."""
    if folds < 2:
        raise WorkloadError("--folds must be at least 2")
    parents: dict[str, str | None] = {}
    ids: list[str] = []
    for n, line in enumerate(lines, start=1):
        try:
            obj = json.loads(line)
            sid, parent = obj["session_id"], obj.get("parent")
        except (ValueError, KeyError, TypeError) as exc:
            raise WorkloadError(f"line {n}: not a trace session ({exc})") from exc
        if not isinstance(sid, str) or not (parent is None or isinstance(parent, str)):
            raise WorkloadError(f"line {n}: session_id and parent must be strings")
        if sid in parents:
            raise WorkloadError(f"line {n}: duplicate session_id {sid!r}")
        parents[sid] = parent
        ids.append(sid)
    roots = sorted(
        (s for s in ids if parents[s] is None),
        key=lambda s: hashlib.sha256(s.encode()).hexdigest(),
    )
    if len(roots) < folds:
        raise WorkloadError(f"{len(roots)} top-level sessions cannot fill {folds} folds")
    fold_of = {root: i % folds for i, root in enumerate(roots)}
    out: list[list[str]] = [[] for _ in range(folds)]
    for sid, line in zip(ids, lines, strict=True):
        out[fold_of[_root_of(sid, parents)]].append(line)
    return out


def describe(path: Path) -> str:
    """One line on a written fold, from the simulator's own parse of it."""
    programs = load_trace(path)
    everyone = list(programs)
    for program in everyone:  # grows as it goes: sub-agents at any depth
        everyone.extend(program.children)
    turns = [t for p in everyone for t in p.turns]
    subs = len(everyone) - len(programs)
    median = statistics.median(t.prompt_tokens for t in turns) if turns else 0
    return (
        f"{path}: {len(programs)} sessions, {subs} sub-agents, {len(turns)} turns, "
        f"median prompt {median:.0f} tokens"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("trace", type=Path, help="an agent-session trace (docs/simulator.md, Traces)")
    ap.add_argument("--folds", type=int, default=2)
    ap.add_argument("--out", type=Path, required=True, help="folder for the fold files")
    args = ap.parse_args(argv)
    try:
        text = args.trace.read_text(encoding="utf-8")
        lines = [line for line in text.splitlines() if line.strip()]
        parts = split_lines(lines, args.folds)
        args.out.mkdir(parents=True, exist_ok=True)
        for k, part in enumerate(parts, start=1):
            path = args.out / f"{args.trace.stem}-fold{k}of{args.folds}.jsonl"
            path.write_text("\n".join(part) + "\n", encoding="utf-8")
            print(describe(path))
    except (OSError, WorkloadError) as exc:
        print(f"split_trace: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""A trace-replaying agent: plays one :class:`~simulator.workload.AgentProgram`
against an OpenAI-compatible server with the real ``openai`` SDK.

It is an ordinary agent program: launched through ``id-tracker`` it reads
``OPENAI_BASE_URL`` and ``OPENAI_API_KEY`` from its environment like any
harness. Each turn is sent with the recorded sizes as hints the fake vLLM server
honours (``vllm_xargs``: prompt, output and shared-prefix tokens), so request
bodies stay small while the server sees the recorded context. Between turns it
waits the recorded tool/think time divided by ``--speedup``. Sub-agents (trace
children) are launched at their offset through a nested ``id-tracker`` when this
agent runs under one, so they register with a parent link.

Usage: ``python -m simulator.replay_agent --program FILE.json [--speedup 20]``.
Exit status 0 when every turn completed, 1 when a request failed for good.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import sys
import time
from collections.abc import Callable, Coroutine
from dataclasses import asdict
from pathlib import Path
from typing import Any

import openai

from simulator.workload import AgentProgram, Turn


def program_to_json(program: AgentProgram) -> dict[str, Any]:
    return asdict(program)


def program_from_json(obj: dict[str, Any]) -> AgentProgram:
    return AgentProgram(
        agent_id=str(obj["agent_id"]),
        turns=tuple(Turn(**t) for t in obj["turns"]),
        parent_id=obj.get("parent_id"),
        offset_s=float(obj.get("offset_s", 0.0)),
        children=tuple(program_from_json(c) for c in obj.get("children", ())),
    )


class TurnFailedError(Exception):
    """A turn's request failed for good (after the transport's own retries)."""


def _messages(program: AgentProgram, turn_index: int) -> list[dict[str, str]]:
    """The first request's body is as large as its recorded prompt (≈4 characters
    a token), like a real agent's: the router sizes a new agent from it. Later
    turns send only the agent's name and the turn number — the sizes travel as
    hints the fake vLLM honours, and the router knows the agent's context from
    usage by then — so the stack's CPU goes to serving, not to JSON. The first
    message names the agent so the server keys its prefix cache per agent (as
    vLLM's block hashes would for a real, unique system prompt)."""
    system = f"kairos replay agent {program.agent_id}"
    filler_chars = 0
    if turn_index == 0:
        filler_chars = max(0, 4 * program.turns[0].prompt_tokens - len(system) - 64)
    return [
        {"role": "system", "content": system},
        {"role": "user", "content": f"turn {turn_index} " + "x" * filler_chars},
    ]


def request_body(program: AgentProgram, i: int, model: str, stream: bool) -> dict[str, Any]:
    """The chat-completions body of turn ``i``, recorded sizes as ``vllm_xargs`` hints."""
    turn = program.turns[i]
    hints = {
        "kairos_prompt_tokens": turn.prompt_tokens,
        "kairos_output_tokens": turn.output_tokens,
        "kairos_shared_prefix_tokens": turn.shared_prefix_tokens,
    }
    body: dict[str, Any] = {
        "model": model,
        "messages": _messages(program, i),
        "max_tokens": turn.output_tokens,
        "vllm_xargs": hints,
    }
    if stream:
        body["stream"] = True
    return body


TurnSender = Callable[[int], Coroutine[Any, Any, None]]
"""Sends turn ``i`` and waits for its last byte; raises :class:`TurnFailedError`."""


def openai_sender(
    client: openai.AsyncOpenAI, model: str, program: AgentProgram, stream: bool
) -> TurnSender:
    """Turns sent with the real ``openai`` SDK (the stand-alone agent's transport)."""

    async def send(i: int) -> None:
        body = request_body(program, i, model, stream)
        kwargs: dict[str, Any] = {
            "model": model,
            "messages": body["messages"],
            "max_tokens": body["max_tokens"],
            "extra_body": {"vllm_xargs": body["vllm_xargs"]},
        }
        try:
            if stream:
                response = await client.chat.completions.create(stream=True, **kwargs)
                async for _chunk in response:
                    pass
            else:
                await client.chat.completions.create(**kwargs)
        except openai.OpenAIError as exc:
            raise TurnFailedError(str(exc)) from exc

    return send


async def _spawn_child(child: AgentProgram, speedup: float, delay_s: float) -> int:
    await asyncio.sleep(delay_s)
    agent_cmd = [
        sys.executable,
        "-m",
        "simulator.replay_agent",
        "--speedup",
        str(speedup),
        "--program-json",
        json.dumps(program_to_json(child)),
    ]
    if os.environ.get("KAIROS_AGENT_ID"):
        agent_cmd = [sys.executable, "-m", "idtracker", "--", *agent_cmd]
    proc = await asyncio.create_subprocess_exec(*agent_cmd)
    return await proc.wait()


ChildRunner = Callable[[AgentProgram, float], Coroutine[Any, Any, int]]
"""``(child, delay_real_s)`` → the child's exit status: how a sub-agent is started."""


async def play(
    program: AgentProgram,
    *,
    speedup: float,
    send_turn: TurnSender,
    run_child: ChildRunner,
    on_first_turn: Callable[[], None] | None = None,
) -> int:
    """Play every turn of ``program`` (and its children) now; the exit status.

    Shared by the stand-alone agent process and :mod:`simulator.agent_host`, so
    an agent behaves the same whichever way it was started. ``on_first_turn``
    runs just before the first request: the caller measures arrival lateness.
    """
    children = [asyncio.create_task(run_child(c, c.offset_s / speedup)) for c in program.children]
    status = 0
    try:
        for i, turn in enumerate(program.turns):
            if i > 0 and turn.think_s > 0:
                await asyncio.sleep(turn.think_s / speedup)
            elif i == 0 and on_first_turn is not None:
                on_first_turn()
            await send_turn(i)
    except TurnFailedError as exc:
        print(f"replay agent {program.agent_id}: turn failed: {exc}", file=sys.stderr)
        status = 1
    except asyncio.CancelledError:
        for task in children:
            task.cancel()
        await asyncio.gather(*children, return_exceptions=True)
        raise
    codes = await asyncio.gather(*children)
    return status or max(codes, default=0)


async def ready_then_go() -> float | None:
    """Print ``ready``; wait for ``go <t0_unix_s>`` on stdin; t0 (None: bad line)."""
    print("ready", flush=True)
    line = await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    parts = line.split()
    if len(parts) != 2 or parts[0] != "go":
        return None
    try:
        return float(parts[1])
    except ValueError:
        return None


def _report_lateness(path: Path, name: str, due_unix_s: float) -> None:
    """Append ``{"agent", "late_s"}`` to ``path``: how late the first turn left."""
    line = json.dumps({"agent": name, "late_s": round(time.time() - due_unix_s, 4)})
    with path.open("a") as out:
        out.write(line + "\n")


async def replay(
    program: AgentProgram,
    *,
    speedup: float,
    stream: bool,
    model: str | None = None,
    start_at_unix_s: float | None = None,
    await_go_offset_s: float | None = None,
    lag_report: Path | None = None,
) -> int:
    """Play every turn; returns the process exit status.

    ``start_at_unix_s``: wait until then before the first turn, so a driver can
    launch the process early and its start-up cost does not shift the arrival.
    ``await_go_offset_s``: once ready, print ``ready`` and read ``go <t0>`` from
    stdin; the first turn is due ``t0 + offset`` (a driver starts the clock only
    when every agent is up). ``lag_report``: where to append how late the first
    turn was.
    """
    client = openai.AsyncOpenAI(max_retries=8, timeout=600.0)
    try:
        if model is None:
            model = (await client.models.list()).data[0].id
        if await_go_offset_s is not None:
            t0 = await ready_then_go()
            if t0 is None:
                return 2
            start_at_unix_s = t0 + await_go_offset_s
        if start_at_unix_s is not None:
            await asyncio.sleep(max(0.0, start_at_unix_s - time.time()))
        due = start_at_unix_s
        report = None
        if lag_report is not None and due is not None:
            report = functools.partial(_report_lateness, lag_report, program.agent_id, due)
        return await play(
            program,
            speedup=speedup,
            send_turn=openai_sender(client, model, program, stream),
            run_child=lambda child, delay_s: _spawn_child(child, speedup, delay_s),
            on_first_turn=report,
        )
    finally:
        await client.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--program", type=Path, help="AgentProgram JSON file.")
    source.add_argument("--program-json", help="AgentProgram as a JSON string.")
    parser.add_argument(
        "--speedup",
        type=float,
        default=1.0,
        help="Divide recorded think/tool times by this factor.",
    )
    parser.add_argument("--no-stream", action="store_true", help="Send non-streaming requests.")
    parser.add_argument("--model", default=None, help="Model name (default: first served).")
    parser.add_argument(
        "--start-at",
        type=float,
        default=None,
        help="Unix time of the first turn (launch early; start-up cost is absorbed).",
    )
    parser.add_argument(
        "--await-go",
        type=float,
        default=None,
        metavar="OFFSET_S",
        help="Print 'ready', read 'go T0' from stdin, start the first turn at T0 + OFFSET_S.",
    )
    parser.add_argument(
        "--lag-report",
        type=Path,
        default=None,
        help="Append how late the first turn left (JSON line) to this file.",
    )
    args = parser.parse_args(argv)
    text = args.program.read_text() if args.program else args.program_json
    program = program_from_json(json.loads(text))
    return asyncio.run(
        replay(
            program,
            speedup=args.speedup,
            stream=not args.no_stream,
            model=args.model,
            start_at_unix_s=args.start_at,
            await_go_offset_s=args.await_go,
            lag_report=args.lag_report,
        )
    )


if __name__ == "__main__":
    sys.exit(main())

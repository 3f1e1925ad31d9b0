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
import json
import os
import sys
import time
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


def _messages(program: AgentProgram, turn_index: int) -> list[dict[str, str]]:
    """A body as large as the recorded prompt (≈4 characters a token), like a
    real agent's: the router sizes a new agent from its first request's body.
    The first message names the agent so the server keys its prefix cache per
    agent (as vLLM's block hashes would for a real, unique system prompt)."""
    system = f"kairos replay agent {program.agent_id}"
    filler_chars = max(0, 4 * program.turns[turn_index].prompt_tokens - len(system) - 64)
    return [
        {"role": "system", "content": system},
        {"role": "user", "content": f"turn {turn_index} " + "x" * filler_chars},
    ]


async def _turn(
    client: openai.AsyncOpenAI, model: str, program: AgentProgram, i: int, stream: bool
) -> None:
    turn = program.turns[i]
    hints = {
        "kairos_prompt_tokens": turn.prompt_tokens,
        "kairos_output_tokens": turn.output_tokens,
        "kairos_shared_prefix_tokens": turn.shared_prefix_tokens,
    }
    kwargs: dict[str, Any] = {
        "model": model,
        "messages": _messages(program, i),
        "max_tokens": turn.output_tokens,
        "extra_body": {"vllm_xargs": hints},
    }
    if stream:
        response = await client.chat.completions.create(stream=True, **kwargs)
        async for _chunk in response:
            pass
    else:
        await client.chat.completions.create(**kwargs)


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


async def replay(
    program: AgentProgram,
    *,
    speedup: float,
    stream: bool,
    model: str | None = None,
    start_at_unix_s: float | None = None,
) -> int:
    """Play every turn; returns the process exit status.

    ``start_at_unix_s``: wait until then before the first turn, so a driver can
    launch the process early and its start-up cost does not shift the arrival.
    """
    client = openai.AsyncOpenAI(max_retries=8, timeout=600.0)
    if model is None:
        model = (await client.models.list()).data[0].id
    if start_at_unix_s is not None:
        await asyncio.sleep(max(0.0, start_at_unix_s - time.time()))
    children = [
        asyncio.create_task(_spawn_child(c, speedup, c.offset_s / speedup))
        for c in program.children
    ]
    status = 0
    try:
        for i, turn in enumerate(program.turns):
            if i > 0 and turn.think_s > 0:
                await asyncio.sleep(turn.think_s / speedup)
            await _turn(client, model, program, i, stream)
    except openai.OpenAIError as exc:
        print(f"replay agent {program.agent_id}: turn failed: {exc}", file=sys.stderr)
        status = 1
    finally:
        codes = await asyncio.gather(*children)
        await client.close()
    return status or max(codes, default=0)


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
        )
    )


if __name__ == "__main__":
    sys.exit(main())

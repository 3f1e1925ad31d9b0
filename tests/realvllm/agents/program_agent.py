"""An agent that runs a scripted program against the router: the what-if validation's agent.

usage: program_agent.py PROGRAM.json

PROGRAM.json: ``{"offset_s": S, "seed": N, "turns": [{"prompt_tokens": P,
"shared_prefix_tokens": K, "output_tokens": O, "think_s": T}, ...]}`` — the shape
of a trace session. Configured by id-tracker alone (``OPENAI_BASE_URL``,
``OPENAI_API_KEY``), it prints ``{"ready": true}`` once its SDK is imported, reads
one stdin line holding the run's start (Unix seconds), waits until its own
arrival ``offset_s`` after it, then takes its turns: the tool/think gap ``T``
(the program's own time, not a wait for something), then a streamed
``/v1/completions`` call whose prompt is the first ``K`` tokens of its previous
context (prompt and output, as vLLM cached it) followed by fresh random tokens up
to ``P``, generating exactly ``O`` tokens (``ignore_eos``). Token-id prompts make
the program exact: no tokenizer decides how long a prompt is or what it shares.
Its last line is its report (what vLLM's usage said of every call).
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from typing import Any

import openai

MODEL = "tiny-llama"
TOKEN_IDS = (100, 1000)
"""Prompt tokens are drawn from here (below the tiny model's vocabulary, above its specials)."""


def say(obj: dict[str, Any]) -> None:
    print(json.dumps(obj), flush=True)


def call(client: openai.OpenAI, prompt: list[int], output_tokens: int) -> tuple[list[int], Any]:
    """One streamed completion: the generated token ids and vLLM's usage."""
    stream = client.completions.create(
        model=MODEL,
        prompt=prompt,
        max_tokens=output_tokens,
        temperature=0.0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True, "return_token_ids": True},
    )
    generated: list[int] = []
    usage = None
    for chunk in stream:
        for choice in chunk.choices:
            ids = getattr(choice, "token_ids", None)
            if ids:
                generated.extend(int(t) for t in ids)
        if chunk.usage is not None:
            usage = chunk.usage.model_dump()
    return generated, usage


def run(program: dict[str, Any], start_unix_s: float) -> list[Any]:
    client = openai.OpenAI(max_retries=0, timeout=900.0)
    rng = random.Random(int(program["seed"]))
    lo, hi = TOKEN_IDS
    wait = start_unix_s + float(program["offset_s"]) - time.time()
    if wait > 0:
        time.sleep(wait)  # the program's arrival time
    context: list[int] = []
    usages = []
    for k, turn in enumerate(program["turns"]):
        if k > 0 and turn["think_s"] > 0:
            time.sleep(float(turn["think_s"]))  # the program's tool/think time
        shared = min(int(turn["shared_prefix_tokens"]), len(context))
        fresh = int(turn["prompt_tokens"]) - shared
        prompt = context[:shared] + [rng.randrange(lo, hi) for _ in range(fresh)]
        generated, usage = call(client, prompt, int(turn["output_tokens"]))
        context = prompt + generated
        usages.append(usage)
    return usages


def main() -> int:
    with open(sys.argv[1], encoding="utf-8") as f:
        program = json.load(f)
    say({"ready": True})
    start = float(sys.stdin.readline())
    usages = run(program, start)
    say({"usages": usages, "agent_id": os.environ.get("KAIROS_AGENT_ID")})
    return 0


if __name__ == "__main__":
    sys.exit(main())

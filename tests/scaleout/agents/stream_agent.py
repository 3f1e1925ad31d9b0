"""Test agent for the scale-out tier: streams chat turns through the ``openai`` SDK,
configured only by its environment (id-tracker sets it), with the SDK's default
retries, until STOP_FILE exists.

usage: stream_agent.py LOG_FILE STOP_FILE [THINK_S [PAUSE_FILE]]

While PAUSE_FILE exists it sends nothing (a quiet moment to compare states), and
says so with a file LOG_FILE.paused (removed when it goes on).

Appends one JSON line per request to LOG_FILE: ``t0``/``t1`` (wall clock),
``ok``, the usage the backend reported (``prompt``, ``completion``) and which
router answered (``served_by``, HAProxy's ``X-Kairos-Router``), or the error.
Exits 0.
"""

from __future__ import annotations

import json
import os
import sys
import time

import openai


def main() -> int:
    log_path, stop_file = sys.argv[1], sys.argv[2]
    think_s = float(sys.argv[3]) if len(sys.argv) > 3 else 0.2
    pause_file = sys.argv[4] if len(sys.argv) > 4 else None
    client = openai.OpenAI()  # default retries: what an agent harness gets
    model = os.environ.get("SCALEOUT_MODEL", "Qwen/Qwen3-Coder-30B-A3B-Instruct-FP8")
    agent_id = os.environ.get("KAIROS_AGENT_ID")
    turn = 0
    with open(log_path, "a", encoding="utf-8") as log:
        while not os.path.exists(stop_file):
            if pause_file is not None and os.path.exists(pause_file):
                open(log_path + ".paused", "w").close()
                time.sleep(0.05)
                continue
            if os.path.exists(log_path + ".paused"):
                os.unlink(log_path + ".paused")
            turn += 1
            t0 = time.time()
            entry: dict[str, object] = {"t0": t0, "turn": turn, "agent_id": agent_id}
            try:
                raw = client.chat.completions.with_raw_response.create(
                    model=model,
                    messages=[
                        {"role": "system", "content": "You are a test agent."},
                        {"role": "user", "content": f"turn {turn}"},
                    ],
                    max_tokens=16,
                    stream=True,
                    stream_options={"include_usage": True},
                )
                entry["served_by"] = raw.headers.get("x-kairos-router")
                stream = raw.parse()
                usage = None
                for chunk in stream:
                    if chunk.usage is not None:
                        usage = chunk.usage
                if usage is None:
                    raise RuntimeError("stream ended without usage")
                entry.update(ok=True, prompt=usage.prompt_tokens,
                             completion=usage.completion_tokens)  # fmt: skip
            except Exception as exc:  # every failure is logged; the agent goes on
                entry.update(ok=False, error=f"{type(exc).__name__}: {exc}"[:300])
            entry["t1"] = time.time()
            log.write(json.dumps(entry) + "\n")
            log.flush()
            time.sleep(think_s)
    return 0


if __name__ == "__main__":
    sys.exit(main())

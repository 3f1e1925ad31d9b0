"""Test agent: talks to "OpenAI" with the openai SDK configured only by its environment.

usage: openai_agent.py N_REQUESTS EXIT_CODE [--nested]

Prints one JSON line (its agent id, the replies, the base URL it used) and
exits with EXIT_CODE. With --nested it first launches itself as a sub-agent
through a nested id-tracker (which finds the router and its parent from the
environment alone).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import openai


def main() -> int:
    n_requests, exit_code = int(sys.argv[1]), int(sys.argv[2])
    nested_rc = None
    if "--nested" in sys.argv[3:]:
        cmd = [sys.executable, "-m", "idtracker", "--name", "sub-agent", "--"]
        nested_rc = subprocess.call([*cmd, sys.executable, __file__, "1", "5"])
    client = openai.OpenAI(max_retries=0)
    replies = [
        client.chat.completions.create(
            model="stand-in", messages=[{"role": "user", "content": f"turn {i}"}]
        )
        .choices[0]
        .message.content
        for i in range(n_requests)
    ]
    report = {
        "agent_id": os.environ.get("KAIROS_AGENT_ID"),
        "base_url": str(client.base_url),
        "replies": replies,
        "nested_rc": nested_rc,
    }
    print(json.dumps(report), flush=True)
    return exit_code


if __name__ == "__main__":
    sys.exit(main())

"""The agent-trace format: what each agent ran, as ``kairos sim --workload trace:FILE`` reads it.

One JSON object per line and session (an agent, or one of its conversations),
in the agent-session trace format of docs/simulator.md, "Traces" (``session_id``, ``parent``,
``offset_s``, ``turns[]`` with ``prompt_tokens``, ``shared_prefix_tokens``,
``output_tokens``, ``think_s``, ``at_s``), extended compatibly with what a
recording router knows and a replay needs: when the session started
(``start_unix_s``, so a replay keeps the recorded arrivals), its name and SLO,
and per turn what was measured (``latency_s``, ``ttft_s``, ``queue_s``,
``cached_tokens``, ``instance``), so ``kairos whatif --compare`` can set a
simulated run beside the recorded one. Token counts and times only: never a
prompt's or a completion's text. Readers ignore fields they do not know.

The router writes it (:mod:`router.trace_recorder`, docs/router.md "Recording
agent traces"); :mod:`simulator.workload_trace` and :mod:`whatif.recorded` read
it. Fields: docs/whatif.md, "The trace format".
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

TRACE_SOURCE = "kairos-router"
"""``source`` of a session a router recorded."""


@dataclass(frozen=True, slots=True)
class TraceTurn:
    """One LLM call of a session, as the router saw it (seconds, tokens)."""

    at_s: float
    """When it reached the router, from the session's first call."""
    prompt_tokens: int
    shared_prefix_tokens: int
    """Leading prompt tokens identical to the session's previous context (its
    previous call's prompt and output): what vLLM's prefix cache can serve."""
    output_tokens: int
    think_s: float
    """Gap before it: from the session's previous call's last byte to this call's
    arrival (tool time, the agent's own work); 0 for the first call."""
    latency_s: float
    """Measured: arrival at the router to the last byte, time held included."""
    queue_s: float
    """Measured: arrival at the router to forwarding (held for admission)."""
    ttft_s: float | None = None
    """Measured: forwarding to the first response byte (streamed calls only)."""
    cached_tokens: int | None = None
    """Measured: prompt tokens vLLM served from its prefix cache, where its usage
    reports them (``vllm serve --enable-prompt-tokens-details``)."""
    instance: str = ""

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "at_s": round(self.at_s, 6),
            "prompt_tokens": self.prompt_tokens,
            "shared_prefix_tokens": self.shared_prefix_tokens,
            "output_tokens": self.output_tokens,
            "think_s": round(self.think_s, 6),
            "latency_s": round(self.latency_s, 6),
            "queue_s": round(self.queue_s, 6),
        }
        if self.ttft_s is not None:
            out["ttft_s"] = round(self.ttft_s, 6)
        if self.cached_tokens is not None:
            out["cached_tokens"] = self.cached_tokens
        if self.instance:
            out["instance"] = self.instance
        return out


@dataclass(frozen=True, slots=True)
class TraceSession:
    """One session: an agent's calls, or one conversation of an agent."""

    session_id: str
    parent: str | None
    offset_s: float
    """A sub-session's start after its parent's (0 for a top-level one)."""
    start_unix_s: float
    """Wall-clock time of its first call's arrival at the router."""
    turns: tuple[TraceTurn, ...]
    name: str | None = None
    slo_tok_s: float | None = None
    run: str = ""
    ended: bool = True
    """False: written when the router stopped, with the agent still live."""
    truncated: bool = False
    """True: the session had more calls than a recording keeps for one session."""

    def to_json_line(self) -> str:
        obj: dict[str, Any] = {
            "session_id": self.session_id,
            "parent": self.parent,
            "offset_s": round(self.offset_s, 6),
            "start_unix_s": round(self.start_unix_s, 6),
            "source": TRACE_SOURCE,
        }
        if self.name is not None:
            obj["name"] = self.name
        if self.slo_tok_s is not None:
            obj["slo_tok_s"] = self.slo_tok_s
        if self.run:
            obj["run"] = self.run
        if not self.ended:
            obj["ended"] = False
        if self.truncated:
            obj["truncated"] = True
        obj["turns"] = [t.to_json() for t in self.turns]
        return json.dumps(obj, separators=(",", ":"), allow_nan=False)

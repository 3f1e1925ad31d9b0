"""Recording agent traces: per agent, the program it ran, for ``kairos whatif``.

Off by default. With ``[trace] path`` (or ``kairos-router run --trace-file``)
the router writes, when an agent ends, one line per session in the format
``kairos sim --workload trace:FILE`` reads (:mod:`reporting.agent_trace`): every
completed call's arrival, prompt, shared-prefix and output tokens, the gap
before it, and what was measured (latency, time held, time to first byte,
cached tokens where vLLM reports them). Token counts and times only, never text.

Sessions: an agent's first conversation (:mod:`router.conversations`) is the
session named by the agent id, with its parent agent as parent; every further
conversation of the same identity (a harness's in-process sub-agent, a side
request) is a sub-session ``<agent>.c<n>`` of it, since the simulator gives every
sub-agent its own cache key. A call's shared prefix is its conversation's
previous context (prompt and output) when the prompt extends it, as agent
harnesses send them; otherwise (a compaction, a rewritten history) what vLLM
served from its cache when the usage says so, else 0.

Bounded: the file rotates at ``max_bytes`` keeping ``backups`` old files (the
standard library's ``RotatingFileHandler``), and a session keeps at most
:data:`MAX_TURNS` calls (then it is marked ``truncated``). Agents still live when
the router stops are written with ``ended: false``.
"""

from __future__ import annotations

import logging
import math
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from logging.handlers import RotatingFileHandler
from pathlib import Path
from typing import TYPE_CHECKING

from kairos_common.config import CODE_ONLY
from kairos_common.errors import ConfigError
from reporting.agent_trace import TraceSession, TraceTurn

if TYPE_CHECKING:  # the ledger's Agent; config.py imports TraceSettings from here
    from router.ledger import Agent

MIB = 1024 * 1024
MAX_TURNS = 20_000
"""Calls kept per session (about 2 MB of memory while it runs)."""
_KNOWN_STARTS = 100_000
"""Agents whose start is remembered after they end, for their sub-agents' offsets."""


@dataclass(frozen=True)
class TraceSettings:
    """``[trace]``: recording agent traces (docs/router.md, "Recording agent traces")."""

    path: Path | None = None
    """JSONL file the traces go to; unset: no recording (the default)."""
    max_bytes: int = field(default=64 * MIB, metadata=CODE_ONLY)
    """The file rotates past this size (``path.1``, ``path.2``, …): at most 320 MiB
    with the backups. A constant of the code (docs/notes/configuration.md)."""
    backups: int = field(default=4, metadata=CODE_ONLY)
    """Rotated files kept; older ones are deleted. A constant of the code."""

    def __post_init__(self) -> None:
        if not 4096 <= self.max_bytes <= 1 << 40:
            raise ConfigError(f"trace.max_bytes must be 4096..2^40, got {self.max_bytes}")
        if not 0 <= self.backups <= 1000:
            raise ConfigError(f"trace.backups must be 0..1000, got {self.backups}")


@dataclass(slots=True)
class _Conversation:
    session_id: str
    parent: str | None
    start_s: float
    start_unix_s: float
    offset_s: float
    last_end_s: float | None = None
    last_context: int = 0
    turns: list[TraceTurn] = field(default_factory=list)
    truncated: bool = False


@dataclass(slots=True)
class _AgentTrace:
    name: str | None
    slo_tok_s: float | None
    conversations: dict[int, _Conversation] = field(default_factory=dict)


class TraceRecorder:
    """Per-agent traces in memory until the agent leaves, then one line per session."""

    def __init__(
        self,
        settings: TraceSettings,
        *,
        clock: Callable[[], float],
        wall_clock: Callable[[], float],
        run: str = "",
    ) -> None:
        if settings.path is None:
            raise ConfigError("trace recording needs trace.path")
        path = settings.path.expanduser()
        if path.is_dir():
            raise ConfigError(f"trace.path {path}: is a directory")
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        # Opened now, so a path the router cannot write is an error at start-up
        # (OSError: the CLI's "cannot use"), not a surprise at the first agent's end.
        self._handler = RotatingFileHandler(
            path, maxBytes=settings.max_bytes, backupCount=settings.backups, encoding="utf-8"
        )
        self._handler.setFormatter(logging.Formatter("%(message)s"))
        self._clock = clock
        self._wall_clock = wall_clock
        self._run = run
        self._agents: dict[str, _AgentTrace] = {}
        self._starts: OrderedDict[str, float] = OrderedDict()
        self.sessions_written = 0

    def request(
        self,
        agent: Agent,
        conversation: int,
        *,
        t0_s: float,
        t_sent_s: float | None,
        first_data_s: float | None,
        t_end_s: float,
        prompt_tokens: int,
        completion_tokens: int,
        cached_tokens: int | None,
        instance: str,
    ) -> None:
        """A call of ``agent`` completed (router clock times): add it to its session."""
        trace = self._agents.get(agent.agent_id)
        if trace is None:
            trace = self._agents[agent.agent_id] = _AgentTrace(agent.name, agent.slo_tok_s)
        conv = trace.conversations.get(conversation)
        if conv is None:
            conv = self._new_conversation(agent, trace, t0_s)
            trace.conversations[conversation] = conv
        if len(conv.turns) >= MAX_TURNS:
            conv.truncated = True
            return
        prompt = max(0, prompt_tokens)
        if conv.last_end_s is None:
            shared = 0
            think_s = 0.0
        else:
            shared = conv.last_context if prompt >= conv.last_context else 0
            think_s = max(0.0, t0_s - conv.last_end_s)
        if cached_tokens is not None:
            shared = max(shared, min(cached_tokens, prompt))
        sent = t0_s if t_sent_s is None else t_sent_s
        conv.turns.append(
            TraceTurn(
                at_s=max(0.0, t0_s - conv.start_s),
                prompt_tokens=prompt,
                shared_prefix_tokens=shared,
                output_tokens=max(0, completion_tokens),
                think_s=think_s,
                latency_s=max(0.0, t_end_s - t0_s),
                queue_s=max(0.0, sent - t0_s),
                ttft_s=None if first_data_s is None else max(0.0, first_data_s - sent),
                cached_tokens=cached_tokens,
                instance=instance,
            )
        )
        conv.last_end_s = t_end_s
        conv.last_context = prompt + max(0, completion_tokens)

    def _new_conversation(self, agent: Agent, trace: _AgentTrace, t0_s: float) -> _Conversation:
        start_unix = self._wall_clock() - (self._clock() - t0_s)
        if not trace.conversations:  # the agent's own session
            self._remember(agent.agent_id, start_unix)
            parent = agent.parent_id
            parent_start = self._starts.get(parent) if parent is not None else None
            offset = 0.0 if parent_start is None else max(0.0, start_unix - parent_start)
            return _Conversation(agent.agent_id, parent, t0_s, start_unix, offset)
        first = next(iter(trace.conversations.values()))
        session_id = f"{agent.agent_id}.c{len(trace.conversations)}"
        offset = max(0.0, t0_s - first.start_s)
        return _Conversation(session_id, agent.agent_id, t0_s, start_unix, offset)

    def _remember(self, agent_id: str, start_unix_s: float) -> None:
        self._starts[agent_id] = start_unix_s
        while len(self._starts) > _KNOWN_STARTS:
            self._starts.popitem(last=False)

    def agent_left(self, agent_id: str) -> None:
        """``agent_id`` ended or expired (``Ledger.on_remove``): write its sessions."""
        trace = self._agents.pop(agent_id, None)
        if trace is not None:
            self._write(trace, ended=True)

    def close(self) -> None:
        """The router stops: write the live agents' sessions so far, then close."""
        for trace in self._agents.values():
            self._write(trace, ended=False)
        self._agents.clear()
        self._handler.close()

    def _write(self, trace: _AgentTrace, *, ended: bool) -> None:
        slo = trace.slo_tok_s
        if slo is not None and not math.isfinite(slo):
            slo = None
        for conv in trace.conversations.values():
            if not conv.turns:
                continue
            session = TraceSession(
                session_id=conv.session_id,
                parent=conv.parent,
                offset_s=conv.offset_s,
                start_unix_s=conv.start_unix_s,
                turns=tuple(conv.turns),
                name=trace.name,
                slo_tok_s=slo,
                run=self._run,
                ended=ended,
                truncated=conv.truncated,
            )
            # The handler rotates the file past max_bytes; a write error (a full
            # disk) goes to its handleError (stderr), never to the agent's request.
            self._handler.emit(logging.makeLogRecord({"msg": session.to_json_line()}))
            self.sessions_written += 1

"""Several conversations under one agent identity, and the ``C_a`` they add up to.

The paper's ``C_a`` is the prompt plus completion of the agent's latest request:
one agent, one growing conversation. A coding harness that runs in one process
under one identity (one ``id-tracker`` launch) does not keep to that. Claude
Code's sub-agents (its Task tool) run in-process with the parent's key, several
at once, each with its own system prompt and history, while the parent's
conversation waits for them; and small side requests (a title, a summary, a
check) come and go between the parent's turns. With ``C_a`` taken from the
latest request alone, a 100-token side request that finishes after a
100K-token turn makes the router count 100 tokens for an agent whose 100K-token
prefix sits in vLLM's cache and comes back at the next turn: admission fills
that room with a newcomer, and the next turn's prompt, minus 100 cached tokens,
looks like a 100K-token prefill and lifts the clock to the top (control-law
point 9) for a prompt vLLM serves from its cache.

So the router tells an agent's conversations apart by their *root* (what every
request of one conversation starts with: the system prompt and the first user
message, as vLLM's prefix cache keys blocks by what precedes them), keeps each
one's own context, and counts for the agent

    ``C_a = max(latest, Σ contexts in flight + the largest context idle within the window)``

where ``latest`` is the paper's value. One conversation gives exactly the paper's
``C_a`` (its context is the latest, in flight or idle). A client whose root
changes at every request (a system prompt with a timestamp, a replay tool's
numbered turns) gives it too, up to the largest of its recent requests: the max,
not a sum, over idle conversations is what keeps such a client from being
counted once per request. A conversation idle past ``window_s`` (a finished
sub-agent, the history a compaction replaced) no longer counts.

Claude Code names its conversations itself, and the root is not stable across
one of them: a compaction replaces the first message with a summary (its
billing header, the first system block, changes with it), and so does a reply
with nothing visible that it asks again. Measured on Claude Code 2.1.332
(docs/agents.md): every request carries its session in
``X-Claude-Code-Session-Id`` (also in ``metadata.user_id``), shared by the
in-process sub-agents, each of which adds ``X-Claude-Code-Agent-Id``; the
system prompt is recorded once per conversation and sent unchanged. So a
request with a session header is keyed by session, sub-agent and system
prompt (less the billing header) instead of the root: a compacted conversation
replaces its old context at once instead of being counted at its old size for
``window_s``, sub-agents with the same prompt stay apart, and a side request with
a system prompt of its own stays apart as before. The session alone would merge
every sub-agent into its parent.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

DEFAULT_KEY = 0
"""The conversation of a request whose root the router cannot read."""
MAX_CONVERSATIONS = 16
"""Per agent; beyond it the conversation idle longest is forgotten first."""
_ROOT_CHARS = 16_384
"""Characters of a root that are read: enough to tell two system prompts or two
first messages apart, bounded so that a 400 KB first prompt costs nothing."""
_TEXT_KEYS = ("role", "content", "text", "type")
"""The parts of a message that make its text. Others (``cache_control``, ids,
names) may change between two requests of one conversation: Claude Code marks
its latest messages as cache breakpoints."""
_SYSTEM_ROLES = frozenset({"system", "developer"})
CLAUDE_CODE_SESSION = "X-Claude-Code-Session-Id"
CLAUDE_CODE_AGENT = "X-Claude-Code-Agent-Id"
"""Claude Code's headers: its session, and an in-process sub-agent's id."""
_BILLING_BLOCK = "x-anthropic-billing-header:"
"""The first system block Claude Code sends: it changes with the first message."""


def claude_code_thread(headers: Mapping[str, str]) -> str | None:
    """Claude Code's own name for the conversation a request continues (its session
    and sub-agent), or None for any other client."""
    session = headers.get(CLAUDE_CODE_SESSION)
    if not session:
        return None
    return f"{session}\x1f{headers.get(CLAUDE_CODE_AGENT, '')}"


def conversation_key(route: str, body: Mapping[str, Any], thread: str | None = None) -> int:
    """The root of the conversation ``body`` continues, as a hash.

    ``route`` is the proxy's name for the endpoint (``chat``, ``messages``,
    ``responses``, ``completions``). Chat: the leading system messages and the
    first other message. Anthropic messages: ``system`` and the first message,
    or with Claude Code's ``thread`` (:func:`claude_code_thread`) that and
    ``system`` less its billing block (module docstring). Responses:
    ``instructions`` and the first input item (or the input's start).
    Completions: the prompt's start. :data:`DEFAULT_KEY` when there is none.

    The key lives only in this process's memory (never persisted or sent), so
    Python's own string hash does: a microsecond less a request than a digest.
    """
    root: list[Any]
    if route == "chat":
        root = _chat_root(body.get("messages"))
    elif route == "messages":
        if thread is not None:
            root = [thread, _without_billing(body.get("system"))]
        else:
            messages = body.get("messages")
            first = messages[0] if isinstance(messages, list) and messages else None
            root = [body.get("system"), first]
    elif route == "responses":
        given = body.get("input")
        first = given[0] if isinstance(given, list) and given else given
        root = [body.get("instructions"), first]
    elif route == "completions":
        prompt = body.get("prompt")
        root = [prompt[0] if isinstance(prompt, list) and prompt else prompt]
    else:
        return DEFAULT_KEY
    parts: list[str] = []
    if _text(root, parts, _ROOT_CHARS) == _ROOT_CHARS:
        return DEFAULT_KEY  # nothing readable: one conversation, as before
    return hash("".join(parts)) or 1


def _without_billing(system: Any) -> Any:
    """Claude Code's system blocks less the billing header it derives from the
    first message."""
    if not isinstance(system, list):
        return system
    return [
        b
        for b in system
        if not (
            isinstance(b, dict)
            and isinstance(b.get("text"), str)
            and b["text"].startswith(_BILLING_BLOCK)
        )
    ]


def _chat_root(messages: Any) -> list[Any]:
    if not isinstance(messages, list):
        return []
    for i, message in enumerate(messages):
        if not (isinstance(message, dict) and message.get("role") in _SYSTEM_ROLES):
            return messages[: i + 1]
    return messages


def _text(value: Any, parts: list[str], budget: int) -> int:
    """Append ``value``'s text to ``parts`` (at most ``budget`` characters); returns
    the budget left. Only :data:`_TEXT_KEYS` of a dict count, each marked, so that
    two roots with the same characters in different places differ."""
    if budget <= 0:
        return 0
    if isinstance(value, str):
        part = value[:budget]
        parts.append(part)
        return budget - len(part)
    if isinstance(value, list):
        for item in value:
            parts.append("\x1e")
            budget = _text(item, parts, budget)
        return budget
    if isinstance(value, dict):
        for name in _TEXT_KEYS:
            if name in value:
                parts.append("\x1f" + name)
                budget = _text(value[name], parts, budget)
    return budget


@dataclass(slots=True)
class Conversation:
    """One conversation of an agent: its context once a request of it completed."""

    context_tokens: int | None = None
    last_end_s: float | None = None
    in_flight: int = 0

    def ended_within(self, now_s: float, window_s: float) -> bool:
        """Did a request of it complete within the last ``window_s``?"""
        return self.last_end_s is not None and now_s - self.last_end_s <= window_s


class Conversations:
    """An agent's conversations, most recently used last (bounded)."""

    __slots__ = ("_by_key", "latest")

    def __init__(self) -> None:
        self._by_key: OrderedDict[int, Conversation] = OrderedDict()
        self.latest: int | None = None
        """The key of the conversation whose request completed last."""

    def __len__(self) -> int:
        return len(self._by_key)

    def start(self, key: int) -> None:
        """A request of conversation ``key`` is forwarded."""
        conv = self._get(key)
        self._by_key.move_to_end(key)
        conv.in_flight += 1

    def done(self, key: int) -> None:
        """That request ended without completing (an error, a client gone)."""
        conv = self._by_key.get(key)
        if conv is not None and conv.in_flight > 0:
            conv.in_flight -= 1

    def complete(self, key: int, context_tokens: int, now_s: float) -> None:
        """A request of ``key`` completed with ``context_tokens`` of context: it ends
        here (no :meth:`done` follows), so that its new context is never counted
        as running beside the one it replaces."""
        conv = self._get(key)
        conv.in_flight = max(0, conv.in_flight - 1)
        conv.context_tokens = context_tokens
        conv.last_end_s = now_s
        self.latest = key

    def context_of(self, key: int) -> int | None:
        """What the cache holds of conversation ``key``: its context (None: new)."""
        conv = self._by_key.get(key)
        return None if conv is None else conv.context_tokens

    def latest_tokens(self) -> int | None:
        """The paper's ``C_a``: the context of the latest completed request."""
        return None if self.latest is None else self.context_of(self.latest)

    def context_tokens(self, now_s: float, window_s: float) -> int | None:
        """The agent's ``C_a`` (module docstring); None before any request completed."""
        latest = self.latest_tokens()
        if latest is None:
            return None
        running = 0
        idle = 0
        for conv in self._by_key.values():
            tokens = conv.context_tokens or 0
            if conv.in_flight:
                running += tokens
            elif conv.ended_within(now_s, window_s):
                idle = max(idle, tokens)
        return max(latest, running + idle)

    def live(self, now_s: float, window_s: float) -> int:
        """Conversations that :meth:`context_tokens` looks at now: the latest, those
        with a request in flight and those that ended within the window."""
        return sum(
            1
            for k, c in self._by_key.items()
            if k == self.latest or c.in_flight or c.ended_within(now_s, window_s)
        )

    def sizes(self, now_s: float) -> list[list[float]]:
        """``[key, context_tokens, idle_for_s, is_latest]`` of each conversation with
        a context, for the store. The keys are this process's string hashes: another
        router matches a restored conversation by nothing but its size, which is
        what ``C_a`` needs (its next request starts a conversation of its own)."""
        return [
            [k, c.context_tokens, max(0.0, now_s - _or(c.last_end_s, now_s)), k == self.latest]
            for k, c in self._by_key.items()
            if c.context_tokens is not None
        ]

    @classmethod
    def from_sizes(cls, sizes: object, now_s: float) -> Conversations:
        """Rebuild from :meth:`sizes` (anything malformed is dropped)."""
        out = cls()
        if not isinstance(sizes, list):
            return out
        for item in sizes[-MAX_CONVERSATIONS:]:
            try:
                key, tokens, idle_s, latest = item
                out._by_key[int(key)] = Conversation(int(tokens), now_s - float(idle_s))
            except (TypeError, ValueError):
                continue
            if latest:
                out.latest = int(key)
        return out

    def _get(self, key: int) -> Conversation:
        """Conversation ``key``, added (within the bound) if new."""
        conv = self._by_key.get(key)
        if conv is None:
            conv = self._by_key[key] = Conversation()
            self._bound()
        return conv

    def _bound(self) -> None:
        """Forget the conversation idle longest beyond :data:`MAX_CONVERSATIONS`
        (never one in flight, nor the latest)."""
        while len(self._by_key) > MAX_CONVERSATIONS:
            victim = next(
                (k for k, c in self._by_key.items() if not c.in_flight and k != self.latest),
                None,
            )
            if victim is None:
                return
            del self._by_key[victim]


def _or(value: float | None, default: float) -> float:
    return default if value is None else value

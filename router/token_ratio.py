"""Bytes a prompt token takes in a request body, learned from vLLM's own counts.

The router has to size a request before vLLM has tokenized it: a newcomer's
context (fleet admission places it by that size, before any usage exists), the
uncached prompt of a request in flight (the clock's prefill signal) and the
prompt of a reply that came back without usage. Four bytes a token is the rule
of thumb for English prose, not a property of what agents send: code and tool
schemas often take fewer bytes a token with the tokenizers vLLM serves, JSON
escapes (``\\n``, ``\\uXXXX`` for non-ASCII text) more, and the error grows with
the prompt: on a coding agent's 100K-token session a quarter is 25K tokens of
cache promised to nobody, or twice.

So the router learns the ratio from the first request of every agent: its body's
length against the ``prompt_tokens`` vLLM reports for it. Only first requests,
because that is the population the newcomer estimate sizes (whole conversation,
system prompt and tools) and a later request may carry its size out of band (the
trace replayer's ``vllm_xargs`` hints). The estimate is the *median* of the last
:data:`WINDOW` such ratios, so one agent sending padding or token ids cannot move
it far, bounded to [:data:`MIN_BYTES_PER_TOKEN`, :data:`MAX_BYTES_PER_TOKEN`];
until :data:`MIN_SAMPLES` agents have been seen it is :data:`DEFAULT_BYTES_PER_TOKEN`.
"""

from __future__ import annotations

import math
import statistics
from collections import deque

DEFAULT_BYTES_PER_TOKEN = 4.0
"""Until enough agents are seen: prose in JSON, the estimate the router always used."""
MIN_BYTES_PER_TOKEN = 1.0
MAX_BYTES_PER_TOKEN = 16.0
WINDOW = 64
"""First requests the median is taken over: recent enough to follow a model swap."""
MIN_SAMPLES = 8
MIN_PROMPT_TOKENS = 256
"""Smaller prompts are mostly the chat template's framing, which the body lacks."""


class BytesPerToken:
    """The learned body bytes per prompt token (see the module docstring)."""

    def __init__(self) -> None:
        self._ratios: deque[float] = deque(maxlen=WINDOW)
        self._value = DEFAULT_BYTES_PER_TOKEN

    @property
    def value(self) -> float:
        """Bytes a token, as the estimates use it now."""
        return self._value

    @property
    def samples(self) -> int:
        return len(self._ratios)

    def observe(self, body_bytes: int, prompt_tokens: int) -> None:
        """An agent's first request: ``body_bytes`` sent, ``prompt_tokens`` by vLLM's
        usage. Prompts under :data:`MIN_PROMPT_TOKENS` are not evidence."""
        if prompt_tokens < MIN_PROMPT_TOKENS or body_bytes <= 0:
            return
        ratio = body_bytes / prompt_tokens
        if not math.isfinite(ratio):
            return
        self._ratios.append(min(max(ratio, MIN_BYTES_PER_TOKEN), MAX_BYTES_PER_TOKEN))
        if len(self._ratios) >= MIN_SAMPLES:
            self._value = statistics.median(self._ratios)

    def tokens(self, body_bytes: int) -> int:
        """The prompt tokens a body of ``body_bytes`` holds, by the learned ratio."""
        return int(max(body_bytes, 0) / self._value)

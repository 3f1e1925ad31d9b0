"""Recent finished requests per instance: the online performance model's input.

The router is where per-request facts are visible (prompt, cached and
completion tokens from the usage object; time to the first streamed byte and
to the last; how many requests the instance was running; its aggregate
context). It keeps the last ``maxlen`` per instance and hands them to the
daemon with the instance state; the daemon de-duplicates by time and fills in
the clock it applied (the router cannot know it). Plain in-memory state owned
by the event loop.
"""

from __future__ import annotations

from collections import deque

from controllers.types import RequestObservation


class ObservationLog:
    """Bounded per-instance ring of :class:`RequestObservation` (clock left 0)."""

    def __init__(self, maxlen: int = 128) -> None:
        self.maxlen = maxlen
        self._by_instance: dict[str, deque[RequestObservation]] = {}

    def record(self, instance: str, observation: RequestObservation) -> None:
        ring = self._by_instance.get(instance)
        if ring is None:
            ring = self._by_instance[instance] = deque(maxlen=self.maxlen)
        ring.append(observation)

    def recent(self, instance: str) -> tuple[RequestObservation, ...]:
        return tuple(self._by_instance.get(instance, ()))

    def forget(self, instance: str) -> None:
        self._by_instance.pop(instance, None)


def observation(
    *,
    t_sent_s: float,
    first_data_s: float,
    end_s: float,
    prompt_tokens: int,
    cached_tokens: int,
    completion_tokens: int,
    running: int,
    active_context_tokens: int,
) -> RequestObservation:
    """One request's observation from the router's timestamps (router clock)."""
    decode_s = max(end_s - first_data_s, 0.0)
    per_token = decode_s / (completion_tokens - 1) if completion_tokens > 1 else 0.0
    return RequestObservation(
        t_s=end_s,
        prompt_tokens=prompt_tokens,
        cached_tokens=cached_tokens,
        completion_tokens=completion_tokens,
        ttft_s=max(first_data_s - t_sent_s, 0.0),
        decode_s_per_token=per_token,
        running=running,
        active_context_tokens=active_context_tokens,
        clock_mhz=0,
    )

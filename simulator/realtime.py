"""Drive the engine model in (scaled) real time for the fake vLLM server.

The simulator's :class:`~simulator.engine.Engine` runs on virtual seconds. Here
virtual time is tied to the event loop's monotonic clock, ``sim_s = (t − t0) ·
speedup``, and one background task advances the engine to "now" whenever it has
something to do: at the engine's next event, at a clock change, when a request
arrives, and every ``stream_tick_s`` (real) while requests are streaming, so
clients see tokens arrive progressively rather than all at the end.

Events are delivered to per-request :class:`asyncio.Queue` objects; the HTTP
layer never touches the engine directly, and the engine is only ever touched on
the event loop thread (no locks needed).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

import structlog

from simulator.engine import Engine
from simulator.engine_types import (
    EngineEvent,
    EngineRequest,
    RequestFinished,
    RequestRejected,
)

log = structlog.get_logger(__name__)


class RealtimeEngine:
    """Owns an :class:`Engine` and advances it as the wall clock moves."""

    def __init__(
        self,
        engine: Engine,
        *,
        speedup: float = 1.0,
        clock: Callable[[], float],
        stream_tick_s: float = 0.05,
    ) -> None:
        if speedup <= 0:
            raise ValueError("speedup must be positive")
        self.engine = engine
        self.speedup = speedup
        self._clock = clock
        self._t0 = clock()
        self._tick_s = stream_tick_s
        self._queues: dict[str, asyncio.Queue[EngineEvent]] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.max_step_lag_s = 0.0
        """Largest real delay between a timed wake-up and the step it ran
        (self-check: the time acceleration is only honest while this stays small)."""
        self.steps = 0

    # ------------------------------------------------------------------ time
    def now_s(self) -> float:
        """Current virtual time (simulated seconds since start)."""
        return (self._clock() - self._t0) * self.speedup

    def to_real_s(self, sim_s: float) -> float:
        return sim_s / self.speedup

    # --------------------------------------------------------------- control
    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="fake-engine")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def submit(
        self,
        request_id: str,
        *,
        prompt_tokens: int,
        output_tokens: int,
        cache_key: str = "",
        shared_prefix_tokens: int = 0,
    ) -> asyncio.Queue[EngineEvent]:
        """Queue a request arriving now; its events arrive on the returned queue."""
        queue: asyncio.Queue[EngineEvent] = asyncio.Queue()
        self._queues[request_id] = queue
        now = self._advance()
        self.engine.submit(
            EngineRequest(
                request_id=request_id,
                prompt_tokens=prompt_tokens,
                output_tokens=output_tokens,
                arrival_s=now,
                cache_key=cache_key,
                shared_prefix_tokens=shared_prefix_tokens,
            )
        )
        self._advance()
        self._wake.set()
        return queue

    def abort(self, request_id: str) -> None:
        """The client went away: free the request's blocks, drop its queue."""
        if self._queues.pop(request_id, None) is not None:
            self.engine.abort(request_id, max(self.now_s(), self.engine.now_s))
            self._wake.set()

    def finish(self, request_id: str) -> None:
        """The HTTP layer is done with a request (after its final event)."""
        self._queues.pop(request_id, None)

    def set_locked_clocks(self, min_mhz: int, max_mhz: int) -> None:
        """Lock the simulated GPU; under load it runs at ``max_mhz``."""
        now = self._advance()
        gpu = self.engine.gpu
        lo, hi = gpu.supported_clocks_mhz[0], gpu.supported_clocks_mhz[-1]
        if not lo <= min_mhz <= max_mhz <= hi:
            raise ValueError(f"locked clocks [{min_mhz}, {max_mhz}] MHz outside [{lo}, {hi}]")
        self.engine.set_clock(max_mhz, now)
        gpu.locked_min_mhz = min_mhz
        self._wake.set()

    def reset_clocks(self) -> None:
        """Unlock: back to the highest clock, like ``nvidia-smi -rgc``."""
        now = self._advance()
        gpu = self.engine.gpu
        self.engine.set_clock(gpu.max_clock_mhz, now)
        gpu.locked_min_mhz = gpu.locked_max_mhz = None
        self._wake.set()

    def sync(self) -> float:
        """Bring the engine up to the current virtual time (before a scrape)."""
        return self._advance()

    # ------------------------------------------------------------------ loop
    def _advance(self) -> float:
        now = max(self.now_s(), self.engine.now_s)
        for event in self.engine.advance_to(now):
            self._dispatch(event)
        return now

    def _dispatch(self, event: EngineEvent) -> None:
        queue = self._queues.get(event.request_id)
        if queue is not None:
            queue.put_nowait(event)
            if isinstance(event, RequestFinished | RequestRejected):
                # The handler still holds the queue; we stop routing to it.
                self._queues.pop(event.request_id, None)

    def _delay_s(self) -> float | None:
        """Real seconds until the loop must run again (None: until woken)."""
        candidates: list[float] = []
        nxt = self.engine.next_event_time()
        if nxt is not None:
            candidates.append(self.to_real_s(max(0.0, nxt - self.now_s())))
        change = self.engine.gpu.next_change_s()
        if change is not None:
            candidates.append(self.to_real_s(max(0.0, change - self.now_s())))
        if self._queues and (self.engine.running or self.engine.waiting):
            candidates.append(self._tick_s)
        return min(candidates) if candidates else None

    async def _run(self) -> None:
        while True:
            try:
                self._advance()
            except Exception:  # a model bug must not kill the server silently
                log.exception("fake_engine_step_failed")
                raise
            self._wake.clear()
            delay = self._delay_s()
            if delay is None:
                await self._wake.wait()
                continue
            due = self._clock() + max(delay, 0.001)
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=max(delay, 0.001))
            except TimeoutError:
                self.steps += 1
                self.max_step_lag_s = max(self.max_step_lag_s, self._clock() - due)

"""vLLM's CPU tier of the prefix cache (``--kv-offloading-backend native``).

With ``--kv-offloading-size`` set, vLLM's ``OffloadingConnector`` copies every
full KV block it computes to a pool of host memory, and a request whose prefix
the GPU no longer holds loads it back from there instead of computing it again.
The pool is LRU by block; a session's blocks are stored and loaded together,
so the model keeps, per cache key (an agent), the full blocks of its latest
context, least recently used first. What it changes for agents with long
contexts and long tool gaps: an idle session whose blocks the GPU evicted costs
a copy over PCIe when it returns (0.4 s for 100K tokens at 96 KiB per token and
25 GB/s) instead of a prefill of its whole context (tens of seconds at low
clocks), and a preempted request resumes the same way (docs/simulator.md,
"CPU KV offload").

Stores are free in the model: vLLM copies blocks out asynchronously while the
GPU computes. Loads are charged by the engine as a stall of the step that admits
the request (:meth:`simulator.timing.TimingModel.load_s`), which overstates
their cost: vLLM loads asynchronously and lets the running requests go on.
"""

from __future__ import annotations

from collections import OrderedDict


class CpuKvTier:
    """Host-memory blocks of each cache key's latest context, LRU."""

    def __init__(self, capacity_tokens: int, block_size: int) -> None:
        self.block_size = block_size
        self.capacity_blocks = max(0, capacity_tokens // block_size)
        self.used_blocks = 0
        self.stored_blocks = 0
        self.loaded_blocks = 0
        self.dropped_blocks = 0
        self._by_key: OrderedDict[str, int] = OrderedDict()

    def blocks_of(self, key: str) -> int:
        """Full blocks of ``key``'s context held in host memory."""
        return self._by_key.get(key, 0)

    def store(self, key: str, blocks: int) -> None:
        """``key``'s context now has ``blocks`` full blocks (most recently used).

        A context only grows or is replaced, so the stored copy is the latest;
        room is made by dropping least recently used contexts whole.
        """
        if not key or blocks <= 0:
            return
        blocks = min(blocks, self.capacity_blocks)
        old = self._by_key.pop(key, 0)
        self.used_blocks -= old
        self.stored_blocks += max(0, blocks - old)
        while self.used_blocks + blocks > self.capacity_blocks and self._by_key:
            _, dropped = self._by_key.popitem(last=False)
            self.used_blocks -= dropped
            self.dropped_blocks += dropped
        if blocks > 0:
            self._by_key[key] = blocks
            self.used_blocks += blocks

    def load(self, key: str, blocks: int) -> None:
        """``blocks`` of ``key`` are copied back to the GPU (they stay here too)."""
        if blocks > 0 and key in self._by_key:
            self._by_key.move_to_end(key)
            self.loaded_blocks += blocks

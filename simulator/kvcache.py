"""Block-granular KV cache of one vLLM V1 instance with prefix caching.

Blocks are owned by running sequences, free, or *cached*: full blocks of a
context no running sequence uses, kept for reuse and evictable. Cached blocks
are grouped per cache key (an agent) in LRU order. Eviction takes blocks from the
least recently released context first, from its tail, exactly like V1's free
queue (a freed request's blocks are appended tail-first), so a partly evicted
context keeps a reusable prefix.

With a CPU tier (vLLM's KV offloading, :mod:`simulator.kv_offload`) every
context released is also stored there, so what the GPU evicts can be loaded
back instead of computed again.

Invariant (tested): ``free + cached + owned == total`` at every step.
"""

from __future__ import annotations

from collections import OrderedDict

from simulator.kv_offload import CpuKvTier


class KvCache:
    def __init__(
        self, capacity_tokens: int, block_size: int, tier: CpuKvTier | None = None
    ) -> None:
        self.block_size = block_size
        self.tier = tier
        self.total_blocks = capacity_tokens // block_size
        self.free_blocks = self.total_blocks
        self.cached_blocks = 0
        self.evicted_blocks = 0
        self._cached: OrderedDict[str, int] = OrderedDict()

    @property
    def available_blocks(self) -> int:
        """Blocks an allocation may use: free plus evictable cached ones."""
        return self.free_blocks + self.cached_blocks

    def cached_of(self, key: str) -> int:
        """Cached (reusable) blocks of ``key``'s context."""
        return self._cached.get(key, 0)

    def cached_contexts(self) -> dict[str, int]:
        """Copy of the cached contexts, LRU first (for tests and metrics)."""
        return dict(self._cached)

    def claim(self, key: str, max_blocks: int) -> int:
        """Take up to ``max_blocks`` cached blocks of ``key`` for a sequence that
        reuses that prefix; the rest of that context no longer matches and is freed."""
        blocks = self._cached.pop(key, 0)
        if blocks == 0:
            return 0
        hit = min(blocks, max(0, max_blocks))
        self.cached_blocks -= blocks
        self.free_blocks += blocks - hit
        return hit

    def allocate(self, blocks: int) -> bool:
        """Reserve ``blocks`` for a running sequence, evicting LRU cached context
        blocks if needed. Returns False (and changes nothing) if impossible."""
        if blocks <= self.free_blocks:
            self.free_blocks -= blocks
            return True
        if blocks > self.free_blocks + self.cached_blocks:
            return False
        need = blocks - self.free_blocks
        self.free_blocks = 0
        self.cached_blocks -= need
        self.evicted_blocks += need
        while need > 0:
            key, held = next(iter(self._cached.items()))
            take = min(held, need)
            need -= take
            if take == held:
                del self._cached[key]
            else:
                self._cached[key] = held - take
        return True

    def release(self, key: str, owned_blocks: int, keep_blocks: int) -> None:
        """A sequence stops using ``owned_blocks``: the first ``keep_blocks`` (its
        full blocks) become ``key``'s cached context (most recently used), the
        rest are freed. A stale cached context of the same key is dropped."""
        keep = min(keep_blocks, owned_blocks) if key else 0
        old = self._cached.pop(key, 0) if key else 0
        self.cached_blocks -= old
        self.free_blocks += old + owned_blocks - keep
        if keep > 0:
            self._cached[key] = keep
            self.cached_blocks += keep
            if self.tier is not None:
                self.tier.store(key, keep)

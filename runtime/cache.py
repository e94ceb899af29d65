"""Caches: specializations per guard key (with a limit and back-off) and compiled kernels.

`SpecializationCache` holds what was compiled for each static guard key of one
traced function, least recently used first. Past `limit` keys it refuses new
ones and the caller runs eagerly; it re-probes after 1, 2, 4, ... refused misses,
evicting the least recently used key each time, so a function whose keys keep
changing settles into eager execution instead of recompiling forever.

`KernelCache` shares compiled kernels across traced functions by graph
structure, so a graph that differs only in sizes reuses a size-generic kernel.
"""

from collections import OrderedDict


class SpecializationCache:
    """Guard key -> specialization, bounded by `limit`, with exponential back-off."""

    def __init__(self, limit: int):
        if limit < 1:
            raise ValueError(f"cache_limit must be >= 1, got {limit}")
        self.limit = limit
        self.entries = OrderedDict()
        self.refused = 0
        self._next_probe = 1

    def get(self, key):
        entry = self.entries.get(key)
        if entry is not None:
            self.entries.move_to_end(key)
        return entry

    def admit(self):
        """May a new key be compiled now? Returns (allowed, reason for the event log)."""
        if len(self.entries) < self.limit:
            return True, None
        self.refused += 1
        if self.refused < self._next_probe:
            return False, None
        self._next_probe *= 2
        self.refused = 0
        evicted = next(iter(self.entries))
        del self.entries[evicted]
        return True, (f"cache_limit={self.limit} reached: evicted the least recently used "
                      f"specialization; the next {self._next_probe} new keys run eagerly "
                      "before another probe")

    def put(self, key, entry):
        self.entries[key] = entry

    def pop(self, key):
        return self.entries.pop(key, None)

    def values(self):
        return self.entries.values()

    def __len__(self) -> int:
        return len(self.entries)

    def __iter__(self):
        return iter(self.entries)

    def __getitem__(self, key):
        return self.entries[key]


class KernelCache:
    """Compiled kernels by (structural hash); shared process-wide."""

    def __init__(self):
        self._kernels = {}
        self.hits = 0
        self.misses = 0

    def get(self, key):
        found = self._kernels.get(key)
        if found is None:
            self.misses += 1
        else:
            self.hits += 1
        return found

    def put(self, key, value):
        self._kernels[key] = value

    def setdefault(self, key, value):
        return self._kernels.setdefault(key, value)

    def clear(self):
        self._kernels.clear()

    def __len__(self) -> int:
        return len(self._kernels)


KERNELS = KernelCache()

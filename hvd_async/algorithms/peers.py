"""Who gossips with whom: a worker's seeded, reproducible sequence of peers (never itself).

Topologies (``rank`` of ``size`` workers, ``r`` the number of exchanges this worker made so far):

- ``random``: uniform over the other workers, from ``np.random.default_rng((seed, rank))``, so a run
  with the same seed and size draws the same sequence on every worker;
- ``ring``: always ``(rank + 1) % size``;
- ``exponential``: ``(rank + 2**(r % k)) % size`` over the ``k`` powers of two below ``size``
  (offsets 1, 2, 4, ...), the time-varying exponential graph of Stochastic Gradient Push: every
  worker is reached within ``log2(size)`` exchanges.

With one worker there is no peer: ``next()`` returns None.
"""
from typing import List, Optional

import numpy as np

TOPOLOGIES = ("random", "ring", "exponential")


def exponential_offsets(size: int) -> List[int]:
    """The powers of two below ``size``: ``[1, 2, 4, ...]`` (empty for one worker)."""
    return [1 << i for i in range((size - 1).bit_length())] if size > 1 else []


class PeerSchedule:
    """The peers of worker ``rank`` in order; ``next()`` gives the next one.

    Example::

        >>> s = PeerSchedule("exponential", rank=0, size=5); [s.next() for _ in range(4)]
        [1, 2, 4, 1]
    """

    def __init__(self, topology: str, *, rank: int, size: int, seed: int = 0):
        if topology not in TOPOLOGIES:
            raise ValueError(f"topology must be one of {', '.join(TOPOLOGIES)}, got {topology!r}")
        if not 0 <= rank < size:
            raise ValueError(f"rank must be in [0, {size}), got {rank}")
        self.topology, self.rank, self.size = topology, rank, size
        self.rng = np.random.default_rng((seed, rank))
        self.offsets = exponential_offsets(size)
        self.count = 0

    def next(self) -> Optional[int]:
        if self.size == 1:
            return None
        if self.topology == "ring":
            offset = 1
        elif self.topology == "exponential":
            offset = self.offsets[self.count % len(self.offsets)]
        else:
            offset = int(self.rng.integers(1, self.size))
        self.count += 1
        return (self.rank + offset) % self.size

"""Batches of changing size from one shared sequence of epoch permutations: every sample once per epoch.

dbs-asgd changes each worker's batch size as it goes, so a fixed split of the data per worker
(``DistributedSampler``) no longer fits. Instead all workers draw from one global sequence: epoch
``e``'s positions ``e*N .. (e+1)*N-1`` are a permutation of the N samples (seeded by ``(seed, e)``,
the same on every worker), and a worker wanting ``b`` samples adds ``b`` to a cursor shared by the
whole job (an atomic fetch-and-add in the servers' windows: ``WindowTransport.fetch_add_counter``),
which hands it positions ``c .. c+b-1`` that nobody else gets. Within an epoch no sample is
repeated or skipped, whatever the batch sizes and whatever the order workers come in. A batch that
starts in epoch ``e`` and runs past its end belongs to epoch ``e`` (its tail is the start of
``e+1``'s permutation, which then no other worker gets).

Workers that take every step together and know each other's batch sizes (lb-sgd) need no shared
counter: :class:`LockstepCursor` computes each worker's part of the step locally, and a whole step
belongs to the epoch its first position is in, so that every worker sees an epoch end at the same step.
"""
from typing import Callable, Dict, List, Sequence, Tuple, Union

import torch


class SharedCursorBatches:
    """Draw batches of any size from the shared sequence.

    Args:
        num_samples: N, the dataset's length.
        seed: seeds every epoch's permutation (the same on every worker).
        fetch_add: ``fetch_add(b) -> c``: atomically advance the shared cursor by ``b`` and return its
            value before (``transport.fetch_add_counter``; tests pass an in-process counter); or
            ``-> (c, a)``: the batch starts at ``c`` and belongs to the epoch of position ``a``
            (:class:`LockstepCursor`: its step's first position).

    Example::

        >>> counter = [0]
        >>> def fetch_add(b):
        ...     counter[0] += b
        ...     return counter[0] - b
        >>> batches = SharedCursorBatches(4, seed=0, fetch_add=fetch_add)
        >>> epoch, idx = batches.draw(3); epoch2, idx2 = batches.draw(3)
        >>> (epoch, epoch2, sorted(idx + idx2[:1]))  # the second batch starts in epoch 0, ends in 1
        (0, 0, [0, 1, 2, 3])
    """

    def __init__(self, num_samples: int, *, seed: int, fetch_add: Callable[[int], Union[int, Tuple[int, int]]]):
        if num_samples < 1:
            raise ValueError(f"num_samples must be >= 1, got {num_samples}")
        self.num_samples, self.seed, self._fetch_add = num_samples, seed, fetch_add
        self._perms: Dict[int, torch.Tensor] = {}
        self.claimed = 0  # the shared cursor after this worker's last claim (a progress display reads it)

    def permutation(self, epoch: int) -> torch.Tensor:
        perm = self._perms.get(epoch)
        if perm is None:
            generator = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            perm = self._perms[epoch] = torch.randperm(self.num_samples, generator=generator)
            for old in [e for e in self._perms if e < epoch - 1]:
                del self._perms[old]
        return perm

    def indices(self, start: int, size: int) -> List[int]:
        """The sample indices at positions ``start .. start+size-1`` of the shared sequence."""
        out: List[int] = []
        position, end = start, start + size
        while position < end:
            epoch, offset = divmod(position, self.num_samples)
            take = min(end - position, self.num_samples - offset)
            out.extend(self.permutation(epoch)[offset:offset + take].tolist())
            position += take
        return out

    def draw(self, size: int) -> Tuple[int, List[int]]:
        """Claim ``size`` positions; returns the epoch the batch belongs to and its sample indices."""
        if size < 1:
            raise ValueError(f"batch size must be >= 1, got {size}")
        claim = self._fetch_add(size)
        start, anchor = claim if isinstance(claim, tuple) else (claim, claim)
        self.claimed = start + size
        return anchor // self.num_samples, self.indices(start, size)


class LockstepCursor:
    """The shared cursor of workers that take every step together (lb-sgd), computed locally.

    Each step claims the next ``sum(sizes)`` positions of the shared sequence; worker ``rank`` gets the
    part after the lower ranks' parts. Every worker must claim once a step, with the same ``sizes``
    (change them between steps, on every worker alike: :meth:`set_sizes`). A claim returns
    ``(start, step_start)``, so a step that runs past an epoch's end belongs to that epoch on every
    worker (:class:`SharedCursorBatches`).

    Example::

        >>> cursors = [LockstepCursor(rank, [3, 1]) for rank in range(2)]
        >>> [cursor(size) for cursor, size in zip(cursors, [3, 1])], [cursors[1](1)]
        ([(0, 0), (3, 0)], [(7, 4)])
    """

    def __init__(self, rank: int, sizes: Sequence[int], position: int = 0):
        self.rank, self.position = rank, int(position)
        self.set_sizes(sizes)

    def set_sizes(self, sizes: Sequence[int]) -> None:
        """Every worker's batch size from the next step on, in rank order."""
        self.sizes = [int(b) for b in sizes]
        self._offset = sum(self.sizes[:self.rank])

    def __call__(self, size: int) -> Tuple[int, int]:
        if size != self.sizes[self.rank]:
            raise ValueError(f"worker {self.rank} drew a batch of {size} samples but its share of the step is "
                             f"{self.sizes[self.rank]}: draw opt.strategy.batch_size samples")
        step_start = self.position
        self.position += sum(self.sizes)
        return step_start + self._offset, step_start

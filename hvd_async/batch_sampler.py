"""A ``torch.utils.data`` batch sampler whose batch size follows the optimizer's (dbs-asgd's data loop)."""
from typing import Iterator, List, Optional, Tuple

import torch
from torch.utils.data import DistributedSampler, Sampler

from .sampling import SharedCursorBatches


class _SamplerSequence(SharedCursorBatches):
    """The shared sequence in a sampler's order: epoch ``e``'s positions are ``sampler``'s indices
    after ``sampler.set_epoch(e)`` (where it has one)."""

    def __init__(self, sampler, *, fetch_add):
        super().__init__(len(sampler), seed=0, fetch_add=fetch_add)
        self.sampler = sampler
        self.orders = {}  # epoch -> the sampler's order (this epoch's and the last)

    def permutation(self, epoch: int) -> torch.Tensor:
        order = self.orders.get(epoch)
        if order is None:
            if hasattr(self.sampler, "set_epoch"):
                self.sampler.set_epoch(epoch)
            order = torch.tensor([int(i) for i in self.sampler], dtype=torch.long)
            if len(order) != self.num_samples:
                raise ValueError(f"the sampler gave {len(order)} indices for epoch {epoch}, but its len() is "
                                 f"{self.num_samples}; DynamicBatchSampler needs a sampler of fixed length")
            self.orders = {e: o for e, o in self.orders.items() if e == epoch - 1}
            self.orders[epoch] = order
        return order


class DynamicBatchSampler(Sampler):
    """Batches of the size the optimizer asks for, every sample once per epoch across the workers.

    dbs-asgd (Ji et al., "Dynamic batch size for distributed SGD", 2019) sets each worker's batch size
    from its measured speed (``opt.strategy.batch_size``). This batch sampler reads that size each time
    it yields a batch and draws the batch from one sequence shared by all workers (a permutation of the
    data per epoch, handed out through a counter in the servers' windows:
    :class:`hvd_async.sampling.SharedCursorBatches`), so an epoch uses every sample once however the
    sizes change, and ends on every worker at about the same step. It takes the place of a
    ``DistributedSampler`` and a fixed ``batch_size`` in the ``DataLoader``.

    Args:
        data: the dataset (indices ``0 .. len(data)-1``, shuffled per epoch), or a sampler over all of
            it whose order is the same on every worker (seeded: e.g. a ``SubsetRandomSampler`` of the
            training split with a seeded generator; its ``set_epoch(e)`` is called where it has one).
            Not a ``DistributedSampler``: the workers share one sequence rather than split the data.
        optimizer: the ``hvd_async.DistributedOptimizer`` of an algorithm that sizes each worker's
            batches (dbs-asgd); built before the sampler, on every worker.
        seed: seeds every epoch's permutation of the dataset; the same on every worker.

    Example::

        opt = ha.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                      named_parameters=model.named_parameters(),
                                      algorithm="dbs-asgd", batch_size=32)
        loader = DataLoader(dataset, batch_sampler=ha.DynamicBatchSampler(dataset, opt))
        for epoch in range(epochs):
            for x, y in loader:                  # len(x): this worker's batch size now
                ...

    Each ``iter()`` is the next epoch (``set_epoch(e)`` names one, as ``DistributedSampler``'s does).
    ``len()`` is the steps of an epoch at the nominal batch, ``len(data) / (workers x batch_size)``;
    since the batches follow the speeds, every worker takes about that many, give or take a step.
    The size is read when the ``DataLoader`` asks for the batch: with ``num_workers=0`` that is just
    before the loop gets it; with loader processes it asks ``prefetch_factor x num_workers`` batches
    ahead, so a change of size reaches the loop that many steps late (and dbs-asgd weighs those
    steps by the new size): keep the prefetch small where the speeds change often.
    """

    def __init__(self, data, optimizer, *, seed: int = 0):
        super().__init__()
        strategy = getattr(optimizer, "strategy", None)
        if strategy is None:
            raise TypeError(f"optimizer must be the hvd_async.DistributedOptimizer whose batch size the batches "
                            f"follow, got {type(optimizer).__name__}")
        cursor = strategy.batch_cursor()
        if cursor is None:
            raise ValueError(f"DynamicBatchSampler follows an algorithm that sizes each worker's batches "
                             f"(dbs-asgd); {strategy.name} uses a fixed batch: give the DataLoader a "
                             f"DistributedSampler and batch_size instead")
        if isinstance(data, DistributedSampler):
            raise ValueError("DynamicBatchSampler shares one sequence of the whole data among the workers; a "
                             "DistributedSampler splits it per worker: pass the dataset (or a sampler over all of it)")
        if not hasattr(data, "__len__"):
            raise TypeError(f"data must be a dataset or a sampler with a len(), got {type(data).__name__}")
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ValueError(f"seed must be an integer >= 0 (the same on every worker), got {seed!r}")
        self.strategy = strategy
        self.sequence = (_SamplerSequence(data, fetch_add=cursor) if isinstance(data, Sampler)
                         else SharedCursorBatches(len(data), seed=seed, fetch_add=cursor))
        self.epoch = 0
        # a batch drawn from the next epoch, which ended this one: that epoch's first
        self._drawn: Optional[Tuple[int, List[int]]] = None

    def set_epoch(self, epoch: int) -> None:
        """The epoch the next ``iter()`` yields (otherwise each ``iter()`` is the one after the last)."""
        self.epoch = epoch

    def __iter__(self) -> Iterator[List[int]]:
        epoch, self.epoch = self.epoch, self.epoch + 1
        while True:
            if self._drawn is None:
                self._drawn = self.sequence.draw(self.strategy.batch_size)
            drawn_epoch, indices = self._drawn
            if drawn_epoch > epoch:  # the shared sequence has moved on: this epoch is over here
                return
            self._drawn = None
            yield indices

    def __len__(self) -> int:
        nominal = self.strategy.options.batch_size * self.strategy.transport.size
        return -(-self.sequence.num_samples // nominal)

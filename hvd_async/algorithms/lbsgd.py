"""lb-sgd: synchronous SGD whose batch sizes follow each worker's measured speed (LB-BSP, Chen et al. 2020).

The baseline against a steady straggler: ssgd's allreduce, ssgd's global batch ``B = workers *
batch_size`` and learning rate, but the global batch is split among the workers in proportion to
their speeds, so that a slow worker computes fewer samples and no worker waits long in the allreduce.

The rule. Each worker measures its speed ``s_m``: samples per second of its own compute (the time from
the end of its previous ``step()`` to the start of this one's exchange: data, forward, backward, and
what the job injects as device time; not the wait in the allreduce), smoothed by an exponential moving
average (``smoothing``: the weight of the past). Every ``every`` steps the workers allgather their
speeds and each sets, from the same numbers,

    b_m = B * s_m / sum_j s_j, rounded by largest remainder (ties to the lower rank), at least min_batch

so that the batches sum to exactly ``B``. Before the averaging allreduce each worker multiplies its
gradient (the mean over its ``b_m`` samples) by ``b_m * workers / B``: the average is then the mean
over all ``B`` samples, which is ssgd's step on the same samples (with equal batches the weight is 1
and nothing is multiplied: exactly ssgd's step).

The batch size is read by the caller before drawing each batch (``opt.strategy.batch_size``). The
training job draws from :class:`hvd_async.sampling.SharedCursorBatches` through a
:class:`~hvd_async.sampling.LockstepCursor`: every step takes the next ``B`` samples of one shared
sequence of epoch permutations, worker m the ``b_m`` after the lower ranks' shares, so every sample is
used once per epoch whatever the sizes, and every worker sees the epoch end at the same step.

Choices: the first interval after construction or ``load_global_model()`` is not measured (it holds
set-up or the evaluation); sizes change only when every worker has measured a speed; everything
else (backward_passes_per_step, compression, the non-finite guard, process sets) is ssgd's.

Tuning: with a straggler whose slowness changes, lower ``every`` and ``smoothing`` so the sizes
follow sooner; a slowness that moves step by step is what asynchronous algorithms are for.
"""
from dataclasses import dataclass
from typing import List, Optional, Sequence

import numpy as np

from ..checks import is_int_at_least
from ..options import option
from ..sampling import LockstepCursor
from .base import ExchangeStats
from .speed import SpeedMeter
from .ssgd import SSGD, SSGDAlgorithm, SSGDOptions


def share_batch(global_batch: int, speeds: Sequence[float], min_batch: int = 1) -> List[int]:
    """``global_batch`` split in proportion to ``speeds``: largest remainder (ties to the lower rank),
    then each raised to ``min_batch`` by taking from the largest batch; the sizes sum to ``global_batch``.

    Example::

        >>> share_batch(16, [3.0, 1.0]), share_batch(10, [1.0, 1.0, 1.0]), share_batch(8, [100.0, 1.0])
        ([12, 4], [4, 3, 3], [7, 1])
    """
    rates = np.asarray(speeds, dtype=np.float64)
    if len(rates) * min_batch > global_batch:
        raise ValueError(f"a global batch of {global_batch} cannot give {len(rates)} workers {min_batch} "
                         f"samples each")
    quota = global_batch * rates / rates.sum()
    sizes = np.floor(quota).astype(np.int64)
    order = np.argsort(-(quota - sizes), kind="stable")
    sizes[order[:global_batch - int(sizes.sum())]] += 1
    for m in range(len(sizes)):
        while sizes[m] < min_batch:
            sizes[int(np.argmax(sizes))] -= 1
            sizes[m] += 1
    return sizes.tolist()


@dataclass
class LBSGDOptions(SSGDOptions):
    """ssgd's options, then how the batches follow speeds."""

    batch_size: Optional[int] = option(None, "the nominal batch per worker (the global batch is workers x it)",
                                       from_job="batch_size")
    every: int = option(10, "steps between re-measuring speeds and re-sharing the global batch", flag="--lb-every")
    smoothing: float = option(0.5, "weight of the past in the speeds' moving average, in [0, 1)",
                              flag="--lb-smoothing")
    min_batch: int = option(1, "smallest batch a worker is given (at most --batch-size)", flag="--lb-min-batch")

    def __post_init__(self):
        super().__post_init__()
        if self.batch_size is None:  # (the job passes its --batch-size; a script must pass it itself)
            raise ValueError("batch_size is required: pass the nominal batch per worker to the optimizer, "
                             "DistributedOptimizer(..., algorithm='lb-sgd', batch_size=32), and draw each "
                             "batch's size from opt.strategy.batch_size (the global batch is workers x batch_size)")
        for name in ("batch_size", "every", "min_batch"):
            if not is_int_at_least(getattr(self, name), 1):
                raise ValueError(f"{name} must be an integer >= 1, got {getattr(self, name)!r}")
        if self.min_batch > self.batch_size:
            raise ValueError(f"min_batch must be at most batch_size ({self.batch_size}) so that every worker "
                             f"can have it, got {self.min_batch}")
        s = self.smoothing
        if isinstance(s, bool) or not isinstance(s, (int, float)) or not 0 <= s < 1:
            raise ValueError(f"smoothing (weight of the past in the speeds' moving average) must be in "
                             f"[0, 1), got {s!r}")


class LBSGD(SSGD):
    """lb-sgd: ssgd with the global batch shared among the workers by their measured speeds.

    Options (keyword options of ``DistributedOptimizer``):
        batch_size: the nominal batch per worker (required; the global batch is ``workers * batch_size``).
        every: steps between re-measures (default 10).
        smoothing: weight of the past in the speed's moving average (default 0.5).
        min_batch: smallest batch a worker is given (default 1).
        and ssgd's: backward_passes_per_step, compression, op, gradient_predivide_factor, ...

    Example::

        opt = ha.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters(),
                                      algorithm="lb-sgd", batch_size=32)
        x, y = next_batch(opt.strategy.batch_size)  # this worker's share of the step's global batch
    """

    def __init__(self, optimizer, named_parameters, transport, options):
        super().__init__(optimizer, named_parameters, transport, options)
        self.workers = transport.size
        self.global_batch = self.workers * options.batch_size
        self._meter = SpeedMeter(options.smoothing)
        self.size_history = []  # (step, every worker's batch size) at every change
        self._cursor = LockstepCursor(transport.rank, [options.batch_size] * self.workers)
        self._since, self._compute_end = self.clock(), None

    @property
    def batch_sizes(self) -> List[int]:
        """Every worker's batch size for the next step, in rank order."""
        return list(self._cursor.sizes)

    @property
    def batch_size(self) -> int:
        """This worker's batch size for the next step: draw this many samples."""
        return self._cursor.sizes[self.transport.rank]

    @property
    def grad_weight(self) -> float:  # type: ignore[override]  # read-only by design: from the sizes; nothing sets it
        return self.batch_size * self.workers / self.global_batch

    def batch_cursor(self):
        return self._cursor

    @property
    def speed(self) -> float:
        """Smoothed samples per second of this worker's compute (0.0 before the first measurement)."""
        return self._meter.speed

    def _end_compute(self) -> None:
        if self._compute_end is None:
            self._compute_end = self.clock()

    def _measure(self) -> None:
        elapsed, self._compute_end = self._compute_end - self._since, None
        self._meter.observe(self.batch_size * self.options.backward_passes_per_step, elapsed)

    def _reshare(self) -> None:
        """Collective: allgather the speeds; every worker sets the same sizes from them."""
        speeds = self.transport.allgather_object(float(self.speed))
        if min(speeds) <= 0:  # someone has not measured yet
            return
        sizes = share_batch(self.global_batch, speeds, self.options.min_batch)
        if sizes != self._cursor.sizes:
            self._cursor.set_sizes(sizes)
            self.size_history.append((self.steps, sizes))

    def synchronize(self) -> None:
        self._end_compute()  # (an explicit synchronize() before step(): its wait is not compute)
        super().synchronize()

    def step(self, closure=None):
        self._end_compute()
        result = super().step(closure)
        self._measure()
        if self.steps % self.options.every == 0:
            self._reshare()
        self._since = self.clock()  # the exchange is not compute
        return result

    def load_global_model(self) -> None:
        super().load_global_model()
        self._meter.skip_next()

    def state_dict(self):
        state = super().state_dict()
        state.update(batch_sizes=self.batch_sizes, speed=self.speed, cursor=self._cursor.position,
                     size_history=[[step, list(sizes)] for step, sizes in self.size_history])
        return state

    def load_state_dict(self, state):
        super().load_state_dict(state)
        self._cursor.set_sizes(state["batch_sizes"])
        self._cursor.position, self._meter.speed = int(state["cursor"]), float(state["speed"])
        self.size_history = [(int(step), list(sizes)) for step, sizes in state["size_history"]]
        self._meter.skip_next()

    def stats(self) -> ExchangeStats:
        out = super().stats()
        out.batch_size = self.batch_size
        out.extra.update(speed=self.speed, global_batch=self.global_batch)
        return out


class LBSGDAlgorithm(SSGDAlgorithm):
    """lb-sgd's declaration: ssgd's collectives, its own options."""

    Options = LBSGDOptions
    strategy = LBSGD

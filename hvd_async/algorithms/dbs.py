"""dbs-asgd: asgd whose batch sizes follow each worker's measured speed (Ji et al., 2019).

Each worker measures its speed ``s_m`` (samples per second of compute: the time between the end of
its previous ``step()`` and the start of this one, i.e. data, forward, backward, without the
exchange; smoothed by an exponential moving average), writes it into its slot of a table in the
servers' windows, and every ``every`` steps reads everyone's and sets its batch size to its share
of the global batch ``B = workers * batch_size``:

    b_m = clip(round(B * s_m / sum_j s_j), min_batch, max_batch)

so that a step takes about as long on every worker. Its gradient (the mean over its ``b_m``
samples) is weighted by its batch share, ``b_m / batch_size`` (1 when all are equally fast), before
the wrapped optimizer's local step, whose change is pushed as in asgd: each sample then counts the
same in the global weights, whichever worker drew it.

The batch size is read by the caller before drawing each batch (``opt.strategy.batch_size``, or
``opt.batch_size``); the job draws batches from :class:`hvd_async.sampling.SharedCursorBatches`
through ``transport.fetch_add_counter``, so that no sample is repeated or skipped within an epoch,
and a script's ``DataLoader`` does both with ``batch_sampler=hvd_async.DynamicBatchSampler(dataset, opt)``.

Choices: the measured time includes whatever the caller does between steps (data loading,
evaluation), as the paper's per-iteration time does; the first interval after construction or
``load_global_model()`` is not measured (it holds set-up or evaluation); workers that have not
reported yet count at the mean of those that have.
"""
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from ..checks import is_int_at_least
from ..options import option
from .asgd import ASGD, ASGDAlgorithm
from .base import ExchangeStats
from .groups import OptionGroup, PullEvery, PushRate, WorkerLookaheadOption
from .speed import SpeedMeter


@dataclass
class BatchSizingOptions(OptionGroup):
    """dbs-asgd's own options: the nominal batch and how batches follow speeds (before asgd's groups)."""

    batch_size: Optional[int] = option(None, "the nominal batch per worker", from_job="batch_size")
    every: int = option(10, "steps between re-measuring speeds and resizing batches (--batch-size is the "
                        "nominal batch; the global batch is workers x it)", flag="--dbs-every")
    smoothing: float = option(0.5, "weight of the past in the speeds' moving average, in [0, 1)",
                              flag="--dbs-smoothing")
    min_batch: int = option(1, "smallest batch a worker is given", flag="--dbs-min-batch")
    max_batch: Optional[int] = option(None, "largest batch a worker is given (default: none)",
                                      flag="--dbs-max-batch")

    def __post_init__(self):
        super().__post_init__()
        if self.batch_size is None:  # (the job passes its --batch-size; a script must pass it itself)
            raise ValueError("batch_size is required: pass the nominal batch per worker to the optimizer, "
                             "DistributedOptimizer(..., algorithm='dbs-asgd', batch_size=32), and draw each "
                             "batch's size from opt.strategy.batch_size (the global batch is workers x batch_size)")
        if not is_int_at_least(self.batch_size, 1):
            raise ValueError(f"batch_size (the nominal batch per worker; the global batch is "
                             f"workers x batch_size) must be an integer >= 1, got {self.batch_size!r}")
        for name in ("every", "min_batch"):
            if not is_int_at_least(getattr(self, name), 1):
                raise ValueError(f"{name} must be an integer >= 1, got {getattr(self, name)!r}")
        if self.max_batch is not None and not is_int_at_least(self.max_batch, self.min_batch):
            raise ValueError(f"max_batch must be an integer >= min_batch ({self.min_batch}), got {self.max_batch!r}")
        s = self.smoothing
        if isinstance(s, bool) or not isinstance(s, (int, float)) or not 0 <= s < 1:
            raise ValueError(f"smoothing (weight of the past in the speed's moving average) must be in "
                             f"[0, 1), got {s!r}")


@dataclass
class DBSASGDOptions(WorkerLookaheadOption, PushRate, PullEvery, BatchSizingOptions):
    """dbs-asgd's options: its batch sizing, then asgd's pull_every, push_rate, lookahead."""


class DBSASGD(ASGD):
    """dbs-asgd: asgd with each worker's batch size set to its share of the global batch by speed.

    Options:
        batch_size: the nominal batch per worker (required; global batch ``workers * batch_size``).
        every: steps between re-measures (default 10).
        smoothing: weight of the past in the speed's moving average (default 0.5).
        min_batch, max_batch: bounds of a worker's batch (default 1 and the global batch).
        pull_every, push_rate, lookahead: as asgd's.

    Example::

        opt = ha.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters(),
                                      algorithm="dbs-asgd", batch_size=32)
        loader = DataLoader(dataset, batch_sampler=ha.DynamicBatchSampler(dataset, opt))  # as many as told
    """

    def __init__(self, optimizer, named_parameters, transport, options):
        super().__init__(optimizer, named_parameters, transport, options)
        self.global_batch = transport.size * options.batch_size
        self.max_batch = options.max_batch or self.global_batch
        self.batch_size = options.batch_size
        self._meter = SpeedMeter(options.smoothing)
        self.share_history = []  # (step, batch size) at every change
        self._since = self.clock()

    def batch_cursor(self):
        return self.transport.fetch_add_counter

    @property
    def speed(self) -> float:
        """Smoothed samples per second of this worker's compute (0.0 before the first measurement)."""
        return self._meter.speed

    def _measure(self, used: int) -> None:
        now = self.clock()
        self._meter.observe(used, now - self._since)
        self._since = now

    def _resize(self) -> None:
        self.transport.publish_value(self.speed)
        speeds = self.transport.read_values()
        known = speeds[speeds > 0]
        if self.speed <= 0 or not len(known):
            return
        speeds = np.where(speeds > 0, speeds, known.mean())
        size = int(round(self.global_batch * self.speed / speeds.sum()))
        size = min(max(size, self.options.min_batch), self.max_batch)
        if size != self.batch_size:
            self.batch_size = size
            self.share_history.append((self.steps, size))

    def step(self, closure=None):
        used = self.batch_size  # the batch this gradient was computed on
        self._measure(used)
        weight = used / self.options.batch_size
        if weight != 1.0:
            with torch.no_grad():
                for p in self.model.params:
                    if p.grad is not None:
                        p.grad.mul_(weight)
        loss = super().step(closure)
        if self.steps % self.options.every == 0:
            self._resize()
        self._since = self.clock()  # the exchange is not compute
        return loss

    def load_global_model(self) -> None:
        super().load_global_model()
        self._meter.skip_next()

    def state_dict(self):
        state = super().state_dict()
        state.update(batch_size=self.batch_size, speed=self.speed,
                     share_history=[list(change) for change in self.share_history])
        return state

    def load_state_dict(self, state):
        super().load_state_dict(state)
        self.batch_size, self._meter.speed = int(state["batch_size"]), float(state["speed"])
        self.share_history = [tuple(change) for change in state["share_history"]]
        self._meter.skip_next()

    def stats(self) -> ExchangeStats:
        out = super().stats()
        out.batch_size = self.batch_size
        out.extra.update(speed=self.speed, global_batch=self.global_batch)
        return out


class DBSASGDAlgorithm(ASGDAlgorithm):
    """dbs-asgd's declaration: asgd's windows; not replayable (the batch sizes follow measured speeds,
    which a replay does not record: its registry row)."""

    Options = DBSASGDOptions
    strategy = DBSASGD

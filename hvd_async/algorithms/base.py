"""The strategy interface: when and what to exchange, through a transport, applying a rule."""
import abc
import dataclasses
from contextlib import contextmanager
from typing import Any, Dict, List, NamedTuple, Optional, Tuple

import torch



def parse_options(options_cls, algorithm: str, options: Dict[str, Any]):
    """Build the strategy's options dataclass; unknown keywords get an error listing the accepted."""
    accepted = [f.name for f in dataclasses.fields(options_cls)]
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise TypeError(f"unknown option(s) {', '.join(map(repr, unknown))} for algorithm "
                        f"{algorithm!r}; accepted: {', '.join(accepted) or 'none'}")
    return options_cls(**options)


class CompensationSums(NamedTuple):
    """What a compensating algorithm's servers added up over their applied pushes: ``||compensated
    step - g||^2``, ``||g||^2`` and the pushes (the metrics' compensation norms)."""

    compensation_sq: float
    grad_sq: float
    pushes: int


@dataclasses.dataclass
class ExchangeStats:
    """What a strategy reports of its exchange so far (:meth:`Strategy.stats`): the figures the training
    job, its metrics file and TensorBoard read are fields (None where the algorithm has no such
    figure); ``extra`` holds the algorithm's own, which ``DistributedOptimizer.stats()`` passes on to
    the user (the job reads none of them)."""

    staleness_mean: float = 0.0
    staleness_max: int = 0
    staleness_hist: Optional[List[int]] = None  # this worker's updates (pushes, moves) by staleness 0, 1, ...
    pushes: Optional[int] = None  # this worker's pushes (the parameter-server family)
    skipped_nonfinite: int = 0  # steps whose gradients held NaN or infinity, not applied
    exchange_wait_seconds: Optional[float] = None  # step() waiting for an exchange in flight (od-sgd, hpsgd, ...)
    server_ms_per_push: Optional[float] = None  # the server program's time per push, the busiest shard's
    inbox_slot_waits: Optional[int] = None  # this worker's pushes that waited for an inbox slot (a pool)
    dropped_pushes: Optional[int] = None  # every worker's pushes the servers dropped as late (backup-sgd)
    batch_size: Optional[int] = None  # this worker's batch, where the algorithm sizes it (dbs-asgd, lb-sgd)
    compensation: Optional[CompensationSums] = None  # the servers' compensation sums (dc-asgd, lc-asgd)
    extra: Dict[str, Any] = dataclasses.field(default_factory=dict)

    def as_dict(self) -> Dict[str, Any]:
        """One flat dict: the fields that are set, the compensation's sums under their own names
        (``server_pushes``, ``compensation_sq_sum``, ``grad_sq_sum``), then ``extra``."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
               if f.name not in ("compensation", "extra") and getattr(self, f.name) is not None}
        if self.compensation is not None:
            out.update(server_pushes=self.compensation.pushes, compensation_sq_sum=self.compensation.compensation_sq,
                       grad_sq_sum=self.compensation.grad_sq)
        out.update(self.extra)
        return out


def exchange_stats(strategy) -> "ExchangeStats":
    """``strategy.stats()``, checked: a strategy of a plugin that still returns a dict gets one line
    saying what to return instead."""
    stats = strategy.stats()
    if not isinstance(stats, ExchangeStats):
        raise TypeError(f"{type(strategy).__name__}.stats() returned a {type(stats).__name__}; return an "
                        f"hvd_async.algorithms.base.ExchangeStats (its fields are what the job reads, its "
                        f"extra dict holds the algorithm's own figures)")
    return stats


class Strategy(abc.ABC):
    """Drives one worker's side of an algorithm. Built by :class:`hvd_async.DistributedOptimizer` from
    the algorithm's declaration (:class:`hvd_async.algorithms.algorithm.Algorithm`: its options, its
    transport, its servers' program), it talks to that transport, never to MPI directly; subclasses
    implement ``step`` and the hooks below whose defaults do not fit them.
    """

    name: str = "strategy"  # the registry's name for the algorithm (DistributedOptimizer sets it on each)
    # Steps whose gradients held NaN or infinity and were therefore not applied, counted by the strategy
    # (``self.skipped_nonfinite += 1``): the training job stops after ``--max-nonfinite`` in a row.
    skipped_nonfinite: int = 0
    # This worker's gradients computed and then not applied by design (backup-sgd's late ones): the job
    # counts their samples as computed, not applied, in its samples per second.
    dropped_gradients: int = 0

    def __init__(self, optimizer: torch.optim.Optimizer, named_parameters: List[Tuple[str, torch.Tensor]],
                 transport, options):
        self.optimizer = optimizer
        self.named_parameters = named_parameters
        self.transport = transport
        self.options = options
        self.steps = 0
        self.reported_loss = None  # the mini-batch loss given to the next step() (lc-asgd sends it)
        self._should_synchronize = True  # False inside skip_synchronize()

    def batch_cursor(self):
        """``n -> first index`` of a fetch-and-add over the epoch's samples shared by all workers, where
        the algorithm sizes each worker's batches itself (dbs-asgd); None: the job's own split."""
        return None

    def after_evaluation(self) -> None:
        """The job evaluated after ``load_global_model()``; go on training from what this worker
        trains on (easgd evaluates the centre and trains its own weights)."""

    def clock(self) -> float:
        """Seconds on the transport's clock, for speeds and waits (the simulator's: virtual time)."""
        return self.transport.clock()

    def progress(self) -> int:
        """Updates made by all workers together so far."""
        return self.steps * self.transport.size

    @abc.abstractmethod
    def step(self, closure=None):
        """Exchange what the algorithm exchanges, then update the local model."""

    def begin(self) -> None:
        """Collective over the workers, once, before the first exchange: start every worker (and
        the servers) from worker 0's weights as they are now. Default: nothing to do."""

    def init_optimizer_state(self):
        """``horovod.torch.broadcast_optimizer_state`` creates a new optimizer's state with a step on
        zero gradients on every worker: a local step of the wrapped optimizer, no exchange (as
        Horovod's own optimizer does; where the rule runs on the servers that state goes unused,
        but the hyperparameters are then broadcast as under Horovod)."""
        return self.optimizer.step()

    def synchronize(self) -> None:
        """Make the local gradients final, as Horovod's ``synchronize()`` (only ssgd has reductions
        in flight after ``backward()``; the others exchange inside ``step()``)."""

    @contextmanager
    def skip_synchronize(self):
        """``step()`` inside it does not synchronize again (after an explicit ``synchronize()``)."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def load_global_model(self) -> None:
        """Collective over the workers: every worker's model becomes the global model (no-op where
        the workers' models are equal after every step)."""

    def check_zero_grad(self) -> None:
        """Raise if clearing gradients now would race with an exchange in flight."""

    def stats(self) -> ExchangeStats:
        """Staleness and exchange statistics so far, for the job's metrics."""
        return ExchangeStats(skipped_nonfinite=self.skipped_nonfinite)

    def state_dict(self) -> Dict[str, Any]:
        return {"steps": self.steps}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.steps = int(state["steps"])

    def close(self) -> None:
        """Release hooks and buffers (the transport is closed by its owner)."""

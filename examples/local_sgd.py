"""Local SGD (periodic model averaging), an algorithm added to hvd_async from outside the package.

Each worker takes ``period`` steps of its own optimizer on its own data, then the workers average
their weights (one fused Horovod allreduce). One averaging per ``period`` steps instead of one
allreduce per step: less communication, and a slow worker holds the others only at the averaging.
With ``period=1`` and plain SGD (no momentum) it computes what ssgd does. References: Stich,
"Local SGD converges fast and communicates little", ICLR 2019; Lin, Stich, Patel, Jaggi, "Don't use
large mini-batches, use local SGD", ICLR 2020.

Importing this file registers the algorithm ``local-sgd``; nothing inside ``hvd_async`` names it.

    hvd-async train --plugin examples/local_sgd.py --algo local-sgd --local-sgd-period 8
    hvd-async simulate --plugin examples/local_sgd.py --algo local-sgd --workers 16
    hvd-async train --config examples/local_sgd.yaml          # a preset that names the plugin

    # in a script of your own, after importing this module (or calling register() below):
    opt = hvd_async.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                         named_parameters=model.named_parameters(),
                                         algorithm="local-sgd", period=8)

The pieces a plugin supplies: an options dataclass whose fields are declared with
``hvd_async.option`` (each becomes a flag of ``hvd-async train`` and ``simulate`` and a key of their
YAML presets; ``__post_init__`` checks the values, once, for the Python API and the command line
alike), and a strategy: a subclass of ``hvd_async.algorithms.base.Strategy`` that talks to the
transport it is given (Horovod's collectives here; the simulator gives a simulated one) and never
to MPI directly; ``register_algorithm`` names the two together. (One that needs a hook of its own, a
transport or server program of its own, registers an ``hvd_async.algorithms.algorithm.Algorithm``
subclass instead: ``examples/staleness_asgd.py``.)
"""
from dataclasses import dataclass

import torch
from torch.nn.utils import parameters_to_vector, vector_to_parameters

import hvd_async
from hvd_async.algorithms.base import ExchangeStats, Strategy
from hvd_async.transport.base import ReduceOp

NAME = "local-sgd"


@dataclass
class LocalSGDOptions:
    period: int = hvd_async.option(4, "local steps between averagings of the workers' weights",
                                   flag="--local-sgd-period")

    def __post_init__(self):
        if isinstance(self.period, bool) or not isinstance(self.period, int) or self.period < 1:
            raise ValueError(f"period must be an integer >= 1 (local steps between averagings), "
                             f"got {self.period!r}")


class LocalSGD(Strategy):
    """Local steps of the wrapped optimizer (any optimizer); every ``period`` steps the workers'
    weights are replaced by their average. A step whose gradients hold NaN or infinity is skipped
    (counted in ``stats()['skipped_nonfinite']``) and still counts towards the period, so that every
    worker joins each averaging at the same step."""

    def __init__(self, optimizer, named_parameters, transport, options):
        super().__init__(optimizer, named_parameters, transport, options)
        self.params = [p for _, p in named_parameters]
        self.averagings = 0

    def begin(self) -> None:
        """Every worker starts from worker 0's weights."""
        self._exchange(lambda flat: self.transport.broadcast_(flat, root=0, name="local_sgd.begin"))

    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        grads = [p.grad for p in self.params if p.grad is not None]
        if all(bool(torch.isfinite(g).all()) for g in grads):
            self.optimizer.step()
        else:
            self.skipped_nonfinite += 1  # (Strategy's count: --max-nonfinite stops the job on it)
        self.steps += 1
        if self.steps % self.options.period == 0:
            self.load_global_model()
        return loss

    def load_global_model(self) -> None:
        """Collective: every worker's weights become the workers' average (also before evaluating)."""
        self._exchange(lambda flat: self.transport.allreduce_(flat, name="local_sgd.weights",
                                                              op=ReduceOp.AVERAGE))
        self.averagings += 1

    def _exchange(self, collective) -> None:
        with torch.no_grad():
            flat = parameters_to_vector(self.params)
            vector_to_parameters(collective(flat), self.params)

    def stats(self):
        return ExchangeStats(skipped_nonfinite=self.skipped_nonfinite, extra={"averagings": self.averagings})

    def state_dict(self):
        return {"steps": self.steps, "averagings": self.averagings, "skipped_nonfinite": self.skipped_nonfinite}

    def load_state_dict(self, state) -> None:
        self.steps, self.averagings = int(state["steps"]), int(state["averagings"])
        self.skipped_nonfinite = int(state.get("skipped_nonfinite", 0))


def register() -> None:
    hvd_async.register_algorithm(NAME, LocalSGD, options=LocalSGDOptions, summary="local SGD: local steps, the weights averaged "
                                 "every --local-sgd-period steps (an example plugin)",
                                 paper="Stich, ICLR 2019; Lin et al., ICLR 2020", uses_servers=False)


register()

"""DistributedOptimizer: holds the user's optimizer and hands exchange and update to an algorithm's strategy."""
import logging
from typing import Any, Dict, Iterable, List, Optional, Tuple

import torch

from . import registry, runtime
from .algorithms.base import parse_options
from .transport.base import Transport

logger = logging.getLogger(__name__)


def _named_parameters(optimizer, named_parameters) -> List[Tuple[str, torch.Tensor]]:
    params = [p for group in optimizer.param_groups for p in group["params"]]
    if named_parameters is None:
        return [(f"param.{i}", p) for i, p in enumerate(params)]
    try:
        named = list(named_parameters)
    except TypeError:
        raise TypeError(f"named_parameters must be an iterable of (name, parameter) pairs, e.g. "
                        f"model.named_parameters(); got {type(named_parameters).__name__}") from None
    if any(not (isinstance(item, tuple) and len(item) == 2) for item in named):
        raise ValueError("named_parameters must be (name, parameter) pairs, e.g. model.named_parameters()")
    names = [name for name, _ in named]
    dups = sorted({name for name in names if names.count(name) > 1})
    if dups:
        raise ValueError(f"parameter names must be unique; duplicated: {', '.join(dups)}")
    named_ids = {id(p) for _, p in named}
    unnamed = [i for i, p in enumerate(params) if id(p) not in named_ids]
    if unnamed:
        raise ValueError(f"named_parameters does not name {len(unnamed)} of the optimizer's parameters "
                         f"(positions {unnamed[:5]}); pass the model's named_parameters()")
    in_optimizer = {id(p) for p in params}
    return [(name, p) for name, p in named if id(p) in in_optimizer]


def _check_same_model(named, allgather) -> None:
    """Every worker must hold the same parameters (names, shapes, dtypes); fail on all of them if not."""
    mine = [(name, tuple(p.shape), str(p.dtype)) for name, p in named]
    everyone = allgather(mine)
    reference = everyone[0]
    for worker, theirs in enumerate(everyone[1:], start=1):
        for i, (a, b) in enumerate(zip(reference, theirs)):
            if a != b:
                raise ValueError(
                    f"workers hold different models: parameter #{i} is {a[0]!r} {a[1]} {a[2]} on "
                    f"worker 0 but {b[0]!r} {b[1]} {b[2]} on worker {worker}; every worker must "
                    f"build the same model")
        if len(reference) != len(theirs):
            raise ValueError(f"workers hold different models: worker 0 has {len(reference)} parameters, "
                             f"worker {worker} has {len(theirs)}; every worker must build the same model")


class DistributedOptimizer(torch.optim.Optimizer):
    """Wrap a PyTorch optimizer so that ``step()`` runs a distributed algorithm from the registry.

    A one-line change from ``horovod.torch.DistributedOptimizer``; the wrapped optimizer keeps its
    own state (momentum, Adam moments) and is reachable as ``.optimizer``.

    Args:
        optimizer: the local ``torch.optim.Optimizer``.
        named_parameters: ``model.named_parameters()``; names key the exchange and the checks.
        algorithm: one of :data:`hvd_async.ALGORITHMS` (``hvd_async.registry.built()`` lists those
            that run now).
        transport: the transport to use; by default the algorithm's own over this job's workers
            (Horovod collectives for ssgd, MPI windows on the servers for the parameter-server
            algorithms). Tests pass a loopback transport.
        **options: the algorithm's keyword options, checked here with errors that say what is
            accepted: ssgd ``backward_passes_per_step``, ``compression``, ``op``; asgd
            ``pull_every``; dc-asgd ``lam``, ``adaptive``, ``ms_momentum``; softsync ``n``,
            ``staleness_lr``; lc-asgd dc-asgd's and ``loss_term``, ``predictor``,
            ``predictor_options``, ``floor``, ``r_min``, ``r_max``, ``min_history``; dbs-asgd
            ``batch_size``, ``every``, ``smoothing``, ``min_batch``, ``max_batch``, ``pull_every``; od-sgd ``local_lr``, ``local_momentum``, ``local_optimizer``,
            ``local_schedule``, ``exchange``; hpsgd ``window``, ``merge_rate``, ``overlap``,
            ``keep_own_change``; gossip ``every``, ``variant``, ``topology``, ``seed``,
            ``progress_interval``; easgd ``tau``, ``alpha`` or ``rho``, ``synchronous``.

    Example::

        import hvd_async as ha
        ha.init()
        opt = ha.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                      named_parameters=model.named_parameters(), algorithm="ssgd")
        loss.backward(); opt.step(); opt.zero_grad()
    """

    def __init__(self, optimizer: torch.optim.Optimizer,
                 named_parameters: Optional[Iterable[Tuple[str, torch.Tensor]]] = None,
                 algorithm: str = "ssgd", *, transport=None, **options: Any):
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
        if isinstance(optimizer, DistributedOptimizer):
            raise TypeError("optimizer is already a hvd_async.DistributedOptimizer; wrap the plain one")
        if transport is not None and not isinstance(transport, Transport):
            raise TypeError(f"transport must be a hvd_async.transport.Transport, got "
                            f"{type(transport).__name__}; leave it out to use the algorithm's own")
        strategy_cls = registry.strategy_class(algorithm)
        parsed = parse_options(strategy_cls.Options, algorithm, options)
        named = _named_parameters(optimizer, named_parameters)
        strategy_cls.check_optimizer(optimizer)
        own_transport = transport is None
        if own_transport:
            _check_same_model(named, runtime._worker_runtime("DistributedOptimizer").group.allgather)
            transport = strategy_cls.make_transport(named, parsed)
        else:
            _check_same_model(named, transport.allgather_object)
        self.optimizer = optimizer
        self.algorithm = algorithm
        try:
            self.strategy = strategy_cls(optimizer, named, transport, parsed)
        except BaseException:
            if own_transport:
                transport.close()
            raise
        self.defaults = optimizer.defaults

    # The wrapped optimizer's state is the state: schedulers and users see it through these.
    @property
    def param_groups(self):
        return self.optimizer.param_groups

    @param_groups.setter
    def param_groups(self, value):
        self.optimizer.param_groups = value

    @property
    def state(self):
        return self.optimizer.state

    def __getstate__(self):
        raise TypeError("DistributedOptimizer cannot be pickled; save state_dict() instead")

    def __repr__(self):
        return f"DistributedOptimizer(algorithm={self.algorithm!r}, optimizer={self.optimizer!r})"

    def step(self, closure=None, *, loss=None):
        """Run the algorithm's step. ``loss``: this step's mini-batch loss (a float or a tensor), which
        the parameter-server algorithms send with the push (lc-asgd needs it)."""
        if loss is not None:
            self.strategy.reported_loss = float(loss)
        return self.strategy.step(closure)

    def synchronize(self) -> None:
        self.strategy.synchronize()

    def skip_synchronize(self):
        return self.strategy.skip_synchronize()

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.strategy.check_zero_grad()
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def add_param_group(self, param_group: Dict[str, Any]) -> None:
        raise NotImplementedError("add parameter groups to the optimizer before wrapping it")

    def stats(self) -> Dict[str, float]:
        """Staleness and exchange statistics of the algorithm so far."""
        return self.strategy.stats()

    def progress(self) -> int:
        """Updates made by all workers together so far, as this worker last saw it (the
        parameter-server algorithms count pushes; ssgd counts steps times workers)."""
        return self.strategy.progress()

    def state_dict(self) -> Dict[str, Any]:
        """The wrapped optimizer's state plus the algorithm's own (so a checkpoint resumes both)."""
        return {"algorithm": self.algorithm, "optimizer": self.optimizer.state_dict(),
                "strategy": self.strategy.state_dict()}

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        if not isinstance(state_dict, dict) or not {"algorithm", "optimizer", "strategy"} <= set(state_dict):
            raise ValueError("not a hvd_async.DistributedOptimizer state_dict (expected keys "
                             "'algorithm', 'optimizer', 'strategy')")
        if state_dict["algorithm"] != self.algorithm:
            raise ValueError(f"state_dict is from algorithm {state_dict['algorithm']!r}, this optimizer "
                             f"runs {self.algorithm!r}")
        self.optimizer.load_state_dict(state_dict["optimizer"])
        self.strategy.load_state_dict(state_dict["strategy"])

    def close(self) -> None:
        self.strategy.close()

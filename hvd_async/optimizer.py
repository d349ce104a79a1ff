"""DistributedOptimizer: holds the user's optimizer and hands exchange and update to an algorithm's strategy."""
import logging
import os
import sys
import warnings
from contextlib import contextmanager
from types import FrameType
from typing import Any, Dict, Iterable, Optional, Tuple

import torch

from . import checkpoint, runtime
from .algorithms.base import exchange_stats
from .horovod_options import HorovodOptions
from .transport.base import Transport
from .transport.window import WindowTransport
from .wrapping import wrap

logger = logging.getLogger(__name__)


# Horovod's words (horovod/torch/optimizer.py, 0.28.1), so that filters and tests written for Horovod match.
STEP_AFTER_SYNCHRONIZE = ("optimizer.step() called without optimizer.skip_synchronize() context after "
                          "optimizer.synchronize(). This can cause training slowdown. You may want to consider "
                          "using optimizer.skip_synchronize() context if you use optimizer.synchronize() in "
                          "your code.")


def _called_by_horovod_state_broadcast() -> bool:
    """Whether ``horovod.torch.broadcast_optimizer_state`` is calling ``step()`` right now to create
    a new optimizer's state (it sets zero gradients first; every worker calls it, a local step)."""
    frame: Optional[FrameType] = sys._getframe(2)
    for _ in range(3):
        if frame is None:
            return False
        if (frame.f_code.co_name == "broadcast_optimizer_state"
                and str(frame.f_globals.get("__name__", "")).startswith("horovod.")):
            return True
        frame = frame.f_back
    return False


def _stepped_on_the_servers(optimizer: torch.optim.Optimizer) -> None:
    """Record that ``optimizer`` has stepped, as torch's LR schedulers see a step: a scheduler built on
    it wraps its ``step`` to set ``_opt_called`` (torch/optim/lr_scheduler.py, ``patch_track_step_called``)
    and warns at its first ``step()`` ("Detected call of `lr_scheduler.step()` before
    `optimizer.step()`") where that is unset. Where the rule runs on the servers, the wrapped SGD's
    step is theirs (with its param_groups' rate, read at each push) and its ``step`` is never called
    here, so the wrapper's step marks it instead."""
    optimizer._opt_called = True  # type: ignore[attr-defined]  # torch's LR schedulers' flag, not in its stubs


class DistributedOptimizer(torch.optim.Optimizer):
    """Wrap a PyTorch optimizer so that ``step()`` runs a distributed algorithm from the registry.

    A drop-in for ``horovod.torch.DistributedOptimizer``: the same keyword options, the wrapped
    optimizer's ``state_dict()`` in torch's own format (so ``hvd.broadcast_optimizer_state``,
    ``torch.save`` checkpoints and schedulers work), ``synchronize()`` / ``skip_synchronize()`` for
    gradient clipping, ``_parameter_names``. The wrapped optimizer keeps its own state (momentum,
    Adam moments) and is reachable as ``.optimizer``.

    Args:
        optimizer: the local ``torch.optim.Optimizer``.
        named_parameters: ``model.named_parameters()``; names key the exchange and the checks.
        algorithm: one of :data:`hvd_async.ALGORITHM_NAMES`.
        transport: the transport to use; by default the algorithm's own over this job's workers
            (Horovod collectives for ssgd, MPI windows on the servers for the parameter-server
            algorithms). Tests pass a loopback transport.
        comms: what the algorithm's own transport is opened over (``make_transport``): by default this
            worker's communicators (:func:`hvd_async.runtime.comms`, MPI and Horovod); the simulator
            passes its stand-in, which opens simulated transports through the same factory.
        compression, backward_passes_per_step, op, gradient_predivide_factor, num_groups, groups,
            sparse_as_dense, process_set: Horovod's options, with Horovod's defaults and meaning
            (docs/guide.md, "Drop-in for a Horovod script"): where an algorithm gives one no
            meaning, a value other than the default is refused with the algorithms where it works.
        **options: the algorithm's own keyword options, checked here with errors that say what is
            accepted (``hvd-async algorithms`` and docs/guide.md list them).

    The weights every worker starts from are worker 0's at the first ``step()`` (or
    ``load_global_model()``), which is collective over the workers once: broadcasts and checkpoint
    loads made after building the optimizer (Horovod's order) reach the parameter servers.

    Example::

        import hvd_async as ha
        ha.init()
        opt = ha.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                      named_parameters=model.named_parameters(), algorithm="ssgd")
        loss.backward(); opt.step(); opt.zero_grad()
    """

    def __init__(self, optimizer: torch.optim.Optimizer,
                 named_parameters: Optional[Iterable[Tuple[str, torch.Tensor]]] = None,
                 algorithm: str = "ssgd", *, transport=None, comms=None, compression=None,
                 backward_passes_per_step: int = 1, op="average", gradient_predivide_factor: float = 1.0,
                 num_groups: int = 0, groups=None, sparse_as_dense: bool = False, process_set=None,
                 **options: Any):
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
        if isinstance(optimizer, DistributedOptimizer):
            raise TypeError("optimizer is already a hvd_async.DistributedOptimizer; wrap the plain one")
        if transport is not None and not isinstance(transport, Transport):
            raise TypeError(f"transport must be a hvd_async.transport.Transport, got "
                            f"{type(transport).__name__}; leave it out to use the algorithm's own")
        hvd_options = HorovodOptions(compression, backward_passes_per_step, op, gradient_predivide_factor,
                                     num_groups, groups, sparse_as_dense, process_set)
        wrapped = wrap(optimizer, named_parameters, algorithm, hvd_options, options, transport=transport,
                       comms=comms)
        self.optimizer = optimizer
        self.algorithm = algorithm
        self._declaration = wrapped.declaration
        self.horovod_options = hvd_options
        self.strategy = wrapped.strategy
        self._parameter_names = {p: name for name, p in wrapped.named}  # Horovod's attribute, same meaning
        self._begun = False
        self._own_transport, self._registered = wrapped.own, wrapped.registered
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

    def begin(self) -> None:
        """Collective over the workers, once: the exchange starts from worker 0's weights as they
        are now (after the user's broadcasts or checkpoint load). The first ``step()``,
        ``load_global_model()`` or ``close()`` calls it; call it yourself where every worker must
        have started before the first step (e.g. steps taken under a lock of the workers)."""
        if not self._begun:
            self._begun = True
            self.strategy.begin()

    def step(self, closure=None, *, loss=None):
        """Run the algorithm's step. ``loss``: this step's mini-batch loss (a float or a tensor), which
        the parameter-server algorithms send with the push (lc-asgd needs it)."""
        if _called_by_horovod_state_broadcast():
            return self.strategy.init_optimizer_state()
        if self._should_synchronize and self._synchronized:  # once per such step, as Horovod
            warnings.warn(STEP_AFTER_SYNCHRONIZE, stacklevel=2)
        self._synchronized = False
        self.begin()
        if loss is not None:  # (a loss that requires grad is read detached, as the caller's own .item())
            self.strategy.reported_loss = float(loss.detach() if torch.is_tensor(loss) else loss)
        result = self.strategy.step(closure)
        if not self._declaration.runs_user_optimizer:
            _stepped_on_the_servers(self.optimizer)
        return result

    def synchronize(self) -> None:
        """Make this worker's gradients final, as Horovod's: ssgd waits for its allreduces (the
        averaged gradient can then be clipped); the other algorithms exchange in ``step()``, so the
        local gradient already is final. Follow it with ``with opt.skip_synchronize(): opt.step()``.
        To give every worker the global weights, call :meth:`load_global_model`."""
        self.strategy.synchronize()
        self._synchronized = True

    _synchronized = False  # synchronize() was called since the last step() (Horovod's attribute)
    _should_synchronize = True  # False inside skip_synchronize() (Horovod's attribute)
    _algorithm_state_taken = False  # algorithm_state_dict() was called: state_dict() then warns not
    _state_warned = False

    @contextmanager
    def skip_synchronize(self):
        """Inside it, ``step()`` does not call ``synchronize()`` again (after an explicit one)."""
        self._should_synchronize = False
        try:
            with self.strategy.skip_synchronize():
                yield
        finally:
            self._should_synchronize = True

    def load_global_model(self) -> None:
        """Collective over the workers: every worker's model becomes the global one (the servers'
        weights, easgd's centre, gossip's exact average, hpsgd's merged model; ssgd's workers hold
        it already). Call it on every worker before evaluating or saving the model."""
        self.begin()
        self.strategy.load_global_model()

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.strategy.check_zero_grad()
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def add_param_group(self, param_group: Dict[str, Any]) -> None:
        raise NotImplementedError("add parameter groups to the optimizer before wrapping it")

    def stats(self) -> Dict[str, Any]:
        """Staleness and exchange statistics of the algorithm so far, as one flat dict (the strategy's
        :class:`~hvd_async.algorithms.base.ExchangeStats`, ``as_dict()``)."""
        return exchange_stats(self.strategy).as_dict()

    def progress(self) -> int:
        """Updates made by all workers together so far, as this worker last saw it (the
        parameter-server algorithms count pushes; ssgd counts steps times workers)."""
        return self.strategy.progress()

    def state_dict(self) -> Dict[str, Any]:
        """The wrapped optimizer's state, in torch's format (local: no exchange). The algorithm's
        own state (counters, server shards) is :meth:`algorithm_state_dict`: where the update runs on
        the servers (dc-asgd, lc-asgd, softsync, od-sgd, backup-sgd) the first call warns once, unless
        that was taken first, since a Horovod-style checkpoint of this alone would not resume them."""
        if not (self._declaration.runs_user_optimizer or self._algorithm_state_taken or self._state_warned
                or _called_by_horovod_state_broadcast()):
            self._state_warned = True
            warnings.warn(f"opt.state_dict() under {self.algorithm} holds the wrapped optimizer's settings only: "
                          f"the servers' momentum and the algorithm's state are not in it. To resume, save "
                          f"opt.algorithm_state_dict() beside it (after opt.load_global_model(), on every worker) "
                          f"and put it back with opt.load_algorithm_state_dict()", UserWarning, stacklevel=2)
        return self.optimizer.state_dict()

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Load the wrapped optimizer's state (torch's format; local, e.g. on rank 0 only before
        ``hvd.broadcast_optimizer_state``). A whole state as written by earlier hvd_async versions
        (``'algorithm'``, ``'optimizer'``, ``'strategy'``) also loads the algorithm's part, which is
        collective (see :meth:`load_algorithm_state_dict`)."""
        self._synchronized = False  # (as Horovod's: no step-after-synchronize warning across a load)
        if isinstance(state_dict, dict) and {"algorithm", "optimizer", "strategy"} <= set(state_dict):
            self.optimizer.load_state_dict(state_dict["optimizer"])
            self.load_algorithm_state_dict(state_dict)
            return
        if not isinstance(state_dict, dict) or not {"state", "param_groups"} <= set(state_dict):
            raise ValueError("not an optimizer state_dict (expected torch's keys 'state' and "
                             "'param_groups', from opt.state_dict())")
        self.optimizer.load_state_dict(state_dict)

    def algorithm_state_dict(self, shard_dir: Optional[str] = None) -> Dict[str, Any]:
        """The algorithm's own state (counters; on worker 0 the servers' shards: weights, versions,
        the rules' buffers), for exact resume. Take it on every worker after
        :meth:`load_global_model` (nothing in flight). ``shard_dir``: a folder every server can
        write (on a shared file system across hosts), where each server writes its own shard to a
        file of its own (``shard-<k>.pt``, atomic), streamed from its tensors: nothing is sent to
        worker 0, whose state then names the files; load it with the same folder."""
        self.begin()
        self._algorithm_state_taken = True
        with self._shard_dir(shard_dir):
            return {"algorithm": self.algorithm, "version": checkpoint.ALGORITHM_STATE_VERSION,
                    "strategy": self.strategy.state_dict()}

    @contextmanager
    def _shard_dir(self, shard_dir: Optional[str]):
        """The servers write (read) their shards in ``shard_dir`` for the duration, where they are
        servers of windows (other transports keep no shards)."""
        transport = self.strategy.transport
        if shard_dir is None or not isinstance(transport, WindowTransport):
            yield
            return
        transport.shard_dir = os.path.abspath(shard_dir)
        try:
            yield
        finally:
            transport.shard_dir = None

    def load_algorithm_state_dict(self, state: Dict[str, Any], shard_dir: Optional[str] = None) -> None:
        """Put back :meth:`algorithm_state_dict`'s state; collective over the workers (worker 0
        restores the servers; nobody exchanges before they are restored). ``shard_dir``: the folder
        of the servers' own files, for a state taken with one."""
        if not isinstance(state, dict) or not {"algorithm", "strategy"} <= set(state):
            raise ValueError("not a hvd_async algorithm state (expected keys 'algorithm' and 'strategy', "
                             "from opt.algorithm_state_dict())")
        checkpoint.check_algorithm_state_version(state)
        if state["algorithm"] != self.algorithm:
            raise ValueError(f"the state is from algorithm {state['algorithm']!r}, this optimizer "
                             f"runs {self.algorithm!r}")
        self.begin()
        with self._shard_dir(shard_dir):
            self.strategy.load_state_dict(state["strategy"])

    def close(self) -> None:
        self.begin()  # a worker that never stepped still meets the others' first exchange
        self.strategy.close()
        if self._own_transport:  # (one the caller passed in is the caller's to close)
            self.strategy.transport.close()
        if self._registered:
            runtime.unregister_transport(self.strategy.transport)

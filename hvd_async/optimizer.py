"""DistributedOptimizer: holds the user's optimizer and hands exchange and update to an algorithm's strategy."""
import dataclasses
import logging
import os
import sys
import warnings
from contextlib import contextmanager
from types import FrameType
from typing import Any, Dict, Iterable, List, Optional, Tuple

import torch

from . import checkpoint, registry, runtime
from .algorithms.base import exchange_stats, parse_options
from .horovod_options import HorovodOptions, check_supported
from .transport.base import Transport
from .transport.window import WindowTransport

logger = logging.getLogger(__name__)


# Options accepted under every algorithm (the strategies need not know): torch sums gradients over
# backward passes by itself; the algorithms other than ssgd exchange one dense flat buffer whatever
# the gradients' layout, and leave a sparse gradient sparse for the user's optimizer, as Horovod
# hands it back after densifying.
_WRAPPER_OPTIONS = ("backward_passes_per_step", "sparse_as_dense")
_HOROVOD_FIELDS = tuple(f.name for f in dataclasses.fields(HorovodOptions))


def _supported(declaration) -> set:
    """The Horovod options that mean something under an algorithm's ``declaration``: the wrapper's, and
    those its options dataclass declares."""
    return set(_WRAPPER_OPTIONS) | {f.name for f in dataclasses.fields(declaration.Options)}


def _where_supported() -> Dict[str, List[str]]:
    """Each Horovod option -> the algorithms that give it a meaning (for the error messages)."""
    table: Dict[str, List[str]] = {name: [] for name in _HOROVOD_FIELDS}
    for algorithm in registry.names():
        for name in _supported(registry.algorithm(algorithm)) & set(table):
            table[name].append(algorithm)
    return table


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


def _named_parameters(optimizer, named_parameters) -> List[Tuple[str, torch.Tensor]]:
    params = [p for group in optimizer.param_groups for p in group["params"]]
    if named_parameters is None:  # Horovod's names for unnamed parameters
        return [(f"allreduce.noname.{i}", p) for i, p in enumerate(params)]
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
    # A tensor named twice (tied weights, named_parameters(remove_duplicate=False)) is exchanged once,
    # under the last of its names in sorted order, as Horovod's ``{p: name for name, p in sorted(...)}``.
    last_name = {id(p): name for name, p in sorted(named, key=lambda item: item[0])}
    return [(name, p) for name, p in named if id(p) in in_optimizer and last_name[id(p)] == name]


def _exchanged(named: List[Tuple[str, torch.Tensor]]) -> List[Tuple[str, torch.Tensor]]:
    """The parameters the algorithm exchanges and steps: those that require grad, as Horovod hooks
    and sends only those. A frozen one (``requires_grad=False``: a fine-tuned model's backbone)
    stays bit for bit as it is on every worker, under every algorithm; it is read when the optimizer
    is built, as Horovod registers its hooks then."""
    trained = [(name, p) for name, p in named if p.requires_grad]
    if named and not trained:
        raise ValueError(f"none of the optimizer's {len(named)} parameters requires grad, so there is "
                         f"nothing to train or exchange; unfreeze some (p.requires_grad_(True)) before "
                         f"building the DistributedOptimizer")
    return trained


_servers_served = False  # a DistributedOptimizer of this job has used its server ranks


def _check_servers_serve(algorithm: str, options: Dict[str, Any]) -> None:
    """Refuse an algorithm without servers in a job whose server ranks no optimizer has used: they would
    sit idle, the job training on fewer processes than it has (the command line refuses it alike)."""
    global _servers_served
    servers = runtime.num_servers()
    if registry.uses_servers(algorithm, options):
        _servers_served = True
    elif servers and not _servers_served:
        raise RuntimeError(f"algorithm {algorithm!r} uses no parameter server, but hvd_async.init(servers={servers}) "
                           f"set {servers} of the job's {runtime.world_size()} processes aside as servers: they "
                           f"would sit idle while {runtime.size()} train; call hvd_async.init(servers=0) so that "
                           f"every process trains (a job that also runs a parameter-server algorithm: build "
                           f"that optimizer first)")


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
        declaration = registry.algorithm(algorithm)
        hvd_options = HorovodOptions(compression, backward_passes_per_step, op, gradient_predivide_factor,
                                     num_groups, groups, sparse_as_dense, process_set)
        supported = _supported(declaration)
        check_supported(algorithm, supported, hvd_options, _where_supported())
        declared = {f.name for f in dataclasses.fields(declaration.Options)}
        for name, value in hvd_options.non_default().items():  # to the strategy, where it declares them
            if name in declared:
                options.setdefault(name, value)
        parsed = parse_options(declaration.Options, algorithm, options)
        named = _exchanged(_named_parameters(optimizer, named_parameters))
        declaration.check_optimizer(optimizer)
        if transport is not None and comms is not None:
            raise TypeError("give transport (one built already) or comms (what the algorithm's own is opened "
                            "over), not both")
        own_transport, registered = transport is None, transport is None and comms is None
        # every worker's model is checked once: over this job's workers before anything opens, or (a
        # transport given, the simulator's comms, a process set: its members, a worker outside it alone)
        # over the transport
        model_checked_first = registered and hvd_options.process_set is None
        if registered:  # this job's runtime: its servers, and its exit hook closes what is left open
            comms = runtime.comms("DistributedOptimizer")
            _check_servers_serve(algorithm, options)
        if model_checked_first:
            _check_same_model(named, comms.group.allgather)
        if own_transport:
            transport = declaration.make_transport(named, parsed, comms)
        if not model_checked_first:
            _check_same_model(named, transport.allgather_object)
        self.optimizer = optimizer
        self.algorithm = algorithm
        self._declaration = declaration
        self.horovod_options = hvd_options
        self._parameter_names = {p: name for name, p in named}  # Horovod's attribute, same meaning
        self._begun = False
        try:
            self.strategy = declaration.strategy(optimizer, named, transport, parsed)
            self.strategy.name = algorithm  # (for its messages)
        except BaseException:
            # Not closed here: closing waits for the other workers, which built theirs and wait for
            # this one at the first step; the error goes up first (uncaught, it ends the job with its
            # traceback), and the exit hook closes the transport if the script goes on.
            if registered:
                runtime.register_transport(transport)
            raise
        self._own_transport, self._registered = own_transport, registered
        if registered:  # one this optimizer built: closed at shutdown if the script never closes it
            runtime.register_transport(transport)
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

"""What :class:`~hvd_async.DistributedOptimizer` decides and checks when it wraps an optimizer: the
Horovod options that mean something under the algorithm, the parameters it exchanges (named as
Horovod names them, frozen ones left out), that every worker holds the same model, that the job's
server ranks serve, and the algorithm's strategy over its transport (:func:`wrap`)."""
import dataclasses
from typing import Any, Dict, List, NamedTuple, Tuple

import torch

from . import registry, runtime
from .algorithms.base import Strategy, parse_options
from .horovod_options import HorovodOptions, check_supported

# Options accepted under every algorithm (the strategies need not know): torch sums gradients over
# backward passes by itself; the algorithms other than ssgd exchange one dense flat buffer whatever
# the gradients' layout, and leave a sparse gradient sparse for the user's optimizer, as Horovod
# hands it back after densifying.
_WRAPPER_OPTIONS = ("backward_passes_per_step", "sparse_as_dense")
_HOROVOD_FIELDS = tuple(f.name for f in dataclasses.fields(HorovodOptions))


def supported(declaration) -> set:
    """The Horovod options that mean something under an algorithm's ``declaration``: the wrapper's, and
    those its options dataclass declares."""
    return set(_WRAPPER_OPTIONS) | {f.name for f in dataclasses.fields(declaration.Options)}


def where_supported() -> Dict[str, List[str]]:
    """Each Horovod option -> the algorithms that give it a meaning (for the error messages)."""
    table: Dict[str, List[str]] = {name: [] for name in _HOROVOD_FIELDS}
    for algorithm in registry.names():
        for name in supported(registry.algorithm(algorithm)) & set(table):
            table[name].append(algorithm)
    return table


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


def check_servers_serve(algorithm: str, options: Dict[str, Any]) -> None:
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


def check_same_model(named, allgather) -> None:
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


class Wrapped(NamedTuple):
    """What :func:`wrap` built: the algorithm's declaration, the parameters it exchanges (name,
    tensor), its strategy over its transport, whether the transport is the optimizer's own to close
    (``own``) and whether the job's runtime tracks it (``registered``: closed at shutdown if the script
    never closes it)."""

    declaration: Any
    named: List[Tuple[str, torch.Tensor]]
    strategy: Strategy
    own: bool
    registered: bool


def wrap(optimizer: torch.optim.Optimizer, named_parameters, algorithm: str, hvd_options: HorovodOptions,
         options: Dict[str, Any], *, transport=None, comms=None) -> Wrapped:
    """Check the options and the model, open the algorithm's transport (unless one is given) and build
    its strategy over it (see :class:`~hvd_async.DistributedOptimizer`'s arguments)."""
    declaration = registry.algorithm(algorithm)
    check_supported(algorithm, supported(declaration), hvd_options, where_supported())
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
    own, registered = transport is None, transport is None and comms is None
    # every worker's model is checked once: over this job's workers before anything opens, or (a
    # transport given, the simulator's comms, a process set: its members, a worker outside it alone)
    # over the transport
    model_checked_first = registered and hvd_options.process_set is None
    if registered:  # this job's runtime: its servers, and its exit hook closes what is left open
        comms = runtime.comms("DistributedOptimizer")
        check_servers_serve(algorithm, options)
    if model_checked_first:
        check_same_model(named, comms.group.allgather)
    if transport is None:
        transport = declaration.make_transport(named, parsed, comms)
    if not model_checked_first:
        check_same_model(named, transport.allgather_object)
    try:
        strategy = declaration.strategy(optimizer, named, transport, parsed)
        strategy.name = algorithm  # (for its messages)
    except BaseException:
        # Not closed here: closing waits for the other workers, which built theirs and wait for
        # this one at the first step; the error goes up first (uncaught, it ends the job with its
        # traceback), and the exit hook closes the transport if the script goes on.
        if registered:
            runtime.register_transport(transport)
        raise
    if registered:  # one this optimizer built: closed at shutdown if the script never closes it
        runtime.register_transport(transport)
    return Wrapped(declaration, named, strategy, own, registered)

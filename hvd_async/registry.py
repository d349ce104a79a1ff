"""The one table of algorithm names: what each is, where it comes from, its capabilities and its
declaration (:class:`~hvd_async.algorithms.algorithm.Algorithm`: options, strategy, hooks); the ones
built in, and those a plugin adds (:func:`register`, the ``hvd_async.algorithms`` entry points, or a
module named by ``--plugin``)."""
import dataclasses
import importlib.util
import os
import sys
from dataclasses import dataclass
from importlib import import_module
from typing import TYPE_CHECKING, Any, Dict, Iterable, Optional, Tuple, Type, Union

if TYPE_CHECKING:
    from .algorithms.algorithm import Algorithm

ENTRY_POINTS = "hvd_async.algorithms"  # entry-point group: name = "module:function or Algorithm subclass"


@dataclass(frozen=True)
class AlgorithmInfo:
    """One row of the registry: what an algorithm is, and the capabilities the job, the simulator and
    the tools choose by, declared here once.

    Attributes:
        name: the name users pass as ``algorithm=`` / ``--algo``.
        summary: one line on what it does.
        paper: where the update rule comes from.
        uses_servers: whether it keeps global weights on parameter-server ranks (the default
            ``servers`` of the training job is 1 for these and 0 for the others; its declaration's
            ``uses_servers`` hook may say otherwise for some options).
        declaration: ``"module:Class"`` of its declaration (an
            :class:`~hvd_async.algorithms.algorithm.Algorithm` subclass), or the class itself (a plugin's).
        plugin: where a plugin algorithm came from (None for the built-in ones).
        synchronous: every update waits for the workers it takes (ssgd, hpsgd's rounds, backup-sgd's
            steps); False for the asynchronous family, which the stress tests exercise.
        peer_windows: it exchanges through one-sided windows among the workers (the simulator runs
            them; ``--deterministic`` cannot fix their order).
        replayable: each push is one update applied where it lands, so ``simulate --replay`` can follow
            the order of a recorded run.
    """

    name: str
    summary: str
    paper: str
    uses_servers: bool
    declaration: Union[str, type]
    plugin: Optional[str] = None
    synchronous: bool = False
    peer_windows: bool = False
    replayable: bool = False


_ROWS = (
    AlgorithmInfo("ssgd", "synchronous SGD: Horovod allreduce of gradients every step (the baseline)",
                  "Sergeev & Del Balso, Horovod, arXiv 1802.05799", False,
                  "hvd_async.algorithms.ssgd:SSGDAlgorithm", synchronous=True),
    AlgorithmInfo("asgd", "asynchronous SGD on a parameter server held in MPI windows",
                  "Dean et al., NIPS 2012 (Downpour)", True, "hvd_async.algorithms.asgd:ASGDAlgorithm",
                  replayable=True),
    AlgorithmInfo("dc-asgd", "ASGD with delay compensation lam * g * g * (w - w_bak)",
                  "Zheng et al., ICML 2017", True, "hvd_async.algorithms.dcasgd:DCASGDAlgorithm", replayable=True),
    AlgorithmInfo("lc-asgd", "ASGD compensated by per-worker loss prediction on the server",
                  "Li, He, Ren, Mao, ICPP 2020", True, "hvd_async.algorithms.lcasgd:LCASGDAlgorithm",
                  replayable=True),
    AlgorithmInfo("od-sgd", "one-step delay SGD: global step on the server, local compensating step",
                  "Xu et al., arXiv 2005.06728", True, "hvd_async.algorithms.odsgd:ODSGDAlgorithm"),
    AlgorithmInfo("hpsgd", "hierarchical parallel SGD: exchange overlapped with local training",
                  "Zhou et al., arXiv 2009.02701", False, "hvd_async.algorithms.hpsgd:HPSGDAlgorithm",
                  synchronous=True),
    AlgorithmInfo("gossip", "gossip aggregation with a random peer through MPI windows",
                  "Jin, Yuan, Iandola, Keutzer, arXiv 1611.04581", False,
                  "hvd_async.algorithms.gossip:GossipAlgorithm", peer_windows=True),
    AlgorithmInfo("easgd", "elastic averaging SGD with the centre variable on the server",
                  "Zhang, Choromanska, LeCun, NIPS 2015", True, "hvd_async.algorithms.easgd:EASGDAlgorithm"),
    AlgorithmInfo("softsync", "n-softsync: apply the mean of every floor(N/n) gradients (rate / staleness: "
                  "--softsync-staleness-lr)",
                  "Zhang, Gupta et al., IJCAI 2016", True,
                  "hvd_async.algorithms.softsync:SoftSyncAlgorithm"),
    AlgorithmInfo("dbs-asgd", "ASGD with batch sizes set by each worker's measured speed",
                  "Ji et al., 2019", True, "hvd_async.algorithms.dbs:DBSASGDAlgorithm"),
    AlgorithmInfo("backup-sgd", "synchronous SGD with backup workers: each step the first N-b gradients, "
                  "the b late ones dropped", "Chen et al., arXiv 1604.00981 (2016)", True,
                  "hvd_async.algorithms.backup:BackupSGDAlgorithm", synchronous=True),
    AlgorithmInfo("lb-sgd", "synchronous SGD with the global batch shared by each worker's measured speed",
                  "Chen et al., LB-BSP, SoCC 2020", False, "hvd_async.algorithms.lbsgd:LBSGDAlgorithm",
                  synchronous=True),
)

ALGORITHMS: Dict[str, AlgorithmInfo] = {row.name: row for row in _ROWS}
NAMES: Tuple[str, ...] = tuple(ALGORITHMS)  # the built-in ones; names() adds the plugins'


def names() -> Tuple[str, ...]:
    """Every algorithm name: the built-in ones, then the plugins' in the order they registered."""
    _load_entry_points()
    return tuple(ALGORITHMS)


def get(name: str) -> AlgorithmInfo:
    """The registry row for ``name``; ``ValueError`` naming the accepted names otherwise."""
    _load_entry_points()
    try:
        return ALGORITHMS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown algorithm {name!r}; choose one of: {', '.join(ALGORITHMS)} (an algorithm "
                         f"of your own: hvd_async.register_algorithm, or --plugin MODULE)") from None


def register(name: str, algorithm: type, *, summary: str, paper: str = "", uses_servers: bool = False,
             options: Optional[type] = None, synchronous: bool = False, peer_windows: bool = False,
             replayable: bool = False, replace: bool = False) -> AlgorithmInfo:
    """Add an algorithm: ``algorithm`` is its declaration, a subclass of
    :class:`hvd_async.algorithms.algorithm.Algorithm` (its ``Options`` dataclass, whose fields declared
    with :func:`hvd_async.options.option` become flags of ``hvd-async train`` and ``simulate``, its
    ``strategy`` and the hooks it overrides), or, for one that needs no hook, its
    :class:`~hvd_async.algorithms.base.Strategy` subclass with ``options=`` its options dataclass. The
    keywords after ``paper`` are its capabilities (:class:`AlgorithmInfo`). Then
    ``DistributedOptimizer(..., algorithm=name)``, ``--algo name``, presets and the simulator run it.
    Registering the same class again is a no-op; another class under a taken name is refused unless
    ``replace`` (never for a built-in name)."""
    from .algorithms.algorithm import Algorithm
    from .algorithms.base import Strategy

    if not (isinstance(name, str) and name and name.strip() == name and " " not in name):
        raise ValueError(f"algorithm name must be a non-empty string without spaces, got {name!r}")
    if isinstance(algorithm, type) and issubclass(algorithm, Strategy):
        if options is None:
            raise TypeError(f"register({name!r}, {algorithm.__name__}): give its options dataclass as options= "
                            f"(an empty one where it takes none), or register an Algorithm subclass")
        old = ALGORITHMS.get(name)
        if old is not None and getattr(old.declaration, "strategy", None) is algorithm:
            return old  # (the same strategy registered again)
        algorithm = type(f"{algorithm.__name__}Algorithm", (Algorithm,), {"Options": options, "strategy": algorithm,
                                                                          "__module__": algorithm.__module__})
    if not (isinstance(algorithm, type) and issubclass(algorithm, Algorithm)):
        raise TypeError(f"register({name!r}, ...): give a subclass of hvd_async.algorithms.algorithm.Algorithm "
                        f"(or a Strategy subclass with options=), got {algorithm!r}")
    if not dataclasses.is_dataclass(getattr(algorithm, "Options", None)):
        raise TypeError(f"register({name!r}, ...): {algorithm.__name__}.Options must be a dataclass (an empty "
                        f"one where it takes no options)")
    if not (isinstance(getattr(algorithm, "strategy", None), type) and issubclass(algorithm.strategy, Strategy)):
        raise TypeError(f"register({name!r}, ...): {algorithm.__name__}.strategy must be a subclass of "
                        f"hvd_async.algorithms.base.Strategy")
    old = ALGORITHMS.get(name)
    if old is not None and old.declaration is not algorithm:
        if old.plugin is None or not replace:
            raise ValueError(f"algorithm {name!r} is taken ({'built in' if old.plugin is None else old.plugin}); "
                             f"register yours under another name")
    _named(algorithm, name)
    module = sys.modules.get(algorithm.__module__)
    row = AlgorithmInfo(name, summary, paper, bool(uses_servers), algorithm,
                        plugin=getattr(module, "__file__", None) or algorithm.__module__,
                        synchronous=bool(synchronous), peer_windows=bool(peer_windows), replayable=bool(replayable))
    ALGORITHMS[name] = row
    return row


def _named(algorithm: Any, name: str) -> Any:
    """Give the declaration the registry's name (its messages and window specs carry it)."""
    algorithm.name = name
    return algorithm


_entry_points_loaded = False


def _load_entry_points() -> None:
    """Import the installed packages' algorithms (entry-point group ``hvd_async.algorithms``), once."""
    global _entry_points_loaded
    if _entry_points_loaded:
        return
    _entry_points_loaded = True
    from importlib.metadata import entry_points

    for ep in entry_points(group=ENTRY_POINTS):
        target = ep.load()
        if isinstance(target, type):
            register(ep.name, target, summary=(target.__doc__ or ep.name).strip().splitlines()[0])
        elif callable(target):
            target()  # a function that calls register() itself


def load_plugins(specs: Iterable[str]) -> None:
    """Import each plugin: a module name (``mypkg.algos``) or a Python file's path; importing it
    registers its algorithms. ``ValueError`` with one line where it cannot be imported."""
    for spec in specs:
        spec = str(spec)
        try:
            if spec.endswith(".py") or os.sep in spec:
                path = os.path.abspath(spec)
                if not os.path.isfile(path):
                    raise ValueError(f"--plugin {spec}: no such file; give a Python file or an importable "
                                     f"module name")
                module_name = "hvd_async_plugin_" + os.path.splitext(os.path.basename(path))[0].replace("-", "_")
                if module_name in sys.modules:
                    continue
                loader_spec = importlib.util.spec_from_file_location(module_name, path)
                if loader_spec is None or loader_spec.loader is None:  # no loader takes the file (not .py)
                    raise ValueError(f"--plugin {spec}: not a Python file; give a .py file or an importable "
                                     f"module name")
                module = importlib.util.module_from_spec(loader_spec)
                sys.modules[module_name] = module
                try:
                    loader_spec.loader.exec_module(module)
                except BaseException:
                    del sys.modules[module_name]
                    raise
            else:
                import_module(spec)
        except ValueError:
            raise
        except ImportError as exc:
            raise ValueError(f"--plugin {spec}: cannot import it ({exc}); give a Python file or a module "
                             f"on PYTHONPATH") from None
        except Exception as exc:
            raise ValueError(f"--plugin {spec}: importing it failed: {type(exc).__name__}: {exc}") from None


def algorithm(name: str) -> Type["Algorithm"]:
    """Import and return an algorithm's declaration (its options, strategy and hooks)."""
    declaration = get(name).declaration
    if not isinstance(declaration, type):
        module, cls = declaration.split(":")
        declaration = getattr(import_module(module), cls)
    return _named(declaration, name)


def uses_servers(name: str, options: Dict) -> bool:
    """Whether ``name`` with these keyword options needs server ranks (the declaration's hook decides,
    from what the registry row says)."""
    return algorithm(name).uses_servers(options, get(name).uses_servers)


def serverless() -> Tuple[str, ...]:
    """The algorithms that keep no weights on server ranks, in the registry's order."""
    return tuple(name for name in names() if not get(name).uses_servers)


def asynchronous() -> Tuple[str, ...]:
    """The algorithms whose updates wait for no other worker, in the registry's order."""
    return tuple(name for name in names() if not get(name).synchronous)


def replayable() -> Tuple[str, ...]:
    """The algorithms whose every push is one update applied where it lands (``simulate --replay``
    follows a recorded run's order of pushes), in the registry's order."""
    return tuple(name for name in names() if get(name).replayable)


def repeatable() -> Tuple[str, ...]:
    """The algorithms whose sums are an allreduce with their default options (``--deterministic``
    fixes its order), in the registry's order: no servers, no peer windows. (od-sgd joins them with
    ``--od-exchange allreduce``.)"""
    return tuple(name for name in names() if not (uses_servers(name, {}) or get(name).peer_windows))


def algorithms() -> Dict[str, Type["Algorithm"]]:
    """Every algorithm's declaration, by name."""
    return {name: algorithm(name) for name in names()}

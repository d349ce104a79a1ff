"""The one table of algorithm names: what each is, where it comes from, and its strategy; the ones
built in, and those a plugin adds (:func:`register`, the ``hvd_async.algorithms`` entry points, or a
module named by ``--plugin``)."""
import importlib.util
import os
import sys
from dataclasses import dataclass
from importlib import import_module
from typing import TYPE_CHECKING, Dict, Iterable, Optional, Tuple, Type, Union

if TYPE_CHECKING:
    from .algorithms.base import Strategy

ENTRY_POINTS = "hvd_async.algorithms"  # entry-point group: name = "module:function or Class"


@dataclass(frozen=True)
class AlgorithmInfo:
    """One row of the registry.

    Attributes:
        name: the name users pass as ``algorithm=`` / ``--algo``.
        summary: one line on what it does.
        paper: where the update rule comes from.
        uses_servers: whether it keeps global weights on parameter-server ranks (the default
            ``servers`` of the training job is 1 for these and 0 for the others).
        strategy: ``"module:Class"`` of its strategy, or the class itself (a plugin's).
        plugin: where a plugin algorithm came from (None for the built-in ones).
        synchronous: every update waits for the workers it takes (ssgd, hpsgd's rounds, backup-sgd's
            steps); False for the asynchronous family, which the stress tests exercise.
    """

    name: str
    summary: str
    paper: str
    uses_servers: bool
    strategy: Union[str, type]
    plugin: Optional[str] = None
    synchronous: bool = False


_ROWS = (
    AlgorithmInfo("ssgd", "synchronous SGD: Horovod allreduce of gradients every step (the baseline)",
                  "Sergeev & Del Balso, Horovod, arXiv 1802.05799", False,
                  "hvd_async.algorithms.ssgd:SSGD", synchronous=True),
    AlgorithmInfo("asgd", "asynchronous SGD on a parameter server held in MPI windows",
                  "Dean et al., NIPS 2012 (Downpour)", True, "hvd_async.algorithms.asgd:ASGD"),
    AlgorithmInfo("dc-asgd", "ASGD with delay compensation lam * g * g * (w - w_bak)",
                  "Zheng et al., ICML 2017", True, "hvd_async.algorithms.dcasgd:DCASGD"),
    AlgorithmInfo("lc-asgd", "ASGD compensated by per-worker loss prediction on the server",
                  "Li, He, Ren, Mao, ICPP 2020", True, "hvd_async.algorithms.lcasgd:LCASGD"),
    AlgorithmInfo("od-sgd", "one-step delay SGD: global step on the server, local compensating step",
                  "Xu et al., arXiv 2005.06728", True, "hvd_async.algorithms.odsgd:ODSGD"),
    AlgorithmInfo("hpsgd", "hierarchical parallel SGD: exchange overlapped with local training",
                  "Zhou et al., arXiv 2009.02701", False, "hvd_async.algorithms.hpsgd:HPSGD", synchronous=True),
    AlgorithmInfo("gossip", "gossip aggregation with a random peer through MPI windows",
                  "Jin, Yuan, Iandola, Keutzer, arXiv 1611.04581", False,
                  "hvd_async.algorithms.gossip:Gossip"),
    AlgorithmInfo("easgd", "elastic averaging SGD with the centre variable on the server",
                  "Zhang, Choromanska, LeCun, NIPS 2015", True, "hvd_async.algorithms.easgd:EASGD"),
    AlgorithmInfo("softsync", "n-softsync: apply the mean of every floor(N/n) gradients (rate / staleness: "
                  "--softsync-staleness-lr)",
                  "Zhang, Gupta et al., IJCAI 2016", True,
                  "hvd_async.algorithms.softsync:SoftSync"),
    AlgorithmInfo("dbs-asgd", "ASGD with batch sizes set by each worker's measured speed",
                  "Ji et al., 2019", True, "hvd_async.algorithms.dbs:DBSASGD"),
    AlgorithmInfo("backup-sgd", "synchronous SGD with backup workers: each step the first N-b gradients, "
                  "the b late ones dropped", "Chen et al., arXiv 1604.00981 (2016)", True,
                  "hvd_async.algorithms.backup:BackupSGD", synchronous=True),
    AlgorithmInfo("lb-sgd", "synchronous SGD with the global batch shared by each worker's measured speed",
                  "Chen et al., LB-BSP, SoCC 2020", False, "hvd_async.algorithms.lbsgd:LBSGD", synchronous=True),
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


def register(name: str, strategy: type, *, summary: str, paper: str = "", uses_servers: bool = False,
             replace: bool = False) -> AlgorithmInfo:
    """Add an algorithm: ``strategy`` is a :class:`hvd_async.algorithms.base.Strategy` subclass with an
    ``Options`` dataclass (fields declared with :func:`hvd_async.options.option` become flags of
    ``hvd-async train`` and ``simulate``). Then ``DistributedOptimizer(..., algorithm=name)``, ``--algo
    name``, presets and the simulator run it. Registering the same class again is a no-op; another
    class under a taken name is refused unless ``replace`` (never for a built-in name)."""
    from .algorithms.base import Strategy

    if not (isinstance(name, str) and name and name.strip() == name and " " not in name):
        raise ValueError(f"algorithm name must be a non-empty string without spaces, got {name!r}")
    if not (isinstance(strategy, type) and issubclass(strategy, Strategy)):
        raise TypeError(f"register({name!r}, ...): strategy must be a subclass of "
                        f"hvd_async.algorithms.base.Strategy, got {strategy!r}")
    if strategy.Options is None:
        raise TypeError(f"register({name!r}, ...): {strategy.__name__} needs an Options dataclass "
                        f"(an empty one where it takes no options)")
    old = ALGORITHMS.get(name)
    if old is not None and old.strategy is not strategy:
        if old.plugin is None or not replace:
            raise ValueError(f"algorithm {name!r} is taken ({'built in' if old.plugin is None else old.plugin}); "
                             f"register yours under another name")
    strategy.name = name
    module = sys.modules.get(strategy.__module__)
    row = AlgorithmInfo(name, summary, paper, bool(uses_servers), strategy,
                        plugin=getattr(module, "__file__", None) or strategy.__module__)
    ALGORITHMS[name] = row
    return row


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


def strategy_class(name: str):
    """Import and return the strategy class of an algorithm."""
    strategy = get(name).strategy
    if isinstance(strategy, type):
        return strategy
    module, cls = strategy.split(":")
    return getattr(import_module(module), cls)


def uses_servers(name: str, options: Dict) -> bool:
    """Whether ``name`` with these keyword options needs server ranks (the strategy's hook decides,
    from what the algorithm was registered with)."""
    return strategy_class(name).uses_servers(options, get(name).uses_servers)


def serverless() -> Tuple[str, ...]:
    """The algorithms that keep no weights on server ranks, in the registry's order."""
    return tuple(name for name in names() if not get(name).uses_servers)


def asynchronous() -> Tuple[str, ...]:
    """The algorithms whose updates wait for no other worker, in the registry's order."""
    return tuple(name for name in names() if not get(name).synchronous)


def replayable() -> Tuple[str, ...]:
    """The algorithms whose every push is one update applied where it lands (``simulate --replay``
    follows a recorded run's order of pushes), in the registry's order."""
    return tuple(name for name in names() if strategy_class(name).replayable)


def repeatable() -> Tuple[str, ...]:
    """The algorithms whose sums are an allreduce with their default options (``--deterministic``
    fixes its order), in the registry's order: no servers, no peer windows. (od-sgd joins them with
    ``--od-exchange allreduce``.)"""
    return tuple(name for name in names() if not (uses_servers(name, {}) or strategy_class(name).peer_windows))


def strategies() -> Dict[str, Type["Strategy"]]:
    """Every algorithm's strategy class, by name."""
    return {name: strategy_class(name) for name in names()}

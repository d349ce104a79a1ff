"""The one table of algorithm names: what each is, where it comes from, and whether it is built."""
from dataclasses import dataclass
from importlib import import_module
from typing import Dict, Optional, Tuple


@dataclass(frozen=True)
class AlgorithmInfo:
    """One row of the registry.

    Attributes:
        name: the name users pass as ``algorithm=`` / ``--algo``.
        summary: one line on what it does.
        paper: where the update rule comes from.
        uses_servers: whether it keeps global weights on parameter-server ranks (the default
            ``servers`` of the training job is 1 for these and 0 for the others).
        strategy: ``"module:Class"`` of its strategy once built; ``None`` while it is planned.
    """

    name: str
    summary: str
    paper: str
    uses_servers: bool
    strategy: Optional[str] = None

    @property
    def built(self) -> bool:
        return self.strategy is not None


_ROWS = (
    AlgorithmInfo("ssgd", "synchronous SGD: Horovod allreduce of gradients every step (the baseline)",
                  "Sergeev & Del Balso, Horovod, arXiv 1802.05799", False,
                  "hvd_async.algorithms.ssgd:SSGD"),
    AlgorithmInfo("asgd", "asynchronous SGD on a parameter server held in MPI windows",
                  "Dean et al., NIPS 2012 (Downpour)", True, "hvd_async.algorithms.asgd:ASGD"),
    AlgorithmInfo("dc-asgd", "ASGD with delay compensation lam * g * g * (w - w_bak)",
                  "Zheng et al., ICML 2017", True, "hvd_async.algorithms.dcasgd:DCASGD"),
    AlgorithmInfo("lc-asgd", "ASGD compensated by per-worker loss prediction on the server",
                  "Li, He, Ren, Mao, ICPP 2020", True, "hvd_async.algorithms.lcasgd:LCASGD"),
    AlgorithmInfo("od-sgd", "one-step delay SGD: global step on the server, local compensating step",
                  "Xu et al., arXiv 2005.06728", True, "hvd_async.algorithms.odsgd:ODSGD"),
    AlgorithmInfo("hpsgd", "hierarchical parallel SGD: exchange overlapped with local training",
                  "Zhou et al., arXiv 2009.02701", False, "hvd_async.algorithms.hpsgd:HPSGD"),
    AlgorithmInfo("gossip", "gossip aggregation with a random peer through MPI windows",
                  "Jin, Yuan, Iandola, Keutzer, arXiv 1611.04581", False,
                  "hvd_async.algorithms.gossip:Gossip"),
    AlgorithmInfo("easgd", "elastic averaging SGD with the centre variable on the server",
                  "Zhang, Choromanska, LeCun, NIPS 2015", True, "hvd_async.algorithms.easgd:EASGD"),
    AlgorithmInfo("softsync", "n-softsync: apply after floor(N/n) gradients, rate divided by staleness",
                  "Zhang, Gupta et al., IJCAI 2016", True,
                  "hvd_async.algorithms.softsync:SoftSync"),
    AlgorithmInfo("dbs-asgd", "ASGD with batch sizes set by each worker's measured speed",
                  "Ji et al., 2019", True, "hvd_async.algorithms.dbs:DBSASGD"),
)

ALGORITHMS: Dict[str, AlgorithmInfo] = {row.name: row for row in _ROWS}
NAMES: Tuple[str, ...] = tuple(ALGORITHMS)


def built() -> Tuple[str, ...]:
    """Names of the algorithms that can run now."""
    return tuple(name for name, row in ALGORITHMS.items() if row.built)


def get(name: str) -> AlgorithmInfo:
    """The registry row for ``name``; ``ValueError`` naming the accepted names otherwise."""
    try:
        return ALGORITHMS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown algorithm {name!r}; choose one of: {', '.join(NAMES)}") from None


def check_built(name: str) -> AlgorithmInfo:
    """Like :func:`get`, and ``NotImplementedError`` if the algorithm is only planned."""
    row = get(name)
    if not row.built:
        raise NotImplementedError(
            f"algorithm {name!r} is planned but not built yet; built now: {', '.join(built())}")
    return row


def strategy_class(name: str):
    """Import and return the strategy class of a built algorithm."""
    module, cls = check_built(name).strategy.split(":")
    return getattr(import_module(module), cls)

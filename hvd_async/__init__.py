"""hvd_async: asynchronous and semi-synchronous SGD for PyTorch on Horovod and MPI.

    import hvd_async as ha
    ha.init(servers=0)
    opt = ha.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                  named_parameters=model.named_parameters(), algorithm="ssgd")

The public names load on first use (PEP 562): ``import hvd_async`` and the ``hvd-async`` command's
first line do not wait for torch, which most of them import.
"""
import importlib
import importlib.util
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# public name -> (module, its name there)
_PUBLIC = {
    "DistributedOptimizer": (".optimizer", "DistributedOptimizer"),
    "DynamicBatchSampler": (".batch_sampler", "DynamicBatchSampler"),
    "ALGORITHMS": (".registry", "ALGORITHMS"),
    "ALGORITHM_NAMES": (".registry", "NAMES"),
    "register_algorithm": (".registry", "register"),
    "option": (".options", "option"),
    **{name: (".runtime", name) for name in (
        "init", "is_initialized", "is_server", "is_worker", "local_rank", "num_servers", "rank", "serve",
        "server_ranks", "shutdown", "size", "worker_comm", "worker_ranks", "world_rank", "world_size")},
}

__all__ = ["DistributedOptimizer", "DynamicBatchSampler", "ALGORITHMS", "ALGORITHM_NAMES", "register_algorithm",
           "option", "init", "is_initialized", "is_server", "is_worker", "local_rank", "num_servers", "rank",
           "serve", "server_ranks", "shutdown", "size", "worker_comm", "worker_ranks", "world_rank",
           "world_size"]  # (the keys of _PUBLIC: tests/unit/test_cli_start.py)


def __getattr__(name: str) -> Any:
    if name in _PUBLIC:
        module, attribute = _PUBLIC[name]
        value = getattr(importlib.import_module(module, __name__), attribute)
    elif not name.startswith("_") and importlib.util.find_spec(f"{__name__}.{name}") is not None:
        value = importlib.import_module(f".{name}", __name__)  # a submodule: ha.registry, ha.optimizer, ...
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value  # later reads are plain attribute reads
    return value


def __dir__():
    return sorted(set(globals()) | set(_PUBLIC))


if TYPE_CHECKING:  # what type checkers and editors see
    from .batch_sampler import DynamicBatchSampler
    from .optimizer import DistributedOptimizer
    from .options import option
    from .registry import ALGORITHMS, NAMES as ALGORITHM_NAMES, register as register_algorithm
    from .runtime import (init, is_initialized, is_server, is_worker, local_rank, num_servers, rank,
                          serve, server_ranks, shutdown, size, worker_comm, worker_ranks, world_rank,
                          world_size)

"""hvd_async: asynchronous and semi-synchronous SGD for PyTorch on Horovod and MPI.

    import hvd_async as ha
    ha.init(servers=0)
    opt = ha.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                  named_parameters=model.named_parameters(), algorithm="ssgd")
"""
from .batch_sampler import DynamicBatchSampler
from .optimizer import DistributedOptimizer
from .options import option
from .registry import ALGORITHMS, NAMES as ALGORITHM_NAMES, register as register_algorithm
from .runtime import (init, is_initialized, is_server, is_worker, local_rank, num_servers, rank,
                      serve, server_ranks, shutdown, size, worker_comm, worker_ranks, world_rank,
                      world_size)

__version__ = "0.1.0"

__all__ = ["DistributedOptimizer", "DynamicBatchSampler", "ALGORITHMS", "ALGORITHM_NAMES", "register_algorithm", "option", "init", "is_initialized",
           "is_server", "is_worker", "local_rank", "num_servers", "rank", "serve", "server_ranks",
           "shutdown", "size", "worker_comm", "worker_ranks", "world_rank", "world_size"]

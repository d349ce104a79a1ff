"""The simulator's Horovod: the part of ``horovod.torch`` that
:class:`~hvd_async.transport.horovod.HorovodTransport` calls, over the simulated network.

The simulator opens the real ``HorovodTransport`` (ssgd, hpsgd, od-sgd's allreduce exchange) over
:class:`SimHorovod` instead of ``horovod.torch``. An allreduce completes one latency after the last
worker's contribution (:class:`~hvd_async.sim.network.SimNetwork`), so one started before compute and
waited for after it costs nothing more: the overlap is simulated. Sums run in worker order, so every
worker gets the same bits on every run. One process set: every simulated worker.
"""
from typing import Any, List

import torch

from .network import Calls, SimNetwork, rank_sum


class _EveryWorker:
    """The global process set of ``size`` simulated workers, as worker ``rank`` sees it."""

    def __init__(self, rank: int, size: int):
        self._rank, self._size = rank, size

    def included(self) -> bool:
        return True

    def rank(self) -> int:
        return self._rank

    def size(self) -> int:
        return self._size


class SimHorovod:
    """Worker ``rank``'s ``horovod.torch`` (what ``HorovodTransport`` calls)."""

    Average, Sum = "average", "sum"

    def __init__(self, net: SimNetwork, rank: int):
        self.net, self._rank, self._calls = net, rank, Calls()
        self.global_process_set = _EveryWorker(rank, net.size)

    @staticmethod
    def is_initialized() -> bool:
        return True

    def rank(self) -> int:
        return self._rank

    def _check(self, process_set) -> None:
        if process_set is not self.global_process_set:
            raise ValueError("the simulator runs every worker in one process set: leave process_set unset")

    def allreduce_async_(self, tensor: torch.Tensor, *, name: str, op, process_set) -> Any:
        self._check(process_set)
        key = self._calls.key(f"allreduce:{name}")

        def combine(values):
            total = rank_sum(values)
            return total / len(values) if op == self.Average else total

        self.net.contribute(self._rank, key, tensor.detach().clone(), combine)
        return key, tensor

    def sparse_allreduce_async(self, tensor, *, name: str, op, process_set):
        raise ValueError("the simulator reduces dense gradients only: give the model dense gradients "
                         "(e.g. nn.Embedding(sparse=False))")

    def synchronize(self, handle) -> torch.Tensor:
        key, tensor = handle
        tensor.copy_(self.net.collect(self._rank, key))
        return tensor

    def broadcast_(self, tensor: torch.Tensor, *, root_rank: int, name: str, process_set) -> torch.Tensor:
        self._check(process_set)
        key = self._calls.key(f"broadcast:{name}")
        tensor.copy_(self.net.collective(self._rank, key, tensor.detach().clone(), lambda values: values[root_rank]))
        return tensor

    def allgather_object(self, obj) -> List[Any]:
        return self.net.collective(self._rank, self._calls.key("allgather"), obj, list)

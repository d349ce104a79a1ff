"""Collectives through Horovod (allreduce over the workers' communicator): the ssgd transport."""
from typing import Any, List

import torch

from .base import CollectiveTransport, ReduceOp


class HorovodTransport(CollectiveTransport):
    """Horovod's allreduce/broadcast/allgather among the workers (``hvd_async.init`` set it up)."""

    def __init__(self):
        super().__init__()
        import horovod.torch as hvd

        if not hvd.is_initialized():
            raise RuntimeError("Horovod is not initialised on this process: call hvd_async.init() "
                               "first (server ranks have no Horovod and cannot hold this transport)")
        self._hvd = hvd
        self._ops = {ReduceOp.AVERAGE: hvd.Average, ReduceOp.SUM: hvd.Sum}

    @property
    def rank(self) -> int:
        return self._hvd.rank()

    @property
    def size(self) -> int:
        return self._hvd.size()

    def allreduce_async_(self, tensor: torch.Tensor, *, name: str, op: ReduceOp) -> Any:
        self._check_open()
        return self._hvd.allreduce_async_(tensor, name=name, op=self._ops[op])

    def sparse_allreduce_async(self, tensor: torch.Tensor, *, name: str, op: ReduceOp) -> Any:
        """Start Horovod's sparse allreduce (an allgather of indices and values); returns a handle."""
        self._check_open()
        return self._hvd.sparse_allreduce_async(tensor, name=name, op=self._ops[op])

    def synchronize(self, handle) -> torch.Tensor:
        self._check_open()
        if callable(handle):  # a sparse allreduce's handle: a function that waits and assembles
            return handle()
        return self._hvd.synchronize(handle)

    def broadcast_(self, tensor: torch.Tensor, *, root: int, name: str) -> torch.Tensor:
        self._check_open()
        return self._hvd.broadcast_(tensor, root_rank=root, name=name)

    def allgather_object(self, obj) -> List[Any]:
        self._check_open()
        return self._hvd.allgather_object(obj)

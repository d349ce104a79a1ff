"""Collectives through Horovod (allreduce over the workers' communicator): the ssgd transport."""
import pickle
from typing import Any, List

import torch

from .base import CollectiveTransport, ReduceOp


class HorovodTransport(CollectiveTransport):
    """Horovod's allreduce/broadcast/allgather among the workers (``hvd_async.init`` set it up), or
    among the workers of a Horovod ``process_set``. On a worker outside the set it is a transport of
    one that exchanges nothing (rank 0 of 1: every collective hands back what it was given), as
    Horovod's optimizer over a set it is not in registers no hooks and steps locally.

    ``horovod``: what to call as ``horovod.torch`` (None: it; the simulator's runs on its network,
    :class:`hvd_async.sim.horovod.SimHorovod`), with ``clock`` for the strategies' speeds and waits."""

    def __init__(self, process_set=None, *, horovod=None, clock=None):
        super().__init__()
        if horovod is None:
            import horovod.torch as hvd
        else:
            hvd = horovod
        if clock is not None:
            self._clock = clock
        if not hvd.is_initialized():
            raise RuntimeError("Horovod is not initialised on this process: call hvd_async.init() "
                               "first (server ranks have no Horovod and cannot hold this transport)")
        self._hvd = hvd
        self._ops = {ReduceOp.AVERAGE: hvd.Average, ReduceOp.SUM: hvd.Sum}
        self._set = hvd.global_process_set if process_set is None else process_set
        self.member = self._set.included()

    @property
    def rank(self) -> int:
        return self._set.rank() if self.member else 0

    @property
    def size(self) -> int:
        return self._set.size() if self.member else 1

    def allreduce_async_(self, tensor: torch.Tensor, *, name: str, op: ReduceOp) -> Any:
        self._check_open()
        if not self.member:  # the sum or average over one: the tensor as it is
            return lambda: tensor
        return self._hvd.allreduce_async_(tensor, name=name, op=self._ops[op], process_set=self._set)

    def sparse_allreduce_async(self, tensor: torch.Tensor, *, name: str, op: ReduceOp) -> Any:
        """Start Horovod's sparse allreduce (an allgather of indices and values); returns a handle."""
        self._check_open()
        if not self.member:
            return lambda: tensor
        return self._hvd.sparse_allreduce_async(tensor, name=name, op=self._ops[op], process_set=self._set)

    def synchronize(self, handle) -> torch.Tensor:
        self._check_open()
        if callable(handle):  # a sparse allreduce's handle (a function that waits and assembles), a non-member's
            return handle()
        return self._hvd.synchronize(handle)

    def broadcast_(self, tensor: torch.Tensor, *, root: int, name: str) -> torch.Tensor:
        self._check_open()
        if not self.member:
            return tensor
        return self._hvd.broadcast_(tensor, root_rank=root, name=name, process_set=self._set)

    def allgather_object(self, obj) -> List[Any]:
        """Every member's ``obj``, in rank order (Horovod's allgather_object knows no process set: the
        pickled bytes go through its allgather, which takes rows of different counts)."""
        self._check_open()
        if not self.member:
            return [obj]
        if self._set is self._hvd.global_process_set:
            return self._hvd.allgather_object(obj)
        data = torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8)
        sizes = self._hvd.allgather(torch.tensor([data.numel()]), process_set=self._set).tolist()
        gathered = self._hvd.allgather(data, process_set=self._set)
        return [pickle.loads(chunk.numpy().tobytes()) for chunk in torch.split(gathered, sizes)]

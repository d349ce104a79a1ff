"""What every transport offers: ownership (close, use-after-close errors) and the collective interface."""
import abc
import enum
import time
from typing import Any, List

import torch


def mpi_module(mpi=None):
    """``mpi``, what a transport was given to call as ``MPI`` (the simulator's in-memory one:
    :class:`hvd_async.sim.mpi.SimMPI`), or else mpi4py's."""
    if mpi is not None:
        return mpi
    from mpi4py import MPI

    return MPI


class ReduceOp(enum.Enum):
    AVERAGE = "average"
    SUM = "sum"

    @classmethod
    def parse(cls, value) -> "ReduceOp":
        """Accept a ReduceOp, 'average'/'sum', or Horovod's ``hvd.Average`` / ``hvd.Sum``."""
        if isinstance(value, cls):
            return value
        if isinstance(value, str) and value.lower() in ("average", "sum"):
            return cls(value.lower())
        if isinstance(value, int) and not isinstance(value, bool):
            from horovod.torch import Average, Sum

            if value == Average:
                return cls.AVERAGE
            if value == Sum:
                return cls.SUM
        raise ValueError(f"op must be 'average' or 'sum' (or hvd.Average / hvd.Sum), got {value!r}; "
                         "for Adasum use horovod.torch.DistributedOptimizer directly")


class Transport(abc.ABC):
    """Owns communication resources. ``close()`` frees them; any later call raises."""

    # whether close() waits for the other workers to close too (window transports: the windows'
    # free is collective); the exit hook closes the others first (hvd_async.runtime)
    closes_collectively = False
    # whether the job can go on without workers that stopped making progress (--worker-timeout):
    # the parameter servers' windows can (drop_workers); a collective among every worker cannot
    can_drop_workers = False

    def __init__(self):
        self._closed = False

    def drop_workers(self, workers, comm, *, tell_servers: bool) -> None:
        """Go on without ``workers``, with ``comm`` the others' communicator (where
        ``can_drop_workers``)."""
        raise NotImplementedError(f"{type(self).__name__} cannot go on without a worker")

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"{type(self).__name__} was closed; create a new one")

    def close(self) -> None:
        self._closed = True

    # what clock() reads: a transport opened over the simulator's communicators takes their virtual clock
    _clock = staticmethod(time.perf_counter)

    def clock(self) -> float:
        """Seconds, for measuring speeds and waits: ``time.perf_counter()``, or in the simulator the
        worker's virtual clock."""
        return self._clock()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class CollectiveTransport(Transport):
    """Collectives among the workers: the synchronous family's transport.

    Names ending in ``_async`` start work and return a handle; ``synchronize(handle)`` waits for it.
    Names ending in ``_`` change their tensor in place (Horovod's convention).
    """

    @property
    @abc.abstractmethod
    def rank(self) -> int: ...

    @property
    @abc.abstractmethod
    def size(self) -> int: ...

    @abc.abstractmethod
    def allreduce_async_(self, tensor: torch.Tensor, *, name: str, op: ReduceOp) -> Any:
        """Start reducing ``tensor`` in place across workers; returns a handle."""

    @abc.abstractmethod
    def synchronize(self, handle) -> torch.Tensor:
        """Wait for a handle from ``allreduce_async_``; returns the reduced tensor."""

    @abc.abstractmethod
    def broadcast_(self, tensor: torch.Tensor, *, root: int, name: str) -> torch.Tensor:
        """Overwrite ``tensor`` with root's value on every worker."""

    @abc.abstractmethod
    def allgather_object(self, obj) -> List[Any]:
        """Every worker's ``obj`` (picklable), in rank order."""

    def allreduce_(self, tensor: torch.Tensor, *, name: str, op: ReduceOp = ReduceOp.AVERAGE):
        return self.synchronize(self.allreduce_async_(tensor, name=name, op=op))

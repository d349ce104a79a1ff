"""The simulated network: message latency and collectives among simulated workers, on the virtual clock.

A collective (barrier, allreduce, broadcast, allgather) completes when every worker has contributed
to the same name for the same time; it completes at the latest contribution's time plus the
latency, and a worker that collects it goes on from then. Reductions run in worker order, so results
are the same on every run. Metric reductions of the training job use ``cost=False``: measuring
takes no simulated time.
"""
from typing import Any, Callable, Dict, List, Tuple

import numpy as np

from .clock import Scheduler


class SimNetwork:
    """Latency and collectives for ``sched.workers`` workers.

    Args:
        sched: the virtual clock.
        latency: simulated seconds per round trip (:mod:`.mpi` says which calls wait for one).
    """

    def __init__(self, sched: Scheduler, latency: float = 0.0):
        self.sched, self.size, self.latency = sched, sched.workers, float(latency)
        self.exchanges = 0
        self._slots: Dict[Tuple, Dict[int, Any]] = {}
        self._latest: Dict[Tuple, float] = {}  # latest contribution's time per open collective
        self._results: Dict[Tuple, Tuple[Any, float]] = {}
        self._fetched: Dict[Tuple, int] = {}

    def contribute(self, worker: int, key: Tuple, value: Any, combine: Callable[[List[Any]], Any],
                   *, cost: bool = True) -> None:
        """Add ``worker``'s ``value`` to collective ``key`` without waiting for the others."""
        slot = self._slots.setdefault(key, {})
        if worker in slot:
            raise RuntimeError(f"worker {worker} contributed twice to {key[0]!r}")
        slot[worker] = value
        now = self.sched.now(worker)
        self._latest[key] = max(self._latest.get(key, now), now)
        if len(slot) == self.size:
            done = self._latest.pop(key) + (self.latency if cost else 0.0)
            if cost:
                self.exchanges += 1
            self._results[key] = (combine([slot[w] for w in range(self.size)]), done)
            del self._slots[key]

    def collect(self, worker: int, key: Tuple) -> Any:
        """Wait for collective ``key`` to complete; ``worker``'s clock then stands at its completion."""
        self.sched.wait_until(worker, lambda: key in self._results, f"collective {key[0]!r}")
        result, done = self._results[key]
        self._fetched[key] = self._fetched.get(key, 0) + 1
        if self._fetched[key] == self.size:
            del self._results[key], self._fetched[key]
        self.sched.advance(worker, max(0.0, done - self.sched.now(worker)))
        return result

    def collective(self, worker: int, key: Tuple, value: Any, combine, *, cost: bool = True) -> Any:
        self.contribute(worker, key, value, combine, cost=cost)
        return self.collect(worker, key)


def rank_sum(values: List[Any]):
    """Sum in worker order (tensors or numbers), so every run adds in the same order."""
    total = values[0].clone() if hasattr(values[0], "clone") else values[0]
    for value in values[1:]:
        total = total + value
    return total


class Calls:
    """Per-name call counters: the n-th call of a name on every worker meets the others' n-th."""

    def __init__(self):
        self._count: Dict[str, int] = {}

    def key(self, name: str) -> Tuple[str, int]:
        n = self._count.get(name, 0)
        self._count[name] = n + 1
        return (name, n)


class LoopComm:
    """The few ``mpi4py`` communicator calls a simulated worker's loop makes for its metrics
    (``allreduce``, ``gather``), over the simulated network at no simulated cost (the simulated MPI's
    communicator, :class:`~hvd_async.sim.mpi.SimCommunicator`, is what the transports use)."""

    def __init__(self, net: SimNetwork, rank: int):
        self.net, self.rank, self.size, self._calls = net, rank, net.size, Calls()

    def allreduce(self, value, op=None):
        combine = (lambda values: max(values)) if op == "max" else _padded_sum
        return self.net.collective(self.rank, self._calls.key("comm.allreduce"), value, combine, cost=False)

    def gather(self, value, root: int = 0):
        result = self.net.collective(self.rank, self._calls.key("comm.gather"), value, list, cost=False)
        return result if self.rank == root else None


def _padded_sum(values):
    if isinstance(values[0], np.ndarray):
        width = max(len(v) for v in values)
        total = np.zeros(width, dtype=values[0].dtype)
        for v in values:
            total[:len(v)] += v
        return total
    return rank_sum(values)

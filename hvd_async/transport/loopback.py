"""In-process collectives among threads: lets strategies be unit-tested with no MPI.

``LoopbackGroup(n)`` stands for n workers; ``group.transport(r)`` is worker r's transport, used
from one thread per worker. A collective completes when every worker has contributed to the same
name for the same time; sums run in rank order, so results are deterministic.
"""
import threading
from collections import defaultdict
from typing import Any, Dict, List, Tuple

import torch

from .base import CollectiveTransport, ReduceOp


class LoopbackGroup:
    """The shared meeting point of ``size`` in-process workers."""

    def __init__(self, size: int, *, timeout: float = 60.0):
        if size < 1:
            raise ValueError(f"size must be >= 1, got {size}")
        self.size = size
        self.timeout = timeout
        self._cond = threading.Condition()
        self._slots: Dict[Tuple[str, int], Dict[int, Any]] = defaultdict(dict)
        self._results: Dict[Tuple[str, int], Any] = {}
        self._fetched: Dict[Tuple[str, int], int] = defaultdict(int)

    def transport(self, rank: int, *, clock=None) -> "LoopbackTransport":
        """Worker ``rank``'s transport; ``clock``: what its ``clock()`` reads (default: perf_counter; a
        test gives each worker a clock it moves itself, to set the speeds the strategies measure)."""
        return LoopbackTransport(self, rank, clock=clock)

    def _contribute(self, key, rank, value, combine) -> None:
        with self._cond:
            slot = self._slots[key]
            if rank in slot:
                raise RuntimeError(f"worker {rank} contributed twice to {key[0]!r}")
            slot[rank] = value
            if len(slot) == self.size:
                self._results[key] = combine([slot[r] for r in range(self.size)])
                del self._slots[key]
                self._cond.notify_all()

    def _wait(self, key, rank):
        with self._cond:
            if not self._cond.wait_for(lambda: key in self._results, timeout=self.timeout):
                missing = sorted(set(range(self.size)) - set(self._slots.get(key, {})))
                raise TimeoutError(f"loopback collective {key[0]!r} waited {self.timeout} s "
                                   f"for worker(s) {missing}")
            result = self._results[key]
            self._fetched[key] += 1
            if self._fetched[key] == self.size:
                del self._results[key], self._fetched[key]
            return result


class LoopbackTransport(CollectiveTransport):
    def __init__(self, group: LoopbackGroup, rank: int, *, clock=None):
        super().__init__()
        if clock is not None:
            self._clock = clock
        if not 0 <= rank < group.size:
            raise ValueError(f"rank must be in 0..{group.size - 1}, got {rank}")
        self._group, self._rank = group, rank
        self._calls: Dict[str, int] = defaultdict(int)

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def size(self) -> int:
        return self._group.size

    def _key(self, kind: str, name: str):
        key = (f"{kind}:{name}", self._calls[f"{kind}:{name}"])
        self._calls[f"{kind}:{name}"] += 1
        return key

    def allreduce_async_(self, tensor: torch.Tensor, *, name: str, op: ReduceOp):
        self._check_open()
        key = self._key("allreduce", name)

        def combine(values: List[torch.Tensor]) -> torch.Tensor:
            total = values[0].clone()
            for value in values[1:]:
                total += value
            return total / len(values) if op is ReduceOp.AVERAGE else total

        self._group._contribute(key, self._rank, tensor.detach().clone(), combine)
        return key, tensor

    def synchronize(self, handle) -> torch.Tensor:
        self._check_open()
        key, tensor = handle
        tensor.copy_(self._group._wait(key, self._rank))
        return tensor

    def broadcast_(self, tensor: torch.Tensor, *, root: int, name: str) -> torch.Tensor:
        self._check_open()
        key = self._key("broadcast", name)
        self._group._contribute(key, self._rank, tensor.detach().clone(), lambda values: values[root])
        tensor.copy_(self._group._wait(key, self._rank))
        return tensor

    def allgather_object(self, obj) -> List[Any]:
        self._check_open()
        key = self._key("allgather", "object")
        self._group._contribute(key, self._rank, obj, list)
        return list(self._group._wait(key, self._rank))

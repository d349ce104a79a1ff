"""Simulated transports of the algorithms without a parameter server: Horovod's collectives (ssgd,
hpsgd, od-sgd with ``exchange="allreduce"``) and the gossip peer windows.

They offer what :class:`~hvd_async.transport.horovod.HorovodTransport` and
:class:`~hvd_async.transport.peer.PeerWindowTransport` offer the strategies, over
:class:`~hvd_async.sim.network.SimNetwork`: an allreduce completes at its last contribution plus the
latency (so an ``allreduce_async_`` started before compute and waited for after it costs nothing
more: the overlap is simulated); a peer's ``get`` or ``accumulate`` costs one exchange and happens
at once (only one simulated worker runs at a time, so ``own()`` needs no lock).
"""
from contextlib import contextmanager
from typing import Any, Iterator, List, Tuple

import numpy as np
import torch

from ..transport.base import CollectiveTransport, ReduceOp, Transport
from .network import Calls, SimNetwork, rank_sum


class _Member:
    """Who a simulated worker is on the network: ``rank`` of ``size``."""

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def size(self) -> int:
        return self.net.size

    def clock(self) -> float:
        """This worker's virtual clock (the strategies time speeds and waits with it)."""
        return self.net.sched.now(self._rank)


class SimCollectiveTransport(_Member, CollectiveTransport):
    """Worker ``rank``'s collectives (the strategies' Horovod transport, simulated)."""

    def __init__(self, net: SimNetwork, rank: int):
        super().__init__()
        self.net, self._rank, self._calls = net, rank, Calls()

    def allreduce_async_(self, tensor: torch.Tensor, *, name: str, op: ReduceOp):
        self._check_open()
        key = self._calls.key(f"allreduce:{name}")

        def combine(values):
            total = rank_sum(values)
            return total / len(values) if op is ReduceOp.AVERAGE else total

        self.net.contribute(self._rank, key, tensor.detach().clone(), combine)
        return key, tensor

    def synchronize(self, handle) -> torch.Tensor:
        self._check_open()
        key, tensor = handle
        tensor.copy_(self.net.collect(self._rank, key))
        return tensor

    def broadcast_(self, tensor: torch.Tensor, *, root: int, name: str) -> torch.Tensor:
        self._check_open()
        key = self._calls.key(f"broadcast:{name}")
        tensor.copy_(self.net.collective(self._rank, key, tensor.detach().clone(), lambda values: values[root]))
        return tensor

    def allgather_object(self, obj) -> List[Any]:
        self._check_open()
        return self.net.collective(self._rank, self._calls.key("allgather"), obj, list)


class PeerWindows:
    """Every worker's gossip window (a float32 buffer and a float64 weight), shared in-process."""

    def __init__(self, workers: int, numel: int):
        self.buffers = [torch.zeros(numel, dtype=torch.float32) for _ in range(workers)]
        self.weights = [np.zeros(1, dtype=np.float64) for _ in range(workers)]


class SimPeerTransport(_Member, Transport):
    """Worker ``rank``'s side of the gossip windows (``PeerWindowTransport``'s interface, simulated)."""

    def __init__(self, net: SimNetwork, rank: int, windows: PeerWindows):
        super().__init__()
        self.net, self._rank, self.windows, self._calls = net, rank, windows, Calls()
        self.numel = windows.buffers[rank].numel()

    def _check_peer(self, peer: int) -> None:
        self._check_open()
        if isinstance(peer, bool) or not isinstance(peer, (int, np.integer)) or not 0 <= peer < self.size \
                or peer == self._rank:
            raise ValueError(f"peer must be another worker's rank in [0, {self.size}) other than "
                             f"{self._rank}, got {peer!r}")

    @contextmanager
    def own(self) -> Iterator[Tuple[torch.Tensor, np.ndarray]]:
        self._check_open()
        yield self.windows.buffers[self._rank], self.windows.weights[self._rank]

    def get(self, peer: int, out: torch.Tensor) -> float:
        self._check_peer(peer)
        self.net.exchange(self._rank)
        out.copy_(self.windows.buffers[peer])
        return float(self.windows.weights[peer][0])

    def accumulate(self, peer: int, delta: torch.Tensor, weight: float = 0.0) -> None:
        self._check_peer(peer)
        self.net.exchange(self._rank)
        self.windows.buffers[peer].add_(delta)
        if weight:
            self.windows.weights[peer][0] += weight

    def barrier(self) -> None:
        self._check_open()
        self.net.collective(self._rank, self._calls.key("barrier"), None, lambda values: None)

    def allgather_object(self, obj) -> List[Any]:
        self._check_open()
        return self.net.collective(self._rank, self._calls.key("allgather"), obj, list)

    def broadcast_(self, tensor: torch.Tensor, *, root: int = 0) -> torch.Tensor:
        self._check_open()
        tensor.copy_(self.net.collective(self._rank, self._calls.key("broadcast"), tensor.clone(),
                                         lambda values: values[root]))
        return tensor

    def sum_(self, tensor: torch.Tensor) -> torch.Tensor:
        self._check_open()
        tensor.copy_(self.net.collective(self._rank, self._calls.key("sum"), tensor.clone(), rank_sum))
        return tensor

    def close(self) -> None:
        if not self._closed:
            self.barrier()
            self._closed = True

"""A pool of inbox slots shared by the workers (mailbox mode with ``slots`` below the workers).

A shard's inbox then holds ``K`` shard-sized slots instead of one per worker: a slot is needed only
from the moment a worker puts its gradient until the server program has taken it (every program
takes a push's gradient while it serves the request, folding what it must keep into state of its
own), so the server's inbox memory no longer grows with the workers. (Where the windows have no
outbox, a pull takes a slot too: the server copies the weights into it, the worker reads them and
gives it back.)

The server hands the slots out (:class:`SlotPool`, on the shard's host): a worker asks with a
``CLAIM`` request and waits for the grant (a blocking receive: a worker that waits for a slot
polls nothing), the server grants a free slot at once or queues the worker, and frees the slot as
soon as it has served the push that used it (or when the worker says ``RELEASE`` after reading a
pull's copy), granting it to the longest-waiting worker. It also frees what a worker that closed or
was dropped held, and forgets it in the queue. A worker claims the shards one at a time, in shard
order, the same order for every worker: no two workers can then each hold a slot the other waits
for. (Open MPI's one-sided ``Compare_and_swap`` would save the round trip, but crashed the target
of ``osc/rdma`` over shared memory here, and left its result unwritten over TCP.)"""
from collections import deque
from typing import Dict, Iterable, List

import numpy as np

from .layout import H_LEN, TAG_GRANT, TAG_REQUEST, Kind, encode_request


class SlotClaim:
    """One worker's side of the pools: ``claim(shards)`` returns a granted slot on each shard."""

    def __init__(self, comm, spec):
        self.comm, self.spec = comm, spec
        self._header = np.zeros(H_LEN, dtype=np.float64)
        self._grant = np.zeros(2, dtype=np.int64)  # (slot, whether the claim queued)
        self.waited = 0  # 1 when the last claim queued for a slot on some shard

    def claim(self, shards: Iterable[int]) -> Dict[int, int]:
        """A slot on each of ``shards``, in shard order; returns ``{shard: slot}``."""
        encode_request(self._header, Kind.CLAIM, None)
        slots, self.waited = {}, 0
        for shard in sorted(shards):
            self.comm.Send(self._header, dest=shard, tag=TAG_REQUEST)
            self.comm.Recv(self._grant, source=shard, tag=TAG_GRANT)
            slots[shard] = int(self._grant[0])
            self.waited |= int(self._grant[1])
        return slots

    def release(self, slots: Dict[int, int]) -> None:
        """Give back slots the servers do not free themselves (a pull's copy, read)."""
        for shard, slot in slots.items():
            encode_request(self._header, Kind.RELEASE, None, slot=slot)
            self.comm.Send(self._header, dest=shard, tag=TAG_REQUEST)


class SlotPool:
    """A shard's side of its pool: which slots are free, who holds the others, who waits."""

    def __init__(self, comm, spec):
        self.comm, self.spec = comm, spec
        self.free: List[int] = list(range(spec.slots))
        self.held: Dict[int, int] = {}  # slot -> worker
        self.queue: deque = deque()  # workers waiting for a slot, longest first
        self._grant = np.zeros(2, dtype=np.int64)

    def _give(self, slot: int, worker: int, queued: bool) -> None:
        self.held[slot] = worker
        self._grant[:] = (slot, int(queued))
        self.comm.Send(self._grant, dest=self.spec.servers + worker, tag=TAG_GRANT)

    def claim(self, worker: int) -> None:
        if self.free:
            self._give(self.free.pop(0), worker, False)
        else:
            self.queue.append(worker)

    def release(self, slot: int) -> None:
        if self.held.pop(slot, None) is None:
            return
        if self.queue:
            self._give(slot, self.queue.popleft(), True)
        else:
            self.free.append(slot)

    def forget(self, worker: int) -> None:
        """``worker`` is gone: free what it held, drop it from the queue."""
        self.queue = deque(w for w in self.queue if w != worker)
        for slot in [s for s, w in self.held.items() if w == worker]:
            self.release(slot)

"""What every worker's side of the parameter servers holds besides its windows: the spec, the shards'
bounds, the versions read and seen, the staleness counts not yet on the servers, the exchange in
flight. A base of :class:`~hvd_async.transport.window.client.WindowTransport`."""
from typing import Any, Callable, Dict, Optional

import numpy as np
import torch

from ..base import Transport
from .layout import HIST_BINS, Answers, Kind, Pending, WindowSpec, shard_bounds


class WorkerSide(Transport):
    """The worker side of ``spec``'s servers for worker ``rank``: the shards' bounds, the versions this
    worker last read and has seen, the staleness counts not yet on the servers, the exchange in flight.

    The transport provides the exchanges: ``publish_``, ``pull``, ``pull_async``, ``accumulate``,
    ``accumulate_async``, ``accumulate_and_pull``, ``request_async``, the servers' state
    (``server_state``, ``load_server_state``), the shared counter and table (``fetch_add_counter``,
    ``publish_value``, ``read_values``), ``read_stats``, ``allgather_object``, ``barrier`` and ``close``.
    """

    # the transport's (the WindowTransport's) method push() sends with
    request_async: Callable[..., Pending]

    # the windows' free is collective: close() waits for every worker (the exit hook closes others first)
    closes_collectively = True

    def __init__(self, spec: WindowSpec, rank: int):
        super().__init__()
        self.spec, self._rank = spec, int(rank)
        self.bounds = shard_bounds(spec.numel, spec.servers)
        self._versions = np.zeros(spec.servers, dtype=np.int64)   # version each shard had at the last pull
        self.latest_versions = np.zeros(spec.servers, dtype=np.int64)  # newest version seen per shard
        self._hist_due = np.zeros((spec.servers, HIST_BINS), dtype=np.int64)  # not yet on the servers
        self._hist_pushes = 0
        self._pending: Optional[Pending] = None
        self.slot_waits = 0  # pushes that found every inbox slot of a shard taken and waited

    @property
    def rank(self) -> int:
        return self._rank

    size = property(lambda self: self.spec.workers)

    servers = property(lambda self: self.spec.servers)

    @property
    def versions(self) -> np.ndarray:
        """Per shard, the version of the weights this worker last received."""
        return self._versions.copy()

    def _check_idle(self) -> None:
        if self._closed:  # (every exchange starts here: one attribute read while open)
            self._check_open()
        if self._pending is not None and not self._pending.done:
            raise RuntimeError("an exchange is still in flight on this transport: wait() for it first")

    def push(self, grad: torch.Tensor, out: torch.Tensor, payload: Dict[int, float]) -> Answers:
        """Push ``grad`` (mailbox mode), wait for the servers' answers, get the new weights into ``out``."""
        return self.request_async(Kind.PUSH, grad=grad, out=out, payload=payload).wait()

    def local_state(self) -> Dict[str, Any]:
        """This worker's side: versions it last read and saw, staleness counts not yet sent."""
        return {"versions": self._versions.tolist(), "latest_versions": self.latest_versions.tolist(),
                "hist_due": self._hist_due.tolist(), "hist_pushes": self._hist_pushes}

    def load_local_state(self, state: Dict[str, Any]) -> None:
        self._versions[:] = state["versions"]
        self.latest_versions[:] = state["latest_versions"]
        self._hist_due[:] = np.asarray(state["hist_due"], dtype=np.int64)
        self._hist_pushes = int(state["hist_pushes"])

"""The worker's side of the servers' state, over the control messages (``TAG_STATE``): every shard's
whole state for a checkpoint and its restoration, and telling the servers to go on without workers
that stopped (this worker's own counters are :class:`~.worker_side.WorkerSide`'s). A base of
:class:`~hvd_async.transport.window.client.WindowTransport`."""
import os
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence

from .layout import TAG_STATE, TAG_STATE_REPLY

if TYPE_CHECKING:
    from ..leave import LeaveWatch


class ServerState:
    """The transport provides ``comm``, ``servers``, ``_check_idle``, ``_send_hist``, ``_watch``, the
    worker communicator and the version and staleness bookkeeping."""

    # the host's (the WindowTransport's) attributes this mixin reads
    comm: Any  # the communicator with the servers (mpi4py's, or the simulator's)
    servers: int
    dropped: List[int]
    _check_idle: Callable[[], None]
    _send_hist: Callable[[], None]
    _watch: "LeaveWatch"

    # Where the servers write their shards' state (each its own file, ``shard-<k>.pt``) and read it back,
    # instead of sending it to worker 0; None: sent. Set around a save or load (see
    # DistributedOptimizer.algorithm_state_dict's ``shard_dir``); a folder every server can reach.
    shard_dir: Optional[str] = None

    def server_state(self) -> List[Dict[str, Any]]:
        """Every shard's whole state, as its server holds it now (weights, counters, outbox slots, the
        rule's buffers): consistent when no worker is pushing, e.g. after ``load_global_model()``. With
        :attr:`shard_dir` set, each server writes its shard there and this returns the files' names."""
        self._check_idle()
        self._send_hist()
        for k in range(self.servers):
            if self.shard_dir is None:
                self.comm.send(("get", None), dest=k, tag=TAG_STATE)
            else:
                self.comm.send(("save", os.path.join(self.shard_dir, f"shard-{k}.pt")), dest=k, tag=TAG_STATE)
        return self._state_replies()

    def _state_replies(self) -> List[Any]:
        replies = [self.comm.recv(source=k, tag=TAG_STATE_REPLY) for k in range(self.servers)]
        for status, value in replies:
            if status != "ok":
                raise RuntimeError(value)
        return [value for _, value in replies]

    def load_server_state(self, states: Sequence[Dict[str, Any]]) -> None:
        """Put back what ``server_state`` returned (same number of servers, shard sizes and workers)."""
        self._check_idle()
        if not isinstance(states, (list, tuple)) or len(states) != self.servers:
            got = len(states) if isinstance(states, (list, tuple)) else type(states).__name__
            raise ValueError(f"the saved server state has {got} shard(s), this job has {self.servers} "
                             f"server(s); resume with --servers {got if isinstance(got, int) else '?'}")
        files = [isinstance(state, dict) and "shard_file" in state for state in states]  # each server's own
        if any(files) and self.shard_dir is None:
            raise ValueError("the saved server state names the files each server wrote its shard to: load "
                             "it with shard_dir, the folder they are in")
        for k, state in enumerate(states):
            if files[k]:
                assert self.shard_dir is not None  # (files named: the check above ruled out None)
                self.comm.send(("load", os.path.join(self.shard_dir, state["shard_file"])), dest=k, tag=TAG_STATE)
            else:
                self.comm.send(("set", state), dest=k, tag=TAG_STATE)
        try:
            self._state_replies()
        except RuntimeError as exc:
            raise ValueError(str(exc)) from None

    can_drop_workers = True

    def drop_workers(self, workers: Sequence[int], comm, *, tell_servers: bool) -> None:
        """Go on without ``workers`` (worker ranks that stopped making progress): collectives among
        the workers now run over ``comm`` (the others'), the servers stop waiting for them (told by
        one worker, ``tell_servers``), and ``close()`` will not join the windows' collective free,
        which the dropped workers would never join (the job then ends with MPI_Abort)."""
        self._check_idle()
        self._workers_comm = comm
        self.dropped = sorted(set(self.dropped) | {int(w) for w in workers})
        self._watch.ignored |= set(self.dropped)
        if tell_servers:
            for k in range(self.servers):
                self.comm.send(("drop", self.dropped), dest=k, tag=TAG_STATE)
            self._state_replies()

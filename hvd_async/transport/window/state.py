"""The worker's side of the servers' state, over the control messages (``TAG_STATE``): every shard's
whole state for a checkpoint and its restoration, and telling the servers to go on without workers
that stopped. :class:`ServerStateLink` is one object the window transport holds."""
import os
from typing import Any, Dict, List, Optional, Sequence

from .layout import TAG_STATE, TAG_STATE_REPLY


class ServerStateLink:
    """Requests about the shards' whole state, to each of ``servers`` server ranks over ``comm`` (the
    transport's communicator with them), answered in turn; safe only while no worker is pushing."""

    def __init__(self, comm, servers: int):
        self._comm, self._servers = comm, int(servers)

    def get(self, shard_dir: Optional[str]) -> List[Any]:
        """Every shard's whole state (weights, counters, outbox slots, the rule's buffers); with
        ``shard_dir``, each server writes its shard there (``shard-<k>.pt``) and the files' names come back."""
        for k in range(self._servers):
            if shard_dir is None:
                self._comm.send(("get", None), dest=k, tag=TAG_STATE)
            else:
                self._comm.send(("save", os.path.join(shard_dir, f"shard-{k}.pt")), dest=k, tag=TAG_STATE)
        return self._replies()

    def load(self, states: Sequence[Dict[str, Any]], shard_dir: Optional[str]) -> None:
        """Put back what :meth:`get` returned (same number of servers, shard sizes and workers)."""
        if not isinstance(states, (list, tuple)) or len(states) != self._servers:
            got = len(states) if isinstance(states, (list, tuple)) else type(states).__name__
            raise ValueError(f"the saved server state has {got} shard(s), this job has {self._servers} "
                             f"server(s); resume with --servers {got if isinstance(got, int) else '?'}")
        files = [isinstance(state, dict) and "shard_file" in state for state in states]  # each server's own
        if any(files) and shard_dir is None:
            raise ValueError("the saved server state names the files each server wrote its shard to: load "
                             "it with shard_dir, the folder they are in")
        for k, state in enumerate(states):
            if files[k]:
                assert shard_dir is not None  # (files named: the check above ruled out None)
                self._comm.send(("load", os.path.join(shard_dir, state["shard_file"])), dest=k, tag=TAG_STATE)
            else:
                self._comm.send(("set", state), dest=k, tag=TAG_STATE)
        try:
            self._replies()
        except RuntimeError as exc:
            raise ValueError(str(exc)) from None

    def drop(self, dropped: Sequence[int]) -> None:
        """Tell every server to stop waiting for the workers ``dropped`` (all of them so far)."""
        for k in range(self._servers):
            self._comm.send(("drop", list(dropped)), dest=k, tag=TAG_STATE)
        self._replies()

    def _replies(self) -> List[Any]:
        replies = [self._comm.recv(source=k, tag=TAG_STATE_REPLY) for k in range(self._servers)]
        for status, value in replies:
            if status != "ok":
                raise RuntimeError(value)
        return [value for _, value in replies]

"""A record of one worker's pushes and pulls on a window transport, for the simulator's replay.

Opt-in: with ``HVD_ASYNC_WINDOW_TRACE=DIR`` in the environment every
:class:`~hvd_async.transport.window.WindowTransport` (accumulate mode: asgd, dbs-asgd, easgd; mailbox
mode: dc-asgd, lc-asgd) writes
``DIR/worker-R.jsonl`` (one JSON line per exchange, in order) and, at ``close()``, ``DIR/worker-R.npy``:
the buffer of its last pull (after the training job's final ``load_global_model()``: the final global
weights). ``hvd-async simulate --trace-out DIR`` writes the same files from the simulator, and
``--replay DIR`` makes each simulated push wait for the place the recorded one took.

Lines: ``{"op": "push", "version": [v per shard], "staleness": [...]}`` (``v``: the shard's version
before this push, i.e. its place in the order of all pushes) and ``{"op": "pull", "version": [...],
"after_push": bool, "digest": sha1 of the weights read}``. In mailbox mode a push is the server's
answer read back: ``version`` is the place the server gave it (the version it answered with, less
one), and a ``pull`` line follows with the digest of the weights the answer brought
(``after_push``: true); a ``Kind.PULL`` request's answer is a ``pull`` line too.
"""
import hashlib
import json
import os
from typing import Dict, List, Optional

import numpy as np
import torch

ENV = "HVD_ASYNC_WINDOW_TRACE"


def digest(flat: torch.Tensor) -> str:
    return hashlib.sha1(flat.detach().numpy().tobytes()).hexdigest()


class Tracer:
    """Appends one worker's exchanges to ``directory/worker-RANK.jsonl``."""

    def __init__(self, directory: str, rank: int, algorithm: str):
        os.makedirs(directory, exist_ok=True)
        self.rank, self.directory = rank, directory
        self._file = open(os.path.join(directory, f"worker-{rank}.jsonl"), "w")
        self._file.write(json.dumps({"op": "open", "algorithm": algorithm, "rank": rank}) + "\n")
        self._last: Optional[torch.Tensor] = None

    @classmethod
    def from_env(cls, rank: int, algorithm: str, mode: str) -> Optional["Tracer"]:
        """A tracer when ``HVD_ASYNC_WINDOW_TRACE`` names a folder (window transports of either mode)."""
        directory = os.environ.get(ENV)
        return cls(directory, rank, algorithm) if directory and mode in ("accumulate", "mailbox") else None

    def answered(self, kind_is_push: bool, answers, out: Optional[torch.Tensor]) -> None:
        """A mailbox answer: the push's place (answered version less one), then what it brought back."""
        versions = answers.versions
        if kind_is_push:
            self.push(versions - 1, answers.staleness)
        if out is not None:
            self.pull(versions, out, kind_is_push)

    def push(self, versions, staleness) -> None:
        self._file.write(json.dumps({"op": "push", "version": [int(v) for v in versions],
                                     "staleness": [int(s) for s in staleness]}) + "\n")

    def pull(self, versions, flat: torch.Tensor, after_push: bool) -> None:
        self._last = flat
        self._file.write(json.dumps({"op": "pull", "version": [int(v) for v in versions],
                                     "after_push": bool(after_push), "digest": digest(flat)}) + "\n")

    def close(self) -> None:
        if self._last is not None:
            np.save(os.path.join(self.directory, f"worker-{self.rank}.npy"), self._last.detach().numpy())
        self._file.close()


class Trace:
    """A recorded run read back: per worker, its exchanges in order and its final weights."""

    def __init__(self, directory: str):
        self.directory = directory
        self.events: Dict[int, List[Dict]] = {}
        for name in sorted(os.listdir(directory)):
            if name.startswith("worker-") and name.endswith(".jsonl"):
                rank = int(name[len("worker-"):-len(".jsonl")])
                with open(os.path.join(directory, name)) as f:
                    self.events[rank] = [json.loads(line) for line in f if line.strip()]
        if not self.events:
            raise ValueError(f"{directory} holds no trace (worker-R.jsonl files); record one with "
                             f"{ENV}={directory} or hvd-async simulate --trace-out {directory}")
        if sorted(self.events) != list(range(len(self.events))):
            raise ValueError(f"{directory}: traces of workers {sorted(self.events)}; expected 0..{len(self.events) - 1}")

    @property
    def workers(self) -> int:
        return len(self.events)

    def pushes(self, rank: int) -> List[int]:
        """The shard-0 version each of ``rank``'s pushes took (its place among all pushes)."""
        return [e["version"][0] for e in self.events[rank] if e["op"] == "push"]

    def pulls(self, rank: int) -> List[Dict]:
        return [e for e in self.events[rank] if e["op"] == "pull"]

    def final(self, rank: int = 0) -> np.ndarray:
        return np.load(os.path.join(self.directory, f"worker-{rank}.npy"))

    def check_order(self) -> int:
        """The pushes of all workers must take the places 0..P-1 once each; returns P."""
        places = sorted(v for rank in self.events for v in self.pushes(rank))
        if places != list(range(len(places))):
            raise ValueError(f"{self.directory}: the recorded pushes do not take each place 0..{len(places) - 1} once")
        return len(places)

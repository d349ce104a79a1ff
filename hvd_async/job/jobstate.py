"""What the training job keeps so that a checkpoint resumes it exactly: batch positions, counters,
and the collective save and restore of every worker's part and the servers' shards.

One checkpoint per save: a folder of parts, each written by the process that holds it (atomic,
``hvd_async.checkpoint.save``), then the file that names the folder, written by worker 0::

    ckpt-<step>-<token>.parts/worker-<r>.pt   worker r's part
    ckpt-<step>-<token>.parts/shard-<k>.pt    server k's shard (window algorithms)
    ckpt-<step>.pt                            {"parts": "ckpt-<step>-<token>.parts", "workers": W, "job": {...}}

Each worker's part holds its model, its ``DistributedOptimizer.state_dict()`` and algorithm state
(worker 0's names the shards' files), its batch position, its RNG states and its counters; ``job``
holds what worker 0 reports (the epoch, the metrics history, the next checkpoint). Every file's
``meta`` names the job (algorithm, workers, servers, dataset, model, batch size, seed, parameter
shapes): resuming a different one is refused with one line saying what differs. The folder must be
on a file system every rank can reach (shared across hosts). Checkpoints written before parts had
files of their own (``{"workers": [part, ...], "job": ...}`` in the one file) still resume.
"""
import glob
import os
import shutil
import time
import uuid
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Tuple

import torch

from .. import checkpoint
from ..checkpoint import CheckpointError

if TYPE_CHECKING:
    from torch.utils.data import DistributedSampler

    from ..sampling import SharedCursorBatches

__all__ = ["Batches", "CheckpointError", "JobCheckpoints", "WorkerStalled", "load_newest", "parse_every",
           "read_whole", "rendezvous"]

TAG_ARRIVED = 7201


class WorkerStalled(RuntimeError):
    """Workers stopped making progress (``--worker-timeout``) where the job cannot go on without them."""

    printer: bool  # set by the raiser: whether this worker prints the error

    def __init__(self, workers: List[int], timeout: float, why: str):
        self.workers = workers
        names = ", ".join(map(str, workers))
        super().__init__(f"worker(s) {names} made no progress for {timeout:g} s (--worker-timeout); {why}")


def rendezvous(comm, timeout: float) -> List[int]:
    """Wait until every rank of ``comm`` has come here, at most ``timeout`` seconds after this one
    did; returns the ranks that did not come (empty when all did). A small message to every other
    rank, so a rank that never arrives is named rather than waited for in a collective."""
    me, size = comm.rank, comm.size
    for rank in range(size):
        if rank != me:
            comm.isend(None, dest=rank, tag=TAG_ARRIVED)  # eager: completes without the receiver
    arrived = {me}
    deadline = time.monotonic() + timeout
    while len(arrived) < size and time.monotonic() < deadline:
        for rank in range(size):
            if rank not in arrived and comm.iprobe(source=rank, tag=TAG_ARRIVED):
                comm.recv(source=rank, tag=TAG_ARRIVED)
                arrived.add(rank)
        time.sleep(0.001)
    return sorted(set(range(size)) - arrived)


def parse_every(text: str):
    """``--checkpoint-every``: ``N`` or ``Nepochs`` (every N epochs), ``Nsteps`` (every N steps) ->
    ``(N, "epochs" | "steps")``; ValueError naming the value otherwise."""
    value = str(text).strip().lower()
    for unit, suffixes in (("steps", ("steps", "step")), ("epochs", ("epochs", "epoch", ""))):
        for suffix in suffixes:
            number = value[:len(value) - len(suffix)] if suffix else value
            if value.endswith(suffix) and number.isdigit() and int(number) >= 1:
                return int(number), unit
    raise ValueError(f"--checkpoint-every {text!r}: give N or Nepochs (every N epochs) or Nsteps (every "
                     f"N steps), N >= 1, e.g. 2 or 500steps")


class Batches:
    """One worker's mini-batches as index lists, with a position a checkpoint holds.

    ``synchronous``: each epoch's ``DistributedSampler`` split (reshuffled per epoch by ``seed``);
    ``next(epoch)`` returns None once this worker's share of that epoch is used. Otherwise an endless
    sequence of random passes over the data from this worker's own generator.
    """

    epoch: Optional[int]  # the epoch ``order`` is of (synchronous), None before the first
    order: List[int]
    pass_start: Optional[torch.Tensor]
    sampler: "DistributedSampler[int]"  # synchronous only

    def __init__(self, num_samples: int, batch_size: int, *, rank: int, workers: int, seed: int,
                 synchronous: bool):
        self.num_samples, self.batch_size = num_samples, batch_size
        self.rank, self.workers, self.seed, self.synchronous = rank, workers, seed, synchronous
        self.generator = torch.Generator().manual_seed(seed * 1000 + rank + 1)
        self.epoch, self.pos, self.order = None, 0, []
        self.pass_start = None  # the generator's state before this pass's permutation
        if synchronous:
            from torch.utils.data import DistributedSampler

            self.sampler = DistributedSampler(
                range(num_samples),  # type: ignore[arg-type]  # torch's stub wants a Dataset; it takes only its len()
                num_replicas=workers, rank=rank, shuffle=True, seed=seed)
            self.per_epoch = -(-len(self.sampler) // batch_size)

    def _epoch_order(self, epoch: int) -> List[int]:
        self.sampler.set_epoch(epoch)
        return list(self.sampler)

    def _new_pass(self) -> List[int]:
        self.pass_start = self.generator.get_state()
        return torch.randperm(self.num_samples, generator=self.generator).tolist()

    def next(self, epoch: int) -> Optional[List[int]]:
        if self.synchronous:
            if self.epoch != epoch:
                self.epoch, self.pos, self.order = epoch, 0, self._epoch_order(epoch)
            if self.pos >= len(self.order):
                return None
        elif self.pos >= len(self.order):
            self.order, self.pos = self._new_pass(), 0
        batch = self.order[self.pos:self.pos + self.batch_size]
        self.pos += len(batch)
        return batch

    def state_dict(self) -> Dict[str, Any]:
        if self.synchronous:
            return {"epoch": self.epoch, "pos": self.pos}
        return {"pass_start": self.pass_start, "pos": self.pos, "after": self.generator.get_state()}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.pos = int(state["pos"])
        if self.synchronous:
            self.epoch = state["epoch"]
            self.order = self._epoch_order(self.epoch) if self.epoch is not None else []
        elif state["pass_start"] is not None:
            self.generator.set_state(state["pass_start"])
            self.order = self._new_pass()
            self.generator.set_state(state["after"])


class WorkerBatches:
    """What one worker trains on next: the training job and the simulator draw alike.

    - dbs-asgd (``fetch_add`` given: the servers' shared cursor): batches of the strategy's current
      size from one shared sequence, each sample once per epoch; the epoch is over for this worker
      when the sequence has moved on to the next one;
    - the other parameter-server algorithms (``servers``): this worker's own random batches until
      the servers' progress reaches ``epoch`` passes over the data (fast workers push more of them,
      and nobody waits inside an epoch), and at least one batch per epoch: with more workers than
      batches in a pass, the pushes in flight when the count is reached can pass the next epoch's
      mark too, which would leave that epoch with no training at all;
    - the rest: this worker's ``DistributedSampler`` share of the epoch.

    ``batches``, ``drawn`` (dbs-asgd's batch taken from the sequence but not trained on yet) and
    ``last_epoch`` (the epoch of this worker's last batch) are what a checkpoint keeps.
    """

    def __init__(self, num_samples: int, batch_size: int, *, rank: int, workers: int, seed: int, strategy,
                 servers: bool, fetch_add=None):
        self.strategy, self.servers = strategy, servers
        self.global_steps = -(-num_samples // batch_size)  # batches in one pass over the data
        self.batches = Batches(num_samples, batch_size, rank=rank, workers=workers, seed=seed,
                               synchronous=not servers)
        self.shared: Optional["SharedCursorBatches"] = None
        if fetch_add is not None:
            from ..sampling import SharedCursorBatches

            self.shared = SharedCursorBatches(num_samples, seed=seed, fetch_add=fetch_add)
        self.drawn: Optional[Tuple[int, List[int]]] = None
        self.last_epoch: Optional[int] = None

    def next(self, epoch: int) -> Optional[List[int]]:
        """The sample indices of this worker's next batch of ``epoch``, or None when it is over."""
        if self.shared is not None:
            self.drawn = self.drawn or self.shared.draw(self.strategy.batch_size)
            if self.drawn[0] >= epoch:  # the shared sequence has moved on to the next epoch
                return None
            indices, self.drawn = self.drawn[1], None
            return indices
        if self.servers:
            if self.last_epoch == epoch and self.strategy.progress() >= epoch * self.global_steps:
                return None
            self.last_epoch = epoch
        return self.batches.next(epoch)


def load_newest(directory: str, expect: Dict[str, Any], *, mmap: bool = False) -> Tuple[str, Dict[str, Any]]:
    """``(path, state)`` of the newest checkpoint in ``directory``, which must exist, be a whole
    hvd_async checkpoint and have been written by a job with ``expect``'s settings; otherwise
    :class:`CheckpointError` with one line saying so. The job restores with it; the launcher checks
    with it before mpirun starts (``mmap``: without reading the tensors, and without the model's
    shapes in ``expect``, which only the job knows), seconds before each rank would have imported
    torch and Horovod and loaded the data to refuse the same."""
    path = checkpoint.latest(directory)
    if path is None:
        raise CheckpointError(f"--resume: no checkpoint (ckpt-<step>.pt) in {directory}; start without "
                              f"--resume, or point --checkpoint-dir at the run's folder")
    return path, checkpoint.load(path, expect=expect, mmap=mmap)


class JobCheckpoints:
    """Collective save and restore of the job over the workers' communicator ``comm``.

    A checkpoint is a folder of parts, ``ckpt-<step>-<token>.parts/``, each written by its own
    process (``worker-<r>.pt`` by worker r; ``shard-<k>.pt`` by server k, when the part's algorithm
    state was taken with ``shard_dir``), and then ``ckpt-<step>.pt``, written by worker 0 last, which
    names the folder: the file is the commit, so a save cut short leaves the previous checkpoint the
    newest. Nothing is gathered to one process. The token keeps a checkpoint of the same step written
    again (a resumed run) out of the folder the older file names."""

    def __init__(self, directory: str, *, keep: int, meta: Dict[str, Any], comm):
        self.directory, self.keep, self.meta, self.comm = os.path.abspath(directory), keep, meta, comm

    def parts_dir(self, step: int) -> str:
        """A new folder for the parts of the checkpoint of ``step`` (the same on every worker)."""
        token = self.comm.bcast(uuid.uuid4().hex[:8] if self.comm.rank == 0 else None, root=0)
        return os.path.join(self.directory, f"ckpt-{step}-{token}.parts")

    def save(self, step: int, folder: str, make_part: Callable[[], Dict[str, Any]],
             job: Optional[Dict[str, Any]]) -> str:
        """Every worker writes ``make_part()`` into ``folder`` (from :meth:`parts_dir`; worker 0 also
        passes ``job``); then worker 0 writes the file that names it. Returns the file's path on all;
        CheckpointError on all when any part could not be made or written."""
        error = None
        try:
            checkpoint.save(part_path(folder, self.comm.rank), make_part(), kind=PART_KIND,
                            meta=self.meta)
        except (OSError, TypeError, RuntimeError, ValueError) as exc:
            error = f"worker {self.comm.rank}: {exc}"
        errors = [e for e in self.comm.gather(error, root=0) or () if e]
        path = None
        if self.comm.rank == 0 and not errors:
            try:
                path = checkpoint.save_in(self.directory, step, {"parts": os.path.basename(folder),
                                                                 "workers": self.comm.size, "job": job},
                                          keep=self.keep, meta=self.meta)
                _prune_parts(self.directory)
            except (OSError, TypeError) as exc:
                errors.append(str(exc))
        path, errors = self.comm.bcast((path, errors), root=0)
        if errors:
            raise CheckpointError(f"could not write a checkpoint in {self.directory}: {errors[0]}")
        return path

    def restore(self):
        """Read the newest checkpoint and hand every worker its part: ``(path, part, job, folder)``
        (``folder``: where the parts are, for the servers' shards). Raises CheckpointError on every
        worker when there is none, it does not fit this job, or a part cannot be read."""
        state, error, path = None, None, None
        if self.comm.rank == 0:
            try:
                path, state = load_newest(self.directory, self.meta)
                saved = state.get("workers")
                saved = saved if isinstance(saved, int) else len(saved or ())
                if saved != self.comm.size:
                    error = f"checkpoint {path} holds {saved} workers' state"
            except CheckpointError as exc:
                error = str(exc)
        path, error, parts = self.comm.bcast((path, error, state and state.get("parts")), root=0)
        if error:
            raise CheckpointError(error)
        if parts is None:  # written before parts had files of their own: worker 0 holds them all
            part = self.comm.scatter(state["workers"] if state else None, root=0)
            folder = None
        else:
            folder, part = os.path.join(self.directory, parts), None
            try:
                part = checkpoint.load(part_path(folder, self.comm.rank), kind=PART_KIND,
                                       expect=self.meta)
            except CheckpointError as exc:
                error = str(exc)
            errors = [e for e in self.comm.allgather(error) if e]
            if errors:
                raise CheckpointError(errors[0])
        job = self.comm.bcast(state["job"] if state else None, root=0)
        return path, part, job, folder


PART_KIND = "worker-part"  # the kind of a worker's own file in a checkpoint's folder of parts


def part_path(folder: str, rank: int) -> str:
    """Where worker ``rank``'s part of a checkpoint is, in its folder of parts."""
    return os.path.join(folder, f"worker-{rank}.pt")


def read_whole(path: str) -> Dict[str, Any]:
    """The job checkpoint at ``path`` as one state, ``{"workers": [part of worker 0, ...], "job": ...}``,
    its workers' parts read from their files (the servers' shards stay in theirs: worker 0's part
    names them); for tools and tests that look inside."""
    state = checkpoint.load(path)
    if "parts" in state:
        folder = os.path.join(os.path.dirname(path), state["parts"])
        state = dict(state, workers=[checkpoint.load(part_path(folder, r), kind=PART_KIND)
                                     for r in range(state["workers"])])
    return state


def parts_folder(path: str) -> Optional[str]:
    """The folder of parts the job checkpoint at ``path`` names (None when it holds them itself)."""
    parts = checkpoint.load(path, mmap=True).get("parts")
    return None if parts is None else os.path.join(os.path.dirname(path), parts)


def _prune_parts(directory: str) -> None:
    """Remove the folders of parts that no checkpoint file in ``directory`` names (those of deleted
    checkpoints, and of saves cut short)."""
    named = {parts_folder(p) for _, p in checkpoint.listed(directory)}
    for folder in glob.glob(os.path.join(glob.escape(directory), "ckpt-*.parts")):
        if folder not in named:
            shutil.rmtree(folder, ignore_errors=True)

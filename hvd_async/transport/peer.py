"""One MPI window per worker holding its gossip state, read and added into by peers one-sidedly; no server.

Each worker allocates (``MPI.Win.Allocate``, collectively over the workers' communicator, so no
parameter server is involved) one window of ``8 + 4 * numel`` bytes, addressed in bytes:

- bytes ``[0, 8)``: a float64 weight (push-sum's ``s``; pull gossip leaves it at 1);
- bytes ``[8, 8 + 4 * numel)``: the flat fp32 buffer (pull: the weights the worker last published;
  push-sum: its numerator ``x``).

Concurrency (passive target, one lock epoch per access, never two locks held at once):

- a peer's ``get`` (pull) and ``accumulate`` (push) run under a *shared* lock on the target: readers
  do not block each other, and concurrent ``MPI_Accumulate(SUM)`` into one element are atomic in MPI,
  so no push is lost however many land together. ``get`` is a plain ``MPI_Get`` beside those
  accumulates where the peer shares this node's memory, and ``Get_accumulate(NO_OP)`` where it is on
  another node (MPI defines only accumulate-family reads there; why a plain one on a node, and the test
  that checks it never reads a partial element, in :mod:`hvd_async.transport.window`);
- the owner touches its own window's memory only inside ``own()``, an *exclusive* lock on itself:
  it waits for the epochs in progress and keeps every peer out while it reads, folds and rewrites
  the buffer and the weight, so a peer never sees the pair half-updated and no push lands in the
  middle of the owner's read-modify-write. The owner's model is a separate buffer (the strategy's):
  computing on it needs no lock.

Progress: across hosts a passive-target operation completes only when its target calls into MPI
(ENVIRONMENT.md), and a worker is mostly computing. Each transport therefore runs one daemon
thread that calls ``Iprobe`` on a communicator of its own (a ``Dup`` of the workers' communicator
that carries no messages) every ``progress_interval`` seconds (default 1 ms: a remote access
waits at most about that long for a busy target; the thread sleeps in between, so its CPU cost is
a few microseconds per turn). It needs ``MPI_THREAD_MULTIPLE``, which ``hvd_async.init`` asks for.
On one host OpenMPI's shared-memory windows do not need it. ``close()`` stops it.

Windows across hosts need ``--mca osc ucx`` (see :data:`hvd_async.transport.window.OSC_HINT`).
"""
import logging
import threading
from contextlib import contextmanager
from typing import Any, Iterator, List, Tuple

import numpy as np
import torch

from .. import failures
from ..checks import is_finite_number
from .base import Transport
from .leave import LeaveWatch
from .window import OSC_HINT, atomic_read_targets

logger = logging.getLogger(__name__)

HEADER = 8  # bytes before the buffer: the float64 weight


class PeerWindowTransport(Transport):
    """Every worker's gossip window, plus the collectives the gossip strategy needs.

    Opening and ``close()`` are collective over the workers.

    Args:
        numel: elements of the flat fp32 buffer each worker exposes.
        name: what the windows are for (thread names, messages).
        progress_interval: seconds between the progress thread's calls into MPI (> 0).

    Example::

        t = PeerWindowTransport(10, comms=hvd_async.runtime.comms(), name="gossip")
        with t.own() as (buf, weight):
            buf.fill_(t.rank); weight[0] = 1.0
        t.barrier()
        peer = torch.empty(10); t.get((t.rank + 1) % t.size, peer)
        t.close()
    """

    closes_collectively = True

    def __init__(self, numel: int, *, comms, name: str, progress_interval: float = 0.001):
        super().__init__()
        if isinstance(numel, bool) or not isinstance(numel, (int, np.integer)) or numel < 1:
            raise ValueError(f"numel must be a positive integer, got {numel!r}")
        if not (is_finite_number(progress_interval) and 0 < progress_interval <= 1):
            raise ValueError(f"progress_interval must be in (0, 1] seconds, got {progress_interval!r}")
        MPI = comms.mpi
        if MPI.Query_thread() != MPI.THREAD_MULTIPLE:
            raise RuntimeError("PeerWindowTransport runs an MPI progress thread and needs MPI_THREAD_MULTIPLE; "
                               "MPI was initialised with a lower thread level (leave mpi4py.rc.thread_level "
                               "at its default 'multiple')")
        self._MPI, self._clock = MPI, comms.clock
        self.name, self.numel, self.progress_interval = name, int(numel), float(progress_interval)
        self.atomic_reads = atomic_read_targets(comms.group, MPI)  # peers read with Get_accumulate(NO_OP)
        self.comm = comms.group.Dup()
        self._rank, self._size = self.comm.rank, self.comm.size
        try:
            self._win = MPI.Win.Allocate(HEADER + 4 * self.numel, 1, comm=self.comm)
        except MPI.Exception as exc:
            self.comm.Free()
            raise RuntimeError(f"{OSC_HINT} (MPI said: {exc.Get_error_string()})") from None
        self._separate = self._win.Get_attr(MPI.WIN_MODEL) != MPI.WIN_UNIFIED
        memory = self._win.tomemory()
        self._weight = np.frombuffer(memory, dtype=np.float64, count=1, offset=0)
        self._buffer = torch.from_numpy(np.frombuffer(memory, dtype=np.float32, count=self.numel, offset=HEADER))
        self._in_weight = np.zeros(1, dtype=np.float64)
        self._out_weight = np.zeros(1, dtype=np.float64)
        self._no_op = ([np.empty(0, dtype=np.float64), MPI.DOUBLE], [np.empty(0, dtype=np.float32), MPI.FLOAT])
        with self.own() as (buf, weight):
            buf.zero_()
            weight[0] = 0.0
        self._progress_comm = comms.group.Dup()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._progress_loop, name=f"{name}-mpi-progress", daemon=True)
        self._thread.start()
        self._watch = LeaveWatch(self.comm, f"{name} transport", MPI)  # no collective waits for a leaver
        self._watch.barrier(self.comm, "the start")  # every window exists and is zeroed before anyone touches a peer's

    # --- who we are ------------------------------------------------------------------------
    @property
    def rank(self) -> int:
        return self._rank

    @property
    def size(self) -> int:
        return self._size

    def _progress_loop(self) -> None:
        """On the progress thread: call into MPI every ``progress_interval`` until ``close()``."""
        comm, any_source, any_tag = self._progress_comm, self._MPI.ANY_SOURCE, self._MPI.ANY_TAG
        while not self._stop.wait(self.progress_interval):
            comm.Iprobe(source=any_source, tag=any_tag)

    def _check_peer(self, peer: int) -> None:
        self._check_open()
        if isinstance(peer, bool) or not isinstance(peer, (int, np.integer)) or not 0 <= peer < self._size \
                or peer == self._rank:
            raise ValueError(f"peer must be another worker's rank in [0, {self._size}) other than "
                             f"{self._rank}, got {peer!r}")

    def _array(self, flat: torch.Tensor) -> np.ndarray:
        if flat.dtype != torch.float32 or flat.device.type != "cpu" or not flat.is_contiguous() \
                or flat.numel() != self.numel:
            raise ValueError(f"expected a contiguous CPU float32 tensor of {self.numel} elements, "
                             f"got {flat.dtype} {tuple(flat.shape)} on {flat.device}")
        return flat.numpy()

    # --- this worker's own window ---------------------------------------------------------------
    @contextmanager
    def own(self) -> Iterator[Tuple[torch.Tensor, np.ndarray]]:
        """Exclusive access to this worker's own window: yields ``(buffer, weight)``, views of the
        window memory (a float32 tensor of ``numel`` and a float64 array of one); no peer reads or
        adds meanwhile. Do not keep the views past the ``with``."""
        self._check_open()
        win = self._win
        win.Lock(self._rank, self._MPI.LOCK_EXCLUSIVE)
        try:
            if self._separate:
                win.Sync()
            yield self._buffer, self._weight
            if self._separate:
                win.Sync()
        finally:
            win.Unlock(self._rank)

    # --- one-sided access to a peer's window ----------------------------------------------------
    def get(self, peer: int, out: torch.Tensor) -> float:
        """Read ``peer``'s buffer into ``out`` and return its weight, both from one lock epoch."""
        self._check_peer(peer)
        MPI, win = self._MPI, self._win
        array = self._array(out)
        win.Lock(peer, MPI.LOCK_SHARED)
        try:
            if peer in self.atomic_reads:  # element-atomic beside the pushers' accumulates
                win.Get_accumulate(self._no_op[0], [self._in_weight, MPI.DOUBLE], peer, target=(0, 1, MPI.DOUBLE),
                                   op=MPI.NO_OP)
                win.Get_accumulate(self._no_op[1], [array, MPI.FLOAT], peer, target=(HEADER, self.numel, MPI.FLOAT),
                                   op=MPI.NO_OP)
            else:
                win.Get([self._in_weight, MPI.DOUBLE], peer, target=(0, 1, MPI.DOUBLE))
                win.Get([array, MPI.FLOAT], peer, target=(HEADER, self.numel, MPI.FLOAT))
        finally:
            win.Unlock(peer)  # the data is in ``out`` once this returns
        return float(self._in_weight[0])

    def accumulate(self, peer: int, delta: torch.Tensor, weight: float = 0.0) -> None:
        """Add ``delta`` into ``peer``'s buffer and ``weight`` into its weight (``MPI_Accumulate(SUM)``,
        atomic per element against other pushers); complete at the target when this returns."""
        self._check_peer(peer)
        MPI, win = self._MPI, self._win
        array = self._array(delta)
        self._out_weight[0] = weight
        win.Lock(peer, MPI.LOCK_SHARED)
        try:
            win.Accumulate([array, MPI.FLOAT], peer, target=(HEADER, self.numel, MPI.FLOAT), op=MPI.SUM)
            if weight:
                win.Accumulate([self._out_weight, MPI.DOUBLE], peer, target=(0, 1, MPI.DOUBLE), op=MPI.SUM)
        finally:
            win.Unlock(peer)

    # --- collectives over the workers ----------------------------------------------------------
    def barrier(self, what: str = "a barrier") -> None:
        """Wait for every worker (it also drives MPI progress while it waits); raises
        :class:`~hvd_async.transport.leave.PeerLeftError` if one has closed instead."""
        self._check_open()
        self._watch.barrier(self.comm, what)

    def allgather_object(self, obj) -> List[Any]:
        self._check_open()
        self._watch.barrier(self.comm, "an allgather")  # everyone is there: the allgather cannot hang
        return self.comm.allgather(obj)

    def broadcast_(self, tensor: torch.Tensor, *, root: int = 0) -> torch.Tensor:
        """Overwrite ``tensor`` (contiguous CPU) with ``root``'s on every worker."""
        self._check_open()
        self._watch.barrier(self.comm, "a broadcast")
        self.comm.Bcast(tensor.numpy(), root=root)
        return tensor

    def sum_(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor <- sum over workers`` in place, bit-identical on every worker (reduced on worker 0
        and broadcast from there, so no worker sums in a different order)."""
        self._check_open()
        array = tensor.numpy()
        self._watch.barrier(self.comm, "a sum over the workers")
        if self._rank == 0:
            self.comm.Reduce(self._MPI.IN_PLACE, array, op=self._MPI.SUM, root=0)
        else:
            self.comm.Reduce(array, None, op=self._MPI.SUM, root=0)
        self.comm.Bcast(array, root=0)
        return tensor

    def close(self) -> None:
        """Collective over the workers: tell the others this worker has left (a collective of theirs
        it will never join raises instead of waiting); once every worker is done with every window,
        stop the progress thread and free the windows. Later calls raise."""
        if self._closed:
            return
        self._watch.announce()
        self._watch.wait_all_closed()  # no access to any window is in flight past this point
        self._watch.free()
        self._stop.set()
        self._thread.join()
        self._closed = True
        with failures.deadline(self.comm, "the peer windows' free at close()", f"worker {self._rank}"):
            self._win.Free()
        self._progress_comm.Free()
        self.comm.Free()

"""MPI one-sided windows on the parameter-server ranks: the transport of the parameter-server family.

The model's parameters are one flat fp32 buffer of ``numel`` elements, cut into ``S`` contiguous
shards (the first ``numel % S`` shards one element longer), shard ``k`` held by server rank ``k``.
Per shard, ``MPI.Win.Allocate`` windows (workers allocate zero bytes; every window has one owner):

- ``weights``: the shard of the global weights;
- ``meta`` (int64): ``[version, pushes, server busy microseconds, staleness histogram (HIST_BINS
  bins, the last one counts everything at or beyond it), two float64 sums over the applied pushes
  (squared norm of the compensation the server added to each gradient, and of the gradients: dc-asgd
  and lc-asgd), a shared cursor, one value per worker]`` (cursor and values are used on shard 0
  only: dbs-asgd's batch cursor and speed table; od-sgd's shards keep ``META_WRITING`` in the
  cursor's place, see below);
- mailbox mode only, ``inbox`` and ``outbox``: one shard-sized slot per worker. A worker puts its
  gradient into its inbox slot, flushes, and sends the server a small header message; the server
  applies its rule, writes the weights it wants the worker to continue from into the worker's
  outbox slot (dc-asgd keeps them there as that worker's backup ``w_bak(m)``) and answers with
  ``[version, staleness, pushes, status]``; the worker then gets its outbox slot.

Two modes:

- ``accumulate`` (asgd): a push is ``Accumulate(SUM)`` of a delta straight into ``weights`` (MPI makes
  concurrent accumulates to one element atomic, so no update is lost) and, in the same round trip,
  ``Fetch_and_op`` on the shard's version counter, whose old value, less the version read at the
  last pull, is the push's staleness; the worker adds its staleness counts into the shard's
  histogram every ``HIST_EVERY`` pushes and at ``read_stats``/``close``. The server does nothing
  but keep MPI progressing.
- ``mailbox`` (dc-asgd, softsync): the server runs the algorithm's rule (see ``ShardHost``).

Workers hold a shared passive-target lock on every window for the transport's whole life
(``Lock_all``) and complete operations with ``Flush``; the server holds one on its own windows and
touches their memory directly between ``Win.Sync`` calls. Headers and answers are two-sided
messages on the transport's own communicator: the data never leaves the windows, and a worker
waiting for an answer sits in ``MPI_Wait`` instead of polling a flag across the network.

Reads of the weights are plain ``Get``/``Rget``, also in accumulate mode where other workers may be
adding into the same elements meanwhile. MPI leaves such a read undefined (only accumulate-family
reads, ``Get_accumulate`` with ``NO_OP``, are element-atomic beside accumulates), but on the
platforms we run (Open MPI's ``osc/sm`` and ``osc/rdma`` over TCP, x86-64, aligned 4-byte floats) a
read never sees a partial element: ``tests/mpi/rma_read_checks.py`` reads while workers push, over
shared memory, TCP and three netns hosts, and checks every element of every read. A NO_OP
``Get_accumulate`` in its place makes a push+pull round 1.17-1.59 times as long over shared memory
from 1 MB up, and 1.4-2.0 times over TCP up to 1 MB (``benchmarks/results/rma_atomic_reads_*.json``),
so the hot path does without it. A pull may see
some elements of a concurrent push and not others, as asgd's analysis allows. The small meta
counters are read with accumulate-family calls (``read_stats``, ``read_values``: ``Fetch_and_op``,
``Get_accumulate``; ``publish_value`` writes with ``Accumulate(REPLACE)``). In mailbox mode no worker
adds into the weights or the outbox: a worker's outbox slot is written by its server only while
serving that worker's own request, never while the worker reads it.

A mailbox program that rewrites the weights window in place while workers may read it (od-sgd's
global step, which its workers read from the weights window after the answer, and which with
``--worker-timeout`` the server may apply again before a set-aside worker has finished reading)
brackets each write with :meth:`ShardHost.writing_weights`: ``META_WRITING`` holds the version
being written while the weights change and the current version otherwise. ``pull(guarded=True)``
reads the weights, then ``META_WRITING``: if it is no longer the version this worker was answered,
a write overlapped the read, and the worker asks its server for a copy (``KIND_PULL``, into its
outbox slot) instead.

Across hosts a passive-target operation completes only when the target calls into MPI: the server
loop (:mod:`hvd_async.server`) keeps calling in between its work. Windows across hosts need a
one-sided component that supports ``MPI_THREAD_MULTIPLE`` over the network: ``--mca osc ucx``;
opening fails with a message that says so when the default one cannot create the window.
"""
import logging
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from .base import Transport

logger = logging.getLogger(__name__)

HIST_BINS = 64
META_VERSION, META_PUSHES, META_BUSY_US, META_HIST = 0, 1, 2, 3
META_COMP_SQ = META_HIST + HIST_BINS  # float64 bits: sum of ||compensated step - g||^2 over pushes
META_GRAD_SQ = META_COMP_SQ + 1        # float64 bits: sum of ||g||^2 over the same pushes
META_CURSOR = META_GRAD_SQ + 1
META_WRITING = META_CURSOR  # shards that rewrite the weights in place (od-sgd; never dbs-asgd): see the docstring
META_TABLE = META_CURSOR + 1
HIST_EVERY = 64  # an accumulate-mode worker adds its staleness counts to the servers' every so many pushes

# header a worker sends with each mailbox request (float64)
H_KIND, H_VERSION, H_LR, H_MOMENTUM, H_WEIGHT_DECAY, H_LOSS, H_WEIGHT, H_NESTEROV, H_LEN = range(9)
KIND_PUSH, KIND_PULL, KIND_IDLE, KIND_RESUME = 0, 1, 2, 3
# the server's answer (float64)
R_VERSION, R_STALENESS, R_PUSHES, R_STATUS, R_LEN = range(5)
STATUS_APPLIED, STATUS_SKIPPED, STATUS_SNAPSHOT = 0, 1, 2

TAG_OPEN = 7101     # worker 0 -> each server on the runtime's control communicator: a WindowSpec
TAG_REQUEST = 7102  # worker -> server: a header
TAG_ANSWER = 7103   # server -> worker: an answer
TAG_CLOSE = 7104    # worker -> server: this worker closed the transport
TAG_STATE = 7105    # worker -> server: ("get", None) or ("set", shard state), answered on TAG_STATE_REPLY
TAG_STATE_REPLY = 7106

MODES = ("accumulate", "mailbox")
OSC_HINT = ("one-sided MPI windows could not be created: across hosts OpenMPI needs the UCX "
            "one-sided component under MPI_THREAD_MULTIPLE; launch with "
            "'mpirun --mca osc ucx -x UCX_TLS=tcp,self ...' (hvd-async train --mpi-args "
            "'--mca osc ucx -x UCX_TLS=tcp,self')")


def staleness_summary(counts) -> Tuple[float, int]:
    """Mean and largest staleness of a histogram (count of pushes by staleness 0, 1, ...)."""
    counts = np.asarray(counts, dtype=np.int64)
    total = int(counts.sum())
    if not total:
        return 0.0, 0
    taus = np.arange(len(counts))
    return float((taus * counts).sum() / total), int(taus[counts > 0].max())


def _pushes(meta: np.ndarray, mode: str) -> int:
    """Pushes a shard received: in accumulate mode each one is one update, counted by the version."""
    return int(meta[META_VERSION] if mode == "accumulate" else meta[META_PUSHES])


def shard_bounds(numel: int, shards: int) -> List[Tuple[int, int]]:
    """``[start, stop)`` of each shard of a flat buffer: contiguous, lengths differing by at most one."""
    if numel < 0 or shards < 1:
        raise ValueError(f"need numel >= 0 and shards >= 1, got numel={numel}, shards={shards}")
    base, extra = divmod(numel, shards)
    bounds, start = [], 0
    for k in range(shards):
        stop = start + base + (1 if k < extra else 0)
        bounds.append((start, stop))
        start = stop
    return bounds


@dataclass
class WindowSpec:
    """What worker 0 tells every server when a transport opens (pickled over the control channel)."""

    algorithm: str
    mode: str
    numel: int
    servers: int
    workers: int
    options: Dict[str, Any] = field(default_factory=dict)
    wire: str = "fp32"  # "fp16": the inbox and outbox slots (what crosses the network) in half precision

    @property
    def wire_dtype(self):
        return np.float16 if self.wire == "fp16" else np.float32

    @property
    def meta_len(self) -> int:
        return META_TABLE + self.workers

    def shard_len(self, shard: int) -> int:
        start, stop = shard_bounds(self.numel, self.servers)[shard]
        return stop - start


@dataclass
class ShardStats:
    """What one server shard saw over one transport's life (part of :class:`hvd_async.server.ServerReport`)."""

    algorithm: str
    shard: int
    numel: int
    updates: int            # updates applied to the weights (the final version)
    pushes: int             # gradients or deltas received
    skipped_nonfinite: int  # pushes refused because they held NaN or infinity
    staleness_hist: List[int]  # count of pushes by staleness 0, 1, ... (last bin: that or more)
    busy_seconds: float = 0.0  # time the server program spent on requests (mailbox mode)

    @property
    def staleness_mean(self) -> float:
        return staleness_summary(self.staleness_hist)[0]


def _allocate(comm, count: int, dtype) -> Any:
    from mpi4py import MPI

    itemsize = np.dtype(dtype).itemsize
    try:
        return MPI.Win.Allocate(count * itemsize, itemsize, comm=comm)
    except MPI.Exception as exc:
        raise RuntimeError(f"{OSC_HINT} (MPI said: {exc.Get_error_string()})") from None


def _window_array(win, count: int, dtype) -> np.ndarray:
    return np.frombuffer(win.tomemory(), dtype=dtype, count=count)


class _Windows:
    """The windows of one transport on one rank (zero-sized on workers)."""

    def __init__(self, comm, spec: WindowSpec, shard: Optional[int]):
        n = spec.shard_len(shard) if shard is not None else 0
        mailbox = spec.mode == "mailbox"
        self.meta = _allocate(comm, spec.meta_len if shard is not None else 0, np.int64)
        self.weights = _allocate(comm, n, np.float32)
        self.inbox = _allocate(comm, n * spec.workers if mailbox else 0, spec.wire_dtype)
        self.outbox = _allocate(comm, n * spec.workers if mailbox else 0, spec.wire_dtype)

    def all(self):
        return [self.meta, self.weights, self.inbox, self.outbox]

    def lock_all(self) -> None:
        for win in self.all():
            win.Lock_all()

    def free(self) -> None:
        for win in self.all():
            win.Unlock_all()
        for win in self.all():
            win.Free()


class Pending:
    """An exchange in flight; ``wait()`` finishes it and returns its result (idempotent)."""

    def __init__(self, finish):
        self._finish, self._done, self._result = finish, False, None

    def wait(self):
        if not self._done:
            self._result = self._finish()
            self._done = True
        return self._result

    @property
    def done(self) -> bool:
        return self._done


class WindowTransport(Transport):
    """The worker side: pull the global weights, push deltas or gradients, read versions.

    Opening is collective over the whole job (every worker constructs it, every server serves);
    ``close()`` is too. Built by the parameter-server strategies; tests build it directly.

    Args:
        numel: elements of the flat fp32 parameter buffer.
        algorithm: registry name (the servers pick their rule by it).
        mode: ``"accumulate"`` or ``"mailbox"`` (see the module docstring).
        options: the server rule's options (plain values, pickled to the servers).
    """

    def __init__(self, numel: int, *, algorithm: str, mode: str, options: Optional[Dict] = None,
                 wire: str = "fp32"):
        super().__init__()
        from mpi4py import MPI

        from .. import runtime

        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        if isinstance(numel, bool) or not isinstance(numel, (int, np.integer)) or numel < 1:
            raise ValueError(f"numel must be a positive integer, got {numel!r}")
        if wire not in ("fp32", "fp16") or (wire == "fp16" and mode != "mailbox"):
            raise ValueError(f"wire must be 'fp32' (or 'fp16' in mailbox mode), got {wire!r} in {mode} mode")
        rt = runtime._worker_runtime("WindowTransport")
        if rt.servers < 1:
            raise RuntimeError(f"algorithm {algorithm!r} keeps its weights on parameter servers, but "
                               f"this job has none: call hvd_async.init(servers=1) (or more) and "
                               f"launch at least one extra process for each server")
        self._MPI = MPI
        self.spec = WindowSpec(algorithm, mode, int(numel), rt.servers, rt.world.size - rt.servers,
                               dict(options or {}), wire)
        # fp16 on the wire: the gradient is rounded into this buffer before it goes, the weights
        # arrive in the other (the servers keep fp32)
        self._wire = [torch.empty(int(numel), dtype=torch.float16) for _ in range(2)] if wire == "fp16" else None
        self.bounds = shard_bounds(self.spec.numel, rt.servers)
        self._workers_comm = rt.group
        self._rank = rt.group.rank
        if self._rank == 0:
            for server in range(rt.servers):
                rt.ctrl.send(self.spec, dest=server, tag=TAG_OPEN)
        self.comm = rt.win_comm.Dup()
        self._win = _Windows(self.comm, self.spec, None)
        self._win.lock_all()
        self._versions = np.zeros(rt.servers, dtype=np.int64)   # version each shard had at the last pull
        self.latest_versions = np.zeros(rt.servers, dtype=np.int64)  # newest version seen per shard
        self._one = np.ones(1, dtype=np.int64)
        self._fetched = np.zeros(rt.servers, dtype=np.int64)
        self._hist_due = np.zeros((rt.servers, HIST_BINS), dtype=np.int64)  # not yet on the servers
        self._hist_pushes = 0
        self._answers = np.zeros((rt.servers, R_LEN), dtype=np.float64)
        self._headers = np.zeros((rt.servers, H_LEN), dtype=np.float64)
        self._pending: Optional[Pending] = None
        self._slice_cache: Dict = {}
        self._one_t = [self._one, MPI.INT64_T]
        # NO_OP reads ignore their origin buffer, but mpi4py wants one: empty, of the window's type
        self._no_int64 = [np.empty(0, dtype=np.int64), MPI.INT64_T]
        self.overlapped_reads = 0  # guarded pulls a server write overlapped (then read from a snapshot)
        self._writing = np.zeros(rt.servers, dtype=np.int64)
        self._writing_bufs = [[self._writing[k:k + 1], MPI.INT64_T] for k in range(rt.servers)]
        self._read = np.zeros(rt.servers, dtype=np.int64)  # versions read by pull()
        self._fetch_bufs = [[self._fetched[k:k + 1], MPI.INT64_T] for k in range(rt.servers)]
        self._read_bufs = [[self._read[k:k + 1], MPI.INT64_T] for k in range(rt.servers)]
        self.dropped: List[int] = []  # workers the others went on without (drop_workers)
        from ..sim.trace import Tracer  # opt-in record of pushes and pulls (HVD_ASYNC_WINDOW_TRACE)

        self._trace = Tracer.from_env(self._rank, algorithm, mode)
        runtime._register_transport(self)

    # --- who we are ------------------------------------------------------------------------
    @property
    def rank(self) -> int:
        return self._rank

    @property
    def size(self) -> int:
        return self.spec.workers

    @property
    def servers(self) -> int:
        return self.spec.servers

    @property
    def versions(self) -> np.ndarray:
        """Per shard, the version of the weights this worker last received."""
        return self._versions.copy()

    def allgather_object(self, obj) -> List[Any]:
        self._check_open()
        return self._workers_comm.allgather(obj)

    def barrier(self) -> None:
        """Wait for every worker (the servers are not involved)."""
        self._check_open()
        self._workers_comm.Barrier()

    # --- helpers ------------------------------------------------------------------------------
    def _slices(self, flat: torch.Tensor):
        """``[(shard, [numpy view, MPI.FLOAT], target), ...]`` over the non-empty shards (cached per buffer)."""
        key = (flat.data_ptr(), flat.numel(), flat.dtype, flat.device.type)
        cached = self._slice_cache.get(key)
        if cached is not None:
            return cached
        if flat.dtype not in (torch.float32, torch.float16) or flat.device.type != "cpu" \
                or not flat.is_contiguous() or flat.numel() != self.spec.numel:
            raise ValueError(f"expected a contiguous CPU float32 tensor of {self.spec.numel} elements, "
                             f"got {flat.dtype} {tuple(flat.shape)} on {flat.device}")
        if flat.dtype == torch.float16:  # moved as 2-byte words: no arithmetic happens on them
            array, F = flat.numpy().view(np.uint16), self._MPI.UINT16_T
        else:
            array, F = flat.numpy(), self._MPI.FLOAT
        slices = [(k, [array[start:stop], F], (0, stop - start, F))
                  for k, (start, stop) in enumerate(self.bounds) if stop > start]
        if len(self._slice_cache) >= 4:  # strategies use 2 or 3 fixed buffers; temporaries churn
            self._slice_cache.clear()
        self._slice_cache[key] = slices
        return slices

    def _weight_slices(self, flat: torch.Tensor):
        """``_slices`` of a buffer that moves to or from the (fp32) weights window."""
        if flat.dtype != torch.float32:
            raise ValueError(f"the weights window holds float32: expected a float32 tensor, got {flat.dtype}")
        return self._slices(flat)

    def _check_idle(self) -> None:
        self._check_open()
        if self._pending is not None and not self._pending.done:
            raise RuntimeError("an exchange is still in flight on this transport: wait() for it first")

    # --- weights ------------------------------------------------------------------------------
    def publish_(self, flat: torch.Tensor) -> None:
        """Collective over the workers: worker 0's ``flat`` becomes the global weights, and every
        worker's ``flat`` is overwritten with them (as ``hvd.broadcast_parameters``)."""
        self._check_idle()
        if self._rank == 0:
            for k, part, target in self._weight_slices(flat):
                self._win.weights.Put(part, k, target=target)
                self._win.weights.Flush(k)
        self._workers_comm.Barrier()
        self.pull(flat)
        self._workers_comm.Barrier()  # nobody pushes before everyone has the initial weights

    def pull_async(self, flat: torch.Tensor) -> Pending:
        """Start reading the global weights into ``flat`` (``Rget`` from every shard)."""
        self._check_idle()
        MPI = self._MPI
        versions = np.zeros(self.servers, dtype=np.int64)
        # The version is read alongside the data (one flush for both): a push landing meanwhile may
        # be in the weights but not in the version, which counts it as stale: an over-estimate.
        for k in range(self.servers):
            self._win.meta.Fetch_and_op(self._one_t, [versions[k:k + 1], MPI.INT64_T], k,
                                        META_VERSION, op=MPI.NO_OP)
        requests = [self._win.weights.Rget(part, k, target=target) for k, part, target in self._weight_slices(flat)]

        def finish(keep=flat):
            MPI.Request.Waitall(requests)
            self._win.meta.Flush_all()
            self._versions[:] = versions
            np.maximum(self.latest_versions, versions, out=self.latest_versions)
            if self._trace is not None:
                self._trace.pull(versions, flat, False)
            return versions

        self._pending = Pending(finish)
        return self._pending

    def pull(self, flat: torch.Tensor, *, after_push: bool = False, guarded: bool = False) -> np.ndarray:
        """Read the global weights into ``flat``; returns each shard's version at the read.

        The blocking twin of ``pull_async`` (the same operations, without request objects). With
        ``after_push`` (right after this worker's ``accumulate``) the versions that push returned
        stand for the read, saving a round trip: pushes landing in between then count as stale.

        ``guarded`` (mailbox mode, right after an answer, against servers that rewrite the weights
        in place: see the module docstring): the read is checked against ``META_WRITING``; when a
        server's write overlapped it, the weights come from a snapshot (``KIND_PULL``) instead, and
        ``overlapped_reads`` counts it. Returns the versions of what ``flat`` then holds."""
        if guarded:
            return self._pull_guarded(flat)
        self._check_idle()
        meta, weights, no_op = self._win.meta, self._win.weights, self._MPI.NO_OP
        if after_push:
            self._read[:] = self.latest_versions
        else:
            for k, buf in enumerate(self._read_bufs):
                meta.Fetch_and_op(self._one_t, buf, k, META_VERSION, op=no_op)
        for k, part, target in self._weight_slices(flat):
            weights.Get(part, k, target=target)
        weights.Flush_all()
        if not after_push:
            meta.Flush_all()
        self._versions[:] = self._read
        np.maximum(self.latest_versions, self._read, out=self.latest_versions)
        if self._trace is not None:
            self._trace.pull(self._read, flat, after_push)
        return self._read.copy()

    def _pull_guarded(self, flat: torch.Tensor) -> np.ndarray:
        """``pull(guarded=True)``: the weights window, unless a server write overlapped the read."""
        self._check_idle()
        if self.spec.mode != "mailbox":
            raise RuntimeError("pull(guarded=True) is for mailbox transports (their servers write the weights)")
        meta, weights, no_op = self._win.meta, self._win.weights, self._MPI.NO_OP
        answered = self._versions.copy()  # complete: a server answers only once its write is done
        for k, part, target in self._weight_slices(flat):
            weights.Get(part, k, target=target)
        weights.Flush_all()  # the data is here before the marks are read
        for k, buf in enumerate(self._writing_bufs):
            meta.Fetch_and_op(self._one_t, buf, k, META_WRITING, op=no_op)
        meta.Flush_all()
        if np.array_equal(self._writing, answered):  # no write began before the read ended
            read = answered
        else:  # a write overlapped (or may have: a server marks before it knows it will write)
            self.overlapped_reads += 1
            self.request_async(KIND_PULL, out=flat).wait()  # sets self._versions
            read = self._versions.copy()
        self._versions[:] = read
        np.maximum(self.latest_versions, read, out=self.latest_versions)
        if self._trace is not None:
            self._trace.pull(read, flat, False)
        return read.copy()

    def accumulate_async(self, delta: torch.Tensor) -> Pending:
        """Start adding ``delta`` to the global weights (accumulate mode); ``wait()`` returns each
        shard's staleness for this push (updates applied since this worker's last pull)."""
        self._check_idle()
        if self.spec.mode != "accumulate":
            raise RuntimeError(f"accumulate() is for accumulate-mode transports; {self.spec.algorithm!r} "
                               f"uses its server's mailbox: use push()")
        MPI = self._MPI
        requests = [self._win.weights.Raccumulate(part, k, target=target, op=MPI.SUM)
                    for k, part, target in self._weight_slices(delta)]

        def finish(keep=delta):  # ``delta`` must outlive the requests reading it
            MPI.Request.Waitall(requests)
            return self._count_push()

        self._pending = Pending(finish)
        return self._pending

    def _count_push(self) -> np.ndarray:
        """After a delta was accumulated: make it land, bump the versions, return the staleness."""
        # One round trip: the version bump travels with the delta (MPI does not order operations on
        # two windows before the flush, so a concurrent pull may see the bump before the delta and
        # count at most the pushes in flight as one fewer of staleness).
        meta, add = self._win.meta, self._MPI.SUM
        for k, buf in enumerate(self._fetch_bufs):
            meta.Fetch_and_op(self._one_t, buf, k, META_VERSION, op=add)
        self._win.weights.Flush_all()
        meta.Flush_all()
        staleness = np.maximum(0, self._fetched - self._versions)
        self.latest_versions[:] = self._fetched + 1
        self._hist_due[np.arange(self.servers), np.minimum(staleness, HIST_BINS - 1)] += 1
        self._hist_pushes += 1
        if self._hist_pushes >= HIST_EVERY:
            self._send_hist()
        if self._trace is not None:
            self._trace.push(self._fetched, staleness)
        return staleness

    def _send_hist(self) -> None:
        """Add this worker's uncounted staleness counts into each shard's histogram on its server
        (one ``Accumulate`` of the whole histogram per shard; completed by the caller's flush)."""
        if self._hist_pushes:
            for k in range(self.servers):
                self._win.meta.Accumulate([self._hist_due[k], self._MPI.INT64_T], k,
                                          target=(META_HIST, HIST_BINS, self._MPI.INT64_T), op=self._MPI.SUM)
            self._win.meta.Flush_all()  # the buffer is reused right after
            self._hist_due[:] = 0
            self._hist_pushes = 0

    def accumulate(self, delta: torch.Tensor) -> np.ndarray:
        """The blocking twin of ``accumulate_async``: returns each shard's staleness for this push."""
        self._check_idle()
        if self.spec.mode != "accumulate":
            raise RuntimeError(f"accumulate() is for accumulate-mode transports; {self.spec.algorithm!r} "
                               f"uses its server's mailbox: use push()")
        SUM, weights = self._MPI.SUM, self._win.weights
        for k, part, target in self._weight_slices(delta):
            weights.Accumulate(part, k, target=target, op=SUM)
        return self._count_push()

    # --- mailbox ------------------------------------------------------------------------------
    def request_async(self, kind: int, *, grad: Optional[torch.Tensor] = None, out: Optional[torch.Tensor] = None,
                      header: Optional[Dict[int, float]] = None) -> Pending:
        """Send a mailbox request to every shard's server (mailbox mode).

        ``KIND_PUSH`` puts ``grad`` into this worker's inbox slots first; ``KIND_PUSH`` and
        ``KIND_PULL`` are answered, and ``wait()`` then gets the weights the server left in this
        worker's outbox slots into ``out`` (unless ``out`` is None) and returns the answers (one
        row per shard, columns ``R_*``). ``KIND_IDLE`` / ``KIND_RESUME`` (this worker stops / starts pushing for a while,
        so softsync need not wait for it) are not answered.
        """
        self._check_idle()
        if self.spec.mode != "mailbox":
            raise RuntimeError(f"{self.spec.algorithm!r} adds deltas into the weights directly: use accumulate()")
        MPI = self._MPI
        answered = kind in (KIND_PUSH, KIND_PULL)
        if kind == KIND_PUSH:
            if self._wire is not None:
                grad = self._wire[0].copy_(grad)
            for k, part, (_, count, F) in self._slices(grad):
                self._win.inbox.Put(part, k, target=(self._rank * count, count, F))
            self._win.inbox.Flush_all()  # the gradient is at the server before the header says so
        final_out = out
        if self._wire is not None and out is not None:
            out = self._wire[1]
        out_parts = self._slices(out) if answered and out is not None else []
        requests = []
        for k in range(self.servers):
            self._headers[k] = 0.0
            self._headers[k, H_KIND] = kind
            self._headers[k, H_VERSION] = self._versions[k]
            for key, value in (header or {}).items():
                self._headers[k, key] = value
            if answered:
                requests.append(self.comm.Irecv(self._answers[k], source=k, tag=TAG_ANSWER))
            self.comm.Send(self._headers[k], dest=k, tag=TAG_REQUEST)

        def finish():
            if not answered:
                return None
            MPI.Request.Waitall(requests)
            # (a plain Rget: the server wrote this slot before answering, and writes it again only
            # while serving this worker's next request; nobody accumulates into it)
            gets = [self._win.outbox.Rget(part, k, target=(self._rank * count, count, F))
                    for k, part, (_, count, F) in out_parts]
            MPI.Request.Waitall(gets)
            if final_out is not out:
                final_out.copy_(out)
            self._versions[:] = self._answers[:, R_VERSION].astype(np.int64)
            return self._answers.copy()

        self._pending = Pending(finish)
        return self._pending

    def push(self, grad: torch.Tensor, out: torch.Tensor, header: Dict[int, float]) -> np.ndarray:
        """Push ``grad`` (mailbox mode), wait for the server's answer, get the new weights into ``out``."""
        return self.request_async(KIND_PUSH, grad=grad, out=out, header=header).wait()

    # --- checkpoints ---------------------------------------------------------------------------
    def server_state(self) -> List[Dict[str, Any]]:
        """Every shard's whole state, as its server holds it now (weights, counters, outbox slots, the
        rule's buffers): consistent when no worker is pushing, e.g. after ``load_global_model()``."""
        self._check_idle()
        self._send_hist()
        for k in range(self.servers):
            self.comm.send(("get", None), dest=k, tag=TAG_STATE)
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
        for k, state in enumerate(states):
            self.comm.send(("set", state), dest=k, tag=TAG_STATE)
        try:
            self._state_replies()
        except RuntimeError as exc:
            raise ValueError(str(exc)) from None

    def drop_workers(self, workers: Sequence[int], comm, *, tell_servers: bool) -> None:
        """Go on without ``workers`` (worker ranks that stopped making progress): collectives among
        the workers now run over ``comm`` (the others'), the servers stop waiting for them (told by
        one worker, ``tell_servers``), and ``close()`` will not join the windows' collective free,
        which the dropped workers would never join (the job then ends with MPI_Abort)."""
        self._check_idle()
        self._workers_comm = comm
        self.dropped = sorted(set(self.dropped) | {int(w) for w in workers})
        if tell_servers:
            for k in range(self.servers):
                self.comm.send(("drop", self.dropped), dest=k, tag=TAG_STATE)
            self._state_replies()

    def local_state(self) -> Dict[str, Any]:
        """This worker's side: versions it last read and saw, staleness counts not yet sent."""
        return {"versions": self._versions.tolist(), "latest_versions": self.latest_versions.tolist(),
                "hist_due": self._hist_due.tolist(), "hist_pushes": self._hist_pushes}

    def load_local_state(self, state: Dict[str, Any]) -> None:
        self._versions[:] = state["versions"]
        self.latest_versions[:] = state["latest_versions"]
        self._hist_due[:] = np.asarray(state["hist_due"], dtype=np.int64)
        self._hist_pushes = int(state["hist_pushes"])

    # --- shared cursor and per-worker values (on shard 0) -------------------------------------
    def fetch_add_cursor(self, n: int) -> int:
        """Atomically add ``n`` to the job's shared cursor; returns its value before (dbs-asgd's batches)."""
        self._check_idle()
        MPI = self._MPI
        add, old = np.array([n], dtype=np.int64), np.zeros(1, dtype=np.int64)
        self._win.meta.Fetch_and_op([add, MPI.INT64_T], [old, MPI.INT64_T], 0, META_CURSOR, op=MPI.SUM)
        self._win.meta.Flush(0)
        return int(old[0])

    def publish_value(self, value: float) -> None:
        """Write this worker's slot of the shared table (a float, e.g. its measured speed)."""
        self._check_idle()
        bits = np.array([value], dtype=np.float64).view(np.int64)
        # REPLACE: an accumulate, so that a worker reading the table meanwhile (read_values) is defined
        self._win.meta.Accumulate([bits, self._MPI.INT64_T], 0, target=(META_TABLE + self._rank, 1, self._MPI.INT64_T),
                                  op=self._MPI.REPLACE)
        self._win.meta.Flush(0)

    def read_values(self) -> np.ndarray:
        """Every worker's slot of the shared table (0.0 where a worker has written nothing)."""
        self._check_idle()
        table = np.zeros(self.size, dtype=np.int64)
        self._win.meta.Get_accumulate(self._no_int64, [table, self._MPI.INT64_T], 0,
                                      target=(META_TABLE, self.size, self._MPI.INT64_T), op=self._MPI.NO_OP)
        self._win.meta.Flush(0)
        return table.view(np.float64).copy()

    def read_stats(self) -> List[Dict[str, Any]]:
        """Every shard's counters as they stand (version, pushes, staleness histogram)."""
        self._check_idle()
        self._send_hist()
        self._win.meta.Flush_all()
        rows = []
        meta = np.zeros(META_CURSOR, dtype=np.int64)
        for k in range(self.servers):
            # (other workers' pushes add into the version and histogram meanwhile)
            self._win.meta.Get_accumulate(self._no_int64, [meta, self._MPI.INT64_T], k,
                                          target=(0, META_CURSOR, self._MPI.INT64_T), op=self._MPI.NO_OP)
            self._win.meta.Flush(k)
            comp_sq, grad_sq = meta[META_COMP_SQ:META_CURSOR].view(np.float64)
            rows.append({"version": int(meta[META_VERSION]), "pushes": _pushes(meta, self.spec.mode),
                         "busy_seconds": int(meta[META_BUSY_US]) / 1e6,
                         "staleness_hist": meta[META_HIST:META_COMP_SQ].tolist(),
                         "compensation_sq": float(comp_sq), "grad_sq": float(grad_sq)})
        return rows

    def close(self) -> None:
        """Collective over the job: waits for this worker's exchange in flight, then frees the windows
        once every worker has closed (the servers keep serving the others meanwhile)."""
        if self._closed:
            return
        from .. import runtime

        if self._pending is not None:
            self._pending.wait()
        self._send_hist()
        self._win.meta.Flush_all()
        self._closed = True
        if self._trace is not None:
            self._trace.close()
        for k in range(self.servers):
            self.comm.send(None, dest=k, tag=TAG_CLOSE)
        if not self.dropped:  # (a dropped worker would never join the free)
            self._win.free()
            self.comm.Free()
        runtime._unregister_transport(self)


class _Widened:
    """fp16 inbox slots read as fp32 tensors (``slots[m]``), for the server programs' arithmetic."""

    def __init__(self, slots):
        self.slots = slots

    def __getitem__(self, worker: int) -> torch.Tensor:
        return self.slots[worker].float()

    def __len__(self) -> int:
        return len(self.slots)


class ShardHost:
    """The server side of one transport on one server rank: owns shard ``shard``'s windows.

    ``program`` (built by the algorithm's strategy class: ``server_program`` in
    ``hvd_async.algorithms.asgd``, ``dcasgd``, ...) gets each request through
    ``on_request(worker, header)``; ``poll()`` is called by the server loop.
    """

    def __init__(self, comm, spec: WindowSpec, shard: int, make_program):
        self.spec, self.shard, self.comm = spec, shard, comm
        self.numel = spec.shard_len(shard)
        self._win = _Windows(comm, spec, shard)
        self._win.lock_all()
        self.meta = _window_array(self._win.meta, spec.meta_len, np.int64)
        self.weights = torch.from_numpy(_window_array(self._win.weights, self.numel, np.float32))
        n, w = self.numel, spec.workers
        if spec.mode == "mailbox":
            inbox = torch.from_numpy(_window_array(self._win.inbox, n * w, spec.wire_dtype))
            outbox = torch.from_numpy(_window_array(self._win.outbox, n * w, spec.wire_dtype))
            self.inbox = [inbox[m * n:(m + 1) * n] for m in range(w)]
            self.outbox = [outbox[m * n:(m + 1) * n] for m in range(w)]
            if spec.wire == "fp16":  # the programs compute in fp32: each gradient read widened
                self.inbox = _Widened(self.inbox)
        self._start_bookkeeping()
        self.program = make_program(self)

    def _start_bookkeeping(self) -> None:
        """The host's counters and worker tracking (also the simulator's shard host's)."""
        self.skipped_nonfinite = 0
        self._seen_version = 0
        self.closed: set = set()
        self.dropped: set = set()  # workers gone without closing (--worker-timeout): no collective free
        self.worker_timeout: Optional[float] = None  # set by the server loop (--worker-timeout)
        self._last_heard = [time.monotonic()] * self.spec.workers
        self._set_aside: set = set()  # workers the watchdog stopped waiting for
        self._header = np.zeros(H_LEN, dtype=np.float64)
        self._answer = np.zeros(R_LEN, dtype=np.float64)

    # The window memory is read and written here directly, under this rank's own lock on it.
    def sync(self) -> None:
        for win in self._win.all():
            win.Sync()

    @property
    def version(self) -> int:
        return int(self.meta[META_VERSION])

    @contextmanager
    def writing_weights(self):
        """Around code that may rewrite the weights window in place while workers read it
        (``pull(guarded=True)``): ``META_WRITING`` holds the next version meanwhile, then the
        current one (see the module docstring). Bump the version inside, before answering."""
        meta = self.meta
        meta[META_WRITING] = meta[META_VERSION] + 1
        self.sync()  # (a memory barrier too) the mark is visible before any weight changes
        try:
            yield
        finally:
            self.sync()
            meta[META_WRITING] = meta[META_VERSION]
            self.sync()

    def reset_writing_mark(self) -> None:
        """No write in progress (after the meta counters were set wholesale, e.g. from a checkpoint)."""
        self.meta[META_WRITING] = self.meta[META_VERSION]

    def bump(self, staleness: Sequence[int], pushes: int = 1) -> None:
        """Record one applied update made of pushes with these staleness values."""
        self.meta[META_VERSION] += 1
        self.meta[META_PUSHES] += pushes
        for s in staleness:
            self.meta[META_HIST + min(int(s), HIST_BINS - 1)] += 1

    def add_compensation(self, compensation_sq: float, grad_sq: float) -> None:
        """Add one push's squared norms (this shard's part) of the compensation and of the gradient."""
        self.meta[META_COMP_SQ:META_CURSOR].view(np.float64)[:] += (compensation_sq, grad_sq)

    def answer(self, worker: int, staleness: int, status: int) -> None:
        """Tell ``worker`` its outbox slot holds the weights of the current version."""
        self.sync()
        self._answer[:] = (self.version, staleness, self.meta[META_PUSHES], status)
        self.comm.Send(self._answer, dest=self.spec.servers + worker, tag=TAG_ANSWER)

    def moved(self) -> bool:
        """Whether the shard's version changed since the last call (one-sided pushes are otherwise
        invisible to the server loop)."""
        version = int(self.meta[META_VERSION])
        moved, self._seen_version = version != self._seen_version, version
        return moved

    @property
    def all_closed(self) -> bool:
        return len(self.closed) == self.spec.workers

    def poll(self, budget: int = 64) -> int:
        """Handle up to ``budget`` waiting messages; returns how many there were."""
        from mpi4py import MPI

        status = MPI.Status()
        handled = 0
        for handled in range(budget):
            if not self.comm.Iprobe(source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG, status=status):
                break
            source, tag = status.Get_source(), status.Get_tag()
            worker = source - self.spec.servers
            if tag == TAG_CLOSE:
                self.comm.recv(source=source, tag=TAG_CLOSE)
                self.closed.add(worker)
                if worker not in self.dropped:
                    self.program.on_leave(worker)
            elif tag == TAG_STATE:
                what, state = self.comm.recv(source=source, tag=TAG_STATE)
                self.sync()
                try:
                    if what == "drop":
                        reply = self._drop(state)
                    else:
                        reply = ("ok", self.state_dict()) if what == "get" else self._load_checked(state)
                except Exception as exc:  # tell the worker; the server goes on serving
                    reply = ("error", f"server {self.shard}: {exc}")
                self.sync()
                self.comm.send(reply, dest=source, tag=TAG_STATE_REPLY)
            elif tag == TAG_REQUEST:
                self.comm.Recv(self._header, source=source, tag=TAG_REQUEST)
                self._last_heard[worker] = time.monotonic()
                self._set_aside.discard(worker)
                start = time.perf_counter()
                self.sync()
                self.program.on_request(worker, self._header.copy())
                self.meta[META_BUSY_US] += int(1e6 * (time.perf_counter() - start))
            else:
                raise RuntimeError(f"server {self.shard}: unexpected message tag {tag} from rank {source}")
        else:
            handled = budget
        if self.worker_timeout is not None and getattr(self.program, "pending", None):
            self._watch()
        return handled

    def _watch(self) -> None:
        """Gradients wait for the aggregate (softsync, od-sgd): stop waiting for a worker that has sent
        nothing for ``worker_timeout`` seconds (it is waited for again from its next push)."""
        now = time.monotonic()
        for worker in sorted(getattr(self.program, "active", ())):
            if worker not in self._set_aside and now - self._last_heard[worker] > self.worker_timeout:
                logger.warning("server %d: worker %d sent nothing for %.0f s (--worker-timeout); the "
                               "update goes on without it", self.shard, worker, now - self._last_heard[worker])
                self._set_aside.add(worker)
                self.program.on_leave(worker)

    def _drop(self, workers) -> Tuple[str, None]:
        """The workers stopped making progress: count them as closed, never wait for them again."""
        for worker in workers:
            if worker not in self.dropped:
                logger.warning("server %d: worker %d stopped making progress (--worker-timeout); going on "
                               "without it", self.shard, worker)
                self.dropped.add(worker)
                self.closed.add(worker)
                self.program.on_leave(worker)
        return ("ok", None)

    def state_dict(self) -> Dict[str, Any]:
        """The shard as it stands: weights, meta counters, outbox slots and the program's state."""
        state = {"algorithm": self.spec.algorithm, "shard": self.shard, "workers": self.spec.workers,
                 "weights": self.weights.clone(), "meta": torch.from_numpy(self.meta.copy()),
                 "skipped_nonfinite": self.skipped_nonfinite}
        if self.spec.mode == "mailbox":
            state["outbox"] = torch.stack([slot.clone() for slot in self.outbox])
        program_state = getattr(self.program, "state_dict", None)
        state["program"] = program_state() if program_state is not None else {}
        return state

    def _load_checked(self, state: Dict[str, Any]) -> Optional[str]:
        """Load ``state``; returns ("ok", None), or ("error", why it does not fit this shard)."""
        for key, want in (("algorithm", self.spec.algorithm), ("shard", self.shard),
                          ("workers", self.spec.workers)):
            if state.get(key) != want:
                return ("error", f"server state for {key}={state.get(key)!r} cannot be loaded into "
                        f"{key}={want!r} (shard {self.shard}); resume with the checkpoint's algorithm, "
                        f"servers and workers")
        if state["weights"].numel() != self.numel:
            return ("error", f"server shard {self.shard} holds {self.numel} parameters, the saved one "
                    f"{state['weights'].numel()}: the checkpoint is from another model or server count")
        self.weights.copy_(state["weights"])
        self.meta[:] = state["meta"].numpy()
        self.skipped_nonfinite = int(state["skipped_nonfinite"])
        self._seen_version = self.version
        if self.spec.mode == "mailbox":
            for slot, saved in zip(self.outbox, state["outbox"]):
                slot.copy_(saved)
        load = getattr(self.program, "load_state_dict", None)
        if load is not None:
            load(state["program"])
        return ("ok", None)

    def close(self) -> ShardStats:
        """Free the windows (collective with the workers' ``close``) and return the shard's statistics."""
        self.sync()
        stats = ShardStats(self.spec.algorithm, self.shard, self.numel, int(self.meta[META_VERSION]),
                           _pushes(self.meta, self.spec.mode), self.skipped_nonfinite,
                           self.meta[META_HIST:META_COMP_SQ].tolist(), int(self.meta[META_BUSY_US]) / 1e6)
        while stats.staleness_hist and stats.staleness_hist[-1] == 0:
            stats.staleness_hist.pop()
        if not self.dropped:
            self._win.free()
            self.comm.Free()
        return stats

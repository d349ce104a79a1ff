"""The windows' layout and wire format, shared by the worker side (:mod:`.client`) and the server
side (:mod:`.host`): the meta slots, the request header and answer, the tags, the shard bounds, the
specification worker 0 sends the servers, and the window allocation (see :mod:`hvd_async.transport.window`)."""
import os
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from ..base import mpi_module

__all__ = [  # what hvd_async.transport.window re-exports
    "HIST_BINS", "META_VERSION", "META_PUSHES", "META_BUSY_US", "META_HIST", "SUMS", "META_SUMS",
    "META_COUNTER", "META_WRITING", "META_TABLE", "HIST_EVERY", "H_KIND", "H_SLOT", "H_PAYLOAD", "PAYLOAD_LEN",
    "H_LEN", "Kind", "Status", "Request", "Answers", "encode_request", "R_VERSION", "R_STALENESS", "R_PUSHES",
    "R_STATUS", "R_LEN", "TAG_OPEN", "TAG_REQUEST", "TAG_ANSWER", "TAG_CLOSE", "TAG_STATE", "TAG_STATE_REPLY",
    "TAG_GRANT",
    "MODES", "OSC_HINT", "ATOMIC_READS_ENV", "atomic_read_targets", "staleness_summary", "shard_bounds",
    "pushes_in", "stats_row", "named_sums",
    "WindowSpec", "WindowSizes", "ShardStats", "Pending",
]

HIST_BINS = 64
META_VERSION, META_PUSHES, META_BUSY_US, META_HIST = 0, 1, 2, 3
SUMS = 2  # float64 sums a server program adds into per push (ShardHost.add_sums; read_stats' "sums")
META_SUMS = META_HIST + HIST_BINS  # SUMS slots holding float64 bits
META_COUNTER = META_SUMS + SUMS  # the job's shared counter (shard 0: fetch_add_counter)
META_WRITING = META_COUNTER  # shards that rewrite the weights in place: see hvd_async.transport.window
META_TABLE = META_COUNTER + 1  # one float per worker (shard 0: publish_value, read_values)
HIST_EVERY = 64  # an accumulate-mode worker adds its staleness counts to the servers' every so many pushes

# header a worker sends with each mailbox request (float64): the kind, the inbox slot holding a push's
# gradient (-1: the worker's own slot), then a payload whose fields (payload indices 0 .. PAYLOAD_LEN - 1)
# the algorithm's strategy and server program define between them
H_KIND, H_SLOT, H_PAYLOAD = 0, 1, 2
PAYLOAD_LEN = 7
H_LEN = H_PAYLOAD + PAYLOAD_LEN
# the server's answer (float64)
R_VERSION, R_STALENESS, R_PUSHES, R_STATUS, R_LEN = range(5)


class Kind(IntEnum):
    """What a mailbox request asks of a shard's server program."""

    PUSH = 0    # the gradient is in the inbox slot the header names: apply it, answer with the weights
    PULL = 1    # answer with a copy of the current weights
    IDLE = 2    # the worker stops pushing for a while (not answered)
    RESUME = 3  # it pushes again (not answered)
    CLAIM = 4   # a pool of inbox slots: grant this worker a free one (answered on TAG_GRANT, the host's)
    RELEASE = 5  # a pool of inbox slots: the worker is done with the slot the header names (not answered)

    @property
    def answered(self) -> bool:
        return self in (Kind.PUSH, Kind.PULL)


class Status(IntEnum):
    """What the server program did with a request, in its answer."""

    APPLIED = 0   # the push went into the weights
    SKIPPED = 1   # the push held NaN or infinity and was dropped
    SNAPSHOT = 2  # a pull: the outbox slot (without an outbox: the pull's inbox slot) holds a copy of the weights
    DROPPED = 3   # the push came late (backup-sgd): not applied; the outbox slot holds the current weights


@dataclass(frozen=True)
class Request:
    """A mailbox request as a server program receives it (``on_request``): its kind, its payload,
    ``PAYLOAD_LEN`` floats whose fields the algorithm defines (its strategy encodes them and its program
    decodes them as its ``Payload``, e.g. :class:`~hvd_async.algorithms.payload.SGDPayload`'s ``lr``;
    the transport only carries them), and for a push the
    inbox slot its gradient is in (None: the worker's own, where each worker has one)."""

    kind: Kind
    payload: np.ndarray
    slot: Optional[int] = None

    @classmethod
    def decode(cls, header: np.ndarray, shard: int, worker: int) -> "Request":
        try:
            kind = Kind(int(header[H_KIND]))
        except ValueError:
            raise RuntimeError(f"server {shard}: unknown request kind {float(header[H_KIND]):g} "
                               f"from worker {worker}") from None
        slot = int(header[H_SLOT])
        return cls(kind, header[H_PAYLOAD:].copy(), worker if slot < 0 else slot)


def encode_request(header: np.ndarray, kind: Kind, payload: Optional[Dict[int, float]],
                   slot: Optional[int] = None) -> None:
    """Write a request into ``header`` (H_LEN float64): ``payload`` is ``{field: value}`` with fields
    from 0 to PAYLOAD_LEN - 1, unset fields 0; ``slot``: the inbox slot of a push's gradient (None: the
    worker's own)."""
    header[:] = 0.0
    header[H_KIND] = kind
    header[H_SLOT] = -1 if slot is None else slot
    for index, value in (payload or {}).items():
        if not 0 <= index < PAYLOAD_LEN:
            raise ValueError(f"payload field {index} is outside 0..{PAYLOAD_LEN - 1}")
        header[H_PAYLOAD + index] = value


class Answers:
    """The servers' answers to one request, one per shard, in shard order."""

    __slots__ = ("rows",)

    def __init__(self, rows: np.ndarray):
        self.rows = rows  # (shards, R_LEN) float64, as they came

    @property
    def versions(self) -> np.ndarray:
        """The version of the weights each shard answered with."""
        return self.rows[:, R_VERSION].astype(np.int64)

    @property
    def staleness(self) -> np.ndarray:
        """Each shard's staleness of the push it applied."""
        return self.rows[:, R_STALENESS].astype(np.int64)

    @property
    def pushes(self) -> int:
        """The pushes the job's first shard has received from all workers."""
        return int(self.rows[0, R_PUSHES])

    def all(self, status: Status) -> bool:
        """Whether every shard answered with ``status``."""
        return bool((self.rows[:, R_STATUS] == status).all())


TAG_OPEN = 7101     # worker 0 -> each server on the runtime's control communicator: a WindowSpec
TAG_REQUEST = 7102  # worker -> server: a header
TAG_ANSWER = 7103   # server -> worker: an answer
TAG_CLOSE = 7104    # worker -> server: this worker closed the transport
TAG_STATE = 7105    # worker -> server: ("get", None) or ("set", shard state), answered on TAG_STATE_REPLY
TAG_STATE_REPLY = 7106
TAG_GRANT = 7107    # server -> worker: the inbox slot a CLAIM was granted, and whether it had to queue

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


def pushes_in(meta: np.ndarray, mode: str) -> int:
    """Pushes a shard received: in accumulate mode each one is one update, counted by the version."""
    return int(meta[META_VERSION] if mode == "accumulate" else meta[META_PUSHES])


def stats_row(meta: np.ndarray, mode: str) -> Dict[str, Any]:
    """One shard's counters as ``read_stats`` gives them, from its meta window's first ``META_COUNTER``
    words: version, pushes, server busy seconds, staleness histogram, the program's ``sums``."""
    return {"version": int(meta[META_VERSION]), "pushes": pushes_in(meta, mode),
            "busy_seconds": int(meta[META_BUSY_US]) / 1e6, "staleness_hist": meta[META_HIST:META_SUMS].tolist(),
            "sums": meta[META_SUMS:META_COUNTER].view(np.float64).tolist()}


def named_sums(rows: Sequence[Dict[str, Any]], names: Sequence[str]) -> Dict[str, float]:
    """The server program's sums by the names it declares (``ServerProgram.sums``), added over the shards'
    ``read_stats`` rows (each shard sums over the pushes it applied)."""
    return {name: float(sum(row["sums"][k] for row in rows)) for k, name in enumerate(names)}


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
    slots: int = 0  # inbox slots per shard (mailbox mode): 0, or at least the workers, is one per worker
    outbox: bool = True  # False: no outbox; a pull's copy of the weights comes back in its inbox slot

    @property
    def wire_dtype(self):
        return np.float16 if self.wire == "fp16" else np.float32

    @property
    def pooled(self) -> bool:
        """Whether the inbox is a pool of fewer slots than workers, each claimed per push."""
        return self.mode == "mailbox" and 0 < self.slots < self.workers

    @property
    def inbox_slots(self) -> int:
        """Shard-sized inbox slots per shard (mailbox mode)."""
        return self.slots if self.pooled else self.workers

    @property
    def meta_len(self) -> int:
        return META_TABLE + self.workers

    def shard_len(self, shard: int) -> int:
        start, stop = shard_bounds(self.numel, self.servers)[shard]
        return stop - start

    def sizes(self, shard: Optional[int]) -> "WindowSizes":
        """Elements of each window on the rank holding ``shard`` (None: a worker's, all empty): the one
        place they are decided, for the real windows, the simulator's memory and the memory table."""
        if shard is None:
            return WindowSizes(0, 0, 0, 0)
        n, mailbox = self.shard_len(shard), self.mode == "mailbox"
        return WindowSizes(self.meta_len, n, n * self.inbox_slots if mailbox else 0,
                           n * self.workers if mailbox and self.outbox else 0)


class WindowSizes(NamedTuple):
    """Elements of one rank's windows: ``meta`` (int64), ``weights`` (fp32), ``inbox`` and ``outbox``
    (the wire's type; 0 where the mode has none)."""

    meta: int
    weights: int
    inbox: int
    outbox: int


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
    compile_seconds: float = 0.0  # time it spent compiling its push (before the first push, mostly)
    compiled_updates: int = 0  # pushes or rounds its compiled loop applied

    @property
    def staleness_mean(self) -> float:
        return staleness_summary(self.staleness_hist)[0]


def _allocate(comm, count: int, dtype, MPI) -> Any:
    itemsize = np.dtype(dtype).itemsize
    try:
        return MPI.Win.Allocate(count * itemsize, itemsize, comm=comm)
    except MPI.Exception as exc:
        raise RuntimeError(f"{OSC_HINT} (MPI said: {exc.Get_error_string()})") from None


ATOMIC_READS_ENV = "HVD_ASYNC_ATOMIC_READS"
ATOMIC_READS = ("auto", "always", "never")


def atomic_read_targets(comm, mpi=None) -> frozenset:
    """The ranks of ``comm`` whose windows this process reads with ``Get_accumulate(NO_OP)`` instead of
    a plain ``Get`` where other ranks may be accumulating into the same elements meanwhile.

    MPI defines only accumulate-family reads beside concurrent accumulates. Within a node Open MPI's
    shared-memory windows (``osc/sm``) make a plain aligned read whole, and it is the faster read (see
    :mod:`hvd_async.transport.window`). Across nodes the one-sided component is a network one
    (``osc/ucx`` over TCP does a float ``SUM`` as lock, get, add, put at the target), so a plain read
    served meanwhile could see an element half written. ``HVD_ASYNC_ATOMIC_READS``: ``auto`` (the
    default) reads the ranks on other nodes atomically, ``always`` every rank, ``never`` none.
    Collective over ``comm``; ``mpi``: as :func:`mpi_module`."""
    MPI = mpi_module(mpi)
    how = os.environ.get(ATOMIC_READS_ENV, "auto").strip().lower() or "auto"
    if how not in ATOMIC_READS:
        raise ValueError(f"{ATOMIC_READS_ENV}={how!r} is not one of {', '.join(ATOMIC_READS)}: unset it, or "
                         f"set 'always' or 'never' to force the weights' reads one way")
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)  # collective: called alike whatever ``how`` is
    groups = node.Get_group(), comm.Get_group()
    try:
        here = groups[0].Translate_ranks(list(range(node.size)), groups[1])
    finally:
        for group in groups:
            group.Free()
        node.Free()
    everyone = frozenset(range(comm.size))
    return {"always": everyone, "never": frozenset(), "auto": everyone - frozenset(here)}[how]


def _window_array(win, count: int, dtype) -> np.ndarray:
    return np.frombuffer(win.tomemory(), dtype=dtype, count=count)


class _Windows:
    """The windows of one transport on one rank (zero-sized on workers). A server's
    :class:`~hvd_async.transport.window.host.ShardHost` reads and writes their memory through
    :meth:`arrays`; the simulator hands the host plain memory with the same methods instead."""

    def __init__(self, comm, spec: WindowSpec, shard: Optional[int], mpi=None):
        MPI = mpi_module(mpi)
        self.spec, self.shard = spec, shard
        sizes = spec.sizes(shard)
        self.atomic = atomic_read_targets(comm, MPI)  # the ranks whose weights a worker reads atomically
        self.meta = _allocate(comm, sizes.meta, np.int64, MPI)
        self.weights = _allocate(comm, sizes.weights, np.float32, MPI)
        self.inbox = _allocate(comm, sizes.inbox, spec.wire_dtype, MPI)
        self.outbox = _allocate(comm, sizes.outbox, spec.wire_dtype, MPI)

    def all(self):
        return [self.meta, self.weights, self.inbox, self.outbox]

    def arrays(self):
        """``(meta, weights, inbox, outbox)``: the shard's window memory (int64 array, fp32 tensor, and in
        mailbox mode the wire-typed tensors of every inbox slot and every worker's outbox slot, else None)."""
        import torch

        spec, sizes = self.spec, self.spec.sizes(self.shard)
        mailbox = spec.mode == "mailbox"
        meta = _window_array(self.meta, sizes.meta, np.int64)
        weights = torch.from_numpy(_window_array(self.weights, sizes.weights, np.float32))
        inbox = torch.from_numpy(_window_array(self.inbox, sizes.inbox, spec.wire_dtype)) if mailbox else None
        outbox = (torch.from_numpy(_window_array(self.outbox, sizes.outbox, spec.wire_dtype))
                  if mailbox and spec.outbox else None)
        return meta, weights, inbox, outbox

    def sync(self) -> None:
        """Between this rank's direct reads and writes of the memory and the others' one-sided calls."""
        for win in self.all():
            win.Sync()

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

"""The worker side of the windows: :class:`WindowTransport` pulls the global weights, pushes
deltas (accumulate mode) or gradients (mailbox mode), and reads versions (see
:mod:`hvd_async.transport.window` for the protocol). It holds the parts with a job of their own: the
counters of the ``meta`` window (:class:`~.counters.MetaCounters`), the servers' state
(:class:`~.state.ServerStateLink`), a pool's slot claims (:class:`~.slots.SlotClaim`) and the watch
on the other workers' leaving (:class:`~hvd_async.transport.leave.LeaveWatch`)."""
import time
from typing import Any, Dict, List, Optional, Sequence

import numpy as np
import torch

from ... import failures
from ..base import Transport
from ..leave import LeaveWatch
from .counters import MetaCounters
from .state import ServerStateLink
from .slots import SlotClaim
from .layout import (H_LEN, H_SLOT, META_WRITING, MODES, R_LEN, TAG_ANSWER, TAG_CLOSE, TAG_OPEN, TAG_REQUEST,
                     Answers, Kind, Pending, WindowSpec, _Windows, encode_request, shard_bounds)

# how often a worker on an oversubscribed node checks for its servers' answer, sleeping between checks
ANSWER_POLL_SECONDS = 1e-4


def wait_for_answers(MPI, requests, polite: bool) -> None:
    """Complete the receives of the servers' answers: in MPI's own wait, which spins for the lowest
    latency, or (``polite``: more processes on this node than cores) by checking every
    :data:`ANSWER_POLL_SECONDS` and sleeping between: a spinning wait takes a core from the workers
    still computing, which a synchronous update (backup-sgd's) then waits for in turn."""
    if not polite:
        MPI.Request.Waitall(requests)
        return
    while not MPI.Request.Testall(requests):
        time.sleep(ANSWER_POLL_SECONDS)


class WindowTransport(Transport):
    """The worker side: pull the global weights, push deltas or gradients, read versions.

    Opening is collective over the whole job (every worker constructs it, every server serves);
    ``close()`` is too. Built by the parameter-server algorithms' declarations; tests build it directly.

    Args:
        numel: elements of the flat fp32 parameter buffer.
        comms: the worker's communicators and the ``MPI`` they belong to (:func:`hvd_async.runtime.comms`;
            the simulator's are in memory, :class:`hvd_async.sim.job.SimComms`).
        algorithm: registry name (the servers pick their rule by it).
        mode: ``"accumulate"`` or ``"mailbox"`` (see the module docstring).
        options: the server rule's options (plain values, pickled to the servers).
    """

    @classmethod
    def open(cls, spec: WindowSpec, comms) -> "WindowTransport":
        """The transport for ``spec`` (its servers and workers are the job's, from ``comms``)."""
        return cls(spec.numel, comms=comms, algorithm=spec.algorithm, mode=spec.mode, options=spec.options,
                   wire=spec.wire, slots=spec.slots, outbox=spec.outbox)

    def __init__(self, numel: int, *, comms, algorithm: str, mode: str, options: Optional[Dict] = None,
                 wire: str = "fp32", slots: int = 0, outbox: bool = True):
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        if isinstance(numel, bool) or not isinstance(numel, (int, np.integer)) or numel < 1:
            raise ValueError(f"numel must be a positive integer, got {numel!r}")
        if wire not in ("fp32", "fp16") or (wire == "fp16" and mode != "mailbox"):
            raise ValueError(f"wire must be 'fp32' (or 'fp16' in mailbox mode), got {wire!r} in {mode} mode")
        if isinstance(slots, bool) or not isinstance(slots, (int, np.integer)) or slots < 0:
            raise ValueError(f"slots must be an integer >= 0 (0: one inbox slot per worker), got {slots!r}")
        if comms.servers < 1:
            raise RuntimeError(f"algorithm {algorithm!r} keeps its weights on parameter servers, but "
                               f"this job has none: call hvd_async.init(servers=1) (or more) and "
                               f"launch at least one extra process for each server")
        super().__init__()
        self.spec = WindowSpec(algorithm, mode, int(numel), comms.servers, comms.group.size, dict(options or {}),
                               wire, int(slots), bool(outbox))
        self._rank = int(comms.group.rank)
        self.bounds = shard_bounds(self.spec.numel, self.spec.servers)
        self._pending: Optional[Pending] = None
        self.slot_waits = 0  # pushes that found every inbox slot of a shard taken and waited
        self._MPI = MPI = comms.mpi
        self._clock = comms.clock
        self._polite = bool(comms.oversubscribed)  # (see wait_for_answers)
        # fp16 on the wire: the gradient is rounded into this buffer before it goes, the weights
        # arrive in the other (the servers keep fp32)
        self._wire = [torch.empty(int(numel), dtype=torch.float16) for _ in range(2)] if wire == "fp16" else None
        self._workers_comm = comms.group
        if self._rank == 0:
            for server in range(comms.servers):
                comms.ctrl.send(self.spec, dest=server, tag=TAG_OPEN)
        self.comm = comms.win_comm.Dup()
        self._win = _Windows(self.comm, self.spec, None, MPI)
        # shards whose weights other workers add into while this one reads them: there, across nodes,
        # the read is accumulate-family (atomic per element; see layout.atomic_read_targets)
        self.atomic_reads = self._win.atomic if mode == "accumulate" else frozenset()
        self._no_float = [np.empty(0, dtype=np.float32), MPI.FLOAT]
        self._win.lock_all()
        self._watch = LeaveWatch(comms.group, f"{algorithm} transport", MPI)  # no collective waits for a leaver
        self._answers = np.zeros((comms.servers, R_LEN), dtype=np.float64)
        self._header = np.zeros(H_LEN, dtype=np.float64)  # one request, the same to every shard
        self._slice_cache: Dict = {}
        self.overlapped_reads = 0  # guarded pulls a server write overlapped (then read from a snapshot)
        self._writing = np.zeros(comms.servers, dtype=np.int64)
        self._writing_bufs = [[self._writing[k:k + 1], MPI.INT64_T] for k in range(comms.servers)]
        self._read = np.zeros(comms.servers, dtype=np.int64)  # versions read by pull()
        self._read_bufs = [[self._read[k:k + 1], MPI.INT64_T] for k in range(comms.servers)]
        self.dropped: List[int] = []  # workers the others went on without (drop_workers)
        self._claim = SlotClaim(self.comm, self.spec) if self.spec.pooled else None
        self._trace = comms.tracer(self._rank, algorithm, mode)  # opt-in record of pushes and pulls
        self.counters = MetaCounters(self._win, MPI, self.spec, self._rank, self._trace)
        self._state = ServerStateLink(self.comm, comms.servers)

    # --- what the worker holds ----------------------------------------------------------------
    # the windows' free is collective: close() waits for every worker (the exit hook closes others first)
    closes_collectively = True
    can_drop_workers = True
    # Where the servers write their shards' state (each its own file, ``shard-<k>.pt``) and read it back,
    # instead of sending it to worker 0; None: sent. Set around a save or load (see
    # DistributedOptimizer.algorithm_state_dict's ``shard_dir``); a folder every server can reach.
    shard_dir: Optional[str] = None

    @property
    def rank(self) -> int:
        return self._rank

    size = property(lambda self: self.spec.workers)

    servers = property(lambda self: self.spec.servers)

    @property
    def versions(self) -> np.ndarray:
        """Per shard, the version of the weights this worker last received."""
        return self.counters.read.copy()

    @property
    def latest_versions(self) -> np.ndarray:
        """Per shard, the newest version this worker has seen (the counters' own array)."""
        return self.counters.latest

    def _check_idle(self) -> None:
        if self._closed:  # (every exchange starts here: one attribute read while open)
            self._check_open()
        if self._pending is not None and not self._pending.done:
            raise RuntimeError("an exchange is still in flight on this transport: wait() for it first")

    def local_state(self) -> Dict[str, Any]:
        """This worker's side: versions it last read and saw, staleness counts not yet sent."""
        return self.counters.state()

    def load_local_state(self, state: Dict[str, Any]) -> None:
        self.counters.load_state(state)

    # --- the shared counter and table, the shards' counters (on the meta window) ----------------
    def fetch_add_counter(self, n: int) -> int:
        """Atomically add ``n`` to the job's shared counter; returns its value before."""
        self._check_idle()
        return self.counters.fetch_add_counter(n)

    def publish_value(self, value: float) -> None:
        """Write this worker's slot of the shared table (a float, e.g. its measured speed)."""
        self._check_idle()
        self.counters.publish_value(value)

    def read_values(self) -> np.ndarray:
        """Every worker's slot of the shared table (0.0 where a worker has written nothing)."""
        self._check_idle()
        return self.counters.read_values()

    def read_stats(self) -> List[Dict[str, Any]]:
        """Every shard's counters as they stand (:meth:`MetaCounters.read_stats`)."""
        self._check_idle()
        return self.counters.read_stats()

    # --- the servers' state -------------------------------------------------------------------
    def server_state(self) -> List[Dict[str, Any]]:
        """Every shard's whole state, as its server holds it now (weights, counters, outbox slots, the
        rule's buffers): consistent when no worker is pushing, e.g. after ``load_global_model()``. With
        :attr:`shard_dir` set, each server writes its shard there and this returns the files' names."""
        self._check_idle()
        self.counters.send_hist()
        return self._state.get(self.shard_dir)

    def load_server_state(self, states: Sequence[Dict[str, Any]]) -> None:
        """Put back what ``server_state`` returned (same number of servers, shard sizes and workers)."""
        self._check_idle()
        self._state.load(states, self.shard_dir)

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
            self._state.drop(self.dropped)

    # --- the workers' collectives -------------------------------------------------------------
    def allgather_object(self, obj) -> List[Any]:
        self._check_open()
        self._watch.barrier(self._workers_comm, "an allgather")  # then the allgather cannot hang
        return self._workers_comm.allgather(obj)

    def barrier(self, what: str = "a barrier") -> None:
        """Wait for every worker (not the servers); PeerLeftError if one has closed instead."""
        self._check_open()
        self._watch.barrier(self._workers_comm, what)

    # --- helpers ------------------------------------------------------------------------------
    def _slices(self, flat: torch.Tensor):
        """``[(shard, [numpy view, MPI.FLOAT], target), ...]`` over the non-empty shards (cached per buffer)."""
        return self._slice_entry(flat)[0]

    def _slice_entry(self, flat: torch.Tensor):
        """``(slices, is_float32, address, tensor)`` of ``flat``, cached by the tensor object's ``id``
        and checked against its storage address: the entry holds the tensor, so its ``id`` is not
        reused while cached, and a tensor given new storage (``.data = ...``, ``set_``) has a new
        address and is sliced again."""
        entry = self._slice_cache.get(id(flat))
        if entry is not None and entry[2] == flat.data_ptr():
            return entry
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
        entry = self._slice_cache[id(flat)] = (slices, flat.dtype == torch.float32, flat.data_ptr(), flat)
        return entry

    def _weight_slices(self, flat: torch.Tensor):
        """``_slices`` of a buffer that moves to or from the (fp32) weights window."""
        slices, fp32 = self._slice_entry(flat)[:2]
        if not fp32:
            raise ValueError(f"the weights window holds float32: expected a float32 tensor, got {flat.dtype}")
        return slices

    def _get(self, part, k: int, target) -> None:
        """Read ``target`` of shard ``k``'s weights into ``part`` (a plain ``Get``, or where
        ``atomic_reads`` names the shard, ``Get_accumulate`` with ``NO_OP``)."""
        if k in self.atomic_reads:
            self._win.weights.Get_accumulate(self._no_float, part, k, target=target, op=self._MPI.NO_OP)
        else:
            self._win.weights.Get(part, k, target=target)

    # --- weights ------------------------------------------------------------------------------
    def publish_(self, flat: torch.Tensor) -> None:
        """Collective over the workers: worker 0's ``flat`` becomes the global weights, and every
        worker's ``flat`` is overwritten with them (as ``hvd.broadcast_parameters``)."""
        self._check_idle()
        if self._rank == 0:
            for k, part, target in self._weight_slices(flat):
                self._win.weights.Put(part, k, target=target)
                self._win.weights.Flush(k)
        self._watch.barrier(self._workers_comm, "the start (worker 0's weights published)")
        self.pull(flat)
        self._watch.barrier(self._workers_comm, "the start")  # nobody pushes before everyone has the initial weights

    def pull_async(self, flat: torch.Tensor) -> Pending:
        """Start reading the global weights into ``flat`` (a ``Get`` from every shard, flushed by ``wait()``)."""
        self._check_idle()
        MPI = self._MPI
        versions = np.zeros(self.servers, dtype=np.int64)
        # The version is read alongside the data (one flush for both): a push landing meanwhile may
        # be in the weights but not in the version, which counts it as stale: an over-estimate.
        counters = self.counters
        counters.start_reads([[versions[k:k + 1], MPI.INT64_T] for k in range(self.servers)])
        slices = self._weight_slices(flat)
        for k, part, target in slices:  # (under the lock held since opening, a Get is under way once issued)
            self._get(part, k, target)

        def finish(keep=flat):
            _flush_servers(self._win.weights, [k for k, _, _ in slices])
            self._win.meta.Flush_all()
            counters.read[:] = versions
            np.maximum(counters.latest, versions, out=counters.latest)
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
        server's write overlapped it, the weights come from a snapshot (``Kind.PULL``) instead, and
        ``overlapped_reads`` counts it. Returns the versions of what ``flat`` then holds."""
        if guarded:
            return self._pull_guarded(flat)
        self._check_idle()
        counters, weights = self.counters, self._win.weights
        read = counters.latest if after_push else self._read
        if not after_push:
            counters.start_reads(self._read_bufs)
        for k, part, target in self._weight_slices(flat):
            self._get(part, k, target)
        weights.Flush_all()
        if not after_push:
            self._win.meta.Flush_all()
            np.maximum(counters.latest, read, out=counters.latest)
        # (after a push the versions read are the newest seen)
        counters.read[:] = read
        if self._trace is not None:
            self._trace.pull(read, flat, after_push)
        return read.copy()

    def _pull_guarded(self, flat: torch.Tensor) -> np.ndarray:
        """``pull(guarded=True)``: the weights window, unless a server write overlapped the read."""
        self._check_idle()
        if self.spec.mode != "mailbox":
            raise RuntimeError("pull(guarded=True) is for mailbox transports (their servers write the weights)")
        counters, weights = self.counters, self._win.weights
        answered = counters.read.copy()  # complete: a server answers only once its write is done
        for k, part, target in self._weight_slices(flat):
            weights.Get(part, k, target=target)
        weights.Flush_all()  # the data is here before the marks are read
        counters.start_reads(self._writing_bufs, META_WRITING)
        self._win.meta.Flush_all()
        if np.array_equal(self._writing, answered):  # no write began before the read ended
            read = answered
        else:  # a write overlapped (or may have: a server marks before it knows it will write)
            self.overlapped_reads += 1
            self.request_async(Kind.PULL, out=flat).wait()  # sets the versions read
            read = counters.read.copy()
        counters.read[:] = read
        np.maximum(counters.latest, read, out=counters.latest)
        if self._trace is not None:
            self._trace.pull(read, flat, False)
        return read.copy()

    def accumulate_async(self, delta: torch.Tensor) -> Pending:
        """Start adding ``delta`` to the global weights (accumulate mode); ``wait()`` returns each
        shard's staleness for this push (updates applied since this worker's last pull). The
        ``Accumulate``s are issued now and completed by ``wait()``'s flush."""
        self._start_accumulate(delta)

        def finish(keep=delta):  # ``delta`` must outlive the accumulates reading it
            return self._count_push()

        self._pending = Pending(finish)
        return self._pending

    def _count_push(self) -> np.ndarray:
        """After a delta was accumulated: make it land, bump the versions, return the staleness."""
        self.counters.bump_versions()
        self._win.weights.Flush_all()
        self._win.meta.Flush_all()
        return self.counters.push_counted()

    def accumulate(self, delta: torch.Tensor) -> np.ndarray:
        """The blocking twin of ``accumulate_async``: returns each shard's staleness for this push."""
        self._start_accumulate(delta)
        return self._count_push()

    def _start_accumulate(self, delta: torch.Tensor) -> None:
        self._check_idle()
        if self.spec.mode != "accumulate":
            raise RuntimeError(f"accumulate() is for accumulate-mode transports; {self.spec.algorithm!r} "
                               f"uses its server's mailbox: use push()")
        SUM, weights = self._MPI.SUM, self._win.weights
        for k, part, target in self._weight_slices(delta):
            weights.Accumulate(part, k, target=target, op=SUM)

    def accumulate_and_pull(self, delta: torch.Tensor, flat: torch.Tensor) -> np.ndarray:
        """``accumulate(delta)`` then ``pull(flat, after_push=True)``, with the same operations and
        results (returns the push's staleness), but the version bump's reply is waited for after the
        read instead of before it: its round trip overlaps the read's (across hosts each is
        a round trip of its own)."""
        self._start_accumulate(delta)
        counters = self.counters
        counters.bump_versions()
        weights, slices = self._win.weights, self._weight_slices(flat)
        servers = [k for k, _, _ in slices]  # (the shards that hold weights)
        _flush_servers(weights, servers)  # the delta is in the weights before they are read
        for k, part, target in slices:
            self._get(part, k, target)
        _flush_servers(weights, servers)
        _flush_servers(self._win.meta, range(self.servers))  # every shard's version bump
        staleness = counters.push_counted()
        read = counters.latest  # what pull(after_push=True) stands for
        counters.read[:] = read
        if self._trace is not None:
            self._trace.pull(read, flat, True)
        return staleness

    # --- mailbox ------------------------------------------------------------------------------
    def push(self, grad: torch.Tensor, out: torch.Tensor, payload: Dict[int, float]) -> Answers:
        """Push ``grad`` (mailbox mode), wait for the servers' answers, get the new weights into ``out``."""
        return self.request_async(Kind.PUSH, grad=grad, out=out, payload=payload).wait()

    def request_async(self, kind: Kind, *, grad: Optional[torch.Tensor] = None, out: Optional[torch.Tensor] = None,
                      payload: Optional[Dict[int, float]] = None) -> Pending:
        """Send a mailbox request to every shard's server (mailbox mode).

        ``Kind.PUSH`` puts ``grad`` into this worker's inbox slots first (with a pool of fewer slots
        than workers, a slot claimed on each shard: :class:`~.slots.SlotClaim`); ``Kind.PUSH`` and
        ``Kind.PULL`` are answered, and ``wait()`` then gets the weights the server left in this
        worker's outbox slots into ``out`` (unless ``out`` is None) and returns the
        :class:`Answers`. ``Kind.IDLE`` / ``Kind.RESUME`` (this worker stops / starts pushing for a
        while, so a server that waits for every worker need not wait for it) are not answered.
        ``payload``: ``{field: value}`` with fields from 0 to ``PAYLOAD_LEN - 1``, whose meaning the
        algorithm's strategy and server program agree on (the transport only carries it); unset
        fields are 0.
        """
        self._check_idle()
        if self.spec.mode != "mailbox":
            raise RuntimeError(f"{self.spec.algorithm!r} adds deltas into the weights directly: use accumulate()")
        MPI = self._MPI
        answered = kind.answered
        slots = None  # {shard: claimed slot} (a pool); else each worker's own slot
        into_inbox = kind is Kind.PULL and not self.spec.outbox  # the copy comes back in the inbox slot
        if self._claim is not None and (kind is Kind.PUSH or into_inbox):
            slots = self._claim.claim(range(self.servers))
            self.slot_waits += self._claim.waited
        if kind is Kind.PUSH:
            assert grad is not None  # (a push carries its gradient)
            if self._wire is not None:
                grad = self._wire[0].copy_(grad)
            for k, part, (_, count, F) in self._slices(grad):
                slot = self._rank if slots is None else slots[k]
                self._win.inbox.Put(part, k, target=(slot * count, count, F))
            self._win.inbox.Flush_all()  # the gradient is at the server before the header says so
        final_out = out
        if self._wire is not None and out is not None:
            out = self._wire[1]
        out_parts = self._slices(out) if answered and out is not None else []
        requests = []
        encode_request(self._header, kind, payload)
        for k in range(self.servers):
            if answered:
                requests.append(self.comm.Irecv(self._answers[k], source=k, tag=TAG_ANSWER))
            if slots is not None:
                self._header[H_SLOT] = slots[k]
            self.comm.Send(self._header, dest=k, tag=TAG_REQUEST)  # (blocking: the buffer is free again)

        def finish():
            if not answered:
                return None
            wait_for_answers(MPI, requests, self._polite)
            # (a plain Get: the server wrote this slot before answering, and writes it again only
            # while serving this worker's next request; nobody accumulates into it)
            window = self._win.inbox if into_inbox else self._win.outbox  # (the outbox: this worker's slot)
            claimed = into_inbox and slots is not None
            for k, part, (_, count, F) in out_parts:
                window.Get(part, k, target=((slots[k] if claimed else self._rank) * count, count, F))
            _flush_servers(window, [k for k, _, _ in out_parts])
            if into_inbox and slots is not None:
                self._claim.release(slots)  # the pull's copy is read: the slot is free again
            if final_out is not out:
                final_out.copy_(out)
            answers = Answers(self._answers.copy())
            self.counters.read[:] = answers.versions
            if self._trace is not None:
                self._trace.answered(kind is Kind.PUSH, answers, final_out)
            return answers

        self._pending = Pending(finish)
        return self._pending

    def close(self) -> None:
        """Collective over the job: finishes this worker's exchange in flight, tells the other workers it
        has left (their collectives raise instead of waiting for it), frees the windows once all have."""
        if self._closed:
            return
        if self._pending is not None:
            self._pending.wait()
        self.counters.send_hist()
        self._win.meta.Flush_all()
        self._closed = True
        if self._trace is not None:
            self._trace.close()
        self._watch.announce()
        for k in range(self.servers):
            self.comm.send(None, dest=k, tag=TAG_CLOSE)
        if not self.dropped:  # (a dropped worker would never join the free)
            self._watch.wait_all_closed()  # every worker has closed: the frees cannot hang
            self._watch.free()
            with failures.deadline(self.comm, "the windows' free at close()", f"worker {self._rank}"):
                self._win.free()
            self.comm.Free()


def _flush_servers(win, ranks) -> None:
    """Complete this worker's operations on ``win`` at the shards' servers ``ranks``, one target at a
    time (a worker's operations only ever target servers). Across hosts ``Flush_all`` cost more
    than these (``rma_bandwidth.py --mode netns``, records ``bench-check/*-flush_servers*``)."""
    for k in ranks:
        win.Flush(k)

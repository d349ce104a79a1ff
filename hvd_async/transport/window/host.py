"""The server side of the windows: :class:`ShardHost` owns one shard's windows on its server rank,
takes the workers' requests to the algorithm's server program and keeps the shard's counters (see
:mod:`hvd_async.transport.window` for the protocol; the loop that polls it is :mod:`hvd_async.server`)."""
import logging
import os
import time
from contextlib import contextmanager
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple, Union, cast

import numpy as np
import torch

from .layout import (HIST_BINS, H_LEN, Kind, META_BUSY_US, META_COUNTER, META_HIST, META_SUMS, META_PUSHES,
                     META_VERSION, META_WRITING, R_LEN, TAG_ANSWER, TAG_CLOSE, TAG_REQUEST, TAG_STATE,
                     TAG_STATE_REPLY, Request, ShardStats, Status, WindowSpec, pushes_in,
                     _Windows)
from .slots import SlotPool
from ... import checkpoint, failures

SHARD_KIND = "server-shard"  # the kind of a shard's own checkpoint file
MESSAGE_LIMIT = 2**31 - 2**26  # bytes of tensors one pickled MPI message may carry (a C int count, with room)

logger = logging.getLogger("hvd_async.transport.window")


class WidenedSlots:
    """fp16 inbox slots read as fp32 tensors (``slots[s]``), for the server programs' arithmetic: each
    read widens the slot as it is now into one fp32 buffer shared by every slot (made at the first read
    and kept, so that a push allocates nothing: a fresh 4-byte copy of a large model costs its pages'
    first-touch faults, more than the copy). A read is valid until the next one: a program takes each
    gradient within ``on_request`` (it folds what it must keep into state of its own)."""

    def __init__(self, slots):
        self.slots = slots
        self._wide: Optional[torch.Tensor] = None

    def __getitem__(self, slot: int) -> torch.Tensor:
        if self._wide is None:
            self._wide = torch.empty(self.slots[slot].shape, dtype=torch.float32)
        return self._wide.copy_(self.slots[slot])

    def __len__(self) -> int:
        return len(self.slots)


class ServerProgram:
    """What a :class:`ShardHost` asks of the algorithm's server program (built by the strategy
    class's ``server_program(host)``). The defaults suit a program that takes no requests and keeps
    nothing between them (asgd's: the workers' accumulates land by themselves)."""

    # the names of the floats the program adds up with ``host.add_sums``, in the order it passes them
    # (at most ``SUMS``); the workers read them by these names (:func:`named_sums`)
    sums: Tuple[str, ...] = ()

    def __init__(self, host):
        self.host = host

    @property
    def compile_seconds(self) -> float:
        """Seconds spent compiling the program's push (dc-asgd's and lc-asgd's compiled loop; 0: none)."""
        return 0.0

    @property
    def compiled_updates(self) -> int:
        """Updates the program's compiled loop applied (0: none)."""
        return 0

    def on_request(self, worker: int, request: Request) -> None:
        """One request (its ``kind``, the ``payload`` the strategy wrote, a push's inbox ``slot``); the
        program answers with ``host.answer`` where the kind is answered. A pool's inbox slot is free for
        other workers' pushes once this returns: a program that waits for more gradients before it
        updates (softsync, backup-sgd) folds this one into state of its own here. A worker's own slot
        (no pool) is written again only by that worker's next request, after this push is answered, so
        a program may leave the gradient there until it answers (backup-sgd's compiled update)."""
        raise RuntimeError(f"server {self.host.shard}: {self.host.spec.algorithm} takes no mailbox "
                           f"requests (worker {worker})")

    def on_leave(self, worker: int) -> None:
        """``worker`` stopped pushing for now (idle, closed, set aside or dropped)."""

    def on_close(self, worker: int) -> None:
        """``worker`` will never push again (it closed its transport, or the others dropped it); called
        after :meth:`on_leave`."""

    def waiting_on(self) -> Iterable[int]:
        """The workers whose gradients an update now waits for (empty when nothing waits): with
        ``--worker-timeout`` the host stops waiting for one that has sent nothing for that long."""
        return ()

    def state_dict(self) -> Dict[str, Any]:
        """What the program keeps besides the windows (part of the shard's checkpoint): its own tensors,
        not copies (the host copies the whole state where it must outlive the moment; a load copies)."""
        return {}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        pass

    def close(self) -> None:
        """The shard is closing: free what the program owns (threads)."""


class ShardHost:
    """The server side of one transport on one server rank: owns shard ``shard``'s windows.

    ``program`` (a :class:`ServerProgram`, built by the algorithm's strategy class:
    ``server_program`` in ``hvd_async.algorithms.asgd``, ``dcasgd``, ...) gets each request through
    ``on_request(worker, request)``; ``poll()`` is called by the server loop.
    """

    # what the server's busy time (META_BUSY_US) is measured with (the simulator's servers take no time)
    clock = staticmethod(time.perf_counter)

    inbox: Union[List[torch.Tensor], WidenedSlots]  # (mailbox mode) the inbox slots, fp16 ones read widened

    def __init__(self, comm, spec: WindowSpec, shard: int, make_program, *, windows=None, threads: int = 1):
        """``windows``: the memory the shard lives in; None opens its MPI windows over ``comm``
        (collective with the workers' side). The simulator passes plain memory with the same methods.
        ``threads``: how many threads the program may apply a push on (``serve(threads=)``)."""
        self.spec, self.shard, self.comm, self.threads = spec, shard, comm, threads
        self.numel = n = spec.shard_len(shard)
        self._win = _Windows(comm, spec, shard) if windows is None else windows
        self._win.lock_all()
        self.meta, self.weights, inbox, outbox = self._win.arrays()
        if spec.mode == "mailbox":
            self.inbox = self.inbox_raw = [inbox[s * n:(s + 1) * n] for s in range(spec.inbox_slots)]
            # (no outbox: answers to pulls go back through the inbox slots)
            self.outbox = None if outbox is None else [outbox[m * n:(m + 1) * n] for m in range(spec.workers)]
            if spec.wire == "fp16":  # the programs compute in fp32: each gradient read widened
                self.inbox = WidenedSlots(self.inbox)
        self.pool = SlotPool(comm, spec) if spec.pooled else None
        self.skipped_nonfinite = 0
        self._seen_version = 0
        self.closed: set = set()
        self.dropped: set = set()  # workers gone without closing (--worker-timeout): no collective free
        self.worker_timeout: Optional[float] = None  # set by the server loop (--worker-timeout)
        self._last_heard = [time.monotonic()] * self.spec.workers
        self._set_aside: set = set()  # workers the watchdog stopped waiting for
        self._header = np.zeros(H_LEN, dtype=np.float64)
        self._answer = np.zeros(R_LEN, dtype=np.float64)
        self.program = make_program(self)

    # The window memory is read and written here directly, under this rank's own lock on it.
    def sync(self) -> None:
        self._win.sync()

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

    def add_sums(self, *values: float) -> None:
        """Add floats into the shard's sums, in the order of the program's ``sums`` (its names for them;
        workers read them with ``read_stats`` and :func:`named_sums`)."""
        self.meta[META_SUMS:META_COUNTER].view(np.float64)[:len(values)] += values  # (more than SUMS: an error)

    def answer(self, worker: int, staleness: int, status: Status) -> None:
        """Tell ``worker`` its outbox slot (for a pull without an outbox: the pull's inbox slot) holds the
        weights of the current version."""
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
        while handled < budget and self.comm.Iprobe(source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG, status=status):
            self.handle(status.Get_source(), status.Get_tag())
            handled += 1
        if self.worker_timeout is not None:
            waiting = self.program.waiting_on()
            if waiting:
                self._watch(waiting)
        return handled

    def handle(self, source: int, tag: int) -> None:
        """Receive and serve the message from rank ``source`` with ``tag`` (one ``poll`` found, or the
        simulator delivered)."""
        worker = source - self.spec.servers
        if tag == TAG_CLOSE:
            self.comm.recv(source=source, tag=TAG_CLOSE)
            self.closed.add(worker)
            if self.pool is not None:
                self.pool.forget(worker)
            if worker not in self.dropped:
                self.program.on_leave(worker)
                self.program.on_close(worker)
        elif tag == TAG_STATE:
            what, state = self.comm.recv(source=source, tag=TAG_STATE)
            self.sync()
            try:
                if what == "drop":
                    reply: Tuple[str, Any] = self._drop(state)
                elif what == "get":
                    reply = self._state_message()
                elif what == "save":
                    reply = self._save(state)
                else:
                    reply = self._load_checked(checkpoint.load(state, kind=SHARD_KIND, mmap=True)
                                               if what == "load" else state)
            except Exception as exc:  # tell the worker; the server goes on serving
                reply = ("error", f"server {self.shard}: {exc}")
            self.sync()
            self.comm.send(reply, dest=source, tag=TAG_STATE_REPLY)
        elif tag == TAG_REQUEST:
            self.comm.Recv(self._header, source=source, tag=TAG_REQUEST)
            self._last_heard[worker] = time.monotonic()
            self._set_aside.discard(worker)
            start = self.clock()
            self.sync()
            request = Request.decode(self._header, self.shard, worker)
            if request.kind is Kind.CLAIM:  # the pool's own requests: the program never sees them
                assert self.pool is not None  # (only a pool's workers claim and release)
                self.pool.claim(worker)
            elif request.kind is Kind.RELEASE:
                assert self.pool is not None
                self.pool.release(cast(int, request.slot))  # (a decoded request has its slot)
            else:
                self.program.on_request(worker, request)
                if self.pool is not None and request.kind is Kind.PUSH:  # the gradient is taken
                    self.pool.release(cast(int, request.slot))
            self.meta[META_BUSY_US] += int(1e6 * (self.clock() - start))
        else:
            raise RuntimeError(f"server {self.shard}: unexpected message tag {tag} from rank {source}")

    def _watch(self, waiting) -> None:
        """Gradients wait for the aggregate (softsync, od-sgd): stop waiting for a worker that has sent
        nothing for ``worker_timeout`` seconds (it is waited for again from its next push)."""
        now = time.monotonic()
        for worker in sorted(waiting):
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
                if self.pool is not None:
                    self.pool.forget(worker)
                self.program.on_leave(worker)
                self.program.on_close(worker)
        return ("ok", None)

    def state_dict(self, copy: bool = True) -> Dict[str, Any]:
        """The shard as it stands: weights, meta counters, outbox slots and the program's state. With
        ``copy=False`` the tensors are the shard's own, valid while nothing pushes (for a write to a
        file or a message, which copy them anyway)."""
        state = {"algorithm": self.spec.algorithm, "shard": self.shard, "workers": self.spec.workers,
                 "weights": self.weights, "meta": torch.from_numpy(self.meta.copy()),
                 "skipped_nonfinite": self.skipped_nonfinite}
        if self.spec.mode == "mailbox" and self.spec.outbox:
            assert self.outbox is not None  # (the windows have an outbox)
            state["outbox"] = list(self.outbox)
        state["program"] = self.program.state_dict()
        return checkpoint.tensors_copy(state) if copy else state

    def _state_message(self) -> Tuple[str, Any]:
        """("ok", the shard's state) for a message to worker 0, or ("error", why) when it is larger than
        one MPI message carries (its count is a C int), measured before anything is copied. Copied when
        sent: a pickled view (an outbox slot) would carry its whole window."""
        state = self.state_dict(copy=False)
        size = sum(t.numel() * t.element_size() for t in checkpoint.tensors_in(state))
        if size > MESSAGE_LIMIT:
            return ("error", f"server {self.shard}: the shard's state is {size / 2**30:.1f} GiB, more than one "
                             f"MPI message carries ({MESSAGE_LIMIT / 2**30:.1f} GiB): take it with "
                             f"algorithm_state_dict(shard_dir=...), each server writing its own file")
        return ("ok", checkpoint.tensors_copy(state))

    def _save(self, path: str) -> Tuple[str, Dict[str, Any]]:
        """Write the shard's state to ``path`` (atomic: :func:`hvd_async.checkpoint.save`), streamed
        from the shard's own tensors; returns ("ok", the file's name and size)."""
        checkpoint.save(path, self.state_dict(copy=False), kind=SHARD_KIND)
        return ("ok", {"shard_file": os.path.basename(path), "bytes": os.path.getsize(path)})

    def _load_checked(self, state: Dict[str, Any]) -> Tuple[str, Optional[str]]:
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
        if self.spec.mode == "mailbox" and self.spec.outbox and "outbox" in state:
            assert self.outbox is not None  # (the windows have an outbox)
            for slot, saved in zip(self.outbox, state["outbox"]):
                slot.copy_(saved)
        self.program.load_state_dict(state["program"])
        return ("ok", None)

    def close(self) -> ShardStats:
        """Free the windows (collective with the workers' ``close``) and return the shard's statistics."""
        self.program.close()
        self.sync()
        stats = ShardStats(self.spec.algorithm, self.shard, self.numel, int(self.meta[META_VERSION]),
                           pushes_in(self.meta, self.spec.mode), self.skipped_nonfinite,
                           self.meta[META_HIST:META_SUMS].tolist(), int(self.meta[META_BUSY_US]) / 1e6,
                           self.program.compile_seconds, self.program.compiled_updates)
        while stats.staleness_hist and stats.staleness_hist[-1] == 0:
            stats.staleness_hist.pop()
        if not self.dropped:
            with failures.deadline(self.comm, "the windows' free at close()", f"server {self.shard}"):
                self._win.free()
            self.comm.Free()
        return stats

"""Collectives among the workers that never wait for a worker that has left.

A worker leaves a transport when it closes it: ``opt.close()``, a ``finally`` after an error it
caught, ``sys.exit`` (the exit hook closes what is open), a constructor that failed on that worker
alone. Its peers may then sit in a collective (a barrier of ``load_global_model``, a window free)
that the leaver will never join, and MPI's blocking collectives would wait for ever.

So every collective of a window transport goes through :class:`LeaveWatch`: the collective is
entered with a non-blocking barrier, polled; a worker that closes first tells every peer how many
collectives it entered (its *count*). All workers run the same collectives in the same order, so a
worker waiting in its collective number ``k`` knows that a peer which left after ``c <= k``
collectives will never come, and raises :class:`PeerLeftError` naming it (uncaught, the job ends:
``hvd_async.init``'s hook aborts every rank). Once the barrier is passed everyone is there, and the
blocking MPI call that follows (an allgather, a broadcast) cannot hang.

Closing waits, polled, until every peer has closed too, and only then frees the windows (a
collective every rank must join). The wait is for the peers' leave notices, point to point, and
never a barrier on the workers' communicator: MPI matches collectives on a communicator by their
order alone, so a closing barrier would complete a peer's ordinary barrier (its
``load_global_model``), which would then go on to a window free the closer is not in, while the
closer waited for a second barrier that never comes. Peers still training go on; a peer that reaches
a collective sees the notice and raises, and closes in its turn. A closing worker's wait is the only
one a peer cannot end this way when that peer waits in something else (a Horovod allreduce of the
script's own): at exit the runtime shuts Horovod down before it closes the windows, as Horovod's own
exit does, so that such an allreduce fails on the others ("one of the ranks finished execution").

Every wait is a loop over one non-blocking step (:meth:`LeaveWatch.settle`, :meth:`LeaveWatch.closed`),
and the protocol's checker (``tests/unit/test_leave_protocol.py``) runs these same steps over every
interleaving of 2 and 3 workers.
"""
import os
import time
from typing import Any, Dict, List, NamedTuple

import numpy as np

from .base import mpi_module

TAG_LEFT = 7301  # a worker has closed this transport; payload: how many collectives it had entered

# Polling a request: spin (yielding the core) this long, then sleep between tests; the same wait
# as MPI's own progress loops, without holding a core while a slow peer computes.
SPIN_SECONDS = 0.002
SLEEP_SECONDS = 0.0005


class PeerLeftError(RuntimeError):
    """A collective cannot complete: a worker it needs has closed its transport or left the job."""


class Collective(NamedTuple):
    """A collective this worker has entered: its number among the transport's collectives, the
    barrier's request, and what it is (for messages)."""
    index: int  # type: ignore[assignment]  # (a field may shadow tuple's index(); mypy assumes the method)
    request: Any  # mpi4py's request, or the simulator's
    what: str


def _pause(start: float) -> None:
    if time.perf_counter() - start < SPIN_SECONDS:
        os.sched_yield()
    else:
        time.sleep(SLEEP_SECONDS)


class LeaveWatch:
    """Leave notices among the workers of one transport, over a duplicate of their communicator.

    Args:
        comm: the workers' communicator (duplicated here; freed by :meth:`free`).
        what: the transport's name, for messages.
        mpi: what ``comm`` belongs to (the transport's ``MPI``; None: mpi4py's).
    """

    def __init__(self, comm, what: str, mpi=None):
        self._MPI = mpi_module(mpi)
        self.comm = comm.Dup()
        self.what = what
        self.rank, self.size = self.comm.rank, self.comm.size
        self.count = 0  # collectives this worker has entered
        self.left: Dict[int, int] = {}  # worker rank -> how many collectives it had entered when it closed
        self.ignored: set = set()  # workers the others went on without (--worker-timeout)
        self._notices: List = []
        self._inbox = np.zeros(1, dtype=np.int64)
        self._freed = False

    def poll(self) -> None:
        """Take in the leave notices that have arrived."""
        status = self._MPI.Status()
        while self.comm.Iprobe(source=self._MPI.ANY_SOURCE, tag=TAG_LEFT, status=status):
            source = status.Get_source()
            self.comm.Recv([self._inbox, self._MPI.INT64_T], source=source, tag=TAG_LEFT)
            self.left[source] = int(self._inbox[0])

    def gone(self, entered: int) -> List[int]:
        """Workers that left before entering collective number ``entered`` (0-based)."""
        return sorted(r for r, count in self.left.items() if count <= entered and r not in self.ignored)

    def missing(self) -> List[int]:
        """Peers whose leave notice has not arrived (the workers gone on without are not waited for)."""
        return [r for r in range(self.size) if r != self.rank and r not in self.ignored and r not in self.left]

    # --- a collective: entered, then settled by polling ------------------------------------------
    def enter(self, comm, what: str) -> Collective:
        """Enter the next collective: a non-blocking barrier over ``comm`` (the workers, or those left
        after a drop)."""
        index = self.count
        self.count += 1
        return Collective(index, comm.Ibarrier(), what)

    def settle(self, collective: Collective) -> bool:
        """One poll of ``collective``: True once every worker is there; :class:`PeerLeftError` when a
        worker it needs has left; False while it waits."""
        if collective.request.Test():
            return True
        self.poll()
        gone = self.gone(collective.index)
        if gone and not collective.request.Test():
            names = ", ".join(map(str, gone))
            raise PeerLeftError(
                f"{self.what}: worker(s) {names} left the job (closed the optimizer or the transport, "
                f"or the process exited) before {collective.what}, which needs every worker; "
                f"worker {self.rank} cannot go on with the others (the leaving worker's own message, if "
                f"any, is above)")
        return False

    def barrier(self, comm, what: str) -> None:
        """A barrier over ``comm`` that raises instead of waiting for a worker that has left."""
        collective = self.enter(comm, what)
        start = time.perf_counter()
        while not self.settle(collective):
            _pause(start)

    # --- closing: a notice to every peer, then every peer's notice -------------------------------
    def announce(self) -> None:
        """Tell every peer this worker has closed, after ``count`` collectives (non-blocking)."""
        payload = np.array([self.count], dtype=np.int64)
        self._payload = payload  # (kept alive until the sends complete)
        for peer in range(self.size):
            if peer != self.rank and peer not in self.ignored:
                self._notices.append(self.comm.Isend([payload, self._MPI.INT64_T], dest=peer, tag=TAG_LEFT))

    def closed(self) -> bool:
        """One poll of the closing wait: True once every peer's leave notice has arrived."""
        self.poll()
        return not self.missing()

    def wait_all_closed(self) -> None:
        """Closing, after :meth:`announce`: wait until every peer has closed too. Each wait is a
        receive of one missing peer's notice, polled (in the simulator a request's test waits on the
        virtual clock, so the other simulated workers run meanwhile)."""
        while not self.closed():
            peer = self.missing()[0]
            request = self.comm.Irecv([self._inbox, self._MPI.INT64_T], source=peer, tag=TAG_LEFT)
            start = time.perf_counter()
            while not request.Test():
                _pause(start)
            self.left[peer] = int(self._inbox[0])

    def free(self) -> None:
        """After every peer has closed: complete this worker's notices and free the communicator
        (collective over the workers, all of which are closing)."""
        if self._freed:
            return
        self._freed = True
        self._MPI.Request.Waitall(self._notices)
        self.comm.Free()

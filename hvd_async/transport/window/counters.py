"""The worker's side of the servers' small counters (the ``meta`` window): every shard's version, pushes,
staleness histogram and the sums its server program keeps (``read_stats``), and on shard 0 the job's
shared counter and per-worker table; with the bookkeeping they need on the worker (the versions it read
and saw, the staleness counts not yet on the servers). What the sums, the counter and the table mean is
the algorithm's business (e.g. dbs-asgd's batch cursor and speed table), not the transport's.
:class:`MetaCounters` is one object the window transport holds."""
from typing import Any, Dict, List

import numpy as np

from .layout import HIST_BINS, HIST_EVERY, META_COUNTER, META_HIST, META_TABLE, META_VERSION, WindowSpec, stats_row


class MetaCounters:
    """One worker's use of the ``meta`` window: accumulate-family operations only (defined beside
    concurrent pushes), on a window the transport keeps locked.

    Attributes:
        read: per shard, the version of the weights this worker last received (a pull, an answer).
        latest: per shard, the newest version this worker has seen.

    Args:
        windows: the transport's windows (``windows.meta``: mpi4py's, or the simulator's), read at each
            operation, so that a window put in its place (a test's recording one) is the one used.
        MPI: the module they belong to.
        spec: the windows' spec (the shards, the workers, the mode).
        rank: this worker.
        trace: the opt-in record of pushes and pulls, or None.
    """

    def __init__(self, windows, MPI, spec: WindowSpec, rank: int, trace=None):
        self._windows, self._MPI, self._spec, self._rank, self._trace = windows, MPI, spec, int(rank), trace
        servers = spec.servers
        self.read = np.zeros(servers, dtype=np.int64)
        self.latest = np.zeros(servers, dtype=np.int64)
        self._hist_due = np.zeros((servers, HIST_BINS), dtype=np.int64)  # not yet on the servers
        self._hist_pushes = 0
        self._fetched = np.zeros(servers, dtype=np.int64)  # each shard's version before this push's bump
        self._fetch_bufs = [[self._fetched[k:k + 1], MPI.INT64_T] for k in range(servers)]
        self._one_t = [np.ones(1, dtype=np.int64), MPI.INT64_T]
        # NO_OP reads ignore their origin buffer, but mpi4py wants one: empty, of the window's type
        self._no_int64 = [np.empty(0, dtype=np.int64), MPI.INT64_T]

    # --- versions and staleness, at every accumulate-mode push ----------------------------------
    def bump_versions(self) -> None:
        """Start adding 1 to every shard's version, fetching the old value (completed by a flush of
        the meta window). One round trip with the delta: MPI does not order operations on two windows
        before the flush, so a concurrent pull may see the bump before the delta and count at most
        the pushes in flight as one fewer of staleness."""
        meta, add = self._windows.meta, self._MPI.SUM
        for k, buf in enumerate(self._fetch_bufs):
            meta.Fetch_and_op(self._one_t, buf, k, META_VERSION, op=add)

    def push_counted(self) -> np.ndarray:
        """Once the bump was flushed: this push's staleness per shard, and the bookkeeping."""
        # Per shard in Python ints: numpy's ufuncs cost about a microsecond each on arrays this small
        # (this runs at every push; see benchmarks/speed/rma_bandwidth.py at 1 KB).
        versions, hist, latest = self.read.tolist(), self._hist_due, self.latest
        stale = []
        for k, fetched in enumerate(self._fetched.tolist()):
            s = max(0, fetched - versions[k])
            stale.append(s)
            hist[k, s if s < HIST_BINS else HIST_BINS - 1] += 1
            latest[k] = fetched + 1
        staleness = np.array(stale, dtype=np.int64)
        self._hist_pushes += 1
        if self._hist_pushes >= HIST_EVERY:
            self.send_hist()
        if self._trace is not None:
            self._trace.push(self._fetched, staleness)
        return staleness

    def send_hist(self) -> None:
        """Add this worker's uncounted staleness counts into each shard's histogram on its server
        (one ``Accumulate`` of the whole histogram per shard; completed by the caller's flush)."""
        if self._hist_pushes:
            for k in range(self._spec.servers):
                self._windows.meta.Accumulate([self._hist_due[k], self._MPI.INT64_T], k,
                                      target=(META_HIST, HIST_BINS, self._MPI.INT64_T), op=self._MPI.SUM)
            self._windows.meta.Flush_all()  # the buffer is reused right after
            self._hist_due[:] = 0
            self._hist_pushes = 0

    def start_reads(self, bufs, index: int = META_VERSION) -> None:
        """Start reading counter ``index`` (the version; ``META_WRITING``: the write a server began) of
        every shard into ``bufs`` (``[[array, MPI type], ...]``, one per shard; completed by a flush of
        the meta window)."""
        meta, no_op = self._windows.meta, self._MPI.NO_OP
        for k, buf in enumerate(bufs):
            meta.Fetch_and_op(self._one_t, buf, k, index, op=no_op)

    # --- shared counter and per-worker values (on shard 0) ------------------------------------
    def fetch_add_counter(self, n: int) -> int:
        """Atomically add ``n`` to the job's shared counter; returns its value before."""
        MPI = self._MPI
        add, old = np.array([n], dtype=np.int64), np.zeros(1, dtype=np.int64)
        self._windows.meta.Fetch_and_op([add, MPI.INT64_T], [old, MPI.INT64_T], 0, META_COUNTER, op=MPI.SUM)
        self._windows.meta.Flush(0)
        return int(old[0])

    def publish_value(self, value: float) -> None:
        """Write this worker's slot of the shared table (a float, e.g. its measured speed)."""
        bits = np.array([value], dtype=np.float64).view(np.int64)
        # REPLACE: an accumulate, so that a worker reading the table meanwhile (read_values) is defined
        self._windows.meta.Accumulate([bits, self._MPI.INT64_T], 0, target=(META_TABLE + self._rank, 1, self._MPI.INT64_T),
                              op=self._MPI.REPLACE)
        self._windows.meta.Flush(0)

    def read_values(self) -> np.ndarray:
        """Every worker's slot of the shared table (0.0 where a worker has written nothing)."""
        table = np.zeros(self._spec.workers, dtype=np.int64)
        self._windows.meta.Get_accumulate(self._no_int64, [table, self._MPI.INT64_T], 0,
                                  target=(META_TABLE, self._spec.workers, self._MPI.INT64_T), op=self._MPI.NO_OP)
        self._windows.meta.Flush(0)
        return table.view(np.float64).copy()

    def read_stats(self) -> List[Dict[str, Any]]:
        """Every shard's counters as they stand: version, pushes, server busy seconds, staleness
        histogram, and ``sums`` (the ``SUMS`` floats its server program added up, ``ShardHost.add_sums``)."""
        self.send_hist()
        self._windows.meta.Flush_all()
        rows = []
        meta = np.zeros(META_COUNTER, dtype=np.int64)
        for k in range(self._spec.servers):
            # (other workers' pushes add into the version and histogram meanwhile)
            self._windows.meta.Get_accumulate(self._no_int64, [meta, self._MPI.INT64_T], k,
                                      target=(0, META_COUNTER, self._MPI.INT64_T), op=self._MPI.NO_OP)
            self._windows.meta.Flush(k)
            rows.append(stats_row(meta, self._spec.mode))
        return rows

    # --- a checkpoint of this worker's side ---------------------------------------------------
    def state(self) -> Dict[str, Any]:
        """The versions this worker last read and saw, the staleness counts not yet sent."""
        return {"versions": self.read.tolist(), "latest_versions": self.latest.tolist(),
                "hist_due": self._hist_due.tolist(), "hist_pushes": self._hist_pushes}

    def load_state(self, state: Dict[str, Any]) -> None:
        self.read[:] = state["versions"]
        self.latest[:] = state["latest_versions"]
        self._hist_due[:] = np.asarray(state["hist_due"], dtype=np.int64)
        self._hist_pushes = int(state["hist_pushes"])

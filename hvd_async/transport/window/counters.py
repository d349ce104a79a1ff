"""The worker's reads and writes of the servers' small counters (the ``meta`` window): every shard's
version, pushes, staleness histogram and the sums its server program keeps (``read_stats``), and on
shard 0 the job's shared counter and per-worker table. What the sums, the counter and the table mean
is the algorithm's business (e.g. dbs-asgd's batch cursor and speed table), not the transport's. A base of :class:`~hvd_async.transport.window.client.WindowTransport`."""
from typing import TYPE_CHECKING, Any, Callable, Dict, List

import numpy as np

from .layout import HIST_BINS, HIST_EVERY, META_COUNTER, META_HIST, META_TABLE, META_VERSION, stats_row

if TYPE_CHECKING:
    from .layout import WindowSpec, _Windows


class MetaAccess:
    """Accumulate-family operations on the meta window (defined beside concurrent pushes); the
    transport provides ``_win``, ``_MPI``, ``_one_t``, ``_rank``, ``size``, ``servers``, ``spec``,
    ``_check_idle``, ``_no_int64``, ``_trace`` and the push bookkeeping (``_versions``,
    ``latest_versions``, ``_fetch_bufs``, ``_fetched``, ``_hist_due``, ``_hist_pushes``)."""

    # the host's (the WindowTransport's) attributes this mixin reads
    _win: "_Windows"
    _MPI: Any  # mpi4py's MPI, or the simulator's
    _one_t: List[Any]
    _rank: int
    size: int
    servers: int
    spec: "WindowSpec"
    _check_idle: Callable[[], None]
    _no_int64: List[Any]
    _trace: Any  # the opt-in record of pushes and pulls, or None
    _versions: np.ndarray
    latest_versions: np.ndarray
    _fetch_bufs: List[List[Any]]
    _fetched: np.ndarray
    _hist_due: np.ndarray
    _hist_pushes: int

    # --- versions and staleness, at every accumulate-mode push ----------------------------------
    def _bump_versions(self) -> None:
        """Start adding 1 to every shard's version, fetching the old value (completed by a flush of
        the meta window). One round trip with the delta: MPI does not order operations on two windows
        before the flush, so a concurrent pull may see the bump before the delta and count at most
        the pushes in flight as one fewer of staleness."""
        meta, add = self._win.meta, self._MPI.SUM
        for k, buf in enumerate(self._fetch_bufs):
            meta.Fetch_and_op(self._one_t, buf, k, META_VERSION, op=add)

    def _push_counted(self) -> np.ndarray:
        """Once the bump was flushed: this push's staleness per shard, and the bookkeeping."""
        # Per shard in Python ints: numpy's ufuncs cost about a microsecond each on arrays this small
        # (this runs at every push; see benchmarks/rma_bandwidth.py at 1 KB).
        versions, hist, latest = self._versions.tolist(), self._hist_due, self.latest_versions
        stale = []
        for k, fetched in enumerate(self._fetched.tolist()):
            s = max(0, fetched - versions[k])
            stale.append(s)
            hist[k, s if s < HIST_BINS else HIST_BINS - 1] += 1
            latest[k] = fetched + 1
        staleness = np.array(stale, dtype=np.int64)
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

    # --- shared counter and per-worker values (on shard 0) ------------------------------------
    def fetch_add_counter(self, n: int) -> int:
        """Atomically add ``n`` to the job's shared counter; returns its value before."""
        self._check_idle()
        MPI = self._MPI
        add, old = np.array([n], dtype=np.int64), np.zeros(1, dtype=np.int64)
        self._win.meta.Fetch_and_op([add, MPI.INT64_T], [old, MPI.INT64_T], 0, META_COUNTER, op=MPI.SUM)
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
        """Every shard's counters as they stand: version, pushes, server busy seconds, staleness
        histogram, and ``sums`` (the ``SUMS`` floats its server program added up, ``ShardHost.add_sums``)."""
        self._check_idle()
        self._send_hist()
        self._win.meta.Flush_all()
        rows = []
        meta = np.zeros(META_COUNTER, dtype=np.int64)
        for k in range(self.servers):
            # (other workers' pushes add into the version and histogram meanwhile)
            self._win.meta.Get_accumulate(self._no_int64, [meta, self._MPI.INT64_T], k,
                                          target=(0, META_COUNTER, self._MPI.INT64_T), op=self._MPI.NO_OP)
            self._win.meta.Flush(k)
            rows.append(stats_row(meta, self.spec.mode))
        return rows

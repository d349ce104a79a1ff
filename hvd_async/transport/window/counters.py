"""The worker's reads and writes of the servers' small counters (the ``meta`` window): every shard's
version, pushes, staleness histogram and the sums its server program keeps (``read_stats``), and on
shard 0 the job's shared counter and per-worker table. What the sums, the counter and the table mean
is the algorithm's business (e.g. dbs-asgd's batch cursor and speed table), not the transport's. A base of :class:`~hvd_async.transport.window.client.WindowTransport`."""
from typing import Any, Dict, List

import numpy as np

from .layout import META_BUSY_US, META_COUNTER, META_HIST, META_SUMS, META_TABLE, META_VERSION, _pushes


class MetaAccess:
    """Accumulate-family operations on the meta window (defined beside concurrent pushes); the
    transport provides ``_win``, ``_MPI``, ``_rank``, ``size``, ``servers``, ``spec``, ``_check_idle``,
    ``_send_hist`` and ``_no_int64``."""

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
            rows.append({"version": int(meta[META_VERSION]), "pushes": _pushes(meta, self.spec.mode),
                         "busy_seconds": int(meta[META_BUSY_US]) / 1e6,
                         "staleness_hist": meta[META_HIST:META_SUMS].tolist(),
                         "sums": meta[META_SUMS:META_COUNTER].view(np.float64).tolist()})
        return rows

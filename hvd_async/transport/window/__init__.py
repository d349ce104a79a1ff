"""MPI one-sided windows on the parameter-server ranks: the transport of the parameter-server family.

The model's parameters are one flat fp32 buffer of ``numel`` elements, cut into ``S`` contiguous
shards (the first ``numel % S`` shards one element longer), shard ``k`` held by server rank ``k``.
Per shard, ``MPI.Win.Allocate`` windows (workers allocate zero bytes; every window has one owner):

- ``weights``: the shard of the global weights;
- ``meta`` (int64): ``[version, pushes, server busy microseconds, staleness histogram (HIST_BINS
  bins, the last one counts everything at or beyond it), SUMS float64 sums the server program adds
  into (``ShardHost.add_sums``), a shared counter, one value per worker]`` (counter and values are
  used on shard 0 only: ``fetch_add_counter``, ``publish_value``, ``read_values``; shards that
  rewrite their weights keep ``META_WRITING`` in the counter's place, see below). What the sums,
  the counter and the values stand for is the algorithm's (dc-asgd's compensation norms, dbs-asgd's
  batch cursor and speed table): the transport names no learning quantity;
- mailbox mode only, ``inbox`` and ``outbox``: shard-sized slots. The outbox has one per worker;
  the inbox one per worker too, or a pool of fewer (``slots``: :mod:`.slots`, the server grants a
  push a free one on request and frees it once it has taken the gradient). A worker
  puts its gradient into its inbox slot, flushes, and sends the server a small header message (a
  :class:`Request`: its :class:`Kind`, the slot, and a payload of ``PAYLOAD_LEN`` floats whose fields
  the algorithm defines); the server program takes the gradient (a program that waits for several
  folds each into a running sum as it lands, so a pool's slot is free at once; backup-sgd's compiled
  update leaves it in the worker's own slot, which that worker writes again only after its answer,
  until the round's update reads them all), applies its rule, writes
  the weights it wants the worker to continue from into the worker's outbox slot (dc-asgd keeps them
  there as that worker's backup ``w_bak(m)``) and answers with the version, the staleness, the
  pushes and a :class:`Status` (the worker reads them as :class:`Answers`); the worker then gets its
  outbox slot. An algorithm whose workers read the weights window themselves (od-sgd) has no
  outbox: a pull's copy comes back through the pull's inbox slot.

Two modes:

- ``accumulate`` (asgd): a push is ``Accumulate(SUM)`` of a delta straight into ``weights`` (MPI makes
  concurrent accumulates to one element atomic, so no update is lost) and, in the same round trip,
  ``Fetch_and_op`` on the shard's version counter, whose old value, less the version read at the
  last pull, is the push's staleness; the worker adds its staleness counts into the shard's
  histogram every ``HIST_EVERY`` pushes and at ``read_stats``/``close``. The server does nothing
  but keep MPI progressing.
- ``mailbox`` (dc-asgd, softsync): the server runs the algorithm's rule (see ``ShardHost``).

Workers hold a shared passive-target lock on every window for the transport's whole life
(``Lock_all``) and complete operations with ``Flush``, never with request-based calls (``Rget``):
Open MPI 4.1's UCX one-sided component takes an ``Rget``'s request from an extra atomic at the target,
and a worker's wait for one was seen never to end while both servers polled (docs/reliability.md).
The server holds a lock on its own windows and touches their memory directly between ``Win.Sync``
calls. Headers and answers are two-sided messages on the transport's own communicator: the data
never leaves the windows, and a worker waiting for an answer sits in ``MPI_Wait`` instead of polling
a flag across the network (on a node with more processes than cores it checks with ``MPI_Testall``
and sleeps between checks, so that its wait takes no core from the workers still computing:
``client.wait_for_answers``).

Reads of the weights from a shard on this node are plain ``Get``, also in accumulate mode
where other workers may be adding into the same elements meanwhile. MPI leaves such a read undefined
(only accumulate-family reads, ``Get_accumulate`` with ``NO_OP``, are element-atomic beside
accumulates), but Open MPI's shared-memory windows (``osc/sm``, x86-64, aligned 4-byte floats) never
show a partial element, and neither did ``osc/rdma`` over TCP on one node:
``tests/mpi/rma_read_checks.py`` reads while workers push and checks every element of every read. A
NO_OP ``Get_accumulate`` in its place makes a push+pull round take longer (measured in the guide's
benchmark results), so the hot path does without it there. A shard on
another node is read with ``Get_accumulate(NO_OP)``: there the one-sided component is a network one
(``osc/ucx`` over TCP adds a float as lock, get, add, put at the target), which a plain read could
catch half done (``layout.atomic_read_targets``; ``HVD_ASYNC_ATOMIC_READS=always|never`` forces
either). A pull may see
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
a write overlapped the read, and the worker asks its server for a copy (``Kind.PULL``, into its
outbox slot) instead.

Across hosts a passive-target operation completes only when the target calls into MPI: the server
loop (:mod:`hvd_async.server`) keeps calling in between its work. Windows across hosts need a
one-sided component that supports ``MPI_THREAD_MULTIPLE`` over the network: ``--mca osc ucx``;
opening fails with a message that says so when the default one cannot create the window.
"""
from .client import WindowTransport  # noqa: F401
from .host import ServerProgram, ShardHost  # noqa: F401
from .layout import *  # noqa: F401,F403  (the layout and wire format: window.H_LEN, window.Kind, window.Request, ...)

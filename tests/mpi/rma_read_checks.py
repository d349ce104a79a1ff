"""Reads of windows that other workers accumulate into at the same time, under mpirun, run by
tests/test_rma_reads.py (and tests/test_netns.py across hosts): ``SERVERS=S python rma_read_checks.py
[CHECK ...]``.

MPI defines a read beside concurrent ``Accumulate``s only for accumulate-family reads
(``Get_accumulate`` with ``NO_OP``), and then per element. The transports read windows on their own
node with plain ``Get`` all the same (an accumulate-family read halves push+pull's bandwidth: see
hvd_async/transport/window/__init__.py), and those on other nodes with ``Get_accumulate``
(``HVD_ASYNC_ATOMIC_READS``: ``always`` forces it on one node too). These checks are the evidence that
no read sees a partial element, and that each read is of the kind its target calls for:
workers add vectors of ones while worker 0 reads the whole window again and again through the
transport's own read (``WindowTransport.pull``/``pull_async``/``read_stats``, ``PeerWindowTransport.get``),
and every read must hold, element by element, a whole number of pushes: an integer in ``[0, pushes]``,
never below what the same element held at the reader's previous read (no torn or invented value).
The windows are wrapped to record the MPI calls the reads made: the meta counters must be read with
accumulate-family calls. Reads that mix elements of different pushes are allowed (per-element
atomicity only) and counted. Worker 0 prints ``RMA READ CHECKS OK`` at the end.

The reads and the pushes overlap by construction: the pushing workers push ``PUSHES`` times each
and then go on until the reader has made ``READS`` reads; the reader reads on until they are done.
Pushes add ``VALUE`` (1.0; a value like 1/3 makes every element's bits change at each push).

Environment: ``SERVERS`` (1), ``NUMEL`` (1 << 16), ``READS`` (40), ``PUSHES`` (per pushing worker,
at least; 100), ``VALUE`` (1.0).
"""
import collections
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/

import hvd_async as ha  # noqa: E402
from harness import check, main, say  # noqa: E402
from hvd_async.transport.peer import PeerWindowTransport  # noqa: E402
from hvd_async.transport.window import WindowTransport  # noqa: E402

NUMEL = int(os.environ.get("NUMEL", str(1 << 16)))
READS = int(os.environ.get("READS", "40"))
PUSHES = int(os.environ.get("PUSHES", "100"))
VALUE = float(os.environ.get("VALUE", "1.0"))
MAX_PUSHES = 20000  # per pushing worker: every value read is at most this many pushes
READS_OK = {"Get_accumulate", "Rget_accumulate", "Fetch_and_op"}  # element-atomic beside accumulates
PLAIN_READS = {"Get", "Rget"}


class Recording:
    """A window that counts the calls made on it (everything else goes to the window)."""

    def __init__(self, win):
        self.win, self.calls = win, collections.Counter()

    def __getattr__(self, name):
        attr = getattr(self.win, name)
        if not callable(attr):
            return attr

        def call(*args, **kwargs):
            self.calls[name] += 1
            return attr(*args, **kwargs)

        return call


def sums(value: float, total: int) -> np.ndarray:
    """What an element holds after 0..``total`` pushes of ``value``, each added in float32 by MPI."""
    table = np.zeros(total + 1, dtype=np.float32)
    v = np.float32(value)
    for k in range(total):
        table[k + 1] = table[k] + v
    return table


class Reads:
    """Checks each read of a window of counters that only ever grow by whole pushes of ``value``."""

    def __init__(self, what: str, total: int, value: float = 1.0):
        self.what, self.total = what, total
        self.table = sums(value, total)
        self.last = None
        self.count = self.mixed = 0

    def pushes(self, values: torch.Tensor) -> np.ndarray:
        """How many pushes each element holds; -1 where it holds no whole number of them."""
        values = values.numpy().astype(np.float32)
        index = np.searchsorted(self.table, values).clip(max=self.total)
        return np.where(self.table[index] == values, index, -1)

    def see(self, values: torch.Tensor) -> None:
        index = self.pushes(values)
        bad = index < 0
        if self.last is not None:
            bad |= index < self.last
        if bool(bad.any()):
            i = int(bad.nonzero()[0][0])
            before = "-" if self.last is None else f"{int(self.last[i])} pushes"
            raise AssertionError(f"{self.what}: read {self.count}: element {i} is {float(values[i])!r} (previous "
                                 f"read {before}; every value must be a whole number of pushes in "
                                 f"[0, {self.total}], never going back)")
        self.count += 1
        self.mixed += int(index.min() != index.max())
        self.last = index


def _race(role: str, read, push) -> int:
    """``role`` "reader": ``read()`` ``READS`` times, then on until every pusher is done; "pusher":
    ``push()`` ``PUSHES`` times, then on until the reader has made its ``READS`` reads (at most
    ``MAX_PUSHES``); any other role waits. Collective over the workers; returns the pushes of all."""
    comm = ha.worker_comm()
    pushes = 0
    if role == "reader":
        for _ in range(READS):
            read()
        stop, done = comm.Ibarrier(), comm.Ibarrier()
        while not done.Test():
            read()
        stop.Wait()
    else:
        stop = comm.Ibarrier()
        if role == "pusher":
            while pushes < MAX_PUSHES and (pushes < PUSHES or not stop.Test()):
                push()
                pushes += 1
        stop.Wait()
        comm.Ibarrier().Wait()
    return comm.allreduce(pushes)


def _calls_check(what: str, recording: Recording, wanted) -> None:
    used = {name for name in recording.calls if name in READS_OK | PLAIN_READS}
    plain = used & PLAIN_READS
    check(not plain, f"{what} read with {sorted(plain)}: a plain read beside concurrent accumulates is undefined "
          f"in MPI (want {sorted(wanted)}); calls: {dict(recording.calls)}")
    check(wanted <= used, f"{what}: expected reads with {sorted(wanted)}, saw {dict(recording.calls)}")


def _reads_check(what: str, recording: Recording, targets, atomic) -> None:
    """The data reads went where they should: accumulate-family reads for the ``targets`` in
    ``atomic`` (off this node, or every one under HVD_ASYNC_ATOMIC_READS=always), plain ones elsewhere."""
    wanted = set()
    if any(k in atomic for k in targets):
        wanted |= {"Get_accumulate"}
    if any(k not in atomic for k in targets):
        wanted |= {"Get"}
    used = {name.replace("Rget", "Get") for name in recording.calls if name in READS_OK | PLAIN_READS}
    check(used == wanted, f"{what}: targets {sorted(targets)}, atomic {sorted(atomic)}: expected reads with "
          f"{sorted(wanted)} (and their R- forms), saw {dict(recording.calls)}")


def weights_pull():
    """asgd's windows (accumulate mode): workers 1.. push ones; worker 0 only reads, alternating
    ``pull`` and ``pull_async``, and now and then the shards' counters (``read_stats``)."""
    workers, rank = ha.size(), ha.rank()
    t = WindowTransport(NUMEL, comms=ha.runtime.comms(), algorithm="asgd", mode="accumulate")
    flat, ones = torch.zeros(NUMEL), torch.full((NUMEL,), VALUE)
    t.publish_(flat)  # zeros
    bound = MAX_PUSHES * (workers - 1)
    reads, versions = Reads("pull", bound, VALUE), []
    weights, meta = t._win.weights, t._win.meta
    if rank == 0:
        t._win.weights, t._win.meta = Recording(weights), Recording(meta)

    def read():
        if reads.count % 2:
            t.pull_async(flat).wait()
        else:
            t.pull(flat)
        reads.see(flat)
        if reads.count % 16 == 1:
            version = sum(row["version"] for row in t.read_stats())
            check(not versions or versions[-1] <= version <= bound * t.servers,
                  f"read_stats: version {version} after {versions[-1:]}")
            versions.append(version)

    total = _race("reader" if rank == 0 else "pusher", read, lambda: t.accumulate(ones))
    if rank == 0:
        _calls_check("read_stats", t._win.meta, {"Get_accumulate", "Fetch_and_op"})
        _reads_check("pull", t._win.weights, range(t.servers), t.atomic_reads)
        say(f"WEIGHTS PULL reads={reads.count} mixed={reads.mixed} workers={workers} pushes={total} "
            f"atomic={sorted(t.atomic_reads)} calls={dict(t._win.weights.calls)}")
        t._win.weights, t._win.meta = weights, meta
    t.pull(flat)
    want = float(reads.table[total])
    check(bool((flat == want).all()), f"after every push: weights in [{flat.min()}, {flat.max()}], want {want}")
    t.close()


def gossip_get():
    """Gossip's windows: workers 2.. add ones (and weight 1) into worker 1's window, worker 0 gets it."""
    workers, rank = ha.size(), ha.rank()
    if workers < 3:
        if rank == 0:
            say(f"GOSSIP GET SKIPPED: needs a reader, a target and a pusher ({workers} workers)")
        return
    t = PeerWindowTransport(NUMEL, comms=ha.runtime.comms(), name="rma-read-check")
    target, bound = 1, MAX_PUSHES * (workers - 2)
    out, ones = torch.zeros(NUMEL), torch.full((NUMEL,), VALUE)
    reads, weights = Reads("get", bound, VALUE), Reads("get's weight", bound)
    win = t._win
    if rank == 0:
        t._win = Recording(win)

    def read():
        weight = t.get(target, out)
        reads.see(out)
        weights.see(torch.tensor([weight], dtype=torch.float64))

    role = "reader" if rank == 0 else "target" if rank == target else "pusher"
    total = _race(role, read, lambda: t.accumulate(target, ones, weight=1.0))
    if rank == 0:
        _reads_check("get", t._win, [target], t.atomic_reads)
        say(f"GOSSIP GET reads={reads.count} mixed={reads.mixed} workers={workers} pushes={total} "
            f"atomic={sorted(t.atomic_reads)} calls={dict(t._win.calls)}")
        t._win = win
    if rank != target:
        weight = t.get(target, out)
        want = float(reads.table[total])
        check(bool((out == want).all()) and weight == total,
              f"after every push: buffer in [{out.min()}, {out.max()}], weight {weight}; want {want}, {total}")
    t.close()


CHECKS = {f.__name__: f for f in (weights_pull, gossip_get)}

if __name__ == "__main__":
    main(CHECKS, sys.argv[1:], "RMA READ CHECKS OK")

"""The server ranks' loop: keeps MPI progressing, hosts window shards, ends when all workers say done.

Across nodes a passive-target one-sided call waits until its target rank calls into MPI (see
ENVIRONMENT.md), so a server never sits in long computation or a long ``time.sleep``: each turn of
the loop probes the control channel and lets every open shard handle its waiting requests (a
bounded number each). While workers are active (a request handled, or a shard's version moved by
one-sided pushes, within the last ``spin_seconds``) it only yields the CPU between turns, so a
remote ``Get`` or ``Accumulate`` waits microseconds for progress, not a sleep; when idle it sleeps
``poll_interval`` per turn.

When worker 0 opens a :class:`~hvd_async.transport.window.WindowTransport` it sends the servers a
``WindowSpec``; each server then joins the collective window creation and hosts its shard with the
server program of that algorithm (``server_program`` of its strategy class) until every worker
has closed the transport.
"""
import logging
import os
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, List, Optional

if TYPE_CHECKING:
    from .transport.window import ShardHost

logger = logging.getLogger(__name__)

TAG_DONE = 7001  # worker -> every server: this worker has finished
# A worker's close message can arrive after its TAG_DONE when no collective free orders them (after
# --worker-timeout dropped a worker): how long the server goes on polling before it calls a window
# transport that is still open an error.
CLOSE_GRACE_SECONDS = 10.0

@dataclass
class ServerReport:
    """What one server rank did, returned by :func:`hvd_async.serve`."""

    workers_done: List[int] = field(default_factory=list)  # world ranks, in the order they finished
    loop_turns: int = 0
    wall_seconds: float = 0.0
    shards: List = field(default_factory=list)  # ShardStats of every transport this rank hosted
    dropped: List[int] = field(default_factory=list)  # workers the job went on without (--worker-timeout)


def _open_shard(ctrl, win_comm, source: int):
    import torch

    from . import registry
    from .transport.window import ShardHost, TAG_OPEN

    spec = ctrl.recv(source=source, tag=TAG_OPEN)
    comm = win_comm.Dup()
    program = registry.algorithm(spec.algorithm).server_program
    # a push applied on the threads serve() gave this rank (torch's: its slices on as many lanes)
    host = ShardHost(comm, spec, ctrl.rank, program, threads=torch.get_num_threads())
    logger.info("hosting shard %d of %s: %d of %d parameters, %d workers", ctrl.rank, spec.algorithm,
                host.numel, spec.numel, spec.workers)
    return host


def run(ctrl, workers: List[int], *, poll_interval: float = 0.0005, spin_seconds: float = 0.05,
        win_comm=None, worker_timeout: Optional[float] = None, spin_yield: bool = True) -> ServerReport:
    """Serve until every world rank in ``workers`` has sent ``TAG_DONE`` on communicator ``ctrl``
    (or was dropped by the workers for making no progress: ``worker_timeout``). ``spin_yield``: give
    the core away at each turn while spinning (:func:`hvd_async.serve`)."""
    from mpi4py import MPI

    from .transport.window import TAG_OPEN

    report = ServerReport()
    start = time.perf_counter()
    waiting = set(workers)
    hosts: List["ShardHost"] = []
    status = MPI.Status()
    last_activity = time.perf_counter()
    all_done_at = None  # when the last worker said it was done
    while waiting or hosts:
        report.loop_turns += 1
        busy = False
        for host in list(hosts):
            busy = host.poll() > 0 or host.moved() or busy
            for worker in host.dropped - set(report.dropped):
                report.dropped.append(worker)
                waiting.discard(host.spec.servers + worker)
            if host.all_closed:
                stats = host.close()
                hosts.remove(host)
                report.shards.append(stats)
                logger.info("shard %d of %s closed: %d updates from %d pushes, mean staleness %.2f, "
                            "%d non-finite pushes skipped", stats.shard, stats.algorithm, stats.updates,
                            stats.pushes, stats.staleness_mean, stats.skipped_nonfinite)
        if ctrl.Iprobe(source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG, status=status):
            busy = True
            source, tag = status.Get_source(), status.Get_tag()
            if tag == TAG_OPEN:
                hosts.append(_open_shard(ctrl, win_comm, source))
                hosts[-1].worker_timeout = worker_timeout
            elif tag == TAG_DONE:
                ctrl.recv(source=source, tag=TAG_DONE)
                waiting.discard(source)
                report.workers_done.append(source)
                logger.info("worker at world rank %d finished; %d still running", source, len(waiting))
                if not waiting and hosts:
                    all_done_at = time.perf_counter()  # their close messages may still be on the way
            else:
                raise RuntimeError(f"server: unexpected control message tag {tag} from rank {source}")
        now = time.perf_counter()
        if hosts and not waiting and all_done_at is not None and now - all_done_at > CLOSE_GRACE_SECONDS:
            raise RuntimeError("every worker finished but a window transport is still open; workers must "
                               "close() the transports they built (an optimizer's: opt.close(), or "
                               "hvd_async.shutdown() at exit)")
        if busy:
            last_activity = now
        if now - last_activity < spin_seconds:
            if spin_yield:
                os.sched_yield()  # runnable ranks on this core go first; otherwise straight back to MPI
        else:
            time.sleep(poll_interval)
    report.wall_seconds = time.perf_counter() - start
    return report

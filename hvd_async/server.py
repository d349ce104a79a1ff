"""The server ranks' loop: keeps MPI progressing, runs registered server-side work, ends when all workers say done.

Across nodes a passive-target one-sided call waits until its target rank calls into MPI (see
ENVIRONMENT.md), so a server must never sit in pure computation or ``time.sleep`` for long: the loop
below probes for control messages every ``poll_interval`` seconds and runs each registered
*poller* (a callable doing a bounded slice of server-side work, e.g. draining a mailbox and applying
a rule) in between. Algorithms that need server-side work register pollers with :func:`add_poller`.
"""
import logging
import time
from dataclasses import dataclass, field
from typing import Callable, List

logger = logging.getLogger(__name__)

TAG_DONE = 7001  # worker -> every server: this worker has finished

_pollers: List[Callable[[], None]] = []


def add_poller(poller: Callable[[], None]) -> None:
    """Run ``poller()`` on every turn of the server loop (it must return quickly)."""
    _pollers.append(poller)


@dataclass
class ServerReport:
    """What one server rank did, returned by :func:`hvd_async.serve`."""

    workers_done: List[int] = field(default_factory=list)  # world ranks, in the order they finished
    loop_turns: int = 0
    wall_seconds: float = 0.0


def run(ctrl, workers: List[int], *, poll_interval: float = 0.0005) -> ServerReport:
    """Serve until every world rank in ``workers`` has sent ``TAG_DONE`` on communicator ``ctrl``."""
    from mpi4py import MPI

    report = ServerReport()
    start = time.perf_counter()
    waiting = set(workers)
    status = MPI.Status()
    while waiting:
        report.loop_turns += 1
        for poller in _pollers:
            poller()
        if ctrl.Iprobe(source=MPI.ANY_SOURCE, tag=TAG_DONE, status=status):
            source = status.Get_source()
            ctrl.recv(source=source, tag=TAG_DONE)
            waiting.discard(source)
            report.workers_done.append(source)
            logger.info("worker at world rank %d finished; %d still running", source, len(waiting))
        else:
            time.sleep(poll_interval)
    report.wall_seconds = time.perf_counter() - start
    return report

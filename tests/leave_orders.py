"""The ways a worker's script can end, for the leave protocol's checker (tests/unit/test_leave_protocol.py)
and the same orders under mpirun (tests/test_leave_orders.py, tests/mpi/leave_order_job.py).

A worker's script runs the transport's collectives in order: the start (inside the optimizer's
constructor), the end of epoch 1 (``load_global_model``), and the end of training
(``load_global_model`` again); then it closes. It leaves at one of these points in one way:

  finish       every collective, then ``opt.close()`` in its ``finally``
  close        an error it catches after ``point`` collectives, ``opt.close()`` in ``finally``, and the
               script goes on to return normally (at point 1, "close early"; at 2, "close late")
  exit         ``sys.exit(0)`` after ``point`` collectives: its ``finally`` and the exit hook close
  raise        an uncaught exception after ``point`` collectives: its ``finally`` closes, then the
               exception ends the job (the excepthook's MPI_Abort)

A worker whose collective raises PeerLeftError leaves as ``raise`` does (its ``finally``
closes, then the error ends the job).
"""
import itertools
from typing import Iterator, NamedTuple, Tuple

COLLECTIVES = ("the start", "the end of epoch 1", "the end of training")
WAYS = ("close", "exit", "raise")


class Leave(NamedTuple):
    way: str  # "finish" or one of WAYS
    point: int  # collectives run before leaving (all of them for "finish")

    @property
    def name(self) -> str:
        if self.way == "finish":
            return "finish"
        if self.way == "close" and self.point in (1, 2):
            return ("close-early", "close-late")[self.point - 1]
        return f"{self.way}@{self.point}"

    def ops(self) -> Tuple[str, ...]:
        """The script as the protocol sees it: 'coll' per collective, then 'close', then how the
        process ends ('end': returns normally; 'abort': the excepthook ends the job)."""
        return ("coll",) * self.point + ("close", "abort" if self.way == "raise" else "end")

    @classmethod
    def parse(cls, name: str) -> "Leave":
        for leave in LEAVES:
            if leave.name == name:
                return leave
        raise ValueError(f"unknown leave order {name!r}; one of {', '.join(l.name for l in LEAVES)}")


FINISH = Leave("finish", len(COLLECTIVES))
# Every way at every point after the start (the start is inside the constructor, which every worker
# runs), and finishing.
LEAVES = (FINISH,) + tuple(Leave(way, point) for way in WAYS for point in (1, 2))


def combinations(workers: int) -> Iterator[Tuple[Leave, ...]]:
    """Every assignment of a leave order to each worker, up to a renumbering of the workers (the
    protocol treats every worker alike)."""
    return itertools.combinations_with_replacement(LEAVES, workers)

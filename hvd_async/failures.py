"""One error, one line: an uncaught error raised alike on several ranks (a bad option every worker
passes) is said once, by the lowest rank that has it, and an error of the library's bad-input kind
(a ``ValueError`` or ``TypeError`` raised inside ``hvd_async``) is one line naming where the call
was made, without the traceback (``HVD_ASYNC_DEBUG=1`` prints it). And every ending of the job on an
error goes through :func:`abort`, which makes sure the aborting process does end."""
import os
import signal
import sys
import time
import traceback
from typing import Optional

TAG_FAILED = 7303  # on the runtime's ``failures`` communicator: this rank is ending the job on an error
PACKAGE = os.path.dirname(os.path.abspath(__file__))


def bad_input_line(exc, tb, who: str, kinds=(ValueError, TypeError)) -> Optional[str]:
    """``hvd_async: error: WHO: Type: message (the call at FILE:LINE)`` where ``exc`` is a bad-input
    error (one of ``kinds``) raised inside the package from a caller outside it; None for any other."""
    if not isinstance(exc, kinds):
        return None
    frames = traceback.extract_tb(tb)
    inside = [i for i, frame in enumerate(frames) if os.path.abspath(frame.filename).startswith(PACKAGE + os.sep)]
    if not inside or inside[-1] != len(frames) - 1 or inside[0] == 0:
        return None  # raised outside the package, or not called from outside it
    call = frames[inside[0] - 1]
    return (f"hvd_async: error: {who}: {type(exc).__name__}: {exc} (the call at {call.filename}:{call.lineno}; "
            f"HVD_ASYNC_DEBUG=1 prints the traceback)")


def lowest_alike(comm, key: str, grace: float) -> Optional[int]:
    """Tell every other rank of ``comm`` that this one fails with ``key``, and for ``grace`` seconds
    hear theirs; the lowest rank below this one that failed with the same key (None: none did, this
    rank is the one to say it). Sends are not waited for: the job is about to end."""
    from mpi4py import MPI

    me = comm.rank
    for rank in range(comm.size):
        if rank != me:
            comm.isend(key, dest=rank, tag=TAG_FAILED)
    alike, status, deadline = [], MPI.Status(), time.monotonic() + grace
    while time.monotonic() < deadline:
        while comm.iprobe(source=MPI.ANY_SOURCE, tag=TAG_FAILED, status=status):
            source = status.Get_source()
            if comm.recv(source=source, tag=TAG_FAILED) == key and source < me:
                alike.append(source)
        time.sleep(0.01)
    return min(alike) if alike else None


# After MPI_Abort, the seconds before the kernel ends this process if it is somehow still alive.
ABORT_BACKSTOP_SECONDS = 10


def abort(world, code: int, *, wait: float = 0.0) -> None:
    """End the whole job with ``code`` (``MPI_Abort`` on ``world``) after ``wait`` seconds (the other
    ranks' time to report). MPI_Abort hands the ending to mpirun and then ends this process; should
    anything keep the process alive past that (an exit handler waiting on a thread that is blocked in
    MPI, say), the job would wait on it. So an alarm is armed first:
    ``ABORT_BACKSTOP_SECONDS`` later SIGALRM's default action ends the process, and mpirun, seeing a
    rank die on a signal, ends the job."""
    sys.stdout.flush()
    sys.stderr.flush()
    time.sleep(wait)
    try:
        signal.signal(signal.SIGALRM, signal.SIG_DFL)  # a handler the script installed would run in Python
    except ValueError:  # not the main thread: the alarm still fires (with Python's own default: none)
        pass
    signal.alarm(ABORT_BACKSTOP_SECONDS)
    world.Abort(code)

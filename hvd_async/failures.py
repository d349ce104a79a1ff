"""One error, one line: an uncaught error raised alike on several ranks (a bad option every worker
passes) is said once, by the lowest rank that has it, and an error of the library's bad-input kind
(a ``ValueError`` or ``TypeError`` raised inside ``hvd_async``) is one line naming where the call
was made, without the traceback (``HVD_ASYNC_DEBUG=1`` prints it). And every ending of the job on an
error goes through :func:`abort`, which makes sure the aborting process does end."""
import contextlib
import os
import signal
import sys
import threading
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


# How long a collective that every rank has reached may take before the job is ended instead (the
# windows' free at close: milliseconds normally; see :func:`deadline`).
FREE_TIMEOUT_ENV = "HVD_ASYNC_FREE_TIMEOUT"
FREE_TIMEOUT_SECONDS = 60.0


def free_timeout() -> float:
    value = os.environ.get(FREE_TIMEOUT_ENV, "").strip()
    try:
        seconds = float(value) if value else FREE_TIMEOUT_SECONDS
    except ValueError:
        seconds = -1.0
    if not seconds > 0:
        raise ValueError(f"{FREE_TIMEOUT_ENV}={value!r} is not a positive number of seconds: unset it "
                         f"(default {FREE_TIMEOUT_SECONDS:g}) or set e.g. {FREE_TIMEOUT_ENV}=120")
    return seconds


@contextlib.contextmanager
def deadline(world, what: str, who: str, seconds: Optional[float] = None):
    """Bound a blocking MPI call that every rank has reached and that should return at once (the
    windows' free, after every worker has closed): should it still be running ``seconds`` later (an
    MPI one-sided component that never completes a free has been seen across hosts), say so in one
    line and end the job through :func:`abort` (exit status 1) instead of waiting for ever. The
    watch is a timer thread: mpi4py releases the interpreter while it waits in MPI."""
    seconds = free_timeout() if seconds is None else seconds

    def expired():
        sys.stderr.write(f"hvd_async: error: {who}: {what} did not complete within {seconds:g} s although every "
                         f"rank had reached it (an MPI one-sided component that never completes it); ending "
                         f"the job ({FREE_TIMEOUT_ENV} sets the limit)\n")
        abort(world, 1)

    timer = threading.Timer(seconds, expired)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()

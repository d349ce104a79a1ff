"""The driver of the check scripts run under mpirun (ps_checks.py, odsgd_checks.py): servers serve
and print what they hosted; workers run the named checks in order (all when none is named), and a
failing check aborts the whole job so no rank is left waiting. A rank that finished ends its process
with ``exit_process(0)`` (MPI finalized, no interpreter teardown: most of a second a rank).

A rank still running after ``HVD_ASYNC_CHECK_WATCHDOG`` seconds (240; tests/procs.py sets it a little
under the test's own timeout) prints every thread's Python stack, and 5 s later (every rank has
printed by then) exits 1, which ends the job: a hang leaves the place each rank hung in the test's
output, not only a timeout."""
import faulthandler
import os
import sys
import threading
import traceback

import hvd_async as ha
from hvd_async.job.job_process import exit_process


def say(line: str) -> None:
    """Print ``line`` in one write: print() writes the text and the newline apart, and mpirun may put
    another rank's output between them, joining two ranks' lines into one."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def _arm_watchdog(seconds: float) -> None:
    """Print every thread's stack after ``seconds`` (from C: even while this rank is blocked in MPI),
    then exit 1 five seconds later, so that the other ranks print theirs before the job ends."""
    faulthandler.dump_traceback_later(seconds, exit=False)
    timer = threading.Timer(seconds + 5, os._exit, args=(1,))
    timer.daemon = True
    timer.start()


def main(checks, names, banner: str) -> None:
    _arm_watchdog(float(os.environ.get("HVD_ASYNC_CHECK_WATCHDOG", "240")))
    ha.init(servers=int(os.environ.get("SERVERS", "1")))
    if ha.is_server():
        report = ha.serve()
        for s in report.shards:
            say(f"SHARD {s.shard} {s.algorithm} numel={s.numel} updates={s.updates} pushes={s.pushes} "
                f"skipped={s.skipped_nonfinite} compiled={s.compiled_updates}")
        say(f"SERVER {ha.world_rank()} DONE order={report.workers_done}")
        exit_process(0)
    try:
        for name in names or checks:
            checks[name]()
            ha.worker_comm().Barrier()
    except BaseException:
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        from mpi4py import MPI

        MPI.COMM_WORLD.Abort(1)
    ha.shutdown()
    if ha.rank() == 0:
        say(f"{banner} {' '.join(names or checks)}")
    exit_process(0)

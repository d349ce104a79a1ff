"""A windows' free that never completes on one rank (rank 1 never joins it, as an MPI one-sided component
that loses a free would behave): rank 0's free, bounded by ``hvd_async.failures.deadline``, ends the
job within HVD_ASYNC_FREE_TIMEOUT seconds with one line instead of waiting for ever."""
import sys
import time

from mpi4py import MPI

from hvd_async import failures

comm = MPI.COMM_WORLD
win = MPI.Win.Allocate(64, 1, comm=comm)
comm.Barrier()
if comm.rank == 1:
    time.sleep(120)  # never frees: mpirun's kill at the abort ends it
    sys.exit(0)
print(f"rank 0 frees at t={time.time():.3f}", flush=True)
with failures.deadline(comm, "the windows' free at close()", "worker 0"):
    win.Free()
print("FREED", flush=True)  # not reached

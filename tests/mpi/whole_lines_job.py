"""Run under mpirun with PYTHONUNBUFFERED=1: every rank prints LINES lines, the ranks in step (a
barrier before each line), as a training script's ranks print together at an epoch's end. After
hvd_async.init each line must reach mpirun's output whole, never with another rank's line inside."""
import os

import hvd_async as ha
from mpi4py import MPI

ha.init()
for i in range(int(os.environ.get("LINES", "200"))):
    MPI.COMM_WORLD.Barrier()
    print(f"LINE rank {ha.rank()} number {i} end")

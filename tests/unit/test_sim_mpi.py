"""The simulator's MPI (hvd_async.sim.mpi): one-sided operations take effect when completed, one latency
after the first of them was issued; a message arrives one latency after it was sent; a collective
completes one latency after the last worker arrives."""
import numpy as np
import pytest

from hvd_async.sim.clock import Scheduler
from hvd_async.sim.mpi import SimCommunicator, SimMPI, SimWorld
from hvd_async.sim.network import SimNetwork

LATENCY = 1.0


def world(workers: int = 2):
    sched = Scheduler(workers)
    net = SimNetwork(sched, LATENCY)
    return sched, SimWorld(net, servers=0)


def comm_of(world_: SimWorld, worker: int) -> SimCommunicator:
    return SimCommunicator(world_, ("group",), list(range(world_.net.size)), worker)


def test_one_sided_operations_land_at_completion_one_latency_after_the_first_was_issued():
    sched, w = world()
    MPI = SimMPI
    seen = {}

    def body(rank):
        comm = comm_of(w, rank)
        win = MPI.Win.Allocate(16, 4, comm=comm)  # a collective: every worker's 16 bytes
        mine = np.frombuffer(win.tomemory(), dtype=np.float32)
        start = sched.now(rank)
        if rank == 0:
            win.Put([np.full(4, 7.0, dtype=np.float32), MPI.FLOAT], 1, target=(0, 4, MPI.FLOAT))
            sched.advance(0, 0.25)
            win.Accumulate([np.ones(2, dtype=np.float32), MPI.FLOAT], 1, target=(2, 2, MPI.FLOAT), op=MPI.SUM)
            seen["issued"] = sched.now(0) - start
            win.Flush(1)
            seen["flushed"] = sched.now(0) - start  # both completed at the first one's issue + latency
        else:
            sched.advance(1, 0.5)  # worker 0 has issued both by now: neither has landed
            seen["before"] = mine.copy()
            sched.advance(1, 1.0)
            seen["after"] = mine.copy()
        comm.Barrier()
        return sched.now(rank) - start

    sched.run(body)
    assert seen["issued"] == pytest.approx(0.25) and seen["flushed"] == pytest.approx(LATENCY)
    np.testing.assert_array_equal(seen["before"], np.zeros(4, dtype=np.float32))
    np.testing.assert_array_equal(seen["after"], np.array([7, 7, 8, 8], dtype=np.float32))


def test_a_message_arrives_one_latency_after_it_was_sent_and_a_receiver_waits_for_it():
    sched, w = world()
    got = {}

    def body(rank):
        comm = comm_of(w, rank)
        if rank == 0:
            sched.advance(0, 2.0)
            comm.Send(np.array([3.0, 4.0]), dest=1, tag=5)
        else:
            out = np.zeros(2)
            comm.Irecv(out, source=0, tag=5).Wait()
            got["at"], got["data"] = sched.now(1), out

    sched.run(body)
    assert got["at"] == pytest.approx(2.0 + LATENCY)
    np.testing.assert_array_equal(got["data"], [3.0, 4.0])


def test_a_reduction_sums_in_worker_order_and_reaches_the_root_one_latency_after_the_last_arrival():
    sched, w = world(3)
    MPI = SimMPI
    out = {}

    def body(rank):
        comm = comm_of(w, rank)
        sched.advance(rank, float(rank))
        array = np.full(3, rank + 1, dtype=np.float32)
        if rank == 0:
            comm.Reduce(MPI.IN_PLACE, array, op=MPI.SUM, root=0)
            out["sum"], out["at"] = array, sched.now(0)
        else:
            comm.Reduce(array, None, op=MPI.SUM, root=0)

    sched.run(body)
    np.testing.assert_array_equal(out["sum"], np.full(3, 6, dtype=np.float32))
    assert out["at"] == pytest.approx(2.0 + LATENCY)

"""Orders of leaving that the leave protocol's checker explores (tests/unit/test_leave_protocol.py), run
under mpirun for every algorithm (shared memory on for half, off for the others): one worker catches an
error and closes early while the other trains on and closes late, each from its ``finally`` (issue 56's
hang). The job ends within the limit, leaves no process behind, and ends as the checker says it can:
every worker finishing where none left early, by the error (a non-zero status) where one did."""
import os
import sys
import time

import pytest

from hvd_async import registry
from procs import mpirun

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "unit"))
import leave_orders  # noqa: E402
from test_leave_protocol import check  # noqa: E402

LIMIT = 45  # seconds a job may take in all
SERVERLESS = registry.serverless()


def run_order(algo: str, leaves, no_shm: bool):
    servers = 0 if algo in SERVERLESS else 1
    env = {"ALGO": algo, "SERVERS": str(servers), "LEAVES": ",".join(leave.name for leave in leaves)}
    start = time.time()
    result = mpirun(len(leaves) + servers, [sys.executable, "tests/mpi/leave_order_job.py"], env=env,
                    no_shm=no_shm, timeout=LIMIT)
    return result, time.time() - start, servers


# Each algorithm under one transport, alternating in the registry's order: the serverless family
# (ssgd, hpsgd, gossip, lb-sgd) and the families with servers each leave both with shared memory and
# over TCP, at half the jobs of every algorithm under both.
CELLS = [(algo, index % 2 == 1) for index, algo in enumerate(registry.NAMES)]


@pytest.mark.parametrize("algo,no_shm", CELLS, ids=[f"{a}-{'no-shm' if n else 'shm'}" for a, n in CELLS])
def test_early_close_late_close_ends(algo, no_shm):
    leaves = (leave_orders.FINISH, leave_orders.Leave.parse("close-early"))
    result, seconds, servers = run_order(algo, leaves, no_shm)
    assert f"FAULT close-early on worker 1" in result.out, result
    assert "worker 1 caught: worker 1: bad shard" in result.out, result
    _, _, ends = check(leaves, servers)
    if result.returncode == 0:
        assert "finished" in ends, (ends, result)
        assert result.out.count(" DONE ") == len(leaves), result
    else:
        assert "aborted" in ends, (ends, result)
        assert "left the job" in result.out, result  # the one line that names the leaver
